"""The standard gRPC health service (``grpc.health.v1.Health/Check``) for DLB's grpc.aio servers.

Why: Envoy health-checks the clusters of DLB's gRPC services (``grpc_health_check``), and a service
that is shutting down must say so before it stops listening — SIGTERM turns the status to
NOT_SERVING, Envoy stops opening streams to it (and fails open), the streams in flight finish, then
the process exits (:func:`dlb.ext_proc.protocol.serve_until_signal`).

Why hand-coded rather than ``grpcio-health-checking``: the two messages are one field each
(``HealthCheckRequest{string service = 1}``, ``HealthCheckResponse{ServingStatus status = 1}``), and
that package pins protobuf ranges the shared environment cannot follow. The wire bytes below are
the protobuf encodings of those messages (field 1, varint); ``Watch`` is not offered (Envoy and
``grpc_health_probe`` use ``Check``; a client calling ``Watch`` gets UNIMPLEMENTED).
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

SERVICE = "grpc.health.v1.Health"
SERVING, NOT_SERVING = 1, 2
#: HealthCheckResponse{status: SERVING} / {status: NOT_SERVING}, pre-encoded.
_REPLY = {SERVING: b"\x08\x01", NOT_SERVING: b"\x08\x02"}


@dataclass
class HealthState:
    """One serving flag for the whole process (every service name gets the same answer)."""

    serving: bool = True

    def check(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return _REPLY[SERVING if self.serving else NOT_SERVING]


def health_handler(state: HealthState) -> grpc.GenericRpcHandler:
    """Register ``Health/Check`` on a grpc.aio server: ``server.add_generic_rpc_handlers((health_handler(s),))``."""

    async def check(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return state.check(request, context)

    method = grpc.unary_unary_rpc_method_handler(check, request_deserializer=None, response_serializer=None)
    return grpc.method_handlers_generic_handler(SERVICE, {"Check": method})


def decode_status(reply: bytes) -> int:
    """The ``status`` of a serialised HealthCheckResponse (for clients and tests without the proto)."""
    if len(reply) >= 2 and reply[0] == 0x08:
        return reply[1]
    return 0  # UNKNOWN (proto3 default: an empty message)
