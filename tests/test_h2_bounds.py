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

import h2.settings
import hpack
import pytest
from bounded_wait import until
from test_h2_connection import METHOD, Pair, echo_upper, frame, grpc_message

from dlb.ext_proc.transport.h2 import PREFACE, ErrorCode, FrameType, H2Connection, SettingCode, StreamReset
from dlb.ext_proc.transport.limits import H2Limits, TransportStats
from dlb.ext_proc.transport.server import H2GrpcServer

END_STREAM, END_HEADERS = 0x1, 0x4


def request_block(pad: str = "", path: str = METHOD) -> bytes:
    """A request header block that leaves the HPACK table unchanged (so the server may cache it)."""
    fields = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "dlb"),
              ("content-type", "application/grpc"), ("te", "trailers")]
    if pad:
        fields.append(("x-pad", pad))
    return hpack.Encoder().encode([hpack.NeverIndexedHeaderTuple(k, v) for k, v in fields], huffman=False)


def headers_frames(sid: int, block: bytes, end_stream: bool = True) -> bytes:
    """HEADERS (+ CONTINUATION when the block is larger than one 16 KB frame)."""
    chunks = [block[i:i + 16384] for i in range(0, len(block), 16384)] or [b""]
    out = b""
    for i, chunk in enumerate(chunks):
        last = END_HEADERS if i == len(chunks) - 1 else 0
        if i == 0:
            out += frame(FrameType.HEADERS, last | (END_STREAM if end_stream else 0), sid, chunk)
        else:
            out += frame(FrameType.CONTINUATION, last, sid, chunk)
    return out


def connected(stats: TransportStats | None = None, limits: H2Limits | None = None, handler=echo_upper) -> H2Connection:
    conn = H2Connection(METHOD.encode(), handler, stats or TransportStats(), *(() if limits is None else (limits,)))
    conn.initiate()
    conn.receive_data(PREFACE + frame(FrameType.SETTINGS, 0, 0))
    conn.data_to_send()
    return conn


def cached_bytes(conn: H2Connection) -> int:
    """What the header cache holds, counted here from its contents: each key plus its decoded fields."""
    total = 0
    for block, value in conn.decoder.cache.items():
        fields = value.fields if hasattr(value, "fields") else value
        total += len(block) + sum(len(k) + len(v) for k, v in fields)
    return total


# --- row 1: the header-block cache ---------------------------------------------------------------
@pytest.mark.parametrize("pad", [2_000, 20_000], ids=["2KB-blocks", "20KB-blocks"])
def test_distinct_cacheable_header_blocks_stay_within_the_per_connection_bound(pad: int) -> None:
    """64 distinct cacheable header blocks (the attack used 245 KB ones, 34 MB kept per connection)
    leave at most H2Limits.header_cache_bytes cached on the connection, and closing it gives it all back."""
    stats = TransportStats()
    conn = connected(stats)
    peak = 0
    for i in range(64):
        conn.receive_data(headers_frames(2 * i + 1, request_block(f"{i:04d}" + "a" * pad)))
        assert not conn.terminated
        peak = max(peak, cached_bytes(conn))
    assert peak <= H2Limits().header_cache_bytes
    assert stats.header_cache_refused > 0  # the bound was hit, and the metric says so
    assert stats.header_cache_bytes == conn.decoder.cache_bytes >= cached_bytes(conn)
    conn.connection_lost()
    assert conn.decoder.cache == {} and stats.header_cache_bytes == 0


def test_the_header_cache_is_bounded_across_connections() -> None:
    """All connections of a server together cache at most header_cache_total_bytes."""
    limits = H2Limits(header_cache_total_bytes=50_000)
    stats = TransportStats()
    conns = [connected(stats, limits) for _ in range(20)]
    for c, conn in enumerate(conns):
        for i in range(8):
            conn.receive_data(headers_frames(2 * i + 1, request_block(f"{c}-{i}-" + "b" * 1000)))
    assert sum(cached_bytes(c) for c in conns) <= stats.header_cache_bytes <= 50_000
    assert stats.header_cache_refused > 0
    for conn in conns:
        conn.connection_lost()
    assert stats.header_cache_bytes == 0


