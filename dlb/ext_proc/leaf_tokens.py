"""The leaf's stream token count: decoded tokens of each request on a data-parallel rank, counted from
the response body the leaf Envoy proxies, fed to that group's balancer (:meth:`DpBalancer.progress`).

Why this way: Envoy sends the body to the agent through a second ext_proc filter in
``observability_mode`` (:func:`dlb.envoy.bootstrap.stream_tokens_filter`, only in a leaf whose cell has a
data-parallel server): Envoy does not wait for an answer, so a token reaches the client as it would
without the filter, and the agent answers nothing. The filter's call starts with the request headers
(the request id names the resident request); a request not on a DP rank, a response whose end was seen,
or a count at its cap ends the call, so Envoy sends that response nothing more. Counting is
:class:`dlb.core.stream_tokens.TokenCount` (bytes-level, bounded); the per-call state lives with the call
(:attr:`CallContext.state`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from dlb.core.bfio import DpBalancer
from dlb.core.stream_tokens import TokenCount
from dlb.envoy import contract
from dlb.ext_proc.leaf_state import UNKNOWN, LeafState
from dlb.ext_proc.protocol import header_value
from dlb.transport.h2 import CALL


@dataclass(slots=True)
class _Counting:
    key: str
    balancer: DpBalancer
    count: TokenCount
    high: int = 0  # the most this response was counted at (what the metric has of it)


class StreamTokens:
    """Answers the observability filter's messages (always with nothing) and counts what they carry."""

    def __init__(self, state: LeafState, clock: Callable[[], float]) -> None:
        self.state = state
        self.clock = clock
        self.calls = 0  # calls that counted (the request was on a DP rank)
        self.chunks = 0  # response body chunks counted
        self.capped = 0  # responses whose count reached MAX_TOKENS
        self.counted = 0  # decoded tokens counted, over all responses (a metric)

    def headers(self, req: ep.ProcessingRequest) -> tuple[None, bool]:
        """The request's headers: count its response if it is resident on a DP rank, else end the call."""
        st = self.state
        rid = next((header_value(h) for h in req.request_headers.headers.headers if h.key == contract.REQUEST_ID), "")
        rec = st.inflight.get(rid) if rid else None
        dp = st.dp_of.get(st.servers[rec.server].address) if rec is not None and rec.server != UNKNOWN else None
        if dp is None or rid not in dp[0].residents:
            return None, True
        CALL.state = _Counting(rid, dp[0], TokenCount())
        self.calls += 1
        return None, False

    def body(self, req: ep.ProcessingRequest) -> tuple[None, bool]:
        """One chunk of the response body: count it and tell the balancer."""
        c = CALL.state
        if not isinstance(c, _Counting):
            return None, True
        body = req.response_body
        self.chunks += 1
        now = c.count.feed(body.body)
        if now > c.high:  # the running count dips below the truth at a no-token event, never above it
            self.counted += now - c.high
            c.high = now
        c.balancer.progress(c.key, float(now))
        if c.count.capped:
            self.capped += 1
            return None, True
        return None, body.end_of_stream
