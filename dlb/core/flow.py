"""Flow routing: projected gradient descent on the allowed simplex (docs/design.md §3).

Every Δ seconds a root in cell i moves its routing vector against the observed costs,
``x_i ← Proj_{Δ_i}(x_i − η_i·Δ·c_i)``, and samples each request's cell from ``x_i``.

Step-size rule (our reconstruction; checked by ``dlb theory``, reasoning in docs/theory.md):
``η_i = κ / (τ̄_i · ĥ_i)``, where

- ``τ̄_i`` is the *pure* feedback delay the root acts under: the mean round trip ``2τ_ij`` over its
  allowed arcs plus the step/probe period (floored at ``min_delay_s``).
- ``ĥ_i`` converts probability into cost: ``∂c_ij/∂x_ij ≈ c_j'(N_j) · λ_i / μ_j'(N_j)`` (a unit of
  probability moves λ_i requests/s, which moves the steady workload by λ_i/μ'), taken as the mean over
  the arcs in use, with N clipped at the workload of ``saturation`` (99 %) utilisation. It makes κ
  dimensionless, so one κ serves endpoints whose costs are in ms or in minutes.

Why this τ̄ (and not one that adds the serving time): linearised, one arc's loop is
``L(s) = η·λ·c'·e^{−sT} / (s·(s + μ'))`` — the step integrates, the workload lags with time constant
1/μ', the probe is T late. With ``η = κ/(T·ĥ)`` the loop gain is ``κ·μ'/T``. When the workload relaxes
fast (μ'T ≫ 1) this is ``κ·e^{−sT}/(sT)``, stable for κ < π/2; when it relaxes slowly (μ'T ≪ 1,
near-saturated cells, long requests) the crossover is ``√(κμ'/T)`` and the phase condition reads
κ < 1. So κ < 1 is stable in both regimes with T the *pure* delay: the relaxation is already paid for
by the 1/μ' inside ĥ, and adding it to τ̄ as well (our first rule used ``T + ℓ``) divides the step by
a second load-dependent factor. Measured by ``dlb theory``: with ``T + ℓ``, routing directions that
only the network term drives (swapping far sources between cells, which leaves every cell's load
unchanged) crawled (Flow-Grad still 1–4 % above the optimum after 300 s on 6 of 12 topologies), and in
overload — where ĥ and ℓ both grow with N faster than the cost difference — the router froze and one
topology diverged. Clipping N at saturation for the step keeps the step growing with the overload.
κ = 0.5 (not 0.9) leaves margin for several sources sharing a cell, whose gains add up: at κ = 0.8 a
topology with slowly relaxing cells settles into a small limit cycle.

Since the projection is invariant to adding a constant to every allowed coordinate, only cost
*differences* move ``x``; the step is therefore written against the centred cost.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dlb.core.latency_model import Num
from dlb.core.projection import project_simplex


@dataclass(frozen=True)
class FlowConfig:
    kappa: float = 0.5
    period_s: float = 0.2
    #: Lower bound of τ̄ in seconds (a root with all cells local still has some feedback delay).
    min_delay_s: float = 0.05
    #: Largest probability change of one step on any arc (keeps the first steps sane when ĥ is tiny).
    max_step: float = 0.25
    #: Utilisation beyond which a cell's workload is treated as "saturated" when sizing the step
    #: (ĥ is evaluated at min(N, N_sat)); see :func:`saturation_workload`.
    saturation: float = 0.99

    def __post_init__(self) -> None:
        if not 0 < self.kappa < np.pi / 2:
            raise ValueError(f"flow kappa must be in (0, π/2): {self.kappa}")
        if self.period_s <= 0 or self.min_delay_s <= 0 or not 0 < self.max_step <= 1:
            raise ValueError("flow period_s and min_delay_s must be > 0, max_step in (0, 1]")
        if not 0 < self.saturation < 1:
            raise ValueError(f"flow saturation must be in (0, 1): {self.saturation}")


def saturation_workload(a: Num, b: Num, c: Num, s: Num, rho: float) -> np.ndarray:
    """The workload at which a cell runs at utilisation ``rho`` (μ(N) = rho/b), from the linear branch.

    Past the knee ℓ(N) ≈ a + b(N − c), so μ(N) = rho/b gives ``N = rho(a − bc)/(b(1 − rho))``; floored
    at ``c + 4s`` (the end of the knee) where that branch is not yet accurate. Cheap and vectorised:
    it is only a scale for the step size, not a routing decision.
    """
    a, b, c, s = (np.asarray(v, float) for v in (a, b, c, s))
    return np.maximum(rho * np.maximum(a - b * c, 0.0) / (b * (1.0 - rho)), c + 4.0 * s)


def feedback_delay(rtt: np.ndarray, mask: np.ndarray, period_s: float, serving_s: float, min_delay_s: float) -> float:
    """τ̄_i: mean round trip over usable arcs + probe period + any extra lag ``serving_s``.

    The router passes ``serving_s = 0``: the workload's relaxation is already in ĥ (module docstring).
    """
    mean_rtt = float(rtt[mask].mean()) if mask.any() else 0.0
    return max(min_delay_s, mean_rtt + period_s + max(serving_s, 0.0))


def flow_step(
    x: np.ndarray,
    costs: np.ndarray,
    mask: np.ndarray,
    dt: float,
    delay_s: float,
    h_scale: float,
    cfg: FlowConfig,
) -> np.ndarray:
    """One projected-gradient step of duration ``dt``; returns the new vector (on Δ(mask))."""
    if not mask.any():
        raise ValueError("flow step with no usable destination")
    eta = cfg.kappa / (delay_s * max(h_scale, 1e-12))
    c = np.where(mask, costs, 0.0)
    centred = np.where(mask, c - c[mask].mean(), 0.0)
    move = eta * dt * centred
    biggest = float(np.abs(move).max())
    if biggest > cfg.max_step:
        move *= cfg.max_step / biggest
    return project_simplex(np.where(mask, x, 0.0) - move, mask)
