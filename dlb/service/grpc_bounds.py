"""The bounds every DLB grpc.aio listener keeps whatever connects to it (the leaf's probe and ext_proc
port, its access-log port, the root's grpc transport), exported as ``dlb_<service>_grpc_limit{limit}``.

Why: with gRPC's defaults a connection that never completes its handshake is held for 120 s and the
number of connections is unbounded. Measured on a leaf: 1,500 idle TCP connections to the probe port,
no certificate needed, were each held 120 s (+22 MB); with the process's file limit reached the agent
could no longer read its Envoy or servers and its cell went out of service. DLB's own HTTP/2 transport
(the root's ext_proc, the xDS server) already closes such a peer within 10 s; these are the same bounds
on gRPC core's side.
"""

from __future__ import annotations

from typing import Any

#: A connection must finish its TLS and HTTP/2 handshake within this (gRPC's default: 120 s).
HANDSHAKE_TIMEOUT_S = 10.0
#: Connections a listener holds at once; past it gRPC closes a new one at accept. A leaf's legitimate
#: peers are its cell's roots, the control planes and its Envoy: tens. Well under a 1,024-file limit.
MAX_CONNECTIONS = 256
#: A connection with no call for this long is closed (a peer that probes or streams never idles this long;
#: one that does reconnects at its next call). It was 600 s: 256 connections that sent the HTTP/2 preface
#: and went quiet held a leaf's probe port shut to new roots for 10 minutes.
MAX_CONNECTION_IDLE_S = 30.0


def bounded_options(max_streams: int, reuse_port: bool = False) -> list[tuple[str, Any]]:
    """gRPC core channel arguments for a server: the bounds above and ``max_streams`` per connection."""
    return [("grpc.so_reuseport", int(reuse_port)), ("grpc.max_concurrent_streams", max_streams),
            ("grpc.server_handshake_timeout_ms", int(HANDSHAKE_TIMEOUT_S * 1000)),
            ("grpc.max_allowed_incoming_connections", MAX_CONNECTIONS),
            ("grpc.max_connection_idle_ms", int(MAX_CONNECTION_IDLE_S * 1000))]


def limit_samples() -> dict[str, float]:
    """The bounds as metric samples (the per-connection stream caps differ per listener and are not here)."""
    return {"handshake_timeout_s": HANDSHAKE_TIMEOUT_S, "max_connections": MAX_CONNECTIONS,
            "max_connection_idle_s": MAX_CONNECTION_IDLE_S}
