"""The root router's decision logic: one object per (endpoint, source cell).

This is the single implementation shared by the root ext_proc service (real time) and the simulator
(simulated time): it holds the cached probe state and turns it into a destination cell per request.
It never does I/O and never reads a clock; callers pass ``now``.

Discrete: ``argmin_j c_ij`` over usable cells on the root's own view — the last probe's RIF plus the
requests this root has sent to the cell that the probe could not have seen yet (without that
correction every request between two probes herds onto the same cell). A probe answered by the leaf
at ``t − τ_ji`` counts the requests sent up to ``t − 2τ``; those sent later are still on the wire
or arrived after the answer, so they stay counted until a probe that could have seen them (the
correction used to reset on every probe and forgot them). Flow: sample from ``x_i`` (or draw two cells
from it and take the cheaper now: ``FlowConfig.pick``), which :meth:`tick` moves by
projected gradient descent every period (see :mod:`dlb.core.flow`); in its cold start
(``FlowConfig.warmup_s``) the picks are discrete and ``x`` follows their split.

Both honour error aversion (skip cell j with probability ``a_j``, then choose among the rest) and
conditional session affinity (stay while the session cell's expected latency minus the prefix
saving is no worse than the best alternative's; else move to that alternative).
"""

from __future__ import annotations

import bisect
import enum
import itertools
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from dlb.core.affinity import AffinityCache, AffinityConfig
from dlb.core.aversion import AversionConfig, cap_to_headroom, fold_into_split, update_aversion
from dlb.core.background import capacity_floor
from dlb.core.costs import Cost, ModelTable, cost_vector, offered_inflation
from dlb.core.flow import (
    FlowConfig,
    adapt_gain,
    feedback_delay,
    fleet_rate,
    flow_step,
    lead_horizon,
    saturation_workload,
    workload_at_rate,
)
from dlb.core.grad_floor import GradFloorConfig, ModelSpread
from dlb.core.latency_model import (
    GRAD_EPS,
    GRAD_MAX_RHO,
    LatencyParams,
    d_latency,
    d_service_rate,
    latency,
    latency_at,
    service_rate,
)
from dlb.core.shedding import ShedConfig, should_shed
from dlb.core.slowed_share import SlowedShares
from dlb.core.topology import Topology

NO_CELL = -1
#: A pick that refuses on purpose (shedding: every allowed cell saturated); the simulator counts it
#: apart from NO_CELL (no usable cell) and from overflow errors at the servers.
SHED = -2


class Router(Protocol):
    """What every root policy offers, declared where it is used (the simulator, the theory model and
    the root service drive :class:`RootRouter`, :class:`~dlb.core.baselines.WeightedRouter` and the
    simulator's Rand through exactly this). Time is always passed in; none of them reads a clock."""

    def pick(self, now: float, session: str | None = None) -> int:
        """The destination cell for one request arriving at ``now`` (``session``: affinity key)."""
        ...

    def on_probe(self, cell: int, now: float, rif: float, params: LatencyParams | None = None, error_rate: float = 0.0,
                 confidence: float = 1.0, replicas: float | None = None, seen_until: float | None = None,
                 capacity: float | None = None) -> None:
        """A probe answer from ``cell``'s leaf, received at ``now`` (``seen_until``, ``capacity``: see RootRouter.on_probe)."""
        ...

    def tick(self, now: float) -> None:
        """Periodic control (flow step, aversion update); cheap when nothing is due."""
        ...


#: The policy names of the paper, one per (mechanism, cost). :attr:`PolicyConfig.name` and
#: :meth:`PolicyConfig.from_name` both read this table.
POLICY_NAMES: dict[tuple[Mechanism, Cost], str] = {}

#: The flow cold start's default length by cost (others: 0, off); research/compare-stress/coldstart-grad.md.
DEFAULT_WARMUP_S: dict[Cost, float] = {Cost.GRADIENT: 20.0}


class Mechanism(str, enum.Enum):
    DISCRETE = "discrete"
    FLOW = "flow"


@dataclass(frozen=True)
class PolicyConfig:
    """An endpoint's routing policy: mechanism × cost, plus aversion and affinity."""

    mechanism: Mechanism = Mechanism.DISCRETE
    cost: Cost = Cost.LATENCY
    flow: FlowConfig = field(default_factory=FlowConfig)
    aversion: AversionConfig = field(default_factory=AversionConfig)
    affinity: AffinityConfig = field(default_factory=AffinityConfig)
    shed: ShedConfig = field(default_factory=ShedConfig)
    #: The gradient cost's floor on ``1 − ρ`` from the spread of each cell's recent models (off by default).
    grad_floor: GradFloorConfig = field(default_factory=GradFloorConfig)
    #: Probe state older than this makes a cell unusable (the leaf may be gone).
    stale_after_s: float = 1.0
    #: Time constant of the EMA of this root's own arrival rate (reported; the flow step does not use it).
    rate_tau_s: float = 5.0

    @property
    def name(self) -> str:
        return POLICY_NAMES[(self.mechanism, self.cost)]

    @property
    def warmup_s(self) -> float:
        """The flow cold start's length: ``flow.warmup_s``, or the cost's default when that is None.
        Resolved here, where the cost is known, so the simulator and the roots (whose policy arrives
        over xDS without it) get the same default from the same object."""
        w = self.flow.warmup_s
        return DEFAULT_WARMUP_S.get(self.cost, 0.0) if w is None else w

    @staticmethod
    def from_name(name: str) -> PolicyConfig:
        """The policy called ``name`` (``Flow-Grad``, ...) with the core's defaults otherwise."""
        for (mechanism, cost), known in POLICY_NAMES.items():
            if known == name:
                return PolicyConfig(mechanism=mechanism, cost=cost)
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES.values())}")


