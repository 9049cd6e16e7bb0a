"""Bounds of the root's HTTP/2 transport against hostile peers (issue 14, rows 1-3), without timing.

Here: the tests that run in-process (no sockets, no processes);
the others: ``tests/integration/test_h2_bounds.py``.
The rules and what the tests stand for: that file's docstring.
"""

from __future__ import annotations

import struct

import h2.settings
import hpack
import pytest
from test_h2_connection import METHOD, Pair, echo_upper, frame, grpc_message

from dlb.transport.h2 import PREFACE, ErrorCode, FrameType, H2Connection, SettingCode, StreamReset
from dlb.transport.limits import H2Limits, TransportStats

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


def test_the_control_allowance_refills_with_time_so_keepalive_pings_never_run_it_out() -> None:
    """A fixed allowance: an xDS stream that carried nothing, pinged every 10 s by its client, was cut as a
    flood after ~28 h. It now regains CONTROL_REFILL_PER_S a second, up to the allowance."""
    from dlb.transport.h2 import CONTROL_REFILL_PER_S

    now = [0.0]
    stats = TransportStats()
    conn = H2Connection(METHOD.encode(), echo_upper, stats, H2Limits(control_frame_allowance=5), clock=lambda: now[0])
    conn.initiate()
    conn.receive_data(PREFACE + frame(FrameType.SETTINGS, 0, 0))  # the SETTINGS is one control frame
    ping = frame(FrameType.PING, 0, 0, b"12345678")
    for _ in range(200):  # a day of keepalive at 10 s, compressed: each ping 10 s after the last
        now[0] += 10.0
        conn.receive_data(ping)
    assert not conn.terminated and stats.control_floods == 0
    burst = int(5 + 10 * CONTROL_REFILL_PER_S) + 1  # past the allowance within one instant: still a flood
    events = conn.receive_data(ping * burst)
    assert conn.terminated and events[-1].error_code == ErrorCode.ENHANCE_YOUR_CALM and stats.control_floods == 1
