"""The operator baseline ``hub-score`` on the real data path, made Envoy-native by the control plane.

DESIGN §3: per request, the allowed cell with the best weighted score of pool-average queue depth, KV-cache
utilisation and RTT (0.4 / 0.4 / 0.2), signals as fresh as DLB's probes. Between two probes that pick
is the same cell for every request (the signals do not change), so it needs no per-request code:
the control plane keeps one :class:`~dlb.core.operator_baselines.HubScoreRoot` per source cell (the
simulator's object), feeds it each probe answer, and when a source's best cell changes it pushes a
fail-open route with all the weight on that cell (RDS). Envoy then sends every request there until
the next change: the same herding between probes the design describes, delayed by one xDS push.

Signals from the leaf's probe answer: queue = requests waiting in the servers' queues (scraped) per
healthy server — the leaf's RIF per healthy server when no server reports its queue; KV = the mean
scraped KV-cache usage (0 when unknown); a cell whose leaf does not answer or reports no healthy
server is no candidate. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dlb.core.operator_baselines import HubScoreRoot
from dlb.core.router import NO_CELL
from dlb.core.topology import Topology


@dataclass
class HubScoreLoop:
    topology: Topology
    endpoints: Sequence[str]
    sources: Sequence[int]
    roots: dict[int, HubScoreRoot] = field(init=False)

    def __post_init__(self) -> None:
        self.roots = {i: HubScoreRoot(self.topology, i) for i in self.sources}

    def best(self) -> dict[int, int]:
        """Source cell -> the cell its requests go to now (``NO_CELL``: none is usable)."""
        return {i: r.pick(0.0) for i, r in self.roots.items()}

    def on_probe(self, cell: int, rif: float, waiting: float, kv_usage: float, healthy: float | None) -> bool:
        """One leaf's answer; True when some source's best cell changed (push new routes)."""
        before = self.best()
        live = self.topology.replicas[cell] if healthy is None else healthy
        queue = (waiting if waiting >= 0 else rif) / max(live, 1.0)
        for r in self.roots.values():
            r.on_signals(cell, queue, max(kv_usage, 0.0), up=live > 0)
        return self.best() != before

    def on_probe_failure(self, cell: int) -> bool:
        before = self.best()
        for r in self.roots.values():
            r.on_signals(cell, 0.0, 0.0, up=False)
        return self.best() != before

    def weights(self) -> dict[str, dict[int, np.ndarray]]:
        """``{endpoint: {source: row}}``: all of a source's weight on its best cell; a source with no
        usable cell keeps Rand's replica split (Envoy's route must name some cluster)."""
        rows = {}
        for i, j in self.best().items():
            if j == NO_CELL:
                w = np.where(self.topology.allowed[i], self.topology.replicas, 0.0)
                rows[i] = w / w.sum()
            else:
                rows[i] = np.eye(self.topology.n)[j]
        return {ep: {i: r.copy() for i, r in rows.items()} for ep in self.endpoints}