def test_the_steady_state_block_is_still_cached() -> None:
    """The bound does not cost the common case: Envoy's repeated block hits the cache."""
    conn = connected()
    block = request_block()
    for i in range(10):
        conn.receive_data(headers_frames(2 * i + 1, block))
    assert conn.decoder.hits == 9


# --- row 2: no per-frame walk over all streams ----------------------------------------------------
class CountingDict(dict):
    """The connection's stream table, counting every walk over it."""

    walks = 0

    def values(self):  # type: ignore[override]
        CountingDict.walks += 1
        return super().values()

    def items(self):  # type: ignore[override]
        CountingDict.walks += 1
        return super().items()

    def __iter__(self):
        CountingDict.walks += 1
        return super().__iter__()


def instrumented(conn: H2Connection) -> list[int]:
    """Count _drain calls (a stream visited to send) and walks over the stream table."""
    calls = [0]
    drain = conn._drain

    def counting(stream):
        calls[0] += 1
        return drain(stream)

    conn._drain = counting  # type: ignore[method-assign]
    conn.streams = CountingDict(conn.streams)
    CountingDict.walks = 0
    return calls


def test_stream_zero_floods_do_not_visit_open_streams() -> None:
    """1,000 open streams, then ~45 KB of WINDOW_UPDATE and SETTINGS on stream 0: no stream is visited
    (the attack's 10,000 streams blocked the loop 3.8 s; each frame walked every stream)."""
    conn = connected()
    block = request_block()
    conn.receive_data(b"".join(headers_frames(2 * i + 1, block, end_stream=False) for i in range(1000)))
    assert len(conn.streams) == 1000
    calls = instrumented(conn)
    flood = b""
    for i in range(1700):
        flood += frame(FrameType.WINDOW_UPDATE, 0, 0, struct.pack(">I", 1))
        flood += frame(FrameType.SETTINGS, 0, 0, struct.pack(">HI", SettingCode.INITIAL_WINDOW_SIZE, 65535 + i % 7))
    assert len(flood) > 45_000
    conn.receive_data(flood)
    assert not conn.terminated
    assert calls[0] == 0 and CountingDict.walks == 0


def test_partial_messages_are_counted_not_summed_per_frame() -> None:
    """The partial-message bound is checked without summing every stream's buffer on each DATA frame."""
    conn = connected()
    block = request_block()
    conn.receive_data(b"".join(headers_frames(2 * i + 1, block, end_stream=False) for i in range(1000)))
    calls = instrumented(conn)
    half = b"\x00" + struct.pack(">I", 100) + b"x" * 10  # a message that never completes
    conn.receive_data(b"".join(frame(FrameType.DATA, 0, 2 * i + 1, half) for i in range(1000)))
    assert not conn.terminated
    assert CountingDict.walks == 0 and calls[0] == 0
    assert conn.buffered == conn.stats.buffered_bytes == 1000 * len(half)
    conn.connection_lost()
    assert conn.stats.buffered_bytes == 0


def test_a_window_update_visits_only_the_streams_it_lets_send() -> None:
    """Replies held by the connection window wait in a queue: a WINDOW_UPDATE of n bytes visits at
    most the streams those n bytes let send, not every stream."""
    conn = connected()
    block = request_block()
    body = b"y" * 200
    conn.receive_data(b"".join(headers_frames(2 * i + 1, block, end_stream=False)
                               + frame(FrameType.DATA, 0, 2 * i + 1, grpc_message(body)) for i in range(600)))
    assert conn.conn_send_window <= 0 and len(conn.conn_blocked) > 200
    calls = instrumented(conn)
    for _ in range(100):
        before = calls[0]
        conn.receive_data(frame(FrameType.WINDOW_UPDATE, 0, 0, struct.pack(">I", 1)))
        assert calls[0] - before <= 2
    assert CountingDict.walks == 0


