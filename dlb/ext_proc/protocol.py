"""Envoy ext_proc plumbing shared by the root and the leaf: pre-built responses and a raw-bytes handler.

Why pre-serialised bytes: a per-request ``ProcessingResponse`` build + serialise costs several µs of
Python; the answers are drawn from a small fixed set (one per destination cell, plus a few
"continue" and error replies), so we serialise them once at start-up and register the handler with
an identity response serializer — the hot path then only parses the request and picks.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.type.v3 import http_status_pb2

from dlb.errors import BindError
from dlb.service.grpc_bounds import bounded_options
from dlb.service.health import WATCH_PATH, HealthState, h2_health_routes, health_handler
from dlb.service.ports import add_port
from dlb.transport.h2 import CALL, Later
from dlb.transport.h2 import Handler as MessageHandler  # one definition for both transports
from dlb.transport.limits import H2Limits
from dlb.transport.server import H2GrpcServer

if TYPE_CHECKING:  # pragma: no cover
    from dlb.config.tls import TlsIdentity

PROCESS_METHOD = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


def header_response(set_headers: Sequence[tuple[str, str]], remove: Sequence[str] = (), clear_route_cache: bool = True) -> bytes:
    """A request-headers reply that sets/removes headers (and re-resolves the route)."""
    mutation = ep.HeaderMutation(
        set_headers=[base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=k, raw_value=v.encode()), append_action=_OVERWRITE)
                     for k, v in set_headers],
        remove_headers=list(remove),
    )
    common = ep.CommonResponse(header_mutation=mutation, clear_route_cache=clear_route_cache)
    return ep.ProcessingResponse(request_headers=ep.HeadersResponse(response=common)).SerializeToString()


def immediate_response(code: int, body: str, details: str, *, content_type: str = "text/plain",
                       extra_headers: Sequence[tuple[str, str]] = ()) -> bytes:
    """A local reply (Envoy answers the client without going upstream)."""
    hdrs = [("content-type", content_type), *extra_headers]
    resp = ep.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=code),
        headers=ep.HeaderMutation(set_headers=[base_pb2.HeaderValueOption(
            header=base_pb2.HeaderValue(key=k, raw_value=v.encode()), append_action=_OVERWRITE) for k, v in hdrs]),
        body=body.encode(),
        details=details,
    )
    return ep.ProcessingResponse(immediate_response=resp).SerializeToString()


def openai_error(code: int, message: str, err_type: str, err_code: str, *, retry_after_s: int | None = None) -> bytes:
    """A local reply shaped as the OpenAI API's errors: ``{"error": {"message", "type", "param", "code"}}``.

    DLB sits in front of OpenAI-compatible servers, so its own replies must read like theirs: an
    OpenAI SDK shows ``message`` and ``code`` from this body (a text/plain body surfaced only as
    "Error code: 503"), and retries 5xx on its own honouring ``retry-after``, which is therefore set
    where waiting helps (no usable cell now) and left out where it cannot (no endpoint for a path).
    ``err_code`` doubles as Envoy's response-code details, so access logs and replies name it alike.
    """
    body = json.dumps({"error": {"message": message, "type": err_type, "param": None, "code": err_code}})
    extra = [("retry-after", str(retry_after_s))] if retry_after_s is not None else []
    return immediate_response(code, body, err_code, content_type="application/json", extra_headers=extra)


#: "Continue unchanged" for every other phase, in case an Envoy config sends more than request headers.
CONTINUE = {
    "request_headers": ep.ProcessingResponse(request_headers=ep.HeadersResponse()).SerializeToString(),
    "response_headers": ep.ProcessingResponse(response_headers=ep.HeadersResponse()).SerializeToString(),
    "request_body": ep.ProcessingResponse(request_body=ep.BodyResponse()).SerializeToString(),
    "response_body": ep.ProcessingResponse(response_body=ep.BodyResponse()).SerializeToString(),
    "request_trailers": ep.ProcessingResponse(request_trailers=ep.TrailersResponse()).SerializeToString(),
    "response_trailers": ep.ProcessingResponse(response_trailers=ep.TrailersResponse()).SerializeToString(),
}


def header_value(h: base_pb2.HeaderValue) -> str:
    """Envoy sends ``raw_value`` (bytes) in current versions and ``value`` in old ones."""
    raw = h.raw_value
    return raw.decode("utf-8", "replace") if raw else h.value


def ext_proc_handler(handle: MessageHandler) -> grpc.GenericRpcHandler:
    """Register a synchronous ``handle`` as ExternalProcessor.Process on a grpc.aio server.

    Requests arrive as raw bytes (the handler parses them) and replies leave as the handler's
    pre-serialised bytes (identity serializer): the same contract as the HTTP/2 transport.
    """

    async def process(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        tp = next((v for k, v in context.invocation_metadata() or () if k == "traceparent"), None)
        traceparent = tp.encode() if isinstance(tp, str) else tp
        state = None
        async for raw in requests:
            CALL.traceparent = traceparent  # other calls ran while this one awaited its message
            CALL.state = state
            reply, end = handle(raw)
            state = CALL.state
            if isinstance(reply, Later):  # a held request: its answer comes when the future resolves
                if reply.now is not None:
                    yield reply.now
                later = reply.later
                try:
                    reply = await later  # type: ignore[misc]  # an asyncio.Future on this transport
                finally:
                    later.cancel()  # no-op once resolved; if the stream ended first, the request is gone
            if reply is not None:
                yield reply
            if end:
                return

    method = grpc.stream_stream_rpc_method_handler(process, request_deserializer=None, response_serializer=_identity)
    return grpc.method_handlers_generic_handler("envoy.service.ext_proc.v3.ExternalProcessor", {"Process": method})


def _identity(b: bytes) -> bytes:
    return b


class ExtProcServer:
    """The ext_proc listener on either transport, behind one ``bind`` / ``stop``.

    ``h2`` (:mod:`dlb.transport.h2`) calls ``handle(message) -> (reply, end)`` inline from the
    socket; ``grpc`` calls it from grpc.aio's stream (:func:`ext_proc_handler`). Same bytes in and out.
    With ``tls`` both serve mutual TLS only (a client certificate from the config's CA).
    """

    def __init__(self, transport: str, handle: MessageHandler, limits: H2Limits | None = None,
                 health: HealthState | None = None, tls: TlsIdentity | None = None) -> None:
        if transport not in ("h2", "grpc"):
            raise ValueError(f"unknown ext_proc transport {transport!r} (h2 or grpc)")
        self.tls = tls
        #: grpc.health.v1 status on either transport (Check on both, Watch on h2); serve_until_signal
        #: turns it NOT_SERVING when a drain starts. ``health`` shares a process's status (the leaf's).
        self.health = health if health is not None else HealthState()
        self._h2 = None
        if transport == "h2":
            h2 = H2GrpcServer(PROCESS_METHOD, handle, limits=limits or H2Limits(), routes=h2_health_routes(self.health))
            self.health.listeners.append(lambda reply: h2.notify(WATCH_PATH, reply))
            self._h2 = h2
        self._handle = handle
        self._grpc: grpc.aio.Server | None = None

    @property
    def stats(self):
        return self._h2.stats if self._h2 is not None else None

    def has_clients(self) -> bool:
        """True while a client (its Envoy) is connected; always True on grpc.aio, which does not say."""
        return self._h2 is None or self._h2.connections > 0

    async def bind(self, listen: str, reuse_port: bool = False) -> int:
        """Listen on ``host:port`` (port 0 = any) and serve; returns the port. Raises :class:`BindError`."""
        host, _, port_s = listen.rpartition(":")
        try:
            port = int(port_s)
        except ValueError:
            raise BindError(listen, "the port is not a number") from None
        if self._h2 is not None:
            try:
                ssl_context = self.tls.server_ssl_context() if self.tls is not None else None
                return await self._h2.start(host.strip("[]") or "127.0.0.1", port, reuse_port=reuse_port, ssl=ssl_context)
            except OSError as exc:
                raise BindError(listen, exc.strerror or str(exc)) from None
        self._grpc = grpc.aio.server(options=bounded_options(10_000, reuse_port))
        self._grpc.add_generic_rpc_handlers((ext_proc_handler(self._handle), health_handler(self.health)))
        bound = add_port(self._grpc, listen, self.tls)
        await self._grpc.start()
        return bound

    async def stop(self, grace_s: float = 2.0) -> None:
        if self._h2 is not None:
            await self._h2.stop(grace_s)
        if self._grpc is not None:
            await self._grpc.stop(grace_s)
