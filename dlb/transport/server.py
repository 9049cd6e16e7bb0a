"""The asyncio side of DLB's HTTP/2 gRPC server: sockets, timers, the connection cap and the drain.

Why apart from :mod:`.h2`: the connection there is sans-I/O (bytes in, bytes out) and is tested and
fuzzed without sockets; everything that needs a clock or a file descriptor lives here. Each bound is
an :class:`~.limits.H2Limits` field with a counter in :class:`~.limits.TransportStats`:

- a connection cap, in total and per peer address (:mod:`.admission`): at a cap a new connection takes
  the slot of the oldest one that has opened no stream, and is closed at once, before a transport
  exists, only if there is none; so the process keeps file descriptors for ``/metrics``, probes and
  xDS, and squatters never lock Envoy out. A few connections are accepted per loop turn
  (:mod:`.pacing`), so a burst of them never holds the loop;
- a handshake timeout: a client that has not sent the whole preface in time is dropped (a 1 byte/s
  slow-loris never finished it and was never dropped); under TLS the TLS handshake runs inside the
  protocol (:mod:`.tls`), so the cap and this timeout bound it too;
- a first-stream timeout: a connection that has opened no stream that long after accept is closed
  (a preface and SETTINGS and then nothing is not a client);
- an idle timeout: a connection with no stream open for a whole period gets GOAWAY(NO_ERROR) and is
  closed (Envoy reconnects on its next request). Checked by a timer per period, not per byte.

Stopping drains: the listener closes, every connection gets GOAWAY(NO_ERROR) (new streams refused,
Envoy retries them elsewhere), watch calls end, the streams in flight get ``grace_s`` to finish,
then the sockets close.
"""

from __future__ import annotations

import asyncio
import socket
import ssl as ssl_module
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import cast

from dlb.log import get_logger
from dlb.transport.admission import Admission
from dlb.transport.h2 import ConnectionTerminated, GrpcStatus, H2Connection, Handler, Route, route_table
from dlb.transport.limits import H2Limits, TransportStats
from dlb.transport.pacing import CLOSE_BATCH, HANDSHAKE_BATCH, BoundedListener, TurnBudget, listen_sockets
from dlb.transport.tls import TlsServerSession

log = get_logger("dlb.h2server")


