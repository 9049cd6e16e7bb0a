"""Connection churn paced per event-loop turn: accepting and closing a bounded number at a time.

Why not ``loop.create_server``: uvloop (libuv) accepts every connection waiting in the backlog in one
loop turn and builds a transport and a protocol for each before anything else runs. Under issue 14's
row 3 (20,000 connections opened as fast as a client can) that was up to 1024 connections per turn —
72–114 ms without a timer firing on a loaded box — while beyond the cap each refused connection still
cost a transport, a protocol and an abort. :class:`BoundedListener` accepts at most ``batch``
connections per readiness callback (the socket stays readable, so the loop comes back to it after
serving everything else), and the server closes a connection beyond the cap before any transport or
protocol exists.

Closing is the mirror image: connections accepted together reach the handshake timeout together, and
an attacker leaving closes thousands at once; each close runs Python (timers, the connection's
bookkeeping) and the transport's teardown; and under TLS, answering a ClientHello costs a key exchange
and a signature. :class:`TurnBudget` runs at most so many closes, and so many handshake steps, per turn.
"""

from __future__ import annotations

import asyncio
import errno
import socket
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from dlb.log import get_logger

log = get_logger("dlb.h2server")

#: Connections accepted per loop turn: enough for Envoy's few connections per worker at once, small
#: enough that a burst never holds the loop (each admitted connection costs ~10–30 µs of Python).
ACCEPT_BATCH = 32
#: Out of file descriptors (EMFILE/ENFILE): stop accepting this long rather than spin on a readable
#: socket we cannot accept from (what asyncio does too).
ACCEPT_RETRY_S = 0.5
#: Connections closed per loop turn (a close costs ~20–40 µs: a few ms per turn at most).
CLOSE_BATCH = 64
#: TLS handshake steps per loop turn: answering a ClientHello (ECDHE + an ECDSA signature) took
#: 0.5–1.7 ms here, and thousands of them arriving together blocked the loop 170–290 ms.
HANDSHAKE_BATCH = 8
_OUT_OF_FDS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def listen_sockets(host: str, port: int, reuse_port: bool = False, backlog: int = 1024) -> list[socket.socket]:
    """Non-blocking listening TCP sockets on every address ``host`` resolves to (``localhost``: IPv4 and
    IPv6, as ``loop.create_server`` does), all on one port (``port=0``: the first one's); OSError if not."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    socks: list[socket.socket] = []
    try:
        for family, kind, proto, _, resolved in dict.fromkeys(infos):
            addr = resolved
            sock = socket.socket(family, kind, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # its IPv4 twin is a socket of its own
            if len(socks) > 1:
                addr = (addr[0], socks[0].getsockname()[1], *addr[2:])
            sock.bind(addr)
            sock.listen(backlog)
            sock.setblocking(False)
    except OSError:
        for sock in socks:
            sock.close()
        raise
    return socks


@dataclass
class BoundedListener:
    """Calls ``on_accept(sock)`` for each accepted connection, at most ``batch`` per loop turn."""

    sock: socket.socket
    on_accept: Callable[[socket.socket], None]
    batch: int = ACCEPT_BATCH
    _loop: asyncio.AbstractEventLoop | None = None
    _retry: asyncio.TimerHandle | None = None
    _closed: bool = field(default=False)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.sock.fileno(), self._ready)

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def _ready(self) -> None:
        for _ in range(self.batch):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno in _OUT_OF_FDS and self._loop is not None and not self._closed:
                    log.warning("h2_accept_paused", reason=exc.strerror, retry_s=ACCEPT_RETRY_S)
                    self._loop.remove_reader(self.sock.fileno())
                    self._retry = self._loop.call_later(ACCEPT_RETRY_S, self.start)
                    return
                raise
            conn.setblocking(False)
            self.on_accept(conn)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._retry is not None:
            self._retry.cancel()
        if self._loop is not None:
            self._loop.remove_reader(self.sock.fileno())
        self.sock.close()


@dataclass
class TurnBudget:
    """Runs callables, at most ``per_turn`` per event-loop turn, in the order they came: the rest wait
    for the next turn (after the I/O ready by then). One for closes, one for TLS handshake steps."""

    per_turn: int
    _queue: deque[Callable[[], None]] = field(default_factory=deque)
    _used: int = 0
    _turn_scheduled: bool = False
    #: Callables that had to wait for a later turn (a burst was spread).
    deferred: int = 0

    def run(self, fn: Callable[[], None]) -> bool:
        """Run ``fn`` now if this turn's budget allows, else queue it; True if it ran now."""
        if self._used < self.per_turn and not self._queue:
            self._used += 1
            self._schedule_turn()
            self._call(fn)
            return True
        self._queue.append(fn)
        self.deferred += 1
        self._schedule_turn()
        return False

    def _schedule_turn(self) -> None:
        if not self._turn_scheduled:
            self._turn_scheduled = True
            asyncio.get_running_loop().call_soon(self._next_turn)

    def _next_turn(self) -> None:
        self._turn_scheduled = False
        self._used = 0
        queue = self._queue
        while queue and self._used < self.per_turn:
            self._used += 1
            self._call(queue.popleft())
        if self._used:  # the budget spent here is given back at the start of the next turn
            self._schedule_turn()

    @staticmethod
    def _call(fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:  # one connection's failure must not stop the others'
            log.warning("h2_paced_call_failed", error=repr(exc))
