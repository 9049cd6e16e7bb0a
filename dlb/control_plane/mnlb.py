"""MNLB on the real data path: the paper's centralised baseline, run by the control plane.

The simulator's MNLB (:mod:`dlb.sim.policies`) is handed its inputs; here they are measured the way an
operator's central balancer would have them:

- **demand** λ̂_i: every leaf counts its completions per source cell (the root's ``x-dlb-src-cell``,
  from the access log) and reports the monotone counters in its probe answers; λ̂_i is the sum over
  cells of their increase over one period, divided by the period;
- **capacity** μ̄_j: ``1/b`` of each cell's published latency model (the slope of latency in RIF),
  scaled by the healthy fraction of its servers; a cell whose leaf does not answer has none.

Every ``period_s`` (10 s, the paper's) it solves :func:`dlb.core.baselines.mnlb_solve` and the control
plane writes the rows into every endpoint's fail-open route, so the root Envoys split traffic natively
(no root service on the request path — how ``dlb demo --compare`` runs it). Until the first period has
measured any demand it keeps Rand's replica split. Pure: time is passed in, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from dlb.core.baselines import mnlb_solve, rand_weights, without_dead_cells
from dlb.core.latency_model import LatencyParams
from dlb.core.topology import Topology


@dataclass
class MnlbLoop:
    topology: Topology
    endpoints: Sequence[str]
    sources: Sequence[int]
    period_s: float = 10.0
    rho: float = 0.85
    #: (n, n) routing matrix, row i = source cell i; starts at Rand's replica split.
    y: np.ndarray = field(init=False)
    demand: np.ndarray = field(init=False)
    capacity: np.ndarray = field(init=False)
    solves: int = field(init=False, default=0)
    _counts: list[dict[str, int]] = field(init=False)
    _prev: np.ndarray | None = field(init=False, default=None)
    _last: float = field(init=False, default=math.nan)

    def __post_init__(self) -> None:
        n = self.topology.n
        self.y = rand_weights(self.topology)
        self.demand = np.zeros(n)
        self.capacity = np.zeros(n)
        self._counts = [{} for _ in range(n)]
        self._index = {name: i for i, name in enumerate(self.topology.names)}

    def on_probe(self, cell: int, by_source: Mapping[str, int], model: LatencyParams | None,
                 healthy_fraction: float) -> None:
        """One leaf's answer: its per-source completion counters and its current model."""
        self._counts[cell] = dict(by_source)
        self.capacity[cell] = model.capacity * healthy_fraction if model is not None else 0.0

    def on_probe_failure(self, cell: int) -> None:
        self.capacity[cell] = 0.0

    def _totals(self) -> np.ndarray:
        """Completions per source cell so far, summed over every leaf."""
        tot = np.zeros(self.topology.n)
        for counts in self._counts:
            for src, k in counts.items():
                i = self._index.get(src)
                if i is not None:
                    tot[i] += k
        return tot

    def step(self, now: float) -> bool:
        """At most once per period: re-measure demand and re-solve; True when ``y`` changed."""
        if not math.isnan(self._last) and now - self._last < self.period_s:
            return False
        tot = self._totals()
        prev, last = self._prev, self._last
        self._prev, self._last = tot, now
        if prev is None or not (now > last):
            return False
        # A restarted leaf starts its counters from 0: clip so it reads as no demand, not negative.
        self.demand = np.maximum(tot - prev, 0.0) / (now - last)
        if self.demand.sum() <= 0 or self.capacity.sum() <= 0:
            return False
        y = mnlb_solve(self.topology, self.demand, self.capacity, rho=self.rho)
        y = without_dead_cells(self.topology, y, self.capacity, self.y)
        changed = not np.allclose(y, self.y)
        self.y = y
        self.solves += 1
        return changed

    def weights(self) -> dict[str, dict[int, np.ndarray]]:
        """``{endpoint: {source: row}}`` for every endpoint and every source with a root."""
        return {ep: {i: self.y[i].copy() for i in self.sources} for ep in self.endpoints}