class H2GrpcProtocol(asyncio.Protocol):
    """One connection: socket bytes to :class:`H2Connection` and back, plus its two timers.

    The :class:`H2Connection` (its HPACK decoder, tables and stream maps: ~14 objects the garbage
    collector walks) is made when the client's first bytes arrive (under TLS: when its handshake is
    done), and our SETTINGS go out then — RFC 9113 §3.4 asks only that they be the first frame we send.
    20,000 connections that never send a byte (issue 14 row 3) cost a protocol object each, not a
    connection; a full collection over ~60,000 of their objects had blocked the loop 47 ms.
    """

    def __init__(self, make_conn: Callable[[], H2Connection], stats: TransportStats, limits: H2Limits,
                 on_close: Callable[[H2GrpcProtocol], None], closer: TurnBudget | None = None) -> None:
        self.make_conn = make_conn
        #: Called once, when the connection opens its first stream (the server's admission hears of it).
        self.on_proven: Callable[[H2GrpcProtocol], None] | None = None
        self.conn: H2Connection | None = None
        self.stats = stats
        self.limits = limits
        #: Paces the closes this connection decides on its own (timeouts, the peer's EOF); None: at once.
        self.closer = closer
        #: Called from connection_lost (the server forgets the connection; it was counted at accept).
        self.on_close = on_close
        self.transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._opened_seen = -1
        self._first_stream_deadline = 0.0
        #: Set by H2GrpcServer.stop: called whenever this connection has no stream left.
        self.on_drained: Callable[[], None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport; not an isinstance check: uvloop's TCPTransport does not derive from
        # asyncio.Transport (an assert here dropped every connection under uvloop).
        self.transport = cast("asyncio.Transport", transport)
        self.stats.open_connections += 1
        loop = asyncio.get_running_loop()
        self._first_stream_deadline = loop.time() + self.limits.first_stream_timeout_s
        self._timer = loop.call_later(self.limits.handshake_timeout_s, self._handshake_check)

    def _open(self, send: bool = True) -> H2Connection:
        """The HTTP/2 connection, made now, and our SETTINGS, the first thing the server sends (queued
        only with ``send=False``: the caller writes them with its answer to the client's first bytes)."""
        conn = self.conn = self.make_conn()
        conn.on_output = self.flush
        transport = self.transport
        if transport is not None:
            peer = transport.get_extra_info("peername")
            conn.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else str(peer or "")
        conn.initiate()
        if send:
            self._write(conn.data_to_send())
        return conn

    def _write(self, out: bytes) -> None:
        transport = self.transport
        if out and transport is not None and not transport.is_closing():
            transport.write(out)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        # Thousands of peers resetting together (an attacker leaving) end here in one loop turn: the
        # bookkeeping is paced like our own closes.
        self._close_paced(self._release)

    def _release(self) -> None:
        self.stats.open_connections -= 1
        # Break the cycles (transport <-> protocol, connection -> our flush) so reference counting frees
        # the ~19 objects of this connection now, within this paced close. Left to the garbage
        # collector, the connections a squatter churns through (34,000 in 30 s) were freed by one full
        # collection that held the loop 260 ms.
        conn, self.conn, self.transport = self.conn, None, None
        if conn is not None:
            conn.connection_lost()
            conn.on_output = None
        self.on_close(self)
        if self.on_drained is not None:
            self.on_drained()

    def _handshake_check(self) -> None:
        self._timer = None
        if self.conn is None or not self.conn.preface_seen:
            self.stats.handshake_timeouts += 1
            self._close_paced(self._close)
            return
        self._idle_check()

    def _idle_check(self) -> None:
        """Every idle period: close if no stream was open at the last check and none opened since; and
        at the first-stream deadline if none was ever opened."""
        self._timer = None
        conn = self.conn
        if conn is None:
            return
        now = asyncio.get_running_loop().time()
        if not conn.streams_opened and now >= self._first_stream_deadline:
            self.stats.first_stream_timeouts += 1
            self._close_paced(self.shutdown)
            return
        if not conn.streams and conn.streams_opened == self._opened_seen:
            self.stats.idle_timeouts += 1
            self._close_paced(self.shutdown)
            return
        self._opened_seen = conn.streams_opened if not conn.streams else -1
        delay = self.limits.idle_timeout_s
        if not conn.streams_opened:
            delay = min(delay, self._first_stream_deadline - now)
        self._timer = asyncio.get_running_loop().call_later(delay, self._idle_check)

    def eof_received(self) -> bool:
        # The peer is gone (an attacker leaving closes thousands at once): keep the transport until
        # our paced close runs, rather than every teardown in this loop turn.
        self._close_paced(self._close)
        return True

    def _close_paced(self, close: Callable[[], None]) -> None:
        if self.closer is None:
            close()
        else:
            self.closer.run(close)

    def pause_writing(self) -> None:
        # The peer stopped reading: stop reading its requests too, so our buffer stays bounded.
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        if conn is None:
            # Our SETTINGS leave in one write with the answer to the client's preface (its SETTINGS
            # ACK): one write per new connection, not two — a squat churns 1,000+ connections a second.
            conn = self._open(send=False)
        events = conn.receive_data(data)
        if self.on_proven is not None and conn.streams_opened:
            proven, self.on_proven = self.on_proven, None
            proven(self)
        if conn.out:
            self._write(conn.data_to_send())
        for ev in events:
            if isinstance(ev, ConnectionTerminated):
                log.warning("h2_connection_error", code=ev.error_code.name, reason=ev.reason)
                self._close()
        if self.on_drained is not None and not conn.streams:
            self.on_drained()

    def flush(self) -> None:
        if self.conn is not None:
            self._write(self.conn.data_to_send())

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def evict(self) -> None:
        """Closed to give its slot to a new connection (it had opened no stream)."""
        self.on_proven = None
        self._close()

    def shutdown(self) -> None:
        """GOAWAY(NO_ERROR) so Envoy opens new streams elsewhere, then close."""
        if self.conn is not None:
            self.conn.close()
            self.flush()
        self._close()


class TlsH2GrpcProtocol(H2GrpcProtocol):
    """The same connection under TLS run by :class:`~.tls.TlsServerSession` inside this protocol, so the
    connection cap and the handshake timeout (the HTTP/2 preface comes after the TLS handshake) act from
    accept. Until the handshake is done the TLS state exists only from the client's first bytes and
    within ``max_pending_tls_handshakes``, and each handshake step waits its turn in ``handshakes``
    (a few per loop turn: answering a ClientHello costs a key exchange and a signature)."""

    def __init__(self, make_conn: Callable[[], H2Connection], stats: TransportStats, limits: H2Limits,
                 on_close: Callable[[H2GrpcProtocol], None], context: ssl_module.SSLContext,
                 closer: TurnBudget | None = None, handshakes: TurnBudget | None = None) -> None:
        super().__init__(make_conn, stats, limits, on_close, closer)
        self.context = context
        self.handshakes = handshakes
        self.tls: TlsServerSession | None = None
        self._inbox: list[bytes] = []  # ciphertext waiting for a handshake step
        self._reading_paused = False
        self._pending = False  # counted in stats.tls_handshakes_pending

    def _write(self, out: bytes) -> None:
        tls = self.tls
        if out and tls is not None and tls.handshake_done:
            tls.send(out)
            super()._write(tls.data_to_send())

    def data_received(self, data: bytes) -> None:
        tls = self.tls
        if tls is not None and tls.handshake_done:
            self._tls_received(tls, data)
            return
        self._inbox.append(data)
        if len(self._inbox) > 1:
            return  # a step is already waiting for its turn
        if self.handshakes is None:
            self._handshake_step()
        elif not self.handshakes.run(self._handshake_step) and self.transport is not None:
            self.transport.pause_reading()  # nothing more from this peer until its step runs
            self._reading_paused = True

    def _handshake_step(self) -> None:
        data = b"".join(self._inbox)
        self._inbox.clear()
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()
        tls = self.tls
        if tls is None:
            stats = self.stats
            if stats.tls_handshakes_pending >= self.limits.max_pending_tls_handshakes:
                stats.tls_handshakes_refused += 1
                if stats.tls_handshakes_refused == 1 or stats.tls_handshakes_refused % 1000 == 0:
                    log.warning("h2_tls_handshakes_refused", pending=stats.tls_handshakes_pending, refused=stats.tls_handshakes_refused)
                super()._close()
                return
            tls = self.tls = TlsServerSession(self.context)
            stats.tls_handshakes_pending += 1
            self._pending = True
        self._tls_received(tls, data)

    def _handshake_over(self) -> None:
        if self._pending:
            self._pending = False
            self.stats.tls_handshakes_pending -= 1

    def _tls_received(self, tls: TlsServerSession, data: bytes) -> None:
        handshaking = not tls.handshake_done
        try:
            plain = tls.receive(data)
        except ssl_module.SSLError as exc:
            self._handshake_over()
            stats = self.stats
            stats.tls_failures += 1
            if stats.tls_failures == 1 or stats.tls_failures % 1000 == 0:
                log.warning("h2_tls_failed", reason=exc.reason or str(exc), during_handshake=handshaking, failures=stats.tls_failures)
            super()._write(tls.data_to_send())  # the alert
            super()._close()
            return
        if handshaking and tls.handshake_done:
            self._handshake_over()
            self._open().peer_auth = tls.peer_auth()  # our SETTINGS, the first frame inside TLS
        if plain:
            super().data_received(plain)
        super()._write(tls.data_to_send())  # handshake messages, session tickets
        if tls.peer_closed:
            super()._close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._handshake_over()
        super().connection_lost(exc)

    def _close(self) -> None:
        tls = self.tls
        if tls is not None and tls.handshake_done and self.transport is not None and not self.transport.is_closing():
            tls.close()
            super()._write(tls.data_to_send())  # our close_notify
        super()._close()


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
    _listeners: list[BoundedListener] = field(default_factory=list)
    _conns: set[H2GrpcProtocol] = field(default_factory=set)
    _accepting: set[asyncio.Task[object]] = field(default_factory=set)
    _all_gone: asyncio.Event | None = None  # set by stop(): every connection is closed
    _admission: Admission[H2GrpcProtocol] | None = None  # made by start()
    #: Closes and TLS handshake steps, a bounded number per loop turn (:mod:`.pacing`).
    closer: TurnBudget = field(default_factory=lambda: TurnBudget(CLOSE_BATCH))
    handshakes: TurnBudget = field(default_factory=lambda: TurnBudget(HANDSHAKE_BATCH))
    #: TCP keepalive (idle seconds, probe interval, probes) on accepted sockets: long-lived calls (xDS)
    #: notice a peer host that vanished without a FIN; None: off (ext_proc streams are short).
    tcp_keepalive: tuple[int, int, int] | None = None

    async def start(self, host: str, port: int, reuse_port: bool = False, ssl: ssl_module.SSLContext | None = None) -> int:
        """Listen and return the bound port (``port=0`` picks a free one); with ``ssl``, TLS (its ALPN must
        offer h2) run by :class:`TlsH2GrpcProtocol`: the TLS handshake and the preface share one handshake
        timeout, and the connection cap applies before any handshake.

        Accepting is :class:`~.pacing.BoundedListener`'s (a few connections per loop turn); a
        connection counts against the cap from accept until its ``connection_lost`` (or until handing
        it to the loop failed), and one beyond the cap is closed before a transport exists."""
        path = self.path.encode()
        table = route_table(path, self.handler, {p.encode(): r for p, r in self.routes.items()})
        admission = self._admission = Admission[H2GrpcProtocol](self.limits.connection_cap(), self.limits.peer_cap(),
                                                                 closable=lambda p: p.transport is not None)
        loop = asyncio.get_running_loop()
        stats = self.stats
        closer = self.closer
        limits = self.limits

        def make_conn() -> H2Connection:
            return H2Connection(path, self.handler, stats, limits, table=table)

        # One bound method each for every connection: per connection they were two more objects for
        # the garbage collector to walk.
        forget, proven = self._forget, admission.proven

        def on_accept(sock: socket.socket) -> None:
            try:
                peer = str(sock.getpeername()[0])
            except OSError:  # already reset by the peer
                sock.close()
                return
            victims = admission.make_room(peer)
            if victims is None:
                stats.connections_refused += 1
                if stats.connections_refused == 1 or stats.connections_refused % 1000 == 0:
                    log.warning("h2_connection_cap_reached", refused=stats.connections_refused, peer=peer)
                sock.close()
                return
            for victim in victims:
                stats.connections_evicted += 1
                victim.evict()
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.tcp_keepalive is not None:
                idle, interval, probes = self.tcp_keepalive
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, probes)
            proto = (H2GrpcProtocol(make_conn, stats, limits, forget, closer) if ssl is None else
                     TlsH2GrpcProtocol(make_conn, stats, limits, forget, ssl, closer, self.handshakes))
            proto.on_proven = proven
            admission.add(proto, peer)
            self._conns.add(proto)
            task = loop.create_task(loop.connect_accepted_socket(lambda: proto, sock))
            self._accepting.add(task)
            task.add_done_callback(lambda t: self._handed_over(t, proto, sock))

        self._listeners = [BoundedListener(sock, on_accept) for sock in listen_sockets(host, port, reuse_port)]
        for listener in self._listeners:
            listener.start()
        return self._listeners[0].port

    def _handed_over(self, task: asyncio.Task[object], proto: H2GrpcProtocol, sock: socket.socket) -> None:
        self._accepting.discard(task)
        if proto.transport is None and (task.cancelled() or task.exception() is not None):
            self._forget(proto)  # never made, so never lost: uncount it here
            sock.close()

    def notify(self, path: str, message: bytes) -> None:
        """Send ``message`` on every open watch call of ``path`` on every connection."""
        route = self.routes[path]
        for proto in list(self._conns):
            if proto.conn is not None:
                proto.conn.notify(route, message)
                proto.flush()

    @property
    def connections(self) -> int:
        """Client connections open now (an Envoy keeps one per worker thread)."""
        return len(self._conns)

    @property
    def open_streams(self) -> int:
        return sum(len(p.conn.streams) for p in self._conns if p.conn is not None)

    async def stop(self, grace_s: float = 2.0) -> None:
        """Stop listening, GOAWAY every connection, let the streams in flight finish (up to
        ``grace_s``), then close."""
        for listener in self._listeners:
            listener.close()
        drained = asyncio.Event()

        def check() -> None:
            if not self.open_streams:
                drained.set()

        for proto in list(self._conns):
            proto.on_drained = check
            if proto.conn is not None:
                proto.conn.close()
                proto.conn.end_watches(GrpcStatus.UNAVAILABLE, "server shutting down")
                proto.flush()
        check()
        try:
            async with asyncio.timeout(grace_s):
                await drained.wait()
        except TimeoutError:
            log.warning("h2_drain_timeout", open_streams=self.open_streams, grace_s=grace_s)
        for proto in list(self._conns):
            proto.shutdown()
        # Let the closes run (connection_lost) so nothing is left to a closed loop; bounded.
        if self._conns:
            self._all_gone = asyncio.Event()
            try:
                async with asyncio.timeout(grace_s):
                    await self._all_gone.wait()
            except TimeoutError:
                pass

    def _forget(self, proto: H2GrpcProtocol) -> None:
        self._conns.discard(proto)
        if self._admission is not None:
            self._admission.remove(proto)
        if not self._conns and self._all_gone is not None:
            self._all_gone.set()
