"""gRPC wiring: ADS (SotW + delta) and the per-type discovery services on one server.

Two transports (``XdsServer(transport=...)``): ``h2`` (default), DLB's own HTTP/2 server
(``dlb.transport``, driven by ``dlb.xds.h2``), and ``grpc``, a grpc.aio server. At 500–5,000 streams h2
cost the server 45–65 % less CPU per update and a third of the memory per stream (research/xds.md). On grpc.aio, handlers
are registered generically with an identity response serializer; on both, streams send responses
already encoded (see ``dlb.xds.wire``), so resources are serialized once per snapshot, not once per
stream. Requests are parsed with the xds-protos (upb) classes.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import grpc
from envoy.service.discovery.v3 import discovery_pb2

from dlb.errors import BindError
from dlb.log import get_logger
from dlb.transport.h2 import Route
from dlb.transport.limits import H2Limits
from dlb.transport.server import H2GrpcServer
from dlb.xds import types
from dlb.xds.cache import SnapshotCache
from dlb.xds.callbacks import StreamCallbacks
from dlb.xds.delta import DeltaStream
from dlb.xds.h2 import PushQueue, call_route
from dlb.xds.sotw import SotwStream
from dlb.xds.status import StatusRegistry
from dlb.xds.stream import Admission, Authorizer, ServerContext, StreamBase, StreamError, StreamLimits

log = get_logger("dlb.xds.server")

# service name -> (SotW method, delta method, type served; None = ADS)
SERVICES: dict[str, tuple[str, str, str | None]] = {
    "envoy.service.discovery.v3.AggregatedDiscoveryService": ("StreamAggregatedResources", "DeltaAggregatedResources", None),
    "envoy.service.cluster.v3.ClusterDiscoveryService": ("StreamClusters", "DeltaClusters", types.CLUSTER),
    "envoy.service.endpoint.v3.EndpointDiscoveryService": ("StreamEndpoints", "DeltaEndpoints", types.ENDPOINT),
    "envoy.service.listener.v3.ListenerDiscoveryService": ("StreamListeners", "DeltaListeners", types.LISTENER),
    "envoy.service.route.v3.RouteDiscoveryService": ("StreamRoutes", "DeltaRoutes", types.ROUTE),
    "envoy.service.secret.v3.SecretDiscoveryService": ("StreamSecrets", "DeltaSecrets", types.SECRET),
}

# Server-side keepalive: notice dead clients (a stopped Envoy) so their watches are cancelled.
DEFAULT_OPTIONS = [
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.http2.ping_timeout_ms", 10_000),  # what gRPC times the ping out by (60 s by default): dlb.xds.client
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_concurrent_streams", 10_000),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    # A request is a node (tens of KB: Envoy lists its extensions) plus names; 512 KiB is ten times that. Larger
    # ones are refused by gRPC before Python sees them (50 requests with 1 MB node ids kept +112 MB of RSS).
    ("grpc.max_receive_message_length", 512 * 1024),
    # gRPC sets SO_REUSEPORT by default: a second control plane on the same address would then bind
    # "successfully" and silently take half the Envoys. Fail loudly instead.
    ("grpc.so_reuseport", 0),
]

TRANSPORTS = ("h2", "grpc")
#: TCP keepalive on the h2 transport (idle, interval, probes): a vanished Envoy host is noticed in
#: ~60 s and its watches cancelled (grpc.aio's HTTP/2 keepalive above does the same on that transport).
TCP_KEEPALIVE = (30, 10, 3)


def h2_limits(limits: StreamLimits) -> H2Limits:
    """The transport's bounds for an xDS server: a connection per Envoy (all of them may come from one
    address, behind NAT), or many streams on one (grpc clients of one process share a connection), and
    requests bounded as on grpc.aio (``grpc.max_receive_message_length``)."""
    conns = limits.streams + 64  # the streams, plus room for health checks
    return H2Limits(max_connections=conns, max_connections_per_peer=conns, max_concurrent_streams=10_000,
                    max_message=512 * 1024)


class LogBudget:
    """A token bucket for one kind of log line: ``burst`` at once, then ``per_s``; the rest are counted."""

    def __init__(self, per_s: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_s, self.burst, self.clock = per_s, burst, clock
        self._tokens, self._at, self._suppressed = float(burst), clock(), 0

    def allow(self) -> bool:
        now = self.clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.per_s)
        self._at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        self._suppressed += 1
        return False

    def take_suppressed(self) -> int:
        n, self._suppressed = self._suppressed, 0
        return n


def _identity(b: bytes) -> bytes:
    return b


class XdsServer:
    """The xDS management server over a :class:`SnapshotCache`.

    ``authorizer(node, type_url, name) -> bool`` restricts what a node may read (names it may not
    read behave as if they did not exist, and wildcard subscriptions skip them). Combine it with a
    ``node_key`` on the cache that gives each cell its own snapshot. ``callbacks`` observe every
    stream besides the status registry (see ``dlb.xds.callbacks``).

    ``admission(node, auth_context) -> reason | None`` decides whether a peer may be the node it
    claims (with ``credentials`` requiring client certificates, from the certificate gRPC verified);
    a refused stream ends with PERMISSION_DENIED before it sees anything.
    """

    def __init__(self, cache: SnapshotCache, status: StatusRegistry | None = None,
                 authorizer: Authorizer | None = None, make_before_break: bool = True,
                 callbacks: Sequence[StreamCallbacks] = (), admission: Admission | None = None,
                 credentials: grpc.ServerCredentials | None = None, limits: StreamLimits | None = None,
                 transport: str | None = None, ssl_context: ssl.SSLContext | None = None) -> None:
        if transport is None:  # gRPC credentials are for grpc.aio; TLS on h2 is an ssl_context
            transport = "grpc" if credentials is not None else "h2"
        if transport not in TRANSPORTS:
            raise ValueError(f"unknown xDS transport {transport!r} (h2 or grpc)")
        if transport == "h2" and credentials is not None:
            raise ValueError("the h2 xDS transport takes TLS as ssl_context, not gRPC credentials")
        self.ctx = ServerContext(cache=cache, status=status or StatusRegistry(), authorizer=authorizer,
                                 admission=admission, make_before_break=make_before_break, callbacks=callbacks,
                                 limits=limits or StreamLimits())
        self.transport = transport
        self.credentials = credentials  # grpc: None = plaintext
        self.ssl_context = ssl_context  # h2: None = plaintext
        self._server: grpc.aio.Server | None = None
        self._h2: H2GrpcServer | None = None
        self.port = 0
        self._rejections = LogBudget(per_s=1.0, burst=20)

    @property
    def cache(self) -> SnapshotCache:
        return self.ctx.cache

    @property
    def status(self) -> StatusRegistry:
        return self.ctx.status

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        out = []
        for service, (sotw_method, delta_method, fixed) in SERVICES.items():
            out.append(grpc.method_handlers_generic_handler(service, {
                sotw_method: grpc.stream_stream_rpc_method_handler(
                    self._handler(SotwStream, fixed), request_deserializer=discovery_pb2.DiscoveryRequest.FromString,
                    response_serializer=_identity),
                delta_method: grpc.stream_stream_rpc_method_handler(
                    self._handler(DeltaStream, fixed), request_deserializer=discovery_pb2.DeltaDiscoveryRequest.FromString,
                    response_serializer=_identity),
            }))
        return out

    def routes(self) -> dict[str, Route]:
        """Every discovery method as a route of DLB's HTTP/2 transport (``dlb.xds.h2``)."""
        queue = PushQueue()
        out = {}
        for service, (sotw_method, delta_method, fixed) in SERVICES.items():
            out[f"/{service}/{sotw_method}"] = call_route(self.ctx, SotwStream, fixed, queue, self._rejected)
            out[f"/{service}/{delta_method}"] = call_route(self.ctx, DeltaStream, fixed, queue, self._rejected)
        return out

    def _rejected(self, stream: StreamBase, exc: StreamError) -> None:
        """A stream ends for a client's protocol violation or a limit: count it, log it (rate-limited)."""
        if exc.limit is not None:
            self.ctx.status.limit_hit(exc.limit)
        if self._rejections.allow():  # a client opening stream after stream must not flood the log
            stream.log.warning("stream_rejected", code=exc.code.name, reason=str(exc), limit=exc.limit,
                               suppressed=self._rejections.take_suppressed())

    def _handler(self, cls: type[StreamBase], fixed: str | None) -> Callable[..., AsyncIterator[bytes]]:
        ctx = self.ctx

        async def handle(request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            stream = cls(ctx, fixed, context.peer())
            if ctx.admission is not None:
                stream.peer_auth = context.auth_context()
            try:
                async for response in stream.run(request_iterator):
                    yield response
            except StreamError as exc:
                self._rejected(stream, exc)
                await context.abort(exc.code, str(exc))

        return handle

    def add_to(self, server: grpc.aio.Server) -> None:
        server.add_generic_rpc_handlers(tuple(self.handlers()))

    async def start(self, address: str = "127.0.0.1:0", options: list[tuple[str, int]] | None = None,
                    extra_handlers: Sequence[grpc.GenericRpcHandler] = (), extra_routes: Mapping[str, Route] | None = None) -> int:
        """Serve xDS on ``address``; returns the bound port.

        Served next to xDS (e.g. the product's gRPC health service): ``extra_handlers`` on grpc.aio,
        ``extra_routes`` (by ``:path``) on h2; ``options`` are grpc.aio's.
        """
        if self.transport == "h2":
            return await self._start_h2(address, extra_routes or {})
        self._server = grpc.aio.server(options=options or DEFAULT_OPTIONS)
        self.add_to(self._server)
        if extra_handlers:
            self._server.add_generic_rpc_handlers(tuple(extra_handlers))
        try:
            self.port = (self._server.add_insecure_port(address) if self.credentials is None
                         else self._server.add_secure_port(address, self.credentials))
        except RuntimeError:  # grpcio >= 1.5x raises instead of returning 0
            self.port = 0
        if self.port == 0:
            raise BindError(address, "gRPC could not bind it (in use?)")
        await self._server.start()
        log.info("xds_server_listening", address=address, port=self.port, boot_id=self.cache.boot_id)
        return self.port

    async def _start_h2(self, address: str, extra_routes: Mapping[str, Route]) -> int:
        host, _, port = address.rpartition(":")
        routes = {**self.routes(), **extra_routes}
        first = next(iter(routes))
        server = H2GrpcServer(first, routes[first].handler, limits=h2_limits(self.ctx.limits), routes=routes,
                              tcp_keepalive=TCP_KEEPALIVE)
        try:
            self.port = await server.start(host.strip("[]"), int(port), ssl=self.ssl_context)
        except OSError as exc:
            raise BindError(address, str(exc)) from exc
        self._h2 = server
        log.info("xds_server_listening", address=address, port=self.port, boot_id=self.cache.boot_id, transport="h2")
        return self.port

    def transport_families(self, prefix: str) -> list[Any]:
        """h2: the transport's counters as Prometheus families (``<prefix>_h2_*``): its bounds, counted as the
        ext_proc services' are; nothing on grpc."""
        return self._h2.stats.families(prefix) if self._h2 is not None else []

    def transport_stats(self) -> dict[str, int]:
        """h2: the transport's counters (connections accepted, closed by which bound, ...); empty on grpc."""
        return dict(vars(self._h2.stats)) if self._h2 is not None else {}

    def notify(self, path: str, message: bytes) -> None:
        """h2: send ``message`` on every open watch call of ``path`` (the health service's Watch)."""
        if self._h2 is not None:
            self._h2.notify(path, message)

    async def stop(self, grace: float | None = 0.5) -> None:
        if self._h2 is not None:
            server, self._h2 = self._h2, None
            await server.stop(grace if grace else 0.1)
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
