"""The root ext_proc service (``dlb serve root``): picks a destination cell for every request.

Envoy's ext_proc filter opens one gRPC stream per HTTP request and sends the request headers; we
answer with a header mutation ``x-dlb-cell: cell-<name>`` (+ ``x-dlb-src-cell: <own cell>``) and
``clear_route_cache`` so the route's ``cluster_header`` sends the request to that cell's leaf Envoy.
The decision is made by the routing core's :class:`RootRouter` (one per endpoint) from probe state
cached by :class:`ProbeClient`; nothing on the request path waits for I/O. With another allowed cell
the answer also names a fallback, ``x-dlb-fallback-cell``: the next-best usable cell, else the next-best
allowed one (:mod:`dlb.core.fallback`), on which the root Envoy retries a request whose connection to
the first failed or was reset before any response header.

Client-supplied ``x-dlb-*`` headers are never read here (only ``:path`` and the endpoint's session
header are), and the root Envoy strips them before any filter runs (``internal_only_headers``).
A request no cell can take gets an ImmediateResponse shaped as an OpenAI API error (JSON, code
``dlb_no_capacity``, :mod:`dlb.envoy.replies`) with ``retry-after``, so OpenAI clients show it and retry
it: 503 when no cell is usable, 429 when the router sheds (every usable cell saturated,
:mod:`dlb.core.shedding`), its ``retry-after`` the shortest drain time of those cells.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from dlb.config import Config
from dlb.config.model import CELL_CLUSTER_PREFIX
from dlb.core.aversion import RecentErrors
from dlb.core.fallback import NO_FALLBACK, next_best
from dlb.core.latency_model import LatencyParams, latency
from dlb.core.router import NO_CELL, SHED, Mechanism, PolicyConfig, RootRouter
from dlb.core.shedding import retry_after_s
from dlb.core.topology import Topology
from dlb.envoy import contract, replies
from dlb.ext_proc.protocol import CONTINUE, header_response, header_value, openai_error
from dlb.log import get_logger
from dlb.probe.client import ProbeClient
from dlb.probe.codec import model_of
from dlb.probe.target import ProbeTarget
from dlb.proto import probe_pb2
from dlb.service.metrics import FastHistogram
from dlb.transport.limits import TransportStats

log = get_logger("dlb.root")

#: At most one ``requests_shed`` line per endpoint this often (with the count since the last one).
SHED_LOG_EVERY_S = 10.0
#: How long one shed reply (its ``retry-after``) is reused: a few probe periods.
SHED_REPLY_TTL_S = 0.25

PATH = ":path"


@dataclass(frozen=True)
class EndpointSpec:
    """What a root needs to know about one endpoint (from the config file or a RoutingPolicy resource)."""

    name: str
    prefix: str
    policy: PolicyConfig
    prior: LatencyParams
    #: Cells with a prior of their own (``endpoints[].latency_prior_by_cell``); others take ``prior``.
    cell_priors: Mapping[str, LatencyParams] = field(default_factory=dict)

    def priors(self, cells: Sequence[str]) -> list[LatencyParams]:
        return [self.cell_priors.get(c, self.prior) for c in cells]


#: How often each endpoint's fallback table is rebuilt from its costs (a few times per probe period).
FALLBACK_REFRESH_S = 0.05


@dataclass
class EndpointState:
    """One endpoint on this root: its path prefix, router and decision counters."""

    name: str
    prefix: str
    router: RootRouter
    session_header: str | None  # lower-case header name, or None when affinity is off
    decisions: list[int]
    rejected: int = 0
    shed: int = 0
    #: The 429 reply while the state it was derived from is recent (``retry-after`` changes slowly).
    shed_reply: bytes = b""
    shed_reply_until: float = -math.inf
    retry_after_s: int = replies.DEFAULT_RETRY_AFTER_S
    #: Sheds since the last ``requests_shed`` log line (one line per endpoint per SHED_LOG_EVERY_S).
    shed_unlogged: int = 0
    shed_logged_at: float = -math.inf

    #: Per cell, the cell a request there is retried on (:mod:`dlb.core.fallback`),
    #: rebuilt every :data:`FALLBACK_REFRESH_S` rather than per request.
    fallback: list[int] = field(default_factory=list)
    fallback_until: float = -math.inf

    def refuse_shed(self, cell: str, now: float) -> bytes:
        """The 429 for a shed request; its ``retry-after`` is re-derived from the cells' state at most every
        SHED_REPLY_TTL_S (the decision itself is the router's, per request)."""
        self.shed += 1
        self.shed_unlogged += 1
        if now >= self.shed_reply_until:
            r = self.router
            m, v = r.models, r.view
            drain = [float(latency(v.rif[j] + v.sent[j], m.a[j], m.b[j], m.c[j], m.s[j])) for j in np.flatnonzero(r.usable(now))]
            self.retry_after_s = retry_after_s(drain, r.policy.shed)
            self.shed_reply = openai_error(
                429, "dlb: every cell that may serve this request is full; retry after the retry-after seconds",
                replies.ERRORS[replies.NO_CAPACITY].type, replies.NO_CAPACITY, retry_after_s=self.retry_after_s)
            self.shed_reply_until = now + SHED_REPLY_TTL_S
        if now - self.shed_logged_at >= SHED_LOG_EVERY_S:
            log.warning("requests_shed", endpoint=self.name, source_cell=cell, shed=self.shed_unlogged,
                        retry_after_s=self.retry_after_s, every_s=SHED_LOG_EVERY_S)
            self.shed_unlogged, self.shed_logged_at = 0, now
        return self.shed_reply


@dataclass
class RootService:
    """Per-request decisions + the probe-state sink. Build with :meth:`from_config`."""

    cell: str
    cell_names: tuple[str, ...]
    endpoints: list[EndpointState]
    #: Pre-serialised ``ProcessingResponse`` per destination cell index.
    responses: list[bytes]
    #: The same with a fallback cell, ``[cell][fallback]`` (``x-dlb-fallback-cell`` too).
    fallback_responses: list[list[bytes]] = field(default_factory=list)
    no_cell_response: bytes = field(default_factory=lambda: openai_error(
        503, "dlb: no usable cell for this request (all destinations down, stale or not allowed); retry shortly",
        replies.ERRORS[replies.NO_CAPACITY].type, replies.NO_CAPACITY, retry_after_s=replies.DEFAULT_RETRY_AFTER_S))
    no_endpoint_response: bytes = field(default_factory=lambda: openai_error(
        404, replies.NO_ENDPOINT_MESSAGE, replies.ERRORS[replies.NO_ENDPOINT].type, replies.NO_ENDPOINT))
    processing: FastHistogram = field(default_factory=FastHistogram)
    unmatched: int = 0
    streams: int = 0
    errors: int = 0
    probe_client: ProbeClient | None = None
    #: Counters of the h2 transport (None on grpc.aio), exported at scrape time.
    transport_stats: TransportStats | None = None
    clock: Callable[[], float] = time.monotonic
    rng: np.random.Generator = field(default_factory=np.random.default_rng)
    specs: tuple[EndpointSpec, ...] = ()

    @classmethod
    def from_config(cls, cfg: Config, cell: str, seed: int | None = None) -> RootService:
        specs = [EndpointSpec(e.name, e.match.prefix, e.policy.to_core(cfg.probe, e.timeout_s), e.latency_prior.to_core(),
                              e.cell_priors())
                 for e in cfg.endpoints]
        svc = cls(cell=cell, cell_names=(), endpoints=[], responses=[], rng=np.random.default_rng(seed))
        svc.configure(cfg.topology(), specs)
        return svc

    def configure(self, topology: Topology, specs: Sequence[EndpointSpec], initial_x: Mapping[str, np.ndarray] | None = None) -> None:
        """(Re)build the routers for a topology and endpoint policies: the hot-reload path.

        Probe state, models, aversion and flow vectors of cells present before and after carry over,
        so a reload does not forget what the root knew. The swap is a handful of attribute
        assignments on the event-loop thread, between two requests: no request sees half a config,
        and none is dropped. ``initial_x`` seeds new flow routers (e.g. the control plane's weights).
        """
        src = topology.index(self.cell)  # ValueError when this root's cell is not in the topology
        old = {e.name: e for e in self.endpoints}
        endpoints = []
        for spec in specs:
            router = RootRouter(topology, src, spec.policy, spec.prior, rng=self.rng, cell_priors=spec.priors(topology.names))
            prev = old.get(spec.name)
            decisions = [0] * topology.n
            if prev is not None:
                router.carry_over(prev.router, self.cell_names, topology.names)
                for j, name in enumerate(self.cell_names):
                    if name in topology.names:
                        decisions[topology.index(name)] = prev.decisions[j]
            elif initial_x and spec.name in initial_x and spec.policy.mechanism is Mechanism.FLOW:
                x = np.where(router.allowed, np.asarray(initial_x[spec.name], float), 0.0)
                if x.sum() > 0:
                    router.x = x / x.sum()
            header = spec.policy.affinity.header.lower() if spec.policy.affinity.enabled else None
            endpoints.append(EndpointState(spec.name, spec.prefix, router, header, decisions,
                                           prev.rejected if prev is not None else 0, prev.shed if prev is not None else 0))
        def response(cell: str, fallback: str | None = None) -> bytes:
            headers = [(contract.CELL, CELL_CLUSTER_PREFIX + cell), (contract.SRC_CELL, self.cell)]
            if fallback is not None:
                headers.append((contract.FALLBACK, CELL_CLUSTER_PREFIX + fallback))
            return header_response(headers, remove=[contract.SERVER])

        responses = [response(n) for n in topology.names]
        self.fallback_responses = [[response(n, f) for f in topology.names] for n in topology.names]
        self.cell_names, self.endpoints, self.responses = topology.names, endpoints, responses
        self.specs = tuple(specs)
        # Aversion sees a cell's error EMA only while its error counter keeps rising (RecentErrors).
        hold = 2.0 * max((s.policy.aversion.period_s for s in specs), default=1.0)
        self.recent_errors = RecentErrors(topology.n, hold)
        self.session_keys = frozenset(e.session_header for e in endpoints if e.session_header)
        self.generation += 1

    # -- request path ---------------------------------------------------------------------------
    def decide(self, header_list: Iterable) -> bytes:
        """The serialised reply to one request-headers message."""
        path = ""
        session_keys = self.session_keys
        sessions: dict[str, str] | None = None
        for h in header_list:
            key = h.key
            if key == PATH:
                path = header_value(h)
            elif session_keys and key in session_keys:
                if sessions is None:
                    sessions = {}
                sessions[key] = header_value(h)
        for ep_state in self.endpoints:
            if path.startswith(ep_state.prefix):
                break
        else:
            if not self.endpoints:
                return CONTINUE["request_headers"]  # not configured yet (xDS): Envoy's fail-open weights
            self.unmatched += 1
            return self.no_endpoint_response
        session = sessions.get(ep_state.session_header) if sessions and ep_state.session_header else None
        now = self.clock()
        cell = ep_state.router.pick(now, session)
        if cell < 0:
            if cell == SHED:
                return ep_state.refuse_shed(self.cell, now)
            assert cell == NO_CELL
            ep_state.rejected += 1
            return self.no_cell_response
        ep_state.decisions[cell] += 1
        if now >= ep_state.fallback_until:
            self._refresh_fallback(ep_state, now)
        fb = ep_state.fallback[cell]
        return self.responses[cell] if fb == NO_FALLBACK else self.fallback_responses[cell][fb]

    def _refresh_fallback(self, ep_state: EndpointState, now: float) -> None:
        """Rebuild the endpoint's fallback table from the costs a discrete pick would use now."""
        r = ep_state.router
        usable = [int(j) for j in np.flatnonzero(r.usable(now))]
        ep_state.fallback = next_best(r.costs(now).tolist(), usable, len(self.cell_names), r.fallback_candidates())
        ep_state.fallback_until = now + FALLBACK_REFRESH_S

    def __post_init__(self) -> None:
        #: Every endpoint's affinity header (the only client headers besides :path we ever read).
        self.session_keys = frozenset(e.session_header for e in self.endpoints if e.session_header)
        #: Bumped by every configure(): probe results from a client of an older topology are ignored.
        self.generation = 0
        self.recent_errors = RecentErrors(len(self.cell_names))

    def handle(self, message: bytes) -> tuple[bytes, bool]:
        """One serialised ``ProcessingRequest`` in, ``(reply, end_of_call)`` out: the whole request path.

        Synchronous on purpose: both transports call it inline (no task, no await per request).
        After the request-headers reply the call ends — the root only decides on request headers, and
        ending the stream cleanly tells Envoy to proceed without us (ext_proc protocol), so nothing is
        held for the rest of a possibly minutes-long generation. A message that does not parse raises:
        the transport ends that call with a gRPC error and Envoy fails open.
        """
        t0 = time.perf_counter()
        req = ep.ProcessingRequest.FromString(message)
        which = req.WhichOneof("request")
        if which == "request_headers":
            self.streams += 1
            try:
                out = self.decide(req.request_headers.headers.headers)
            except Exception:  # a bug must not fail the request: no header = Envoy's fail-open route
                self.errors += 1
                if self.errors == 1 or self.errors % 1000 == 0:
                    log.exception("decide_failed", errors=self.errors)
                out = CONTINUE["request_headers"]
            self.processing.observe(time.perf_counter() - t0)
            return out, True
        self.processing.observe(time.perf_counter() - t0)
        return CONTINUE.get(which, CONTINUE["request_headers"]), False

    def cell_prior(self, cell: str) -> LatencyParams:
        """What a foreign cell's fitted model shrinks toward: the first endpoint's prior for it, as a leaf's
        does (``dlb.ext_proc.leaf_setup``)."""
        if not self.specs:
            raise ValueError(f"root {self.cell}: no endpoint configured, so no latency prior for cell {cell}")
        return self.specs[0].cell_priors.get(cell, self.specs[0].prior)

    # -- probe state in -------------------------------------------------------------------------
    def on_probe(self, target: ProbeTarget, resp: probe_pb2.ProbeResponse | None, now: float) -> None:
        if target.index >= len(self.cell_names) or self.cell_names[target.index] != target.name:
            return  # a probe of a client built for an older topology, still winding down
        if resp is None:
            for e in self.endpoints:
                e.router.set_available(target.index, False)
            return
        params = model_of(resp)  # None: a leaf without a usable model, keep the previous/prior curve
        conf = resp.model.confidence if resp.HasField("model") else 0.0
        error_rate = self.recent_errors.observe(target.index, resp.errors, resp.error_rate, now)
        j = target.index
        replicas = float(resp.healthy_replicas) if resp.HasField("healthy_replicas") else None
        capacity = resp.capacity if resp.HasField("capacity") else None  # an older leaf: unknown, never shed on
        for e in self.endpoints:
            # A confidence-0 model (a restarted leaf's prior) does not replace a learned one: RootRouter.on_probe.
            e.router.on_probe(j, now, resp.rif, params, error_rate, conf, replicas=replicas, capacity=capacity)

    def tick(self, now: float) -> None:
        for e in self.endpoints:
            e.router.tick(now)

    def routable(self) -> bool:
        """Every endpoint has a cell usable now (allowed, a fresh probe, available): what readiness means."""
        now = self.clock()
        return bool(self.endpoints) and all(e.router.usable(now).any() for e in self.endpoints)

    # -- metrics ---------------------------------------------------------------------------------
    def collect(self) -> Iterable:
        now = self.clock()
        names = self.cell_names
        dec = CounterMetricFamily("dlb_root_decisions", "Requests routed, by endpoint and destination cell", labels=["endpoint", "cell"])
        rej = CounterMetricFamily("dlb_root_rejected", "Requests answered 503 (no usable cell)", labels=["endpoint"])
        shed = CounterMetricFamily("dlb_root_shed", "Requests answered 429 (shed: every usable cell saturated or past the deadline)",
                                   labels=["endpoint", "source_cell"])
        av = GaugeMetricFamily("dlb_root_aversion_rate", "Error-aversion skip probability a_j", labels=["endpoint", "cell"])
        flow = GaugeMetricFamily("dlb_root_flow_weight", "Flow routing vector x_ij", labels=["endpoint", "cell"])
        usable = GaugeMetricFamily("dlb_root_cell_usable", "1 if the cell is usable now (allowed, fresh, available)", labels=["endpoint", "cell"])
        for e in self.endpoints:
            r = e.router

            u = r.usable(now)
            for j, name in enumerate(names):
                dec.add_metric([e.name, name], e.decisions[j])
                av.add_metric([e.name, name], float(r.aversion[j]))
                usable.add_metric([e.name, name], float(u[j]))
                if r.policy.mechanism is Mechanism.FLOW:
                    flow.add_metric([e.name, name], float(r.x[j]))
            rej.add_metric([e.name], e.rejected)
            shed.add_metric([e.name, self.cell], e.shed)
        yield from (dec, rej, shed, av, flow, usable)
        yield CounterMetricFamily("dlb_root_unmatched", "Requests whose path matched no endpoint", value=self.unmatched)
        yield CounterMetricFamily("dlb_root_streams", "ext_proc streams opened by Envoy", value=self.streams)
        if self.transport_stats is not None:
            yield from self.transport_stats.families("dlb_root")
        yield CounterMetricFamily("dlb_root_decide_errors", "Decisions that raised (request continued on the fail-open route)", value=self.errors)
        yield self.processing.family("dlb_root_processing_seconds", "Time to decide one ext_proc message inside the service")
        pc = self.probe_client
        if pc is None:
            return
        age = GaugeMetricFamily("dlb_root_probe_age_seconds", "Seconds since the last good probe answer", labels=["cell"])
        errs = CounterMetricFamily("dlb_root_probe_errors", "Failed probes", labels=["cell"])
        oks = CounterMetricFamily("dlb_root_probes", "Successful probes", labels=["cell"])
        rtt = GaugeMetricFamily("dlb_root_probe_rtt_seconds", "Round trip of the last good probe", labels=["cell"])
        rif = GaugeMetricFamily("dlb_root_cell_rif", "Cell RIF reported by the last probe", labels=["cell"])
        err = GaugeMetricFamily("dlb_root_cell_error_rate", "Cell error rate reported by the last probe", labels=["cell"])
        model = GaugeMetricFamily("dlb_root_cell_model", "Cell latency-model parameter from the last probe", labels=["cell", "param"])
        for t in pc.targets:
            st = pc.cell_stats(t.index) if t.replica == 0 else None
            if st is None:
                continue
            age.add_metric([t.name], now - st.last_ok if math.isfinite(st.last_ok) else math.inf)
            errs.add_metric([t.name], st.errors)
            oks.add_metric([t.name], st.ok)
            rtt.add_metric([t.name], st.last_rtt_s)
            if st.last is not None:
                rif.add_metric([t.name], st.last.rif)
                err.add_metric([t.name], st.last.error_rate)
                m = st.last.model
                for pname, v in (("a_s", m.a_s), ("b_s", m.b_s), ("c", m.c), ("s", m.s), ("confidence", m.confidence)):
                    model.add_metric([t.name, pname], v)
        yield from (age, errs, oks, rtt, rif, err, model)
