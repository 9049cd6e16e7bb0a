"""Bounds of the root's HTTP/2 transport against hostile peers (issue 14, rows 1-3), without timing.

Memory is read from the bounded structures' own sizes (the cached header blocks, counted by this test
from what the cache holds) and event-loop work from operation counts (streams visited per frame), so
the tests say the same on a loaded box. Row 3 (connection cap, handshake and idle timeouts) needs
sockets and a clock: those tests wait for the server to act and assert what it did, never how fast.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import struct
import threading
from collections.abc import Iterator

import pytest
from bounded_wait import until
from test_h2_bounds_unit import END_STREAM, headers_frames, request_block
from test_h2_connection import METHOD, echo_upper, frame, grpc_message

from dlb.transport.h2 import PREFACE, ErrorCode, FrameType
from dlb.transport.limits import H2Limits
from dlb.transport.server import H2GrpcServer


# --- row 3: connection cap, handshake and idle timeouts (sockets) ----------------------------------
class Serving:
    """An H2GrpcServer with ``limits`` on an event-loop thread."""

    def __init__(self, limits: H2Limits, ssl=None) -> None:
        self.server = H2GrpcServer(METHOD, echo_upper, limits=limits)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self.server.start("127.0.0.1", 0, ssl=ssl), self.loop).result(10)

    def on_loop(self, fn):
        async def run():
            return fn()
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(0.5), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def serving(request) -> Iterator[Serving]:
    s = Serving(request.param)
    try:
        yield s
    finally:
        s.close()


def read_to_eof(sock: socket.socket, timeout: float = 20.0) -> bytes:
    """Everything the server sends until it closes (a generous timeout: it only fails a hung test)."""
    sock.settimeout(timeout)
    out = b""
    while True:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            return out
        if not data:
            return out
        out += data


def goaway_code(data: bytes) -> int | None:
    pos = 0
    while pos + 9 <= len(data):
        n = int.from_bytes(data[pos:pos + 3], "big")
        if data[pos + 3] == FrameType.GOAWAY:
            return struct.unpack(">I", data[pos + 13:pos + 17])[0]
        pos += 9 + n
    return None


def served(sock: socket.socket, sid: int, word: bytes) -> None:
    """Send one call on stream ``sid`` of ``sock`` and wait for its echo."""
    sock.sendall(headers_frames(sid, request_block(), end_stream=False) + frame(FrameType.DATA, END_STREAM, sid, grpc_message(word)))
    sock.settimeout(10)
    got = b""
    while grpc_message(word.upper()) not in got:
        data = sock.recv(65536)
        assert data, "closed before the reply"
        got += data


def client(port: int) -> socket.socket:
    """A connection that has sent the preface and SETTINGS (and nothing else yet)."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(PREFACE + frame(FrameType.SETTINGS, 0, 0))
    return sock


@pytest.mark.parametrize("serving", [H2Limits(max_connections=3)], indirect=True)
def test_connections_beyond_the_cap_are_closed_at_accept(serving: Serving) -> None:
    """With the cap reached by connections that opened streams, a new connection is closed at once (fds
    stay free for /metrics and probes), counted; once a connection leaves, a new one is served again."""
    socks = [client(serving.port) for _ in range(3)]
    for s in socks:
        served(s, 1, b"hi")
    extra = socket.create_connection(("127.0.0.1", serving.port))
    assert read_to_eof(extra) == b""
    assert serving.on_loop(lambda: (serving.server.stats.connections_refused, serving.server.stats.connections_evicted)) == (1, 0)
    socks.pop().close()
    until(lambda: serving.on_loop(lambda: serving.server.stats.open_connections) <= 2, "the closed connection gone")
    again = client(serving.port)
    served(again, 1, b"hi")
    for s in [*socks, extra, again]:
        s.close()


@pytest.mark.parametrize("serving", [H2Limits(max_connections=4, max_connections_per_peer=3)], indirect=True)
def test_squatters_never_keep_a_new_client_out(serving: Serving) -> None:
    """At a cap (here the peer's) a new connection takes the slot of the oldest connection that opened no
    stream; one that opened a stream keeps its slot. So connections that send the preface and SETTINGS
    and nothing more cannot lock a restarted Envoy out."""
    busy = client(serving.port)
    served(busy, 1, b"busy")
    squatters = [client(serving.port) for _ in range(2)]
    until(lambda: serving.on_loop(lambda: serving.server.stats.open_connections) == 3, "three connections open")
    newcomer = client(serving.port)
    served(newcomer, 1, b"new")  # it got in: the oldest squatter gave its slot up
    read_to_eof(squatters[0])  # returns at its close (a timeout, failing the test, if it stayed)
    assert serving.on_loop(lambda: serving.server.stats.connections_evicted) == 1
    served(busy, 3, b"still")  # the connection with a stream was never a candidate
    assert serving.on_loop(lambda: serving.server.stats.connections_refused) == 0
    for s in [busy, *squatters, newcomer]:
        s.close()


