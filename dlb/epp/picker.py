"""One ext_proc stream of a GIE gateway: pick on the request headers, follow the response to its end.

Why per-stream state here when the leaf's ext_proc has none: a GIE gateway sends the EPP the whole
exchange (headers, bodies, trailers, both ways), so the EPP sees each request finish itself — there is
no access log to release RIF or give latency samples. The stream carries the pick's key, its start and
the response status; its end (``done``) feeds the same :meth:`LeafState.complete` the leaf's access log does.

Pick rule, counting and fit are the leaf's (:class:`LeafState`): power-of-d or Prequal over the pool, or
over the gateway's subset hint when it sends one. Bodies are never buffered: in FULL_DUPLEX_STREAMED mode
each chunk is handed back as it came (token-by-token streaming stays token by token).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from dlb.envoy.contract import CONTENT_LENGTH
from dlb.epp import protocol
from dlb.ext_proc.leaf_state import REFUSED, UNKNOWN, Completion, LeafState, is_error
from dlb.ext_proc.protocol import CONTINUE, header_value
from dlb.service.tracing import Tracer

FULL_DUPLEX = ProcessingMode.BodySendMode.FULL_DUPLEX_STREAMED
#: How a pick ended (``dlb_epp_picks{outcome}``). The 503s by cause: an empty pool (``no_capacity``) is the
#: pool's to fix, an empty hint or one naming no pool member (``hint_empty``, ``hint_foreign``) the gateway's.
OUTCOMES = ("picked", "no_capacity", "shed", "hint_empty", "hint_foreign")


@dataclass
class EndpointPicker:
    """The pool's picker: a :class:`LeafState` plus the EPP's replies and counters."""

    state: LeafState
    #: Shed (429) a request when every eligible endpoint reports its KV cache full (``state.kv_full``).
    shed_when_full: bool = False
    #: Records a span per pick (``--otlp-endpoint``); None: tracing off.
    tracer: Tracer | None = None
    replies: dict[str, bytes] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    #: Responses the gateway reports served by another endpoint than the pick (``x-gateway-destination-endpoint-served``).
    served_elsewhere: int = 0
    #: Endpoint-set changes applied (an InferencePool's pods, or DNS).
    pool_updates: int = 0
    #: The pool has no ready endpoint (an InferencePool scaled to zero): every request gets 503.
    empty: bool = False
    _keys: itertools.count = field(default_factory=itertools.count)

    def reply_for(self, address: str) -> bytes:
        r = self.replies.get(address)
        if r is None:
            if len(self.replies) > 4 * len(self.state.servers) + 64:  # the pool changed many times: drop stale replies
                self.replies.clear()
            r = self.replies[address] = protocol.pick_reply(address)
        return r

    def eligible(self, hint: list[str] | None) -> list[int] | None:
        """Indices the pick may choose from: None for the whole pool, else the hint's members of the pool."""
        if self.empty:
            return []
        if hint is None:
            return None
        by = self.state.by_address
        return sorted({by[a] for a in hint if a in by})

    def full(self, now: float, among: list[int] | None) -> bool:
        st = self.state
        return all(st.servers[i].kv_usage >= st.kv_full for i in st.usable(now, among))

    def stream(self, traceparent: str | None = None) -> EppStream:
        """A new ext_proc stream; ``traceparent`` from the call's gRPC metadata (Envoy's, when it traces)."""
        return EppStream(self, f"epp-{next(self._keys)}", traceparent=traceparent)


