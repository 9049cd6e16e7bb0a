"""Flow routing: projected gradient descent on the allowed simplex (DESIGN.md section 3).

Every Δ seconds a root in cell i moves its routing vector against the observed costs,
``x_i ← Proj_{Δ_i}(x_i − η_i·Δ·c_i)``, and samples each request's cell from ``x_i``.

Step-size rule (our reconstruction; checked by ``dlb theory``): ``η_i = κ / (τ̄_i · ĥ_i)``, where

- ``τ̄_i`` is the feedback delay the root acts under: the mean round trip ``2τ_ij`` over its allowed
  arcs, plus the probe period, plus the time the workload needs to respond to a routing change
  (≈ the serving latency ℓ, the relaxation time of N). Delayed negative feedback ``ẋ = −k·x(t−T)``
  is stable iff ``k·T < π/2``, hence ``κ < π/2``; in practice κ ≈ 0.5 leaves margin for the
  second-order workload dynamics.
- ``ĥ_i`` converts probability into cost: ``∂c_ij/∂x_ij ≈ c_j'(N_j) · λ_i / μ_j'(N_j)`` (a unit of
  probability moves λ_i requests/s, which moves the steady workload by λ_i/μ'), taken as the mean over
  the arcs in use. It makes κ dimensionless, so one κ serves endpoints whose costs are in ms or in
  minutes.

Since the projection is invariant to adding a constant to every allowed coordinate, only cost
*differences* move ``x``; the step is therefore written against the centred cost.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dlb.control_plane.projection import project_simplex


@dataclass(frozen=True)
class FlowConfig:
    kappa: float = 0.5
    period_s: float = 0.2
    #: Lower bound of τ̄ in seconds (a root with all cells local still has some feedback delay).
    min_delay_s: float = 0.05
    #: Largest probability change of one step on any arc (keeps the first steps sane when ĥ is tiny).
    max_step: float = 0.25

    def __post_init__(self) -> None:
        if not 0 < self.kappa < np.pi / 2:
            raise ValueError(f"flow kappa must be in (0, π/2): {self.kappa}")
        if self.period_s <= 0 or self.min_delay_s <= 0 or not 0 < self.max_step <= 1:
            raise ValueError("flow period_s and min_delay_s must be > 0, max_step in (0, 1]")


def feedback_delay(rtt: np.ndarray, mask: np.ndarray, period_s: float, serving_s: float, min_delay_s: float) -> float:
    """τ̄_i: mean round trip over usable arcs + probe period + serving relaxation time."""
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
