"""Flow routing: projected gradient descent on the allowed simplex (docs/design.md §3).

Every Δ seconds a root in cell i moves its routing vector against the observed costs,
``x_i ← Proj_{Δ_i}(x_i − η_i·Δ·c_i)``, and draws each request's cell from ``x_i`` (:attr:`FlowConfig.pick`).

Step-size rule (docs/theory.md, "Flow step size"; derivation in research/theory.md): ``η = κ / (τ̄_i · Λ̂ · ĝ_i)``, where

- ``τ̄_i`` is the *pure* feedback delay the root acts under: the mean round trip ``2τ_ij`` over its
  allowed arcs plus the step/probe period (floored at ``min_delay_s``).
- ``Λ̂ = Σ_j μ_j(N_j) = Σ_j N_j/ℓ_j(N_j)`` over the usable cells, from the probes: the *fleet's* total
  rate, the same number for every root that sees the same cells (:func:`fleet_rate`). It is floored
  at ``min_rate_fraction`` of the cells' capacity so an idle fleet does not blow the step up.
- ``ĝ_i`` = mean over the arcs in use of ``|c_j'(N)| / μ_j'(N)`` (cost change per unit of steady
  inflow) evaluated at ``N`` clipped to ``[N_ref, N_sat]``: ``N_ref`` is the workload at utilisation
  ``ref_utilisation`` (50 %, in practice the end of the knee, ``c + 4s``) or, if smaller, the workload
  the cell would have carrying the whole fleet's rate Λ̂ (:func:`workload_at_rate`) — no reachable
  state of the cell is busier; ``N_sat`` at ``saturation`` (99 %) (:func:`saturation_workload`).
  Cells past ``N_sat`` (overloaded: no equilibrium there) stay out of the mean unless every arc in use
  is overloaded — their ``g(N_sat)`` would otherwise shrink the step that empties them.
  With ``per_cell_scale`` (the default) each arc uses its own cell's ``g_j`` instead (overloaded
  cells the mean), and the step is projected in the matching metric: every cell's loop gain is then
  within the bound, not only the mean cell's (research/theory.md, "Per-cell scale").

Why: linearised, cell j's steady inflow moves by ``Σ_i λ_i δx_ij`` and its cost by ``g_j`` times that,
so the loop gain acting on cell j is ``Σ_i λ_i η_i g_j``. The old rule divided by each root's own
arrival rate λ_i, so every root feeding j contributed a full ``κ/τ̄`` and the total grew with the
number of roots (4 replicas per cell made Flow-Grad worse than Rand). Dividing by the shared Λ̂ makes
the total ``κ/τ̄ · (Σ_i λ_i/Λ̂) · g_j/ĝ ≤ κ/τ̄ · g_j/ĝ``: splitting a cell's traffic over R replicas
leaves it unchanged, and it is at most the single-root bound (κ < 1 with the pure delay) whatever
the number of roots. Clipping N below at ``N_ref`` makes the scale state-independent below the
reference load: the latency cost's ``ℓ'`` is ≈ 0 below the knee, and a scale taken there swung ~1000×
and made Flow-Lat bang between cells. Above ``N_ref`` the true gain grows with N, and the scale grows
with it (up to saturation, past which it is clipped so the router never freezes in overload). At low
fleet load a fixed 50 % reference is a gain no state can have (the priors experiment: all traffic at 15 %
of one cell, Flow-Grad's step ~17× too small, 122–178 s to find the right cell): N_ref is never above
μ_j⁻¹(Λ̂), where every reachable steady state of cell j lies, so the scale still bounds the gain of
every state the loop can visit and still does not follow the current state.

Since the projection is invariant to adding a constant to every allowed coordinate, only cost
*differences* move ``x``; the step is therefore written against the centred cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dlb.core.latency_model import Num, latency
from dlb.core.projection import project_simplex_scaled
from dlb.core.slowed_share import SlowedShareConfig

#: :attr:`FlowConfig.pick`'s values.
PICKS = ("sample", "two-choice")


@dataclass(frozen=True)
class FlowConfig:
    kappa: float = 1.0
    period_s: float = 0.2
    #: Lower bound of τ̄ in seconds (a root with all cells local still has some feedback delay).
    min_delay_s: float = 0.05
    #: Largest probability change of one step on any arc (keeps the first steps sane when ĥ is tiny).
    max_step: float = 0.25
    #: Utilisation beyond which a cell's workload is treated as "saturated" when sizing the step
    #: (ĥ is evaluated at min(N, N_sat)); see :func:`saturation_workload`.
    saturation: float = 0.99
    #: Utilisation of the reference workload below which the step's scale does not follow the state
    #: (lowered to the whole fleet's rate where that is less; see the module docstring).
    ref_utilisation: float = 0.5
    #: Floor of Λ̂ as a fraction of the usable cells' capacity Σ 1/b_j (an idle fleet's rate is ~0).
    min_rate_fraction: float = 0.05
    #: Scale each arc's step by its own cell's g_j (and project in the matching metric) rather than
    #: by the mean ĝ over the arcs in use; see research/theory.md, "Per-cell scale".
    per_cell_scale: bool = True
    #: Count the queue relaxation time 1/μ'(N) of the slowest cell in use in τ̄. The linearised loop
    #: needs it to be well damped (docs/theory.md), but in the simulator at 95 % load it made every
    #: flow policy slower to move load off an overflowing cell and 2–5× worse than without
    #: (research/routing-stress/README.md), so it is off by default: τ̄ = network + probe delay.
    relaxation_delay: bool = False
    #: Halve a cell's step when its move reverses and grow it back (×``gain_up``, at most 1) while it
    #: keeps its direction (:func:`adapt_gain`). Added when fitted capacities were 2–15× off and the
    #: split banged between cells; since the fit bounds itself by the requests still running, it
    #: costs more than it saves (fresh seeds: Flow-Grad at 95 % on the batched server 0.640 → 0.582
    #: × Rand off, share swing 0.24 → 0.07; research/routing-stress), so it is off by default.
    adaptive_gain: bool = False
    #: Split requests by smooth weighted round robin over ``x`` instead of sampling each one: a cell then
    #: gets its share over any few requests, not a Poisson-thinned stream whose bursts queue.
    smooth_split: bool = False
    #: How a root that routes its own requests turns ``x`` into one request's cell. ``"sample"``: draw
    #: the cell from ``x``. ``"two-choice"``: draw two cells from ``x`` independently and send to the one
    #: whose cost (the policy's own, at the root's view now: probe RIF + unseen sends) is lower, so a
    #: cell that fell behind its share gets the next requests (the discrete policies' advantage, kept
    #: on the flow's split). The fixed point is unchanged: ``x`` stops moving only where the costs of
    #: the cells in use are equal, and there the comparison is decided by fluctuations on either side,
    #: so the realised split is ``x`` on average; away from it the pick only leans the way the step
    #: moves ``x`` anyway, with no memory (it adds no integrator to the loop). A data plane applying
    #: ``x`` as weights (a root Envoy on the control plane's native split) cannot compare costs and
    #: samples whatever this says. Default two-choice: on fresh seed 67 (batched server, 5 scenarios)
    #: it lowered every flow policy's latency at 80 %, in the burst and at 95 % (Flow-Grad 0.709 → 0.690,
    #: 0.528 → 0.513, 0.508 → 0.497 × Rand; research/routing-stress/flow-two-choice.md).
    pick: str = "two-choice"
    #: Evaluate the costs at the workload ``lead_s`` seconds ahead on its smoothed trend (0: off).
    lead_s: float = 5.0
    lead_smoothing_s: float = 1.0
    #: Lag-aware lead (0: off): a cell's lead is ``lead_gain·√(τ̄·T_j/κ)`` with ``T_j = 1/μ_j'(N_j)``
    #: its queue's relaxation time, kept within ``[lead_s, min(T_j, lead_max_s)]``. Why: the step is an
    #: integrator and a slow queue nearly another, so the loop crosses over near ``√(κ/(τ̄T))`` and only
    #: a lead of about the inverse of that adds the phase that damps it; a fixed 5-s lead acts only at
    #: faster frequencies (research/theory.md, "Batched servers"). The step size is untouched, so a cell
    #: that overflows is shed as fast as before — its rising trend makes it look dearer, not slower.
    #: Off: on fresh seeds it halved the 95 % share swing but made Flow-Grad worse at 80 % (+0.023 × Rand),
    #: T being read from fits that put batched cells near saturation (research/routing-stress/lag.md).
    lead_gain: float = 0.0
    lead_max_s: float = 60.0
    #: Cold start: for this long after a root's first flow step with a fresh probe, a root that routes its
    #: own requests picks like the discrete policy of the same cost, and ``x`` follows the split of those
    #: picks (an EMA over ``warmup_smoothing_s``); the flow loop then starts from that split (0: off).
    #: Why: from the replica split the step, sized for stability near the fixed point, took ~40 s to
    #: move traffic to the cheap cells, while a discrete root follows the costs from its first probe
    #: (research/compare-stress/coldstart.md). A router that never picks (the control plane's, whose
    #: split Envoy applies) has no discrete split to follow and steps as before. ``None``: the cost's
    #: default (:attr:`dlb.core.router.PolicyConfig.warmup_s`): 20 s for the gradient cost (on fresh seeds
    #: 401–406: 1.36 → 1.01 × hub-score at 40 s, 1.05 → 0.99 at 180 s, no worse under stress;
    #: research/compare-stress/coldstart-grad.md), 0 for the others (Flow-Lat got worse at steady state,
    #: 1.00 → 1.09 at 180 s: two seeds entered the latency cost's oscillation after the hand-over).
    warmup_s: float | None = None
    warmup_smoothing_s: float = 2.0
    #: A cell whose model slowed under half its best capacity gets the share it held back when the model
    #: recovers (:mod:`dlb.core.slowed_share`): the step alone brought it back ~0.001 per second.
    slowed_share: SlowedShareConfig = field(default_factory=SlowedShareConfig)
    gain_up: float = 1.2
    min_gain: float = 1.0 / 64.0

    def __post_init__(self) -> None:
        if not 0 < self.kappa < np.pi / 2:
            raise ValueError(f"flow kappa must be in (0, π/2): {self.kappa}")
        if self.period_s <= 0 or self.min_delay_s <= 0 or not 0 < self.max_step <= 1:
            raise ValueError("flow period_s and min_delay_s must be > 0, max_step in (0, 1]")
        if not 0 < self.saturation < 1:
            raise ValueError(f"flow saturation must be in (0, 1): {self.saturation}")
        if not 0 < self.ref_utilisation <= self.saturation:
            raise ValueError(f"flow ref_utilisation must be in (0, saturation]: {self.ref_utilisation}")
        if (self.warmup_s is not None and self.warmup_s < 0) or self.warmup_smoothing_s <= 0:
            raise ValueError("flow warmup_s must be >= 0 and warmup_smoothing_s > 0")
        if self.lead_gain < 0 or self.lead_max_s < self.lead_s:
            raise ValueError("flow lead_gain must be >= 0 and lead_max_s >= lead_s")
        if self.pick not in PICKS:
            raise ValueError(f"flow pick must be one of {', '.join(PICKS)}: {self.pick!r}")
        if self.pick != "sample" and self.smooth_split:
            raise ValueError("flow smooth_split is a deterministic order: it needs pick='sample', not two-choice")
        if not 0 < self.min_rate_fraction <= 1:
            raise ValueError(f"flow min_rate_fraction must be in (0, 1]: {self.min_rate_fraction}")


def saturation_workload(a: Num, b: Num, c: Num, s: Num, rho: float) -> np.ndarray:
    """The workload at which a cell runs at utilisation ``rho`` (μ(N) = rho/b), from the linear branch.

    Past the knee ℓ(N) ≈ a + b(N − c), so μ(N) = rho/b gives ``N = rho(a − bc)/(b(1 − rho))``; floored
    at ``c + 4s`` (the end of the knee) where that branch is not yet accurate. Cheap and vectorised:
    it is only a scale for the step size, not a routing decision.
    """
    a, b, c, s = (np.asarray(v, float) for v in (a, b, c, s))
    return np.maximum(rho * np.maximum(a - b * c, 0.0) / (b * (1.0 - rho)), c + 4.0 * s)


def workload_at_rate(z: float, a: Num, b: Num, c: Num, s: Num) -> np.ndarray:
    """μ⁻¹(z) per cell, vectorised: the workload at which each cell serves ``z`` requests/s (inf at or past capacity 1/b).

    Starts from the larger of the softplus's two linear branches (``z·a`` and ``z(a − bc)/(1 − bz)``,
    both lower bounds since ℓ ≥ a and ℓ ≥ a + b(N − c)) and applies N ← z·ℓ(N) twice, which climbs
    monotonically towards the root (its slope zℓ' < 1 below capacity): exact far from the knee,
    within the knee's smoothing near it. Cheap enough for every flow step.
    """
    a, b, c, s = (np.asarray(v, float) for v in (a, b, c, s))
    room = 1.0 - b * z
    ok = room > 0
    n = np.where(ok, np.maximum(z * a, z * np.maximum(a - b * c, 0.0) / np.where(ok, room, 1.0)), 0.0)
    for _ in range(2):
        n = np.where(ok, z * latency(n, a, b, c, s), 0.0)
    return np.where(ok, n, np.inf)


def fleet_rate(n: np.ndarray, a: np.ndarray, b: np.ndarray, c: np.ndarray, s: np.ndarray, floor_fraction: float) -> float:
    """Λ̂ = Σ_j N_j/ℓ_j(N_j) over the given cells, floored at ``floor_fraction·Σ_j 1/b_j``.

    By Little's law the cells' throughput, which in steady state is the total arrival rate feeding
    them: one number every root seeing these cells shares, measured from probes, not per root.
    """
    mu = np.asarray(n, float) / latency(n, a, b, c, s)
    return max(float(mu.sum()), floor_fraction * float((1.0 / np.asarray(b, float)).sum()))


def feedback_delay(rtt: np.ndarray, mask: np.ndarray, period_s: float, serving_s: float, min_delay_s: float) -> float:
    """τ̄_i: mean round trip over usable arcs + probe period + any extra lag ``serving_s``.

    The router passes ``serving_s = 0`` unless ``FlowConfig.relaxation_delay`` (off by default).
    """
    mean_rtt = float(rtt[mask].mean()) if mask.any() else 0.0
    return max(min_delay_s, mean_rtt + period_s + max(serving_s, 0.0))


def lead_horizon(relax_s: np.ndarray, delay_s: float, cfg: FlowConfig) -> np.ndarray:
    """Per cell, how far ahead on its workload trend the costs are taken (:attr:`FlowConfig.lead_gain`).

    ``relax_s``: each cell's queue relaxation time 1/μ'(N). Never beyond it: a queue that settles in T
    is at its new level after T, and leading further predicts a workload it will not reach.
    """
    relax_s = np.asarray(relax_s, float)
    if cfg.lead_gain <= 0:
        return np.minimum(cfg.lead_s, relax_s)
    want = cfg.lead_gain * np.sqrt(delay_s * relax_s / cfg.kappa)
    return np.minimum(np.clip(want, cfg.lead_s, cfg.lead_max_s), relax_s)


def flow_step(
    x: np.ndarray,
    costs: np.ndarray,
    mask: np.ndarray,
    dt: float,
    delay_s: float,
    h_scale: float | np.ndarray,
    cfg: FlowConfig,
) -> np.ndarray:
    """One projected-gradient step of duration ``dt``; returns the new vector (on Δ(mask)).

    ``h_scale``: ``Λ̂·g`` — one number, or one per cell (``Λ̂·g_j``). Per cell, arc j moves with
    ``η_j = κ/(τ̄·Λ̂·g_j)`` and the result is projected in the matching metric
    (:func:`project_simplex_scaled`), so the fixed points stay the cost-equalising ones.
    """
    if not mask.any():
        raise ValueError("flow step with no usable destination")
    h = np.broadcast_to(np.maximum(np.asarray(h_scale, float), 1e-12), costs.shape)
    w = np.where(mask, 1.0 / h, 0.0)
    c = np.where(mask, costs, 0.0)
    centred = np.where(mask, c - float((w * c).sum() / w.sum()), 0.0)
    move = (cfg.kappa / delay_s) * dt * w * centred
    biggest = float(np.abs(move).max())
    if biggest > cfg.max_step:
        move *= cfg.max_step / biggest
    return project_simplex_scaled(np.where(mask, x, 0.0) - move, np.where(mask, w, 1.0), mask)


def adapt_gain(gain: np.ndarray, last_dir: np.ndarray, move: np.ndarray, mask: np.ndarray,
               cfg: FlowConfig) -> tuple[np.ndarray, np.ndarray]:
    """New per-cell step multipliers from the sign of each cell's last two moves (Rprop's rule).

    The step is sized from the fitted models (η ∝ 1/g, g = |c′|/μ′); on the batched server the fitted
    capacity was 2–15× the real one, so g was that much too small and the split jumped between
    corners every few steps. A reversal is the loop overshooting whatever the model says: that cell's
    step halves (down to ``min_gain``); a move in the same direction grows it back by ``gain_up``. At
    a noisy equilibrium the steps shrink (less dither); after a real shift they regrow in ~25 steps.
    """
    direction = np.where(np.abs(move) > 1e-9, np.sign(move), 0.0)
    flipped = mask & (direction * last_dir < 0)
    kept = mask & (direction * last_dir > 0)
    gain = np.where(flipped, np.maximum(gain * 0.5, cfg.min_gain), gain)
    gain = np.where(kept, np.minimum(gain * cfg.gain_up, 1.0), gain)
    return gain, np.where(direction != 0, direction, last_dir)
