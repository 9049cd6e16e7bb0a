"""The control plane's central loops, pure: flow weights per (endpoint, source cell) and fleet state.

For endpoints routed natively by Envoy (flow mechanism, docs/design.md §2) no root service runs
the flow update, so the control plane does: one :class:`RootRouter` per (flow endpoint, source
cell) — the same object a root service would run — fed with the control plane's own probes of every
leaf, ticked every period; its ``x`` becomes that source's RDS ``weighted_clusters``.

The step size needs no per-source arrival rate: it is normalised by the fleet's total rate Λ̂,
which each router estimates from the probes it is fed (``Σ_j N_j/ℓ_j(N_j)``, core/flow.py), so a
control-plane router computes exactly the step a root service's router would, and the split Envoy
applies for a source is the split an in-process root in that cell would apply. ``throughput`` (the
leaves' ``completed`` counters over :data:`THROUGHPUT_WINDOW_S`) is only reported on ``/fleet``.

Also here: the fleet view the control plane publishes as DLB resources — each cell's latest model
and confidence, and aversion rates from :func:`update_aversion`. Aversion (the fleet's and every
router's) sees a cell's error EMA only while the leaf's error counter keeps rising
(:class:`RecentErrors`, as in a root service): fed the bare EMA it kept a recovered cell avoided for
~10 s after its errors stopped (issue 13).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from dlb.core.aversion import AversionConfig, RecentErrors, update_aversion
from dlb.core.latency_model import LatencyParams
from dlb.core.native_discrete import DEFAULT_PICK, PICKS, NativeWeights, cost_offset, router_weights
from dlb.core.router import Mechanism, PolicyConfig, RootRouter
from dlb.core.topology import Topology

#: Completions are counted over at least this long: over one probe gap (~50 ms) a steady 10/s read 0 or 20.
THROUGHPUT_WINDOW_S = 2.0


@dataclass(frozen=True)
class FlowEndpoint:
    name: str
    policy: PolicyConfig
    prior: LatencyParams
    cell_priors: Mapping[str, LatencyParams] = field(default_factory=dict)
    #: ``native-discrete``: a discrete router whose costs become the root Envoy's weights.
    native: bool = False
    #: ``native-discrete``'s ``pick``: the sharpness of its weights (:data:`dlb.core.native_discrete.PICKS`).
    native_pick: str = DEFAULT_PICK


@dataclass
class CellState:
    """The latest probe answer of one cell (``time`` is the control plane's receive time)."""

    rif: float = 0.0
    replicas: float = 0.0
    model: LatencyParams | None = None
    confidence: float = 0.0
    samples: int = 0
    error_rate: float = 0.0
    completed: float = math.nan
    time: float = -math.inf
    available: bool = False


@dataclass
class FlowController:
    topology: Topology
    endpoints: Sequence[FlowEndpoint]
    sources: Sequence[int]
    aversion_config: AversionConfig = field(default_factory=AversionConfig)
    seed: int = 0
    routers: dict[tuple[str, int], RootRouter] = field(init=False)
    cells: list[CellState] = field(init=False)
    aversion: np.ndarray = field(init=False)
    throughput: float = field(init=False, default=0.0)
    _last_step: float = field(init=False, default=math.nan)
    _last_aversion: float = field(init=False, default=-math.inf)
    _completed_prev: dict[int, tuple[float, float]] = field(init=False, default_factory=dict)
    _recent_errors: RecentErrors = field(init=False)

    def __post_init__(self) -> None:
        for ep in self.endpoints:
            if ep.policy.mechanism is not Mechanism.FLOW and not ep.native:
                raise ValueError(f"endpoint {ep.name} is neither a flow nor a native-discrete endpoint")
        rng = np.random.default_rng(self.seed)
        self.routers = {
            (ep.name, i): RootRouter(self.topology, i, ep.policy, ep.prior, np.random.default_rng(rng.integers(1 << 63)),
                                     cell_priors=[ep.cell_priors.get(c, ep.prior) for c in self.topology.names])
            for ep in self.endpoints
            for i in self.sources
        }
        self.cells = [CellState() for _ in range(self.topology.n)]
        self.aversion = np.zeros(self.topology.n)
        periods = [self.aversion_config.period_s] + [ep.policy.aversion.period_s for ep in self.endpoints]
        self._recent_errors = RecentErrors(self.topology.n, 2.0 * max(periods))

    def carry_over(self, old: FlowController) -> None:
        """Take over ``old``'s state for the cells, endpoints and sources both have (a config reload).

        Without it a reload restarts every native split from the replica split and pushes that to the
        root Envoys until the loop converges again, and forgets each cell's probes, models, aversion
        and the shares it would give back (:meth:`RootRouter.carry_over`).
        """
        old_names, new_names = old.topology.names, self.topology.names
        for (name, src), r in self.routers.items():
            prev = old.routers.get((name, old_names.index(new_names[src]))) if new_names[src] in old_names else None
            if prev is not None:
                r.carry_over(prev, old_names, new_names)
        for j, cell in enumerate(new_names):
            if cell not in old_names:
                continue
            o = old_names.index(cell)
            self.cells[j] = old.cells[o]
            self.aversion[j] = old.aversion[o]
            self._recent_errors.adopt(old._recent_errors, o, j)
            if o in old._completed_prev:
                self._completed_prev[j] = old._completed_prev[o]
        self._last_aversion = old._last_aversion
        self.throughput = old.throughput

    # -- probe results in ---------------------------------------------------------------------------
    def on_probe(self, cell: int, now: float, rif: float, replicas: float | None, model: LatencyParams | None,
                 confidence: float, samples: int, error_rate: float, completed: float, errors: int = 0) -> None:
        """One probe answer; ``errors`` is the leaf's monotone error counter, ``error_rate`` its EMA."""
        error_rate = self._recent_errors.observe(cell, errors, error_rate, now)
        st = self.cells[cell]
        st.rif, st.model, st.confidence, st.samples, st.error_rate = rif, model, confidence, samples, error_rate
        st.replicas = replicas or float(self.topology.replicas[cell])
        st.time, st.available = now, True
        prev = self._completed_prev.get(cell)
        if prev is None or completed < prev[0]:  # the first answer, or a restarted leaf's counter
            self._completed_prev[cell] = (completed, now)
        elif now - prev[1] >= THROUGHPUT_WINDOW_S:
            st.completed = (completed - prev[0]) / (now - prev[1])  # completions per second
            self._completed_prev[cell] = (completed, now)
        for r in self.routers.values():
            r.on_probe(cell, now, rif, model, error_rate, confidence, replicas)

    def on_probe_failure(self, cell: int) -> None:
        self.cells[cell].available = False
        self._completed_prev.pop(cell, None)
        for r in self.routers.values():
            r.set_available(cell, False)

    # -- periodic ------------------------------------------------------------------------------------
    def step(self, now: float) -> dict[str, dict[int, np.ndarray]]:
        """Advance every router to ``now``; return ``{endpoint: {source: x_source}}``."""
        self._last_step = now
        rates = [c.completed for c in self.cells if c.available and not math.isnan(c.completed)]
        self.throughput = float(sum(rates)) if rates else 0.0
        out: dict[str, dict[int, np.ndarray]] = {ep.name: {} for ep in self.endpoints if not ep.native}
        for (name, src), r in self.routers.items():
            r.tick(now)
            if name in out:
                out[name][src] = r.x.copy()
        if now - self._last_aversion >= self.aversion_config.period_s:
            active = np.array([c.available for c in self.cells])
            errors = np.array([c.error_rate for c in self.cells])
            self.aversion = update_aversion(self.aversion, errors, active, self.aversion_config)
            self._last_aversion = now
        return out

    def weights(self) -> Mapping[str, Mapping[int, np.ndarray]]:
        """The flow endpoints' splits ``{endpoint: {source: x}}`` (native-discrete ones have none)."""
        native = {ep.name for ep in self.endpoints if ep.native}
        out: dict[str, dict[int, np.ndarray]] = {}
        for (name, src), r in self.routers.items():
            if name not in native:
                out.setdefault(name, {})[src] = r.x.copy()
        return out

    def native_weights(self, now: float) -> dict[str, dict[int, NativeWeights]]:
        """``{endpoint: {source: weights}}`` of the native-discrete endpoints, from each router's costs now."""
        out: dict[str, dict[int, NativeWeights]] = {}
        for ep in self.endpoints:
            if not ep.native:
                continue
            offset, pick = cost_offset(ep.policy.cost), PICKS[ep.native_pick]
            for src in self.sources:
                out.setdefault(ep.name, {})[src] = router_weights(self.routers[(ep.name, src)], now, pick, offset)
        return out
