"""Baselines the paper compares DLB against: Rand and MNLB.

- *Rand*: each root sends to an allowed cell at random, weighted by replica count.
- *MNLB* (minimum network latency balancer): a central optimiser, every ~10 s, solves
  ``min Σ_ij λ̂_i τ_ij y_ij + M·Σ_j s_j``  s.t.  ``Σ_j y_ij = 1``, ``y_ij = 0`` off the allowed arcs,
  ``Σ_i λ̂_i y_ij ≤ ρ·capacity_j + s_j``, ``y, s ≥ 0`` — network latency only, serving latency enters
  through capacity alone (which is the paper's point). The slack ``s`` keeps the LP feasible when
  demand exceeds ρ·capacity; its penalty ``M`` is far above any network cost, so slack is used only
  when needed. Solved with HiGHS through ``scipy.optimize.linprog``. Roots then sample from ``y_i``.
"""

from __future__ import annotations

import bisect

import numpy as np
from scipy.optimize import linprog

from dlb.core.topology import Topology


def rand_weights(topology: Topology) -> np.ndarray:
    """Row-stochastic (n, n) matrix: replica-weighted over allowed arcs."""
    w = np.where(topology.allowed, topology.replicas[None, :], 0.0)
    return w / w.sum(axis=1, keepdims=True)


def mnlb_solve(
    topology: Topology,
    demand: np.ndarray,
    capacity: np.ndarray,
    rho: float = 0.85,
    slack_penalty: float | None = None,
) -> np.ndarray:
    """MNLB routing matrix ``y`` (n, n), rows on the allowed simplex.

    ``demand``: λ̂_i (req/s arriving at each cell); ``capacity``: μ̄_j (req/s each cell can serve).
    """
    n = topology.n
    lam = np.maximum(np.asarray(demand, float), 0.0)
    cap = np.asarray(capacity, float)
    arcs = [(i, j) for i in range(n) for j in range(n) if topology.allowed[i, j]]
    m = len(arcs)
    if slack_penalty is None:
        slack_penalty = 1e3 * (float(topology.tau.max()) + 1.0) * max(float(lam.sum()), 1.0)
    # Variables: y_arc (m), slack_j (n). Objective uses λ̂_i τ_ij; a tiny uniform term breaks ties
    # between cells at equal distance in favour of spreading (HiGHS otherwise picks a vertex).
    c = np.array([lam[i] * topology.tau[i, j] + 1e-9 for i, j in arcs] + [slack_penalty] * n)
    a_eq = np.zeros((n, m + n))
    for k, (i, _j) in enumerate(arcs):
        a_eq[i, k] = 1.0
    b_eq = np.ones(n)
    a_ub = np.zeros((n, m + n))
    for k, (i, j) in enumerate(arcs):
        a_ub[j, k] = lam[i]
    a_ub[np.arange(n), m + np.arange(n)] = -1.0
    b_ub = rho * cap
    res = linprog(c, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=b_eq, bounds=(0, None), method="highs")
    if not res.success:
        raise RuntimeError(f"MNLB linear program failed: {res.message}")
    y = np.zeros((n, n))
    for k, (i, j) in enumerate(arcs):
        y[i, j] = max(res.x[k], 0.0)
    y /= y.sum(axis=1, keepdims=True)
    return y


def without_dead_cells(topology: Topology, y: np.ndarray, capacity: np.ndarray, previous: np.ndarray) -> np.ndarray:
    """``y`` with no share on a cell without capacity (leaf silent, no healthy server), rows renormalised.

    A source with no measured demand gets an arbitrary feasible row from the LP, which may sit on
    such a cell; a row left empty falls back to the usable allowed cells by replicas, else to
    ``previous``'s row. Shared by the control plane's loop and the simulator's.
    """
    usable = np.asarray(capacity, float) > 0
    if not usable.any():
        return y
    y = np.where(usable[None, :], y, 0.0)
    for i in range(topology.n):
        s = y[i].sum()
        if s > 0:
            y[i] /= s
        else:
            w = np.where(topology.allowed[i] & usable, topology.replicas, 0.0)
            y[i] = w / w.sum() if w.sum() > 0 else previous[i]
    return y


class WeightedRouter:
    """A root that samples from fixed weights (Rand, or MNLB between two solves).

    Same ``pick(now, session)`` / ``on_probe`` / ``tick`` surface as :class:`RootRouter`, so the
    simulator drives every policy the same way.
    """

    def __init__(self, weights: np.ndarray, rng: np.random.Generator | None = None) -> None:
        self.rng = rng if rng is not None else np.random.default_rng()
        self.set_weights(weights)

    def set_weights(self, weights: np.ndarray) -> None:
        w = np.maximum(np.asarray(weights, float), 0.0)
        if w.sum() <= 0:
            raise ValueError("weights must have a positive entry")
        self.weights = w / w.sum()
        # Cumulative weights as Python floats: one pick per request, and numpy's searchsorted on a few
        # cells costs several times bisect's (the same comparisons, so the same cell).
        self._cum_list: list[float] = np.cumsum(self.weights).tolist()
        self._total = self._cum_list[-1]
        self._last = len(self._cum_list) - 1

    def pick(self, now: float, session: str | None = None) -> int:
        return min(bisect.bisect_right(self._cum_list, self.rng.random() * self._total), self._last)

    def on_probe(self, *args: object, **kwargs: object) -> None:
        """Baselines ignore probe state."""

    def tick(self, now: float) -> None:
        """Nothing periodic at the root; MNLB's solve is central."""
