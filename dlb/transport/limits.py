"""The bounds of DLB's HTTP/2 server and the counters that show when one was hit.

Why one place: every resource a peer can make the server hold — connections, streams, header-block
cache, half-received messages, time before a handshake or while idle — has a bound here, and each
bound has a counter in :class:`TransportStats` (exported as ``dlb_{root,leaf}_h2_*``, listed in
``dlb/metric_catalogue.py``), so an operator sees an attack or a too-tight limit instead of silently
dropped traffic. The numbers are sized for what Envoy sends to an ext_proc server: header blocks of a
few hundred bytes that repeat, one stream per user request, messages of a few KB (issue 14, rows 1-3:
without these, 64 cacheable 245 KB header blocks kept 34 MB per connection, 10,000 streams made each
stream-0 frame walk them all, and 20,000 idle connections used up the file descriptors).
"""

from __future__ import annotations

import math
import resource
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client import Metric

#: The largest value a SETTINGS parameter can carry (RFC 9113 §6.5.1: 32 bits).
SETTINGS_VALUE_MAX = 2**32 - 1

#: File descriptors kept free for everything else in the process (``/metrics``, probes, xDS, logs).
FD_RESERVE = 128


def default_max_connections() -> int:
    """4096, or fewer when the process's file-descriptor limit would not leave :data:`FD_RESERVE` free."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 4096
    return max(16, min(4096, soft - FD_RESERVE))


@dataclass(frozen=True)
class H2Limits:
    """Per-server bounds (``max_*_total`` are shared by all connections of one server)."""

    max_connections: int = 0  # 0: default_max_connections() at server start
    #: Connections from one peer address; 0: a quarter of the connection cap, at least 64 (or the cap).
    #: Envoy keeps one per worker thread (more past ``max_concurrent_streams``).
    max_connections_per_peer: int = 0
    #: Advertised in SETTINGS; a stream beyond it gets RST_STREAM(REFUSED_STREAM) (Envoy opens another
    #: connection when it reaches a server's limit).
    max_concurrent_streams: int = 1000
    #: Seconds from accept to a complete client preface (under TLS: the TLS handshake, then the
    #: preface); a slow-loris at 1 byte/s never gets there.
    handshake_timeout_s: float = 10.0
    #: Seconds from accept to the connection's first stream; a peer that sends the preface and SETTINGS
    #: and then nothing held a slot for the whole idle timeout (4,300 of them locked Envoy out for
    #: 5 minutes). Checked from the handshake deadline on, so at least ``handshake_timeout_s``.
    first_stream_timeout_s: float = 10.0
    #: TLS handshakes in progress, all connections: each holds
    #: ~50 KB of OpenSSL state; beyond it a new connection's first bytes close it (Envoy reconnects).
    max_pending_tls_handshakes: int = 128
    #: Seconds a connection may stay with no stream open before GOAWAY(NO_ERROR) and close.
    idle_timeout_s: float = 300.0
    #: Decoded header list (RFC 9113 SETTINGS_MAX_HEADER_LIST_SIZE) and the raw block while it is
    #: assembled from CONTINUATION frames; Envoy's ext_proc headers are a few hundred bytes.
    max_header_list: int = 64 * 1024
    #: Bytes of cached decoded header blocks per connection and in total (key + decoded fields).
    header_cache_bytes: int = 64 * 1024
    header_cache_total_bytes: int = 16 * 1024 * 1024
    #: Bytes of half-received gRPC messages per connection and in total.
    max_buffered: int = 16 * 1024 * 1024
    max_buffered_total: int = 64 * 1024 * 1024
    #: Gracefully closed stream ids remembered per connection, to answer frames on them with
    #: STREAM_CLOSED (RFC 9113 §5.1); older ones are forgotten and their frames dropped.
    closed_streams_remembered: int = 64
    #: Control frames (SETTINGS, PING, PRIORITY, RST_STREAM, WINDOW_UPDATE) a peer may send beyond
    #: 10 per stream opened or DATA frame sent to it; more is a flood (ENHANCE_YOUR_CALM).
    control_frame_allowance: int = 10_000
    #: Largest gRPC message a client may send (grpc's default); a larger one ends its call RESOURCE_EXHAUSTED.
    max_message: int = 4 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("max_concurrent_streams", "max_header_list", "header_cache_bytes", "max_buffered",
                     "closed_streams_remembered", "control_frame_allowance", "max_pending_tls_handshakes", "max_message"):
            if getattr(self, name) < 1:
                raise ValueError(f"H2Limits.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_connections < 0:
            raise ValueError(f"H2Limits.max_connections must be >= 0 (0 = default), got {self.max_connections}")
        for name in ("max_concurrent_streams", "max_header_list"):  # sent in SETTINGS: 32-bit values
            if getattr(self, name) > SETTINGS_VALUE_MAX:
                raise ValueError(f"H2Limits.{name} must be <= {SETTINGS_VALUE_MAX} (a SETTINGS value), got {getattr(self, name)}")
        if self.max_connections_per_peer < 0:
            raise ValueError(f"H2Limits.max_connections_per_peer must be >= 0 (0 = default), got {self.max_connections_per_peer}")
        for name in ("handshake_timeout_s", "idle_timeout_s", "first_stream_timeout_s"):  # inf or nan would be no bound at all
            if not 0 < getattr(self, name) < math.inf:
                raise ValueError(f"H2Limits.{name} must be > 0 and finite, got {getattr(self, name)}")

        if self.first_stream_timeout_s < self.handshake_timeout_s:
            raise ValueError(f"H2Limits.first_stream_timeout_s ({self.first_stream_timeout_s}) must be >= handshake_timeout_s "
                             f"({self.handshake_timeout_s}): the first stream comes after the preface")

    def connection_cap(self) -> int:
        return self.max_connections or default_max_connections()

    def peer_cap(self) -> int:
        cap = self.connection_cap()
        return self.max_connections_per_peer or max(cap // 4, min(cap, 64))


#: (field, metric suffix doc) of the counters; the gauges follow.
_COUNTERS = (
    ("connections", "HTTP/2 connections accepted from Envoy"),
    ("messages", "gRPC messages received"),
    ("grpc_errors", "Calls ended with a non-OK gRPC status"),
    ("stream_resets", "Streams reset with an error code"),
    ("connection_errors", "Connections closed for a protocol error (GOAWAY)"),
    ("handler_errors", "Messages whose handler raised"),
    ("connections_refused", "Connections closed at accept: the connection cap was reached"),
    ("connections_evicted", "Streamless connections closed to admit a new one"),
    ("first_stream_timeouts", "Connections closed for opening no stream in time"),
    ("handshake_timeouts", "Connections closed for no TLS handshake and HTTP/2 preface in time"),
    ("tls_failures", "Connections closed for a TLS failure"),
    ("tls_handshakes_refused", "Connections closed: too many TLS handshakes in progress"),
    ("idle_timeouts", "Connections closed idle (no stream open)"),
    ("streams_refused", "Streams refused: stream cap reached or shutting down"),
    ("header_cache_refused", "Header blocks not cached: a cache bound was hit"),
    ("buffer_limit_hits", "Connections cut for too many partial-message bytes"),
    ("control_floods", "Connections cut for a flood of control frames (ENHANCE_YOUR_CALM)"),
    ("non_grpc_requests", "Non-gRPC requests, answered 415/405"),
)
_GAUGES = (
    ("open_connections", "HTTP/2 connections open now"),
    ("tls_handshakes_pending", "TLS handshakes in progress"),
    ("header_cache_bytes", "Bytes of cached header blocks"),
    ("buffered_bytes", "Bytes of partial gRPC messages held"),
)


@dataclass
class TransportStats:
    """Counters and gauges for the service's /metrics, shared by all connections of one server.

    Read at scrape time, never on the request path. The gauges double as the running totals the
    per-server bounds are checked against.
    """

    connections: int = 0
    streams: int = 0
    messages: int = 0
    grpc_errors: int = 0  # streams ended with a non-OK gRPC status
    stream_resets: int = 0  # RST_STREAM sent
    connection_errors: int = 0  # GOAWAY with an error code sent
    handler_errors: int = 0
    connections_refused: int = 0
    connections_evicted: int = 0
    first_stream_timeouts: int = 0
    handshake_timeouts: int = 0
    tls_failures: int = 0
    tls_handshakes_refused: int = 0
    idle_timeouts: int = 0
    streams_refused: int = 0
    header_cache_refused: int = 0
    buffer_limit_hits: int = 0
    control_floods: int = 0
    non_grpc_requests: int = 0
    open_connections: int = 0
    tls_handshakes_pending: int = 0
    header_cache_bytes: int = 0
    buffered_bytes: int = 0

    def families(self, prefix: str) -> list[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        out: list[Metric] = [CounterMetricFamily(f"{prefix}_h2_{name}", doc, value=getattr(self, name)) for name, doc in _COUNTERS]
        out += [GaugeMetricFamily(f"{prefix}_h2_{name}", doc, value=getattr(self, name)) for name, doc in _GAUGES]
        return out