@pytest.mark.parametrize("serving", [H2Limits(handshake_timeout_s=0.2, first_stream_timeout_s=0.5)], indirect=True)
def test_a_connection_that_opens_no_stream_is_closed_at_the_first_stream_timeout(serving: Serving) -> None:
    """The preface and SETTINGS are not enough to keep a slot: with no stream by the first-stream
    timeout the connection gets GOAWAY(NO_ERROR) and is closed, long before the idle timeout."""
    squatter = client(serving.port)
    assert goaway_code(read_to_eof(squatter)) == ErrorCode.NO_ERROR
    assert serving.on_loop(lambda: (serving.server.stats.first_stream_timeouts, serving.server.stats.idle_timeouts)) == (1, 0)
    squatter.close()


@pytest.mark.parametrize("serving", [H2Limits(handshake_timeout_s=0.5)], indirect=True)
def test_a_slow_loris_preface_is_dropped_at_the_handshake_timeout(serving: Serving) -> None:
    """A client dribbling the preface one byte at a time never completes it in time: it is closed."""
    sock = socket.create_connection(("127.0.0.1", serving.port))
    sent = 0
    try:
        while sent < len(PREFACE) - 1:
            sock.sendall(PREFACE[sent:sent + 1])
            sent += 1
            threading.Event().wait(0.1)
    except OSError:
        pass  # closed while we were still dribbling
    read_to_eof(sock)
    assert sent < len(PREFACE)
    assert serving.on_loop(lambda: serving.server.stats.handshake_timeouts) == 1
    sock.close()


@pytest.mark.parametrize("serving", [H2Limits(handshake_timeout_s=0.2, idle_timeout_s=0.3)], indirect=True)
def test_an_idle_connection_gets_goaway_and_is_closed(serving: Serving) -> None:
    """A connection with no stream open for a whole idle period gets GOAWAY(NO_ERROR), then EOF."""
    sock = socket.create_connection(("127.0.0.1", serving.port))
    sock.sendall(PREFACE + frame(FrameType.SETTINGS, 0, 0))
    assert goaway_code(read_to_eof(sock)) == ErrorCode.NO_ERROR
    assert serving.on_loop(lambda: serving.server.stats.idle_timeouts) == 1
    sock.close()


@pytest.mark.parametrize("serving", [H2Limits(handshake_timeout_s=0.1, idle_timeout_s=0.1)], indirect=True)
def test_a_connection_with_an_open_stream_is_not_idle(serving: Serving) -> None:
    """A stream in progress keeps its connection: after many idle periods it still gets its reply."""
    sock = socket.create_connection(("127.0.0.1", serving.port))
    sock.sendall(PREFACE + frame(FrameType.SETTINGS, 0, 0) + headers_frames(1, request_block(), end_stream=False))
    threading.Event().wait(1.0)  # ten idle periods with the stream open
    assert serving.on_loop(lambda: serving.server.stats.idle_timeouts) == 0
    sock.sendall(frame(FrameType.DATA, END_STREAM, 1, grpc_message(b"late")))
    sock.settimeout(10)
    got = b""
    while grpc_message(b"LATE") not in got:
        got += sock.recv(65536)
    sock.close()


def per_turn_changes(serving: Serving, gate: threading.Event, value, settled, max_turns: int = 5000) -> list[int]:
    """Hold the server's loop on ``gate`` (the test queues work for it meanwhile); once released, sample
    ``value()`` once per loop turn (a callback that reschedules itself) until ``settled(value())``; returns
    the change seen in each turn. Turns are counted, never timed."""
    samples: list[int] = []
    done = threading.Event()

    def tick() -> None:
        samples.append(value())
        if settled(samples[-1]) or len(samples) >= max_turns:
            done.set()
            return
        serving.loop.call_soon(tick)

    serving.loop.call_soon_threadsafe(tick)  # queued behind the gate: the first sample is the state before
    gate.set()
    assert done.wait(60), "the loop never settled"
    assert settled(samples[-1]), samples[-10:]
    return [b - a for a, b in itertools.pairwise(samples)]


def hold_loop(serving: Serving) -> threading.Event:
    gate = threading.Event()
    serving.loop.call_soon_threadsafe(gate.wait, 30)
    return gate


