"""Bounds of the EPP's gRPC listener, whatever a peer sends (GIE gateways, or anything that reaches the port).

Why each: an ext_proc stream lives as long as its request (minutes when streaming), so streams are capped
in the handler, refused with RESOURCE_EXHAUSTED (the gateway's ``failureMode`` then decides) and counted;
``maximum_concurrent_rpcs`` caps every RPC a little above that, so health checks and probes still answer
when ext_proc is full. A message is at most one body chunk or header block (4 MiB, gRPC's default, said
out loud); metadata is capped; a peer pinging faster than ``min_ping_interval_s`` without data is cut after
``max_ping_strikes``; the server pings a quiet peer and drops one that does not answer, so a vanished
gateway's streams are released; a connection with no stream is closed after ``max_connection_idle_s``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import grpc

#: RPCs beyond the ext_proc stream cap that gRPC still admits: health checks and DLB probes.
RPC_HEADROOM = 64


@dataclass(frozen=True)
class GrpcLimits:
    """The listener's bounds; each is one ``dlb_epp_grpc_limit{limit}`` sample."""

    max_streams: int = 10_000
    max_message_bytes: int = 4 * 1024 * 1024
    max_metadata_bytes: int = 64 * 1024
    keepalive_time_s: float = 60.0
    keepalive_timeout_s: float = 20.0
    min_ping_interval_s: float = 10.0
    max_ping_strikes: int = 2
    max_connection_idle_s: float = 600.0

    def __post_init__(self) -> None:
        for name, v in asdict(self).items():
            if not 0 < v < math.inf:
                raise ValueError(f"{name} must be > 0 and finite, got {v}")

    @property
    def max_rpcs(self) -> int:
        return self.max_streams + RPC_HEADROOM

    def server_options(self) -> list[tuple[str, Any]]:
        """gRPC core channel arguments (``doc/keepalive.md`` and ``grpc_types.h`` name them)."""
        ms = lambda s: int(s * 1000)
        return [("grpc.so_reuseport", 0), ("grpc.max_concurrent_streams", self.max_rpcs),
                ("grpc.max_receive_message_length", self.max_message_bytes), ("grpc.max_send_message_length", self.max_message_bytes),
                ("grpc.max_metadata_size", self.max_metadata_bytes),
                ("grpc.keepalive_time_ms", ms(self.keepalive_time_s)), ("grpc.keepalive_timeout_ms", ms(self.keepalive_timeout_s)),
                # gRPC times a keepalive ping out after this (60 s by default), not keepalive_timeout: dlb.xds.client.
                ("grpc.http2.ping_timeout_ms", ms(self.keepalive_timeout_s)),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.min_recv_ping_interval_without_data_ms", ms(self.min_ping_interval_s)),
                ("grpc.http2.max_ping_strikes", self.max_ping_strikes),
                ("grpc.max_connection_idle_ms", ms(self.max_connection_idle_s))]

    def server(self) -> grpc.aio.Server:
        return grpc.aio.server(options=self.server_options(), maximum_concurrent_rpcs=self.max_rpcs)

    def samples(self) -> dict[str, float]:
        return {"max_rpcs": self.max_rpcs, **asdict(self)}


@dataclass
class StreamGate:
    """Open ext_proc streams and the ones refused at the cap (event-loop only: plain ints)."""

    limit: int
    open: int = 0
    refused: int = 0

    def enter(self) -> bool:
        if self.open >= self.limit:
            self.refused += 1
            return False
        self.open += 1
        return True

    def leave(self) -> None:
        self.open -= 1
