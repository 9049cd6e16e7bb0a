"""The leaf's access-log service: Envoy's per-request log entries turned into completions.

Why the access log and not ext_proc response processing for completions: the ext_proc response
phase would add a second synchronous round trip per request and only sees response *headers* (for
streamed generations the end of the stream, hence the latency, is only known at stream end, which the
access log reports with the status and timings). See docs/data-plane.md for the measurement.

The leaf Envoy streams one entry per finished request (and, with ``flush_access_log_on_new_request``,
one per started request). Completions release RIF and feed the latency fit and the error rate, off the
request path and batched by Envoy.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

from envoy.data.accesslog.v3 import accesslog_pb2
from envoy.service.accesslog.v3 import als_pb2

from dlb.envoy import contract
from dlb.ext_proc.leaf_state import Completion, LeafState
from dlb.log import get_logger

log = get_logger("dlb.leaf")

#: ``x-request-id`` prefix of the leaf's own background probe requests.
BACKGROUND_PROBE_ID = "dlb-background-probe-"
#: In-flight records an ended stream's records are forgotten in per loop turn.
DROP_BATCH = 2_000
_START = accesslog_pb2.AccessLogType.Value("DownstreamStart")
_PERIODIC = (accesslog_pb2.AccessLogType.Value("DownstreamPeriodic"), accesslog_pb2.AccessLogType.Value("UpstreamPeriodic"),
             accesslog_pb2.AccessLogType.Value("UpstreamPoolReady"))


def _seconds(d) -> float:
    return d.seconds + d.nanos * 1e-9


def _serving_seconds(common) -> float:
    """The server's share of a request: first byte sent upstream → last byte back from upstream.

    Not the leaf-side total: that would include the leaf's own filters, notably the testbed's WAN
    delay (applied at the leaf Envoy, before the upstream), and the roots add the network delay to
    ℓ(N) themselves — counting it in the model too would count it twice.
    """
    if common.HasField("time_to_last_upstream_rx_byte") and common.HasField("time_to_first_upstream_tx_byte"):
        return _seconds(common.time_to_last_upstream_rx_byte) - _seconds(common.time_to_first_upstream_tx_byte)
    if common.HasField("time_to_last_downstream_tx_byte"):
        return _seconds(common.time_to_last_downstream_tx_byte)
    return _seconds(common.duration)


def _cut_stream(entry) -> bool:
    """True if the server started a response and then the upstream stream broke (issue 13, item 6).

    Envoy logs the status it had forwarded (e.g. 200) with details
    ``upstream_reset_after_response_started{reason}`` and a flag for the reason: a SIGKILLed HTTP/1.1
    server's unterminated chunked body is ``protocol_error`` (UPE, measured), a dead HTTP/2 connection
    UC or UR, Envoy's own reset LR, the route timeout mid-body UT. Without this a stream cut after its
    headers counted as a fast success: a 200 and a short latency sample. A reset before any response
    byte has status 0 or Envoy's own 503, an error already.
    """
    status = entry.response.response_code.value
    if not 0 < status < 400:
        return False
    if entry.response.response_code_details.startswith("upstream_reset_after_response_started"):
        return True
    f = entry.common_properties.response_flags
    return bool(f.upstream_remote_reset or f.upstream_connection_termination or f.local_reset
                or f.upstream_request_timeout or f.upstream_protocol_error)


def _client_abort(entry) -> bool:
    """True if the downstream went away before the response ended: a client that closed its stream, or a
    root Envoy that reset it at its route timeout (it talks HTTP/1.1 to the leaf: a closed connection, DC;
    HTTP/2 clients: DR). Before any response byte the status is 0; mid-stream it is the status already
    forwarded (200), and without this the truncated stream counted as a success with a latency sample
    ending at the reset. A server that broke the stream first is a cut stream (:func:`_cut_stream`), not
    an abort: Envoy flags the upstream reset then.
    """
    common = entry.common_properties
    f = common.response_flags
    if not (f.downstream_connection_termination or f.downstream_remote_reset):
        return False
    status = entry.response.response_code.value
    if status and common.HasField("time_to_last_upstream_rx_byte"):
        # The server's answer ended (Envoy stamps the last upstream byte at its end of stream) before the
        # downstream left: a client that stopped at ``data: [DONE]`` and closed (the openai SDK, through a
        # root, whose Envoy then resets its HTTP/1.1 connection here). A whole answer, not an abort: a
        # stranger found 5-50 % of complete SDK streams missing from completions, errors and the fit.
        return False
    return status == 0 or (status < 400 and not _cut_stream(entry))


def _address(addr) -> str:
    sa = addr.socket_address
    if not sa.address:
        return ""
    return f"[{sa.address}]:{sa.port_value}" if ":" in sa.address else f"{sa.address}:{sa.port_value}"

class LeafAccessLog:
    """``AccessLogService`` of one leaf: request starts and completions into its :class:`LeafState`."""

    def __init__(self, state: LeafState, clock: Callable[[], float] = time.monotonic) -> None:
        self.state = state
        self.clock = clock
        self.entries = 0
        self.streams = 0
        #: Log streams open now. With a leaf ext_proc Envoy logs no request starts, so the agent's picks
        #: belong to no stream; when the last one ends, the Envoy that would complete them is gone.
        self.open_streams = 0
        #: Completions per source cell (the root's ``x-dlb-src-cell``), reported in probes: the demand a
        #: central controller (MNLB on the real data path) measures. Bounded by the config's cells: a
        #: header naming no known source (a client cannot set it: the root Envoy strips it) is not counted.
        self.completed_by_source: dict[str, int] = {}
        self.known_sources: frozenset[str] | None = None
        #: Called after each batch of entries (the agent releases held requests to ranks freed by completions).
        self.on_batch: Callable[[], None] | None = None

    async def StreamAccessLogs(self, requests: AsyncIterator[als_pb2.StreamAccessLogsMessage], context) -> als_pb2.StreamAccessLogsResponse:
        self.streams += 1
        self.open_streams += 1
        stream_id = self.streams
        try:
            await self.consume(requests, stream_id)
        except asyncio.CancelledError:
            # The server is stopping and Envoy's log stream never ends on its own: cancellation is how
            # it ends, not an error (re-raised, grpc.aio logged a CancelledError traceback at shutdown).
            pass
        finally:
            # Starts this stream reported can no longer complete through it (Envoy reconnects with a new
            # stream after a restart): forget them now rather than after max_age_s.
            dropped = 0
            while (n := self.state.drop_owner(stream_id, self.clock(), at_most=DROP_BATCH)) == DROP_BATCH:
                dropped += n
                await asyncio.sleep(0)  # 100,000 records at once held the loop ~0.5 s
            dropped += n
            self.open_streams -= 1
            if self.open_streams == 0:
                stale = self.state.unowned()  # picks made from here on are the next Envoy's
                for i in range(0, len(stale), DROP_BATCH):
                    if i:
                        await asyncio.sleep(0)
                    dropped += self.state.drop_unowned(stale[i:i + DROP_BATCH], self.clock())
            if dropped:
                log.info("als_stream_ended", stream=stream_id, inflight_dropped=dropped)
        return als_pb2.StreamAccessLogsResponse()

    async def consume(self, requests: AsyncIterator[als_pb2.StreamAccessLogsMessage], stream_id: int = 0) -> None:
        async for msg in requests:
            if not msg.HasField("http_logs"):
                continue
            now = self.clock()
            st = self.state
            for e in msg.http_logs.log_entry:
                self.entries += 1
                common = e.common_properties
                kind = common.access_log_type
                rid = e.request.request_id
                if kind == _START:
                    st.start(now, rid, owner=stream_id)
                    continue
                if kind in _PERIODIC:
                    continue
                src = e.request.request_headers.get(contract.SRC_CELL)
                if src and (self.known_sources is None or src in self.known_sources) and not rid.startswith(BACKGROUND_PROBE_ID):
                    self.completed_by_source[src] = self.completed_by_source.get(src, 0) + 1
                st.complete(now, Completion(
                    request_id=rid,
                    upstream=_address(common.upstream_remote_address),
                    status=e.response.response_code.value,
                    duration_s=_serving_seconds(common),
                    client_abort=_client_abort(e),
                    probe=rid.startswith(BACKGROUND_PROBE_ID),
                    cut=_cut_stream(e),
                ), owner=stream_id)
            if self.on_batch is not None:
                self.on_batch()