@pytest.mark.parametrize("serving", [H2Limits()], indirect=True)
def test_a_burst_of_connections_is_accepted_a_batch_per_loop_turn(serving: Serving) -> None:
    """Row 3: uvloop accepted every queued connection in one loop turn (up to the 1024 backlog, 72-114 ms
    on a loaded box); now at most ACCEPT_BATCH are taken per turn, so the loop serves other work
    between batches. 200 connections queue while the loop is held; no turn opens more than a batch."""
    from dlb.transport.pacing import ACCEPT_BATCH

    stats = serving.server.stats
    gate = hold_loop(serving)
    socks = [socket.create_connection(("127.0.0.1", serving.port)) for _ in range(200)]
    try:
        steps = per_turn_changes(serving, gate, lambda: stats.open_connections, lambda n: n == 200)
        assert max(steps) <= ACCEPT_BATCH, max(steps)
    finally:
        for s in socks:
            s.close()


@pytest.mark.parametrize("serving", [H2Limits()], indirect=True)
def test_connections_closing_together_are_closed_a_batch_per_loop_turn(serving: Serving) -> None:
    """Row 3: an attacker leaving (or thousands reaching the handshake timeout together) closed every
    connection in the same loop turn; now at most CLOSE_BATCH close per turn."""
    from dlb.transport.pacing import CLOSE_BATCH

    stats = serving.server.stats
    socks = [socket.create_connection(("127.0.0.1", serving.port)) for _ in range(200)]
    until(lambda: serving.on_loop(lambda: stats.open_connections) == 200, "stats.open_connections == 200", period=0.01)
    gate = hold_loop(serving)
    for s in socks:
        s.close()
    steps = per_turn_changes(serving, gate, lambda: stats.open_connections, lambda n: n == 0)
    assert min(steps) >= -CLOSE_BATCH, min(steps)


def client_hello() -> bytes:
    """A real TLS ClientHello (the first flight of any client), made in memory."""
    import ssl

    out = ssl.MemoryBIO()
    with pytest.raises(ssl.SSLWantReadError):
        ssl.create_default_context().wrap_bio(ssl.MemoryBIO(), out, server_hostname="dlb").do_handshake()
    return out.read()


@pytest.fixture
def tls_serving(request, tmp_path) -> Iterator[Serving]:
    from dlb.config.tls import load_identity
    from dlb.testbed.pki import dlb_pki

    files, _ = dlb_pki(tmp_path / "pki", ("a",))
    s = Serving(request.param, ssl=load_identity(files, "root-a").server_ssl_context())
    try:
        yield s
    finally:
        s.close()


@pytest.mark.parametrize("tls_serving", [H2Limits(max_pending_tls_handshakes=2)], indirect=True)
def test_tls_handshakes_in_progress_are_bounded(tls_serving: Serving) -> None:
    """Row 3 under mTLS, the next step of the attack: a ClientHello on each connection, then silence.
    Each answered ClientHello holds ~50 KB of OpenSSL state (4,000 of them: 58 -> 255 MB); beyond
    ``max_pending_tls_handshakes`` a connection's first bytes close it, counted."""
    stats = tls_serving.server.stats
    hello = client_hello()
    socks = [socket.create_connection(("127.0.0.1", tls_serving.port)) for _ in range(2)]
    for s in socks:
        s.sendall(hello)
    until(lambda: tls_serving.on_loop(lambda: stats.tls_handshakes_pending) == 2, "stats.tls_handshakes_pending == 2", period=0.01)
    extra = socket.create_connection(("127.0.0.1", tls_serving.port))
    extra.sendall(hello)
    assert read_to_eof(extra) == b""
    assert tls_serving.on_loop(lambda: (stats.tls_handshakes_refused, stats.tls_handshakes_pending)) == (1, 2)
    for s in [*socks, extra]:
        s.close()
    until(lambda: tls_serving.on_loop(lambda: stats.tls_handshakes_pending) == 0, "stats.tls_handshakes_pending == 0", period=0.01)
    assert tls_serving.on_loop(lambda: stats.tls_handshakes_pending) == 0  # given back when the connections went


@pytest.mark.parametrize("tls_serving", [H2Limits()], indirect=True)
def test_clienthellos_arriving_together_are_answered_a_few_per_loop_turn(tls_serving: Serving) -> None:
    """Answering a ClientHello costs a key exchange and a signature (0.5-1.7 ms here); thousands arriving
    in one loop turn blocked it 170-290 ms. 40 arrive while the loop is held: no turn answers more than
    HANDSHAKE_BATCH of them."""
    from dlb.transport.pacing import HANDSHAKE_BATCH

    stats = tls_serving.server.stats
    socks = [socket.create_connection(("127.0.0.1", tls_serving.port)) for _ in range(40)]
    # accepted (a batch per turn) before the hellos come
    until(lambda: tls_serving.on_loop(lambda: stats.open_connections) == 40, "stats.open_connections == 40", period=0.01)
    gate = hold_loop(tls_serving)
    hello = client_hello()
    for s in socks:
        s.sendall(hello)
    steps = per_turn_changes(tls_serving, gate, lambda: stats.tls_handshakes_pending, lambda n: n == 40)
    assert max(steps) <= HANDSHAKE_BATCH, max(steps)
    for s in socks:
        s.close()


