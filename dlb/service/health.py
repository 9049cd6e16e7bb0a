"""The standard gRPC health service (``grpc.health.v1.Health/Check``) for DLB's grpc.aio servers.

Why: Envoy health-checks the clusters of DLB's gRPC services (``grpc_health_check``), and a service
that is shutting down must say so before it stops listening — SIGTERM turns the status to
NOT_SERVING, Envoy stops opening streams to it (and fails open), the streams in flight finish, then
the process exits (:func:`dlb.service.serve.serve_until_signal`).

Why hand-coded rather than ``grpcio-health-checking``: the two messages are one field each
(``HealthCheckRequest{string service = 1}``, ``HealthCheckResponse{ServingStatus status = 1}``), and
that package pins protobuf ranges the shared environment cannot follow. The wire bytes below are
the protobuf encodings of those messages (field 1, varint). On grpc.aio only ``Check`` is offered
(Envoy and ``grpc_health_probe`` use it; ``Watch`` gets UNIMPLEMENTED); DLB's HTTP/2 transport serves
``Check`` and ``Watch`` (:func:`h2_health_routes`: a watcher gets the status at once and again on
every change).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from dlb.transport.h2 import Route

SERVICE = "grpc.health.v1.Health"
SERVING, NOT_SERVING = 1, 2
#: HealthCheckResponse{status: SERVING} / {status: NOT_SERVING}, pre-encoded.
_REPLY = {SERVING: b"\x08\x01", NOT_SERVING: b"\x08\x02"}


CHECK_PATH, WATCH_PATH = f"/{SERVICE}/Check", f"/{SERVICE}/Watch"


@dataclass
class HealthState:
    """One serving flag for the whole process (every service name gets the same answer).

    Setting ``serving`` calls every listener (the HTTP/2 transport's Watch calls) when it changes.
    """

    _serving: bool = True
    listeners: list[Callable[[bytes], None]] = field(default_factory=list)

    @property
    def serving(self) -> bool:
        return self._serving

    @serving.setter
    def serving(self, value: bool) -> None:
        changed = value != self._serving
        self._serving = value
        if changed:
            for listener in list(self.listeners):
                listener(self.reply())

    def reply(self) -> bytes:
        return _REPLY[SERVING if self._serving else NOT_SERVING]

    def check(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return self.reply()


def health_handler(state: HealthState) -> grpc.GenericRpcHandler:
    """Register ``Health/Check`` on a grpc.aio server: ``server.add_generic_rpc_handlers((health_handler(s),))``."""

    async def check(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return state.check(request, context)

    method = grpc.unary_unary_rpc_method_handler(check, request_deserializer=None, response_serializer=None)
    return grpc.method_handlers_generic_handler(SERVICE, {"Check": method})


def h2_health_routes(state: HealthState) -> dict[str, Route]:
    """``Check`` and ``Watch`` on DLB's HTTP/2 transport (the request message is not read: one status
    serves every service name). Subscribe the server's ``notify(WATCH_PATH, reply)`` to ``state``."""
    return {CHECK_PATH: Route(lambda _request: (state.reply(), True)),
            WATCH_PATH: Route(lambda _request: (state.reply(), False), watch=True)}


def decode_status(reply: bytes) -> int:
    """The ``status`` of a serialised HealthCheckResponse (for clients and tests without the proto)."""
    if len(reply) >= 2 and reply[0] == 0x08:
        return reply[1]
    return 0  # UNKNOWN (proto3 default: an empty message)