def test_raising_the_initial_window_wakes_only_streams_it_unblocks() -> None:
    """Streams waiting for their own window sit in a heap: a SETTINGS that opens no window visits none."""
    p = Pair(client_settings={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
    for i in range(200):
        p.request(2 * i + 1, b"hello")
    assert len(p.server.window_blocked) == 200
    calls = instrumented(p.server)
    p.raw(frame(FrameType.SETTINGS, 0, 0, struct.pack(">HI", SettingCode.INITIAL_WINDOW_SIZE, 0)))
    assert calls[0] == 0
    p.raw(frame(FrameType.SETTINGS, 0, 0, struct.pack(">HI", SettingCode.INITIAL_WINDOW_SIZE, 1 << 16)))
    assert calls[0] == 200 and not p.server.streams  # every reply went out and every stream ended


def test_max_concurrent_streams_is_advertised_and_enforced() -> None:
    """SETTINGS_MAX_CONCURRENT_STREAMS is sent; a stream beyond it gets RST_STREAM(REFUSED_STREAM)."""
    p = Pair()
    assert p.client.remote_settings.max_concurrent_streams == H2Limits().max_concurrent_streams
    conn = connected()
    block = request_block()
    n = H2Limits().max_concurrent_streams
    conn.receive_data(b"".join(headers_frames(2 * i + 1, block, end_stream=False) for i in range(n)))
    events = conn.receive_data(headers_frames(2 * n + 1, block, end_stream=False))
    assert list(events) == [StreamReset(2 * n + 1, ErrorCode.REFUSED_STREAM)]
    assert len(conn.streams) == n and conn.stats.streams_refused == 1


@pytest.mark.parametrize("flood", [
    frame(FrameType.PING, 0, 0, b"12345678") * 102,
    headers_frames(1, request_block(), end_stream=False) + frame(FrameType.DATA, 0, 1) * 120,
    frame(FrameType.HEADERS, 0, 1, request_block()) + frame(FrameType.CONTINUATION, 0, 1) * 102,
], ids=["ping", "empty-data", "empty-continuation"])
def test_a_flood_of_frames_that_do_no_work_ends_the_connection(flood: bytes) -> None:
    """Frames that do no work for a call (PING, empty DATA or CONTINUATION) beyond the allowance end
    the connection with ENHANCE_YOUR_CALM."""
    stats = TransportStats()
    conn = connected(stats, H2Limits(control_frame_allowance=100))
    events = conn.receive_data(flood)
    assert conn.terminated and events[-1].error_code == ErrorCode.ENHANCE_YOUR_CALM
    assert stats.control_floods == 1


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


@pytest.mark.parametrize("serving", [H2Limits(max_connections=3)], indirect=True)
def test_connections_beyond_the_cap_are_closed_at_accept(serving: Serving) -> None:
    """With the cap reached a new connection is closed at once (fds stay free for /metrics and probes),
    counted; once a connection leaves, a new one is served again."""
    socks = [socket.create_connection(("127.0.0.1", serving.port)) for _ in range(3)]
    for s in socks:
        s.sendall(PREFACE + frame(FrameType.SETTINGS, 0, 0))
    extra = socket.create_connection(("127.0.0.1", serving.port))
    assert read_to_eof(extra) == b""
    assert serving.on_loop(lambda: serving.server.stats.connections_refused) == 1
    socks.pop().close()
    while serving.on_loop(lambda: serving.server.stats.open_connections) > 2:
        threading.Event().wait(0.05)
    again = socket.create_connection(("127.0.0.1", serving.port))
    again.sendall(PREFACE + frame(FrameType.SETTINGS, 0, 0) + headers_frames(1, request_block(), end_stream=False)
                  + frame(FrameType.DATA, END_STREAM, 1, grpc_message(b"hi")))
    again.settimeout(10)
    got = b""
    while grpc_message(b"HI") not in got:
        got += again.recv(65536)
    for s in [*socks, extra, again]:
        s.close()


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
    from dlb.ext_proc.transport.pacing import ACCEPT_BATCH

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
    from dlb.ext_proc.transport.pacing import CLOSE_BATCH

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
    from dlb.ext_proc.transport.pacing import HANDSHAKE_BATCH

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
