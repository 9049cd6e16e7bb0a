"""The asyncio side of DLB's HTTP/2 gRPC server: sockets, timers, the connection cap and the drain.

Why apart from :mod:`.h2`: the connection there is sans-I/O (bytes in, bytes out) and is tested and
fuzzed without sockets; everything that needs a clock or a file descriptor lives here. Each bound is
an :class:`~.limits.H2Limits` field with a counter in :class:`~.limits.TransportStats`:

- a connection cap: beyond it an accepted socket is closed at once, so the process keeps file
  descriptors for ``/metrics``, probes and xDS (20,000 idle connections exhausted them, issue 14 row 3);
- a handshake timeout: a client that has not sent the whole preface in time is dropped (a 1 byte/s
  slow-loris never finished it and was never dropped);
- an idle timeout: a connection with no stream open for a whole period gets GOAWAY(NO_ERROR) and is
  closed (Envoy reconnects on its next request). Checked by a timer per period, not per byte.

Stopping drains: the listener closes, every connection gets GOAWAY(NO_ERROR) (new streams refused,
Envoy retries them elsewhere), watch calls end, the streams in flight get ``grace_s`` to finish,
then the sockets close.
"""

from __future__ import annotations

import asyncio
import ssl as ssl_module
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import cast

from dlb.ext_proc.transport.h2 import ConnectionTerminated, GrpcStatus, H2Connection, Handler, Route
from dlb.ext_proc.transport.limits import H2Limits, TransportStats
from dlb.log import get_logger

log = get_logger("dlb.h2server")