@pytest.mark.parametrize("serving", [H2Limits()], indirect=True)
def test_a_silent_connection_holds_no_http2_state(serving: Serving) -> None:
    """Row 3: each accepted connection used to get its HTTP/2 connection (HPACK decoder, tables, stream
    maps: ~14 objects for the garbage collector) at once; 4,096 silent ones made a 47-ms full collection.
    Now it is made with the client's first bytes, and our SETTINGS still come first."""
    socks = [socket.create_connection(("127.0.0.1", serving.port)) for _ in range(20)]
    stats = serving.server.stats
    until(lambda: serving.on_loop(lambda: stats.open_connections) == 20, "stats.open_connections == 20", period=0.01)
    assert serving.on_loop(lambda: [p.conn for p in serving.server._conns]) == [None] * 20
    talker = socks[0]
    talker.sendall(PREFACE + frame(FrameType.SETTINGS, 0, 0))
    talker.settimeout(10)
    first = talker.recv(9)
    assert first[3] == FrameType.SETTINGS and first[4] == 0  # our SETTINGS (not an ACK) is the first frame
    assert serving.on_loop(lambda: sum(p.conn is not None for p in serving.server._conns)) == 1
    for s in socks:
        s.close()


@pytest.mark.parametrize("serving", [H2Limits(handshake_timeout_s=0.2, first_stream_timeout_s=0.5)], indirect=True)
def test_a_closed_connection_is_freed_without_the_garbage_collector(serving: Serving) -> None:
    """Row 8: each closed connection used to be a reference cycle (the connection's output callback and
    the protocol); a squatter churned through 34,000 and one full collection that freed them held the
    loop 260 ms. Now nothing of a connection is left once it is released, with the collector off."""
    import gc
    import weakref

    gc.disable()  # a collection here would free the cycles and hide them
    try:
        squatters, leavers = [client(serving.port) for _ in range(10)], [client(serving.port) for _ in range(10)]
        until(lambda: serving.on_loop(lambda: sum(p.conn is not None for p in serving.server._conns)) == 20, "20 connections with HTTP/2 state")
        refs = serving.on_loop(lambda: [weakref.ref(p) for p in serving.server._conns] + [weakref.ref(p.conn) for p in serving.server._conns])
        for s in leavers:  # closed by the peer
            s.close()
        for s in squatters:  # closed by the server at the first-stream timeout
            read_to_eof(s)
            s.close()
        until(lambda: serving.on_loop(lambda: serving.server.connections + serving.server.stats.open_connections) == 0, "all released")
        alive = serving.on_loop(lambda: [type(r()).__name__ for r in refs if r() is not None])
        assert alive == [], alive
    finally:
        gc.enable()


@pytest.mark.parametrize("serving", [H2Limits()], indirect=True)
def test_a_new_connection_costs_one_write(serving: Serving, monkeypatch: pytest.MonkeyPatch) -> None:
    """Row 8: a squatter churns 1,000+ connections a second through the server. Our SETTINGS (with the
    connection window increase) and the ACK of the client's SETTINGS leave in one write, not two."""
    from dlb.transport.server import H2GrpcProtocol

    writes: list[bytes] = []
    real_write = H2GrpcProtocol._write

    def counted(self: H2GrpcProtocol, out: bytes) -> None:
        if out:
            writes.append(out)
        real_write(self, out)

    monkeypatch.setattr(H2GrpcProtocol, "_write", counted)
    sock = socket.create_connection(("127.0.0.1", serving.port))
    sock.sendall(PREFACE + frame(FrameType.SETTINGS, 0, 0))  # one segment: one data_received
    until(lambda: serving.on_loop(lambda: sum(p.conn is not None for p in serving.server._conns)) == 1, "the connection's HTTP/2 state")
    assert serving.on_loop(lambda: len(writes)) == 1, writes
    types, data = [], writes[0]
    while data:
        length = int.from_bytes(data[:3], "big")
        types.append((FrameType(data[3]), data[4]))
        data = data[9 + length:]
    assert types == [(FrameType.SETTINGS, 0), (FrameType.WINDOW_UPDATE, 0), (FrameType.SETTINGS, 1)], types
    sock.close()