POLICY_NAMES.update({(m, c): f"{mn}-{cn}" for m, mn in ((Mechanism.DISCRETE, "Disc"), (Mechanism.FLOW, "Flow"))
                     for c, cn in ((Cost.RIF, "RIF"), (Cost.LATENCY, "Lat"), (Cost.GRADIENT, "Grad"))})


@dataclass
class CellView:
    """What a root knows about every cell, as arrays indexed by cell."""

    rif: np.ndarray
    sent: np.ndarray
    last_probe: np.ndarray
    error_rate: np.ndarray
    confidence: np.ndarray
    available: np.ndarray
    #: Requests the cell admits before its leaf rejects (NaN: not reported), :mod:`dlb.core.shedding`.
    capacity: np.ndarray

    @classmethod
    def empty(cls, n: int) -> CellView:
        return cls(np.zeros(n), np.zeros(n), np.full(n, -math.inf), np.zeros(n), np.zeros(n), np.ones(n, bool), np.full(n, math.nan))


class RootRouter:
    """Decision state of one root for one endpoint."""

    def __init__(
        self,
        topology: Topology,
        source: int,
        policy: PolicyConfig,
        prior: LatencyParams,
        rng: np.random.Generator | None = None,
        cell_priors: Sequence[LatencyParams] | None = None,
    ) -> None:
        self.topology = topology
        self.source = source
        self.policy = policy
        self.rng = rng if rng is not None else np.random.default_rng()
        n = topology.n
        self.allowed = topology.allowed[source].copy()
        self.rtt = 2.0 * topology.tau[source]
        # A private copy: probes update it when a cell's serving replica count changes (outages).
        self.replicas = topology.replicas.copy()
        # One prior per cell when the config gives cells their own (a known-slower region), else the endpoint's.
        self.priors: tuple[LatencyParams, ...] = tuple(cell_priors) if cell_priors is not None else (prior,) * n
        self.models = ModelTable.from_params(list(self.priors))
        # The gradient cost's per-cell floor on 1 − ρ, from the spread of the models each cell published.
        self._spread: ModelSpread | None = None
        if policy.grad_floor.enabled and (policy.cost is Cost.GRADIENT or policy.flow.relaxation_delay):
            self._spread = ModelSpread(n, policy.grad_floor)
            m = self.models
            self.models = ModelTable(m.a, m.b, m.c, m.s, np.full(n, policy.grad_floor.max_floor))
        self.view = CellView.empty(n)
        # Per cell: (send time, amount) of this root's sends no probe has seen yet; view.sent is their sum.
        self._unseen: list[deque[tuple[float, float]]] = [deque() for _ in range(n)]
        self.aversion = np.zeros(n)
        # Per cell: offered ÷ admitted workload, 1/(1 − error rate) (see :func:`offered_inflation`).
        self._inflate = np.ones(n)
        # Flow state: start from the replica-weighted split over allowed cells (Rand's split).
        w = np.where(self.allowed, self.replicas, 0.0)
        self._x = w / w.sum()
        # Per-request caches (see "per request" below): plain Python lists, rebuilt lazily when the
        # state they derive from changes, so a decision touches no numpy array on the common path.
        self._allowed_idx = [int(j) for j in np.flatnonzero(self.allowed)]
        self._costs: list[float] | None = None  # discrete: cost per cell at rif + sent
        self._usable: list[int] | None = None  # usable cells, valid until _usable_until
        self._usable_set: frozenset[int] = frozenset()
        self._usable_until = -math.inf
        self._cum: list[float] | None = None  # flow: cumulative x over the usable cells
        self._cum_idx: list[int] = []
        self._credit = [0.0] * self.topology.n  # flow with smooth_split: each cell's round-robin credit
        self._xl: list[float] | None = None  # flow: x as a list, for the per-request picks
        self._aversion_on = False
        # Per-request draws use Python's generator (numpy's scalar draws cost µs each), seeded from
        # ``rng`` so a seeded router stays deterministic.
        self._rand = random.Random(int(self.rng.integers(1 << 62)))
        self._last_flow = -math.inf
        # Flow: the usable mask of the last flow step, and the share each cell held when it last left it
        # (0: none kept); a cell that comes back starts from that share (:meth:`_rejoin`).
        self._flow_mask: np.ndarray | None = None
        self._x_left = np.zeros(n)
        # Flow: the share a cell held before its model slowed, given back when it recovers (:meth:`_restore`).
        slowed = policy.flow.slowed_share
        self.slowed_shares = SlowedShares(n, slowed) if policy.mechanism is Mechanism.FLOW and slowed.enabled else None
        # Per-cell step multipliers of the flow loop and the sign of each cell's last move (see
        # FlowConfig.adaptive_gain).
        self._gain = np.ones(n)
        self._last_dir = np.zeros(n)
        # Flow: the workload each cell had at the last step and its smoothed rate of change.
        self._n_prev: np.ndarray | None = None
        self._n_rate = np.zeros(n)
        self._last_aversion = -math.inf
        # Flow cold start (FlowConfig.warmup_s): when it ends (NaN: not started, -inf: handed over), the
        # discrete picks of this flow period, and whether this router routes requests itself (a control
        # plane's router never picks: Envoy applies its split).
        self._warm_until = math.nan
        self._warm_picks = np.zeros(n)
        self._routes_own = False
        self._last_tick = math.nan
        self._arrivals = 0.0
        self.rate = 0.0
        self.affinity = AffinityCache(policy.affinity.max_sessions, policy.affinity.ttl_s) if policy.affinity.enabled else None

    # -- state in ---------------------------------------------------------------------------------
    def on_probe(
        self,
        cell: int,
        now: float,
        rif: float,
        params: LatencyParams | None = None,
        error_rate: float = 0.0,
        confidence: float = 1.0,
        replicas: float | None = None,
        seen_until: float | None = None,
        capacity: float | None = None,
    ) -> None:
        """A probe answer from ``cell``'s leaf, as of ``now`` (the caller's receive time).

        ``capacity``: requests the cell admits before its leaf rejects (None: not reported, never shed on).
        ``replicas``: the leaf's current count of serving replicas, when it reports one; the RIF
        cost ``N_j/k_j`` must use the live count or it keeps loading a cell that lost servers. A
        reported 0 (every server down) makes the cell unusable until a probe reports one back: its
        leaf answers, but each request sent there would fail (``None`` = not reported, not zero).
        ``seen_until``: the latest send time of this root's requests that the answer's RIF includes
        (the probe's own send time, when the caller knows it); default ``now − 2τ_ij``.
        ``confidence`` 0 means the leaf has measured nothing (its configured prior: a restarted leaf):
        such a model does not replace one learned with confidence > 0 — a latency-cost root whose other
        cells look faster than the prior would never send there again to learn it back (issue 13: a
        restarted leaf's cell received 1 request in 65 s). Here, not in the service, so the simulator's
        roots and the control plane's flow loop follow the rule the real roots do.
        """
        v = self.view
        if params is not None and confidence <= 0.0 < v.confidence[cell]:
            params, confidence = None, float(v.confidence[cell])
        serving = replicas is None or replicas > 0
        if replicas is not None and replicas > 0:
            self.replicas[cell] = replicas
        v.rif[cell] = max(0.0, rif)
        cutoff = now - float(self.rtt[cell]) if seen_until is None else seen_until
        unseen = self._unseen[cell]
        while unseen and unseen[0][0] <= cutoff:
            unseen.popleft()
        v.sent[cell] = sum(amount for _, amount in unseen) if unseen else 0.0
        v.last_probe[cell] = now
        v.capacity[cell] = math.nan if capacity is None else capacity
        v.error_rate[cell] = min(max(error_rate, 0.0), 1.0)
        self._inflate[cell] = offered_inflation(float(v.error_rate[cell]))
        v.confidence[cell] = confidence
        if bool(v.available[cell]) != serving:
            self._usable = None
        v.available[cell] = serving
        if params is not None:
            m = self.models
            m.a[cell], m.b[cell], m.c[cell], m.s[cell] = params.a, params.b, params.c, params.s
        if self._spread is not None:
            self._update_floor(cell, now)
        if self._costs is not None:
            self._costs[cell] = self._cost_one(cell)
        if serving and cell not in self._usable_set:
            self._usable = None  # a cell (re)joined; otherwise its deadline only moved later

    def book(self, cell: int, now: float, amount: float = 1.0) -> None:
        """Count ``amount`` requests sent to ``cell`` at ``now`` until a probe can have seen them.

        :meth:`pick` books its own requests; the fluid model of :mod:`dlb.theory.fluid` books
        fractional masses.
        """
        self._unseen[cell].append((now, amount))
        self.view.sent[cell] += amount
        if self._costs is not None:
            self._costs[cell] = self._cost_one(cell)

    def adopt_unseen(self, other: RootRouter, cell: int, other_cell: int) -> None:
        """Take over ``other``'s sends to ``other_cell`` that no probe has seen yet, as ``cell``.

        A reconfiguration builds a new router; copying only the summed ``view.sent`` would leave the
        queue behind it empty, so the next probe would reset the correction to zero and forget the
        requests still on the wire (once per reconfiguration).
        """
        self._unseen[cell] = deque(other._unseen[other_cell])
        self.view.sent[cell] = sum(amount for _, amount in self._unseen[cell])
        if self._costs is not None:
            self._costs[cell] = self._cost_one(cell)

    def adopt_warmup(self, other: RootRouter) -> None:
        """Take over ``other``'s cold-start state (a reconfiguration must not start the warm-up again)."""
        self._warm_until = other._warm_until
        self._routes_own = other._routes_own

    def carry_over(self, old: RootRouter, old_names: Sequence[str], new_names: Sequence[str]) -> None:
        """Take over ``old``'s state of the cells present in both topologies (a reconfiguration).

        A config change builds new routers; without this each would start from the replica split with
        no probe state, models or memory, and route like Rand until it relearned (the root service and
        the control plane's flow loop both rebuild on every reload).
        """
        pairs = [(old_names.index(n), j) for j, n in enumerate(new_names) if n in old_names]
        if not pairs:
            return
        oi = np.array([p[0] for p in pairs])
        ni = np.array([p[1] for p in pairs])
        ov, nv = old.view, self.view
        for attr in ("rif", "last_probe", "error_rate", "confidence", "available", "capacity"):
            getattr(nv, attr)[ni] = getattr(ov, attr)[oi]
        for o, j in pairs:  # the sends no probe has seen yet, not just their sum (view.sent)
            self.adopt_unseen(old, j, o)
        for attr in ("a", "b", "c", "s"):
            getattr(self.models, attr)[ni] = getattr(old.models, attr)[oi]
        for o, j in pairs:
            if old.priors[o] != self.priors[j]:
                # The operator changed this cell's prior: start from it, not from the curve learned before,
                # so the leaf's next model (measured, or the new prior) is taken (a stranger's reloaded prior
                # changed nothing: the learned curve, confidence > 0, outranked every later prior).
                p = self.priors[j]
                self.models.a[j], self.models.b[j], self.models.c[j], self.models.s[j] = p.a, p.b, p.c, p.s
                nv.confidence[j] = 0.0
        self.aversion[ni] = old.aversion[oi]
        self._inflate[ni] = old._inflate[oi]
        self.adopt_warmup(old)
        if self.slowed_shares is not None and old.slowed_shares is not None:
            self.slowed_shares.adopt(old.slowed_shares, pairs)
        self.replicas[ni] = old.replicas[oi]
        if self.policy.mechanism is Mechanism.FLOW and old.policy.mechanism is Mechanism.FLOW:
            x = np.zeros_like(self.x)
            x[ni] = old.x[oi]
            x = np.where(self.allowed, x, 0.0)
            if x.sum() > 0:
                self.x = x / x.sum()
            # The share a cell held when it became unusable: it gets it back when it returns (_rejoin).
            self._x_left[ni] = np.where(self.allowed[ni], old._x_left[oi], 0.0)
            if old._flow_mask is not None:
                mask = np.zeros(self.topology.n, dtype=bool)
                mask[ni] = old._flow_mask[oi]
                self._flow_mask = mask
            self._gain[ni], self._last_dir[ni] = old._gain[oi], old._last_dir[oi]
        self.rate = old.rate
        self.invalidate()  # the arrays above were written directly

    def warming(self, now: float) -> bool:
        """True while the flow cold start routes this router's requests like the discrete policy."""
        return self._routes_own and now < self._warm_until

    def set_available(self, cell: int, available: bool) -> None:
        """The probe client's verdict (e.g. consecutive probe failures, leaf removed)."""
        self.view.available[cell] = available
        self._usable = None

    def set_model(self, cell: int, params: LatencyParams) -> None:
        """Replace one cell's latency model (e.g. the control plane's, for a cell without a local fit;
        the cell's next probe records it for the gradient floor)."""
        m = self.models
        m.a[cell], m.b[cell], m.c[cell], m.s[cell] = params.a, params.b, params.c, params.s
        if self._costs is not None:
            self._costs[cell] = self._cost_one(cell)

    def _update_floor(self, cell: int, now: float) -> None:
        """Record the model ``cell`` uses at ``now`` and re-derive its floor on ``1 − ρ`` at its workload.

        Called on every probe, with or without a new model, so a model that stops changing (an exact
        one, a settled fit) is seen to stay in use and reaches the low floor.
        """
        m = self.models
        if self._spread is None or m.floor is None:
            return
        a, b, c, s = float(m.a[cell]), float(m.b[cell]), float(m.c[cell]), float(m.s[cell])
        self._spread.observe(cell, now, a, b, c, s)
        n = float(self.view.rif[cell] + self.view.sent[cell]) * float(self._inflate[cell])
        m.floor[cell] = self._spread.floor(cell, n)

    def invalidate(self) -> None:
        """Drop the per-request caches after writing the state arrays directly (bulk updates)."""
        self._costs = None
        self._usable = None
        self._cum = None
        self._xl = None

    @property
    def x(self) -> np.ndarray:
        """Flow routing vector on the allowed simplex."""
        return self._x

    @x.setter
    def x(self, value: np.ndarray) -> None:
        self._x = np.asarray(value, dtype=float)
        self._cum = None
        self._xl = None

    @property
    def probed(self) -> bool:
        """True once any probe answer arrived (warm start over: see :meth:`pick`)."""
        return bool(np.isfinite(self.view.last_probe).any())

    def usable(self, now: float) -> np.ndarray:
        v = self.view
        return self.allowed & v.available & (now - v.last_probe <= self.policy.stale_after_s)

    def fallback_candidates(self) -> list[int]:
        """Cells a refused or failed request may be retried on when no other cell is usable
        (:func:`dlb.core.fallback.next_best`'s ``allowed``): allowed ones whose last probe answer did not
        say every server is down. A stale cell may only be late, a cell with no server is not: a leaf's
        429 retried there came back to its client as that cell's 503."""
        return [int(j) for j in np.flatnonzero(self.allowed & self.view.available)]

    def note_arrivals(self, count: float) -> None:
        """Count arrivals this router did not route through :meth:`pick` (for the rate EMA of :meth:`tick`).

        For callers that apply ``x`` themselves — a data plane sampling the flow split natively, or the
        fluid model of :mod:`dlb.theory.fluid`, whose arrivals are fractional.
        """
        self._arrivals += count

    # -- periodic control ---------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        """Run the periodic loops that are due: arrival-rate EMA, flow step, aversion update."""
        if math.isnan(self._last_tick):
            self._last_tick = now
        dt = now - self._last_tick
        if dt > 0:
            alpha = 1.0 - math.exp(-dt / self.policy.rate_tau_s)
            self.rate += alpha * (self._arrivals / dt - self.rate)
            self._arrivals = 0
            self._last_tick = now
        # Ticks come with every probe round; the loops below are due far less often, and only they read
        # the usable mask (three array operations), so it is computed only for them.
        flow_due = self.policy.mechanism is Mechanism.FLOW and now - self._last_flow >= self.policy.flow.period_s
        aversion_due = now - self._last_aversion >= self.policy.aversion.period_s
        if not (flow_due or aversion_due):
            return
        usable = self.usable(now)
        if math.isnan(self._warm_until) and self.policy.warmup_s > 0 and flow_due and usable.any():
            self._warm_until = now + self.policy.warmup_s  # the cold start begins with the first fresh probe
        if aversion_due:
            self._update_aversion(usable, now)
            self._last_aversion = now
        if flow_due:
            step_dt = self.policy.flow.period_s if math.isinf(self._last_flow) else now - self._last_flow
            self._last_flow = now
            if usable.any():
                self._flow_update(usable, min(step_dt, 10 * self.policy.flow.period_s), now)

    def _update_aversion(self, usable: np.ndarray, now: float) -> None:
        """One aversion period: raise/decay the rates, cap them at what the other cells can take, and
        under flow routing fold them into ``x`` instead of skipping cells per request (in the cold start,
        whose picks are discrete, skip as the discrete policy does).

        Skipping per request under flow routing let the integrator wind up: the diverted load lowered
        the averted cell's cost, the flow step raised its share, and when the error average decayed the
        wound-up share overloaded the cell again (per-cell load swung 0.17–1.55 × capacity in 10-s bins).
        Folded in, ``x`` is the split actually served, so the flow step starts from reality.
        """
        av = self.policy.aversion
        errors = self.view.error_rate
        rates = update_aversion(self.aversion, errors, usable, av)
        if rates.any() and usable.any():
            m = self.models
            n = self.view.rif * self._inflate
            inflow = np.where(usable, service_rate(n, m.a, m.b, m.c, m.s), 0.0)
            healthy = usable & (errors <= float(errors[usable].min()) + av.margin)
            spare = np.where(healthy, np.maximum(av.headroom_rho / m.b - inflow, 0.0), 0.0)
            rates = cap_to_headroom(rates, inflow, float(spare.sum()))
        self.aversion = rates
        if self.policy.mechanism is Mechanism.FLOW and not self.warming(now):
            self._aversion_on = False
            if rates.any():
                self.x = fold_into_split(self.x, rates, usable)
        else:
            self._aversion_on = bool(rates.any())

    def _follow_picks(self, usable: np.ndarray, dt: float) -> None:
        """Cold start: move ``x`` towards the split of this period's discrete picks (EMA over
        ``warmup_smoothing_s``), so the flow loop starts where the costs sent the requests."""
        picks = self._warm_picks
        total = float(picks.sum())
        if total <= 0:
            return
        alpha = min(1.0, dt / self.policy.flow.warmup_smoothing_s)
        x = np.where(usable, self.x + alpha * (picks / total - self.x), 0.0)
        picks[:] = 0.0
        if x.sum() > 0:
            self.x = x / x.sum()

    def _rejoin(self, usable: np.ndarray) -> None:
        """Keep the share of a cell that leaves the usable set, and give it back when the cell returns.

        Why: the step projects ``x`` onto the usable cells, so a cell that is unusable for one step (a dead
        leaf agent or Envoy, a few late probes) drops to 0, and the gradient step brings it back only at the
        pace sized for stability near the fixed point: in ``dlb bench faults`` (Flow-Grad, 25-s outages on
        a quiet box) cell ``a`` was not back to 80 % of its pre-fault share 15 s after the restore in 11 of
        12 runs where it became unusable, and at once in every run where it stayed usable. The share it
        held is the loop's last estimate of the equilibrium with the cell in it; from there the step
        corrects whatever changed. The other cells give up that share in proportion to theirs.
        """
        prev, self._flow_mask = self._flow_mask, usable.copy()
        if prev is None:
            return
        left = prev & ~usable
        self._x_left[left] = self._x[left]
        back = usable & ~prev & (self._x_left > 0)
        if not back.any():
            return
        self._give_back(usable, back, self._x_left)
        self._x_left[back] = 0.0

    def _restore(self, usable: np.ndarray, now: float) -> None:
        """Give a cell whose model recovered from a slowdown the share it held before (:mod:`dlb.core.slowed_share`)."""
        memory = self.slowed_shares
        if memory is None:
            return
        m = self.models
        with np.errstate(divide="ignore", invalid="ignore"):  # a cell with no model yet has no capacity
            cap = np.asarray(capacity_floor(self.replicas, m.a, m.b))
        shares = memory.observe(now, self._x, cap, usable & (self.view.confidence > 0))
        if shares is None:
            return
        back = usable & (shares > self._x)
        if back.any():
            self._give_back(usable, back, shares)

    def _give_back(self, usable: np.ndarray, back: np.ndarray, shares: np.ndarray) -> None:
        """Set the cells ``back`` to ``shares``; the other usable cells give that up in proportion to theirs."""
        give = min(float(shares[back].sum()), 1.0)
        rest = usable & ~back
        x = np.where(usable, self._x, 0.0)
        x[back] = 0.0
        if x[rest].sum() > 0:
            x[rest] *= (1.0 - give) / x[rest].sum()
        x[back] = shares[back]
        self.x = x / x.sum()

    def _flow_update(self, usable: np.ndarray, dt: float, now: float) -> None:
        self._rejoin(usable)
        self._restore(usable, now)
        n_obs = self.view.rif * self._inflate
        cfg = self.policy.flow
        if cfg.lead_s > 0:
            if self._n_prev is not None:
                alpha = min(1.0, dt / cfg.lead_smoothing_s)
                trend = (n_obs - self._n_prev) / dt
                self._n_rate = np.where(np.isfinite(trend), self._n_rate + alpha * (trend - self._n_rate), 0.0)
            self._n_prev = n_obs.copy()
            m = self.models
            # The trend runs on for at most the cell's own relaxation time 1/μ'(N): a lightly loaded
            # cell settles within about one latency, and a longer lead would only slow the step.
            dmu = np.maximum(d_service_rate(n_obs, m.a, m.b, m.c, m.s), 1e-9)
            # τ̄ sizes the lag-aware lead only (FlowConfig.lead_gain); the default lead does not read it.
            tau = feedback_delay(self.rtt, usable, cfg.period_s, 0.0, cfg.min_delay_s) if cfg.lead_gain > 0 else 0.0
            n_cost = np.maximum(n_obs + lead_horizon(1.0 / dmu, tau, cfg) * self._n_rate, 0.0)
        else:
            n_cost = n_obs
        if self._routes_own and not math.isnan(self._warm_until) and self._warm_until > -math.inf:
            if now < self._warm_until:
                self._follow_picks(usable, dt)
                return
            # Hand over: from here on the picks sample x, and aversion folds into it again.
            self._warm_until = -math.inf
            self._costs = None
            self._aversion_on = False
        costs = cost_vector(self.policy.cost, n_cost, self.replicas, self.models, self.rtt)
        m = self.models
        in_use = usable & (self.x > 0)
        if not in_use.any():
            in_use = usable
        lam = fleet_rate(n_obs[usable], m.a[usable], m.b[usable], m.c[usable], m.s[usable], cfg.min_rate_fraction)
        g, relax = self._g_scale(n_obs, usable, in_use, lam)
        # τ̄: the feedback delay (plus the slowest in-use cell's queue relaxation time if configured; flow.py).
        delay = feedback_delay(self.rtt, usable, cfg.period_s, relax, cfg.min_delay_s)
        if not cfg.adaptive_gain:
            self.x = flow_step(self.x, costs, usable, dt, delay, lam * g, cfg)
            return
        old = self.x
        self.x = flow_step(old, costs, usable, dt, delay, lam * g / self._gain, cfg)
        self._gain, self._last_dir = adapt_gain(self._gain, self._last_dir, self.x - old, usable, cfg)

    def _g_scale(self, n_obs: np.ndarray, usable: np.ndarray, in_use: np.ndarray,
                 fleet: float) -> tuple[float | np.ndarray, float]:
        """g_j = |c_j'(N)|/μ_j'(N) at N clipped to [N_ref, N_sat], per usable cell (flow.py), and the
        largest relaxation time 1/μ_j'(N) (at most ℓ/(1 − GRAD_MAX_RHO)) of the calm cells in use (0 unless
        FlowConfig.relaxation_delay).

        An overloaded cell (N past saturation) has no equilibrium to stabilise, and its g(N_sat)
        (∝ (1 − ρ)⁻³ for the gradient cost) would shrink the very step that empties it: it takes the
        mean g of the calm cells in use instead. With ``per_cell_scale`` off: one number, the mean over
        the calm cells in use (the rule before per-cell scaling; research/theory.md).
        """
        m = self.models
        cfg = self.policy.flow
        a, b, c, s = m.a[usable], m.b[usable], m.c[usable], m.s[usable]
        # The reference load is never above what the cell would hold with the whole fleet's rate Λ̂: no
        # reachable state of the cell is busier, so the gain there bounds every one it can reach.
        n_ref = np.minimum(saturation_workload(a, b, c, s, cfg.ref_utilisation), workload_at_rate(fleet, a, b, c, s))
        n_sat = saturation_workload(a, b, c, s, cfg.saturation)
        nn = np.minimum(np.maximum(n_obs[usable], n_ref), np.maximum(n_sat, n_ref))
        dmu = np.maximum(d_service_rate(nn, a, b, c, s), 1e-9)
        cost = self.policy.cost
        if cost is Cost.RIF:
            dc = 1.0 / self.replicas[usable]
        elif cost is Cost.LATENCY:
            dc = d_latency(nn, a, b, c, s)
        else:
            eps = np.maximum(1e-3, 1e-3 * nn)
            zero = np.zeros_like(nn)
            sub = ModelTable(a, b, c, s, None if m.floor is None else m.floor[usable])
            up = cost_vector(cost, nn + eps, self.replicas[usable], sub, zero)
            down = cost_vector(cost, np.maximum(nn - eps, 0), self.replicas[usable], sub, zero)
            dc = (up - down) / (nn + eps - np.maximum(nn - eps, 0))
        g_usable = np.abs(dc) / dmu
        g = np.ones(len(usable))
        g[usable] = g_usable
        over = np.zeros(len(usable), bool)
        over[usable] = n_obs[usable] > np.maximum(n_sat, n_ref)
        calm = in_use & ~over
        ref = calm if calm.any() else in_use
        mean_g = float(g[ref].mean())
        slowest = 0.0
        if cfg.relaxation_delay:  # off by default: no work on every step for a term nobody adds
            relax = np.zeros(len(usable))
            floor = (1.0 - GRAD_MAX_RHO) if m.floor is None else m.floor[usable]
            relax[usable] = np.minimum(1.0 / dmu, latency(nn, a, b, c, s) / floor)
            slowest = float(relax[ref].max())
        if not cfg.per_cell_scale:
            return mean_g, slowest
        g[over] = mean_g
        return g, slowest

    # -- per request --------------------------------------------------------------------------------
    # The decision path runs once per request on the root's event loop, so it avoids numpy (whose
    # per-call overhead dominates on arrays of a few cells): usable cells, discrete costs and the
    # flow CDF are Python lists kept current incrementally — a probe updates one cell's cost, a
    # pick updates the chosen cell's cost — and rebuilt only when what they derive from changes.
    def workload(self) -> np.ndarray:
        """N_j a discrete decision would use now: probe RIF + this root's unseen sends, × offered inflation."""
        return (self.view.rif + self.view.sent) * self._inflate

    def costs(self, now: float) -> np.ndarray:
        """The cost vector a discrete decision would use now (probe RIF + local correction)."""
        return cost_vector(self.policy.cost, self.workload(), self.replicas, self.models, self.rtt)

    def _cost_one(self, j: int) -> float:
        """c_ij at N_j = probe RIF + sent since the probe; scalar twin of :func:`cost_vector`."""
        n = float(self.view.rif[j] + self.view.sent[j]) * float(self._inflate[j])
        cost = self.policy.cost
        if cost is Cost.RIF:
            return n / float(self.replicas[j])
        m = self.models
        a, b, c, s = float(m.a[j]), float(m.b[j]), float(m.c[j]), float(m.s[j])
        ell = latency_at(n, a, b, c, s)
        if cost is Cost.LATENCY:
            return ell + float(self.rtt[j])
        z = (n - c) / s
        sig = 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))
        floor = (1.0 - GRAD_MAX_RHO) if m.floor is None else float(m.floor[j])
        return ell * ell / max(ell - n * b * sig, floor * ell, GRAD_EPS) + float(self.rtt[j])

    def _usable_now(self, now: float) -> list[int]:
        if self._usable is None or now > self._usable_until:
            v = self.view
            stale = self.policy.stale_after_s
            idx = [j for j in self._allowed_idx if v.available[j] and now - v.last_probe[j] <= stale]
            self._usable = idx
            self._usable_set = frozenset(idx)
            self._usable_until = min((float(v.last_probe[j]) + stale for j in idx), default=math.inf)
            self._cum = None
        return self._usable

    def unprobed(self) -> list[int]:
        """Before any probe answer (a root that just started): the allowed cells not known dead."""
        if self.probed:
            return []
        v = self.view
        return [j for j in self._allowed_idx if v.available[j]]

    def pick(self, now: float, session: str | None = None) -> int:
        """Destination cell for one request, ``NO_CELL`` when no cell is usable, or ``SHED`` when every
        usable cell is saturated (:mod:`dlb.core.shedding`; a shed counts as an arrival, not a send).

        Warm start: until the first probe answer, the cells not known dead (failed probes) are
        sampled by the flow vector (the control plane's last weights, else the replica split), so a
        restarted root routes from its first request instead of answering 503 until its probes come
        back (measured: 2–5 s of 503s). From the first answer on, only fresh cells are used.
        """
        usable = self._usable_now(now)
        if not usable:
            warm = self.unprobed()
            if not warm:
                return NO_CELL
            self._arrivals += 1
            self._routes_own = True
            cell = self._sample(warm, [])
            self.book(cell, now)
            return cell
        self._arrivals += 1
        if should_shed(usable, self.view, now, self.policy.shed, self.models, self.rtt):
            return SHED
        discrete = self.policy.mechanism is Mechanism.DISCRETE
        if not discrete:
            self._routes_own = True
            discrete = now < self._warm_until  # the flow cold start (FlowConfig.warmup_s)
        cand = usable
        if self._aversion_on:
            rand = self._rand.random
            av = self.aversion
            kept = [j for j in usable if rand() >= av[j]]
            if kept:
                cand = kept
        if discrete:
            cell = self._argmin(self._cost_list(), cand)
        elif self.policy.flow.pick == "two-choice":
            cell = self._sample(cand, usable)
            other = self._sample(cand, usable)
            if other != cell:
                costs = self._cost_list()
                if costs[other] < costs[cell]:
                    cell = other
        else:
            cell = self._sample(cand, usable)
        if self.affinity is not None and session is not None:
            cell = self._affine(session, cell, cand, now)
        self.book(cell, now)
        if discrete and self._routes_own:
            self._warm_picks[cell] += 1.0
        return cell

    def _cost_list(self) -> list[float]:
        """Every cell's cost at this root's view now (kept current by probes and :meth:`book` once built)."""
        costs = self._costs
        if costs is None:
            costs = self._costs = [self._cost_one(j) for j in range(self.topology.n)]
        return costs

    def _argmin(self, costs: list[float], cand: list[int]) -> int:
        best = min(costs[j] for j in cand)
        tol = 1e-12 * max(1.0, abs(best))
        ties = [j for j in cand if costs[j] <= best + tol]
        if not ties:  # a NaN cost (a degenerate but in-domain model, e.g. s near 0): treat it as +inf
            finite = [j for j in cand if not math.isnan(costs[j])]
            return self._argmin(costs, finite) if finite else cand[self._rand.randrange(len(cand))]
        return ties[0] if len(ties) == 1 else ties[self._rand.randrange(len(ties))]

    def _sample(self, cand: list[int], usable: list[int]) -> int:
        if self.policy.flow.smooth_split:
            return self._round_robin(cand)
        if cand is usable:
            if self._cum is None:
                self._cum_idx, self._cum = self._cdf(usable)
            idx, cum = self._cum_idx, self._cum
        else:
            idx, cum = self._cdf(cand)
        u = self._rand.random() * cum[-1]
        k = bisect.bisect_right(cum, u)
        return idx[min(k, len(idx) - 1)]

    def _round_robin(self, cand: list[int]) -> int:
        """Smooth weighted round robin (nginx's) over ``cand`` with weights ``x``: every cell gains its
        weight, the richest is picked and pays the total, so each cell's count stays within one request
        of its share at every point of the stream."""
        w = self._split_weights(cand)
        total = sum(w)
        credit = self._credit
        best, best_k = -math.inf, 0
        for k, j in enumerate(cand):
            if w[k] <= 0:  # no share: its credit, whatever is left of it, must not win
                continue
            credit[j] += w[k]
            if credit[j] > best:
                best, best_k = credit[j], k
        cell = cand[best_k]
        credit[cell] -= total
        return cell

    def _cdf(self, cells: list[int]) -> tuple[list[int], list[float]]:
        """Cumulative flow weights over ``cells`` (replica weights if x gives them no mass)."""
        return list(cells), list(itertools.accumulate(self._split_weights(cells)))

    def _split_weights(self, cells: list[int]) -> list[float]:
        """``x`` over ``cells``, or the replica weights when ``x`` gives them no mass (both picks' rule)."""
        xl = self._xl
        if xl is None:
            xl = self._xl = [float(v) for v in self._x]
        w = [xl[j] for j in cells]
        if sum(w) <= 0:
            w = [float(self.replicas[j]) for j in cells]
        return w

    def _affine(self, session: str, cell: int, cand: list[int], now: float) -> int:
        """Conditional affinity (paper 3.5): stay on the session's cell while its expected latency
        minus the expected prefix-cache saving is no worse than the best alternative's; otherwise go
        to that best alternative — under flow routing too, not to the cell ``x`` sampled.

        Expected latency is ``ℓ_j(N_j) + 2τ_ij`` at this root's view (probe RIF + unseen sends), for
        every cost: the saving is a time, and the RIF or gradient cost is not one.
        """
        assert self.affinity is not None
        pinned = self.affinity.get(session, now)
        if pinned is not None and pinned in cand:
            others = [j for j in cand if j != pinned]
            if not others:
                cell = pinned
            else:
                best = min(others, key=self._expected_latency)
                stay = self._expected_latency(pinned) - self.policy.affinity.prefix_savings
                cell = pinned if stay <= self._expected_latency(best) else best
        self.affinity.put(session, cell, now)
        return cell

    def _expected_latency(self, j: int) -> float:
        """ℓ_j(N_j) + 2τ_ij with N_j = probe RIF + this root's unseen sends."""
        m = self.models
        a, b, c, s = float(m.a[j]), float(m.b[j]), float(m.c[j]), float(m.s[j])
        return latency_at(float(self.view.rif[j] + self.view.sent[j]) * float(self._inflate[j]), a, b, c, s) + float(self.rtt[j])