class H2GrpcProtocol(asyncio.Protocol):
    """One connection: socket bytes to :class:`H2Connection` and back, plus its two timers."""

    def __init__(self, conn: H2Connection, on_close: Callable[[H2GrpcProtocol], None], refuse: bool = False,
                 admit: Callable[[H2GrpcProtocol], bool] | None = None) -> None:
        self.conn = conn
        self.on_close = on_close
        self.refuse = refuse
        #: Called when the connection is made (after the TLS handshake under TLS): False = over the cap.
        self.admit = admit
        self.transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._opened_seen = -1
        #: Set by H2GrpcServer.stop: called whenever this connection has no stream left.
        self.on_drained: Callable[[], None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport; not an isinstance check: uvloop's TCPTransport does not derive from
        # asyncio.Transport (an assert here dropped every connection under uvloop).
        self.transport = stream = cast("asyncio.Transport", transport)
        stats = self.conn.stats
        if self.refuse or (self.admit is not None and not self.admit(self)):
            self.refuse = True
            stats.connections_refused += 1
            if stats.connections_refused == 1 or stats.connections_refused % 1000 == 0:
                log.warning("h2_connection_cap_reached", refused=stats.connections_refused)
            stream.abort()
            return
        stats.open_connections += 1
        self.conn.initiate()
        stream.write(self.conn.data_to_send())
        self._timer = asyncio.get_running_loop().call_later(self.conn.limits.handshake_timeout_s, self._handshake_check)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.refuse:
            self.conn.stats.open_connections -= 1
            self.conn.connection_lost()
        self.on_close(self)
        if self.on_drained is not None:
            self.on_drained()

    def _handshake_check(self) -> None:
        if not self.conn.preface_seen:
            self.conn.stats.handshake_timeouts += 1
            self._close()
            return
        self._idle_check()

    def _idle_check(self) -> None:
        """Every idle period: close if no stream was open at the last check and none opened since."""
        conn = self.conn
        if not conn.streams and conn.streams_opened == self._opened_seen:
            conn.stats.idle_timeouts += 1
            self.shutdown()
            return
        self._opened_seen = conn.streams_opened if not conn.streams else -1
        self._timer = asyncio.get_running_loop().call_later(conn.limits.idle_timeout_s, self._idle_check)

    def pause_writing(self) -> None:
        # The peer stopped reading: stop reading its requests too, so our buffer stays bounded.
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        events = conn.receive_data(data)
        if conn.out:  # (inline _flush: this runs once per request)
            out = conn.data_to_send()
            transport = self.transport
            if transport is not None and not transport.is_closing():
                transport.write(out)
        for ev in events:
            if isinstance(ev, ConnectionTerminated):
                log.warning("h2_connection_error", code=ev.error_code.name, reason=ev.reason)
                self._close()
        if self.on_drained is not None and not conn.streams:
            self.on_drained()

    def flush(self) -> None:
        out = self.conn.data_to_send()
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(out)

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def shutdown(self) -> None:
        """GOAWAY(NO_ERROR) so Envoy opens new streams elsewhere, then close."""
        self.conn.close()
        self.flush()
        self._close()


@dataclass
class H2GrpcServer:
    """The listening socket and its connections (``start`` / ``stop`` like a grpc.aio server).

    ``routes`` adds methods beside ``path`` (e.g. the gRPC health service); :meth:`notify` sends a
    message on every open watch call of one of them.
    """

    path: str
    handler: Handler
    stats: TransportStats = field(default_factory=TransportStats)
    limits: H2Limits = field(default_factory=H2Limits)
    routes: Mapping[str, Route] = field(default_factory=dict)
    _server: asyncio.AbstractServer | None = None
    _conns: set[H2GrpcProtocol] = field(default_factory=set)

    async def start(self, host: str, port: int, reuse_port: bool = False, ssl: ssl_module.SSLContext | None = None) -> int:
        """Listen and return the bound port (``port=0`` picks a free one); with ``ssl``, TLS (its ALPN must
        offer h2), the TLS handshake bounded by the same handshake timeout as the preface."""
        path = self.path.encode()
        routes = {p.encode(): r for p, r in self.routes.items()}
        cap = self.limits.connection_cap()

        def admit(proto: H2GrpcProtocol) -> bool:
            # Counted when the connection is *made*, not when the factory runs: under TLS the factory
            # runs at accept and a connection whose handshake fails is never made (nor lost) — counted
            # at accept, each failed handshake stayed in the set for good and after `cap` of them every
            # new connection, Envoy's too, was refused.
            if len(self._conns) >= cap:
                return False
            self._conns.add(proto)
            return True

        def factory() -> H2GrpcProtocol:
            return H2GrpcProtocol(H2Connection(path, self.handler, self.stats, self.limits, routes), self._conns.discard, admit=admit)

        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            factory, host, port, reuse_port=reuse_port or None, backlog=1024, ssl=ssl,
            ssl_handshake_timeout=self.limits.handshake_timeout_s if ssl is not None else None)
        # (asyncio and uvloop set TCP_NODELAY on accepted connections themselves.)
        return int(self._server.sockets[0].getsockname()[1])

    def notify(self, path: str, message: bytes) -> None:
        """Send ``message`` on every open watch call of ``path`` on every connection."""
        route = self.routes[path]
        for proto in list(self._conns):
            proto.conn.notify(route, message)
            proto.flush()

    @property
    def open_streams(self) -> int:
        return sum(len(p.conn.streams) for p in self._conns)

    async def stop(self, grace_s: float = 2.0) -> None:
        """Stop listening, GOAWAY every connection, let the streams in flight finish (up to
        ``grace_s``), then close."""
        if self._server is not None:
            self._server.close()
        drained = asyncio.Event()

        def check() -> None:
            if not self.open_streams:
                drained.set()

        for proto in list(self._conns):
            proto.on_drained = check
            proto.conn.close()
            proto.conn.end_watches(GrpcStatus.UNAVAILABLE, "server shutting down")
            proto.flush()
        check()
        try:
            await asyncio.wait_for(drained.wait(), grace_s)
        except TimeoutError:
            log.warning("h2_drain_timeout", open_streams=self.open_streams, grace_s=grace_s)
        for proto in list(self._conns):
            proto.shutdown()
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), grace_s)
            except TimeoutError:
                pass
