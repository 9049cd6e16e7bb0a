"""gRPC health with the service names a GIE gateway and its pod probes ask an EPP for.

``liveness`` is SERVING while the process answers; ``readiness``, the ExternalProcessor's own name and
the empty name are SERVING while the EPP can pick (its pool has an endpoint) and is not draining;
any other name is SERVICE_UNKNOWN, as GIE's EPP answers. The shared :class:`HealthState` still carries
the drain (``serve_until_signal`` turns it NOT_SERVING).
"""

from __future__ import annotations

from collections.abc import Callable

import grpc

from dlb.service.health import SERVICE, HealthState

LIVENESS, READINESS = "liveness", "readiness"
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
SERVING, NOT_SERVING, SERVICE_UNKNOWN = b"\x08\x01", b"\x08\x02", b"\x08\x03"


def requested_service(request: bytes) -> str | None:
    """``HealthCheckRequest.service`` (field 1, a string) from its wire bytes; None if they do not parse."""
    if not request:
        return ""
    if request[0] != 0x0A:
        return None
    n, shift, i = 0, 0, 1
    while i < len(request):  # varint length
        b = request[i]
        n |= (b & 0x7F) << shift
        i += 1
        if not b & 0x80:
            break
        shift += 7
    raw = request[i:i + n]
    return raw.decode("utf-8", "replace") if len(raw) == n else None


def answer(service: str | None, state: HealthState, ready: Callable[[], bool]) -> bytes:
    if service == LIVENESS:
        return SERVING
    if service in (READINESS, EXT_PROC_SERVICE, ""):
        return SERVING if state.serving and ready() else NOT_SERVING
    return SERVICE_UNKNOWN


def epp_health_handler(state: HealthState, ready: Callable[[], bool]) -> grpc.GenericRpcHandler:
    """``grpc.health.v1.Health/Check`` answering by service name (:func:`answer`)."""

    async def check(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return answer(requested_service(request), state, ready)

    method = grpc.unary_unary_rpc_method_handler(check, request_deserializer=None, response_serializer=None)
    return grpc.method_handlers_generic_handler(SERVICE, {"Check": method})