@dataclass
class EppStream:
    """The state of one request's ext_proc stream; :meth:`on_message` returns the replies to send."""

    epp: EndpointPicker
    key: str
    picked: int = UNKNOWN
    address: str = ""
    started: float = 0.0
    status: int = 0
    served: str | None = None
    done: bool = False
    request_mode: int = 0
    response_mode: int = 0
    traceparent: str | None = None

    def on_message(self, req: ep.ProcessingRequest, now: float) -> list[bytes]:
        which = req.WhichOneof("request")
        if req.HasField("protocol_config"):
            self.request_mode = req.protocol_config.request_body_mode
            self.response_mode = req.protocol_config.response_body_mode
        if which == "request_headers":
            return [self._pick(req, now)]
        if which == "request_body":
            b = req.request_body
            return [protocol.streamed_body("request_body", b.body, b.end_of_stream) if self.request_mode == FULL_DUPLEX
                    else CONTINUE["request_body"]]
        if which == "response_headers":
            self.status = protocol.status_of(req.response_headers)
            self._note_served(req)
            if req.response_headers.end_of_stream:
                self.finish(now)
            return [CONTINUE["response_headers"]]
        if which == "response_body":
            b = req.response_body
            self._note_served(req)
            if b.end_of_stream:
                self.finish(now)
            return [protocol.streamed_body("response_body", b.body, b.end_of_stream) if self.response_mode == FULL_DUPLEX
                    else CONTINUE["response_body"]]
        if which == "response_trailers":
            self.finish(now)
        return [CONTINUE.get(which, CONTINUE["request_headers"])]

    def _pick(self, req: ep.ProcessingRequest, now: float) -> bytes:
        epp = self.epp
        t0 = time.time_ns() if epp.tracer is not None else 0  # the pick's span starts here (sampled ones only)
        length = None
        for h in req.request_headers.headers.headers:
            if h.key == CONTENT_LENGTH:
                try:
                    length = int(header_value(h))
                except ValueError:
                    length = None
            elif h.key == "traceparent" and self.traceparent is None:
                self.traceparent = header_value(h)
        hint = protocol.subset_hint(req)
        among = epp.eligible(hint)
        if among is not None and not among:
            epp.outcomes["no_capacity" if epp.empty or hint is None else "hint_foreign" if hint else "hint_empty"] += 1
            self.done = True
            reply, refused = protocol.NO_ENDPOINT, 503
        elif epp.shed_when_full and epp.full(now, among):
            epp.outcomes["shed"] += 1
            self.done = True
            reply, refused = protocol.SHED, 429
        else:
            self.started = now
            self.picked = epp.state.pick(now, self.key, length, among)
            if self.picked == REFUSED:  # admission (dlb.core.admission): the picked server is too busy
                epp.outcomes["shed"] += 1
                self.done = True
                reply, refused = protocol.SHED, 429
            else:
                epp.outcomes["picked"] += 1
                self.address = epp.state.servers[self.picked].address
                reply, refused = epp.reply_for(self.address), 0
        if epp.tracer is not None and epp.tracer.sampled(self.traceparent):
            self._trace(t0, among, refused)
        return reply

    def _trace(self, start_ns: int, among: list[int] | None, refused: int) -> None:
        """The pick as a span: where it went and the load it saw there (or why nothing was picked)."""
        st = self.epp.state
        attrs: dict[str, str | int | float] = {"dlb.pool": st.cell, "dlb.pick_rule": st.pick_rule, "dlb.pool.rif": st.rif,
                                                "dlb.subset": -1 if among is None else len(among)}
        if refused:
            attrs["http.response.status_code"] = refused
        else:
            s = st.servers[self.picked]
            attrs.update({"dlb.server": s.address, "dlb.server.rif": s.rif, "dlb.server.tokens_waiting": s.tokens})
        assert self.epp.tracer is not None
        self.epp.tracer.record("dlb.epp.pick", self.traceparent, start_ns, time.time_ns(), attrs,
                               error="no eligible endpoint" if refused == 503 else "shed" if refused else None)

    def _note_served(self, req: ep.ProcessingRequest) -> None:
        """Move the in-flight record to the endpoint the gateway says served (a retry went elsewhere)."""
        served = protocol.served_endpoint(req)
        if served is None or served == self.served:
            return
        self.served = served
        st = self.epp.state
        rec = st.inflight.get(self.key)
        to = st.by_address.get(served)
        if rec is None or to is None or rec.server == to:
            return
        if rec.server != UNKNOWN:
            st.servers[rec.server].rif -= 1
            st.servers[rec.server].tokens -= rec.tokens
        st.servers[to].rif += 1
        st.servers[to].tokens += rec.tokens
        rec.server = to
        self.epp.served_elsewhere += 1

    def finish(self, now: float, aborted: bool = False) -> None:
        """The response ended (or, ``aborted``, the stream did first): release RIF, feed the fit and health."""
        if self.done or self.picked == UNKNOWN:
            self.done = True
            return
        self.done = True
        # Cut short with no error status: the client left (a failed upstream gets Envoy's own 503 first).
        abort = aborted and (self.status == 0 or not is_error(self.status))
        self.epp.state.complete(now, Completion(self.key, self.served or self.address, self.status, now - self.started,
                                                client_abort=abort))
