"""The leaf agent's ExternalProcessor: the leaf Envoy asks which server gets a request; the answer is
``x-dlb-server: ip:port`` (pre-serialised per server) for its ORIGINAL_DST cluster.

The agent (``dlb serve leaf``) picks servers in its cell, measures it and answers probes. Its parts,
one module each around one :class:`~dlb.ext_proc.leaf_state.LeafState`:

- this module — the ExternalProcessor (the request path) and the agent's metrics;
- :mod:`dlb.ext_proc.leaf_als` — Envoy ``AccessLogService``: completions release RIF and feed the fit;
- :mod:`dlb.ext_proc.leaf_tokens` — decoded tokens counted from DP ranks' response streams;
- :mod:`dlb.ext_proc.leaf_probe` — ``dlb.v1.Probe``: roots poll it, answered from memory;
- :mod:`dlb.ext_proc.leaf_background` — refit, scrapes, the leaf Envoy check, background probes;
- :mod:`dlb.ext_proc.leaf_setup` — the starting state from the config;
- :mod:`dlb.ext_proc.leaf_serve` — running it all (:class:`LeafOptions`, :func:`run_leaf`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from google.protobuf import duration_pb2
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from dlb.core.admission import uncongested_stay
from dlb.core.hold_queue import MAX_HOLD_S, REPLY_MARGIN_S
from dlb.envoy import contract, replies
from dlb.ext_proc.leaf_als import LeafAccessLog
from dlb.ext_proc.leaf_background import LeafBackground
from dlb.ext_proc.leaf_probe import LeafProbe
from dlb.ext_proc.leaf_state import HELD, PICK_RULES, REFUSED, LeafState, ServerState
from dlb.ext_proc.leaf_tokens import StreamTokens
from dlb.ext_proc.protocol import CONTINUE, header_response, header_value, openai_error
from dlb.service.grpc_bounds import limit_samples
from dlb.service.metrics import FastHistogram
from dlb.transport.h2 import Later

if TYPE_CHECKING:
    from dlb.ext_proc.local_gate import PeerGate
#: Sent at once for a held request: Envoy's ext_proc message timer (200 ms) restarts at the hold's
#: longest possible wait plus the margin, the leaf Envoy's ``max_message_timeout`` (Envoy honours one
#: override per message). The agent answers (the pick, or 503 at the group's deadline) before it fires.
HOLD_TIMEOUT_OVERRIDE = ep.ProcessingResponse(override_message_timeout=duration_pb2.Duration(
    seconds=int(MAX_HOLD_S + REPLY_MARGIN_S), nanos=int((MAX_HOLD_S + REPLY_MARGIN_S) % 1 * 1e9))).SerializeToString()
#: DLB's own no-capacity answers share one OpenAI error type (the client table of docs/operations.md).
_NO_CAPACITY_TYPE = replies.ERRORS[replies.NO_CAPACITY].type
HOLD_FULL_RESPONSE = openai_error(429, "dlb: every rank of this data-parallel server is full and the leaf's queue for it "
                                  "is full; retry shortly", _NO_CAPACITY_TYPE, replies.NO_CAPACITY, retry_after_s=1)
ADMISSION_RESPONSE = openai_error(429, "dlb: the server this request would go to is too busy to answer it within the "
                                  "clients' timeout; retry shortly", _NO_CAPACITY_TYPE, replies.NO_CAPACITY, retry_after_s=1)
HOLD_DEADLINE_RESPONSE = openai_error(503, "dlb: no rank of this data-parallel server could admit the request before "
                                      "the leaf's hold deadline; retry shortly", _NO_CAPACITY_TYPE, replies.NO_CAPACITY,
                                      retry_after_s=1)


#: ``dlb_leaf_pick_rule``'s rule when the cell has no leaf ext_proc: Envoy's own pick, whatever the policy says.
ENVOY_PICKS = "envoy-least-request"
PICK_RULE_HELP = "1 for the server-pick rule in use (config or xDS LeafPolicy; envoy-least-request: no leaf.ext_proc, the leaf Envoy picks)"

class LeafAgent:
    """The leaf's ExternalProcessor and the parts around one :class:`LeafState`."""

    def __init__(self, state: LeafState, clock=time.monotonic) -> None:
        self.state = state
        self.clock = clock
        self._responses: list[bytes] = []
        self._responses_for: list[ServerState] | None = None  # the server list they were built for
        self.processing = FastHistogram()
        #: Counters of the HTTP/2 ext_proc transport when it serves this agent (exported at scrape time).
        self.transport_stats = None
        #: The cell has no leaf ext_proc, so its Envoy's LEAST_REQUEST picks the server, not this agent's rule.
        self.envoy_picks = False
        self.access_log = LeafAccessLog(state, clock)
        #: The access-log socket's peer check when it is a Unix socket (set by the runner).
        self.als_gate: PeerGate | None = None
        self.background = LeafBackground(state, clock)
        self.probe = LeafProbe(state, self.access_log.completed_by_source, lambda: self.background.envoy_ok, clock)
        #: Held requests' pending replies, by in-flight key (bounded by the groups' hold queues).
        self.held: dict[str, asyncio.Future[bytes]] = {}
        self.access_log.on_batch = self.release
        self.tokens = StreamTokens(state, clock)

    @property
    def responses(self) -> list[bytes]:
        """The pick replies, one pre-built per server, indexed as :attr:`LeafState.servers`.

        Rebuilt when the server list is replaced (an xDS endpoint update): built once at start, a new
        server's pick raised IndexError and a reordered list sent requests to another server.
        """
        servers = self.state.servers
        if servers is not self._responses_for:
            self._responses = [header_response([(contract.SERVER, s.address)], clear_route_cache=True) for s in servers]
            self._responses_for = servers
        return self._responses

    # -- ext_proc (request path) -------------------------------------------------------------------
    def handle(self, message: bytes) -> tuple[bytes | Later | None, bool]:
        """One serialised ``ProcessingRequest`` in, ``(reply, end_of_call)`` out (both transports).

        The call stays open after the pick (``end`` False): an Envoy configured to send response
        headers too gets them answered on the same stream, and Envoy closes it with the request.
        Messages of the observability filter (the stream token count) get no reply.
        """
        t0 = time.perf_counter()
        req = ep.ProcessingRequest.FromString(message)
        which = req.WhichOneof("request")
        if req.observability_mode:
            return self.tokens.headers(req) if which == "request_headers" else self.tokens.body(req)
        if which == "request_headers":
            rid = None
            length = None  # the body's size, for the tokens-waiting pick (the leaf never reads the body)
            for h in req.request_headers.headers.headers:
                if h.key == contract.REQUEST_ID:
                    rid = header_value(h)
                elif h.key == contract.CONTENT_LENGTH:
                    try:
                        length = int(header_value(h))
                    except ValueError:
                        length = None
            i = self.state.pick(self.clock(), rid, length)
            if i >= 0:
                out: bytes | Later = self.responses[i]
            elif i == HELD:
                out = self._hold(self.state.last_held)
            elif i == REFUSED:
                out = ADMISSION_RESPONSE
            else:
                out = HOLD_FULL_RESPONSE
        else:
            out = CONTINUE.get(which, CONTINUE["request_headers"])
        self.processing.observe(time.perf_counter() - t0)
        return out, False

    # -- the hold queue (data-parallel groups at their admission bound) ------------------------------
    def _hold(self, key: str) -> Later:
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.held[key] = fut
        fut.add_done_callback(lambda f: self._held_done(key, f))
        return Later(HOLD_TIMEOUT_OVERRIDE, fut)

    def _held_done(self, key: str, fut: asyncio.Future[bytes]) -> None:
        if self.held.get(key) is fut:
            del self.held[key]
        if fut.cancelled():  # Envoy ended the stream (client gone): it no longer waits for a rank
            self.state.cancel_held(key)

    def release(self) -> None:
        """Answer held requests a rank can now admit, and those past their deadline (503).

        Called after every access-log batch (completions free ranks) and by :meth:`hold_loop`."""
        if not self.held:
            return
        now = self.clock()
        for key, i in self.state.release(now):
            fut = self.held.get(key)
            if fut is not None and not fut.done():
                fut.set_result(self.responses[i])
        for key in self.state.expire_held(now):
            fut = self.held.get(key)
            if fut is not None and not fut.done():
                fut.set_result(HOLD_DEADLINE_RESPONSE)

    async def hold_loop(self, period_s: float = 0.01) -> None:
        """Deadlines and admission changes seen by scrapes (a KV cache no longer full) act within ``period_s``."""
        while True:
            await asyncio.sleep(period_s)
            self.release()

    # -- metrics -----------------------------------------------------------------------------------
    def collect(self) -> Iterable:
        st = self.state
        now = self.clock()
        c = st.cell
        yield GaugeMetricFamily("dlb_leaf_rif", "Requests in flight counted by the leaf", value=st.rif)
        srif = GaugeMetricFamily("dlb_leaf_server_rif", "Leaf-counted RIF per server", labels=["server"])
        sscr = GaugeMetricFamily("dlb_leaf_server_scraped_load", "running + waiting scraped from the server (-1 unknown)", labels=["server"])
        stok = GaugeMetricFamily("dlb_leaf_server_tokens", "Leaf-counted tokens waiting per server (size estimates of requests in flight)", labels=["server"])
        picks = CounterMetricFamily("dlb_leaf_server_picks", "Requests sent to each server", labels=["server"])
        serr = CounterMetricFamily("dlb_leaf_server_errors", "Failed completions per server", labels=["server"])
        cut = CounterMetricFamily("dlb_leaf_cut_streams", "Responses a server started and then broke off (reset mid-body)", labels=["server"])
        floor = GaugeMetricFamily("dlb_leaf_server_uncongested_stay_seconds",
                                  "Each server's uncongested stay that admission compares with (0: not learnt yet, or admission off)",
                                  labels=["server"])
        for s in st.servers:
            floor.add_metric([s.address], uncongested_stay(s.stay_floor, now, st.admission, st.estimator.params.a))
            srif.add_metric([s.address], s.rif)
            sscr.add_metric([s.address], s.scraped)
            stok.add_metric([s.address], s.tokens)
            picks.add_metric([s.address], s.picks)
            serr.add_metric([s.address], s.errors)
            cut.add_metric([s.address], s.cut_streams)
        yield from (srif, sscr, stok, picks, serr, cut, floor)
        if st.dp_groups:
            kv = GaugeMetricFamily("dlb_leaf_dp_rank_kv_tokens", "Predicted resident KV tokens per DP rank", labels=["server"])
            held = GaugeMetricFamily("dlb_leaf_dp_held", "Requests held for a data-parallel server", labels=["server"])
            held_s = CounterMetricFamily("dlb_leaf_dp_held_seconds", "Summed wait of held requests released to a rank", labels=["server"])
            outcome = CounterMetricFamily("dlb_leaf_dp_hold_outcomes", "Held requests: released, full (429), deadline (503), cancelled",
                                          labels=["server", "outcome"])
            for bal, members in st.dp_groups:
                for addr, v in zip(members, bal.kv(now), strict=True):
                    kv.add_metric([addr], float(v))
                q = bal.hold
                if q is not None:
                    held.add_metric([members[0]], len(q))
                    held_s.add_metric([members[0]], q.held_seconds)
                    for name, v in (("released", q.released), ("full", q.rejected_full), ("deadline", q.expired),
                                    ("cancelled", q.cancelled)):
                        outcome.add_metric([members[0], name], v)
            yield from (kv, held, held_s, outcome)
        rule = GaugeMetricFamily("dlb_leaf_pick_rule", PICK_RULE_HELP, labels=["rule"])
        for name in PICK_RULES:
            rule.add_metric([name], float(st.pick_rule == name and not self.envoy_picks))
        rule.add_metric([ENVOY_PICKS], float(self.envoy_picks))
        yield rule
        yield GaugeMetricFamily("dlb_leaf_pick_choices", "Servers probed per pick in use", value=st.choices)
        yield GaugeMetricFamily("dlb_leaf_healthy_servers", "Servers usable for picking", value=st.healthy(now))
        yield GaugeMetricFamily("dlb_leaf_envoy_reachable", "1 if the leaf Envoy accepts connections", value=float(self.background.envoy_ok))
        lim = GaugeMetricFamily("dlb_leaf_grpc_limit", "gRPC listener bounds", labels=["limit"])
        for name, v in limit_samples().items():
            lim.add_metric([name], v)
        yield lim
        yield GaugeMetricFamily("dlb_leaf_error_rate", "EMA error fraction reported in probes", value=st.errors.rate(now))
        yield CounterMetricFamily("dlb_leaf_completed", "Completions seen in the access log", value=st.completed)
        yield CounterMetricFamily("dlb_leaf_failed", "Completions counted as errors", value=st.failed)
        yield CounterMetricFamily("dlb_leaf_client_aborts", "Requests the client (or a root, at its timeout) left before the answer ended",
                                  value=st.client_aborts)
        yield CounterMetricFamily("dlb_leaf_inflight_expired", "In-flight records dropped after max age", value=st.expired)
        yield CounterMetricFamily("dlb_leaf_inflight_refused", "Request starts not recorded: the in-flight table was full",
                                  value=st.inflight_refused)
        yield CounterMetricFamily("dlb_leaf_admission_refused", "Requests answered 429 by admission: the picked server "
                                  "was too busy", value=st.admission_refused)
        yield CounterMetricFamily("dlb_leaf_inflight_orphaned", "In-flight records dropped when the access-log stream that opened them ended",
                                  value=st.orphaned)
        yield CounterMetricFamily("dlb_leaf_probes", "Probe requests answered", value=self.probe.answered)
        if st.dp_groups:
            yield CounterMetricFamily("dlb_leaf_dp_stream_tokens", "Decoded tokens counted in DP responses",
                                      value=self.tokens.counted)
        yield CounterMetricFamily("dlb_leaf_als_entries", "Access-log entries received", value=self.access_log.entries)
        yield CounterMetricFamily("dlb_leaf_als_peers_refused", "Access-log connections from another user, refused",
                                  value=self.als_gate.refused if self.als_gate is not None else 0)
        model = GaugeMetricFamily("dlb_leaf_model", "Published latency-model parameter", labels=["param"])
        p = st.estimator.params
        for name, v in (("a_s", p.a), ("b_s", p.b), ("c", p.c), ("s", p.s), ("confidence", st.estimator.confidence),
                        ("samples", float(len(st.estimator)))):
            model.add_metric([name], v)
        yield model
        yield CounterMetricFamily("dlb_leaf_fit_seconds", "Time spent fitting the latency model", value=self.background.fit_seconds)
        bg = CounterMetricFamily("dlb_leaf_background_probes", "Background probe requests sent by this leaf", labels=["outcome"])
        bg.add_metric(["ok"], self.background.bg_ok)
        bg.add_metric(["failed"], self.background.bg_failed)
        yield bg
        yield CounterMetricFamily("dlb_leaf_background_probe_seconds", "Summed latency of successful background probes",
                                  value=self.background.bg_seconds)
        prober = self.background.prober
        yield GaugeMetricFamily("dlb_leaf_background_watched", "1 while the cell is watched: probed every watch interval",
                                value=float(prober is not None and prober.watching))
        ch = CounterMetricFamily("dlb_leaf_cell_changes", "Changes of the cell declared by probes or traffic (samples before them dropped)",
                                 labels=["source", "direction"])
        for (source, direction), n in sorted(self.background.changes.items()):
            ch.add_metric([source, direction], n)
        yield ch
        yield self.processing.family("dlb_leaf_processing_seconds", "Time to pick a server inside the service")
        if self.transport_stats is not None:
            yield from self.transport_stats.families("dlb_leaf")
        del c

