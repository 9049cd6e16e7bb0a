"""Property and fuzz tests over the HTTP/2 transport's frame parser and HPACK handling (issue 14, item 5).

Hypothesis drives the sans-I/O connection with structured frame sequences (every frame type, random
flags, stream ids and payloads, with real header blocks mixed in) and with raw bytes; the properties
are the ones a hostile peer must not break: no exception escapes, what we send is well-formed frames,
every bound holds after every input, a terminated connection ends with GOAWAY and accepts nothing
more, the bytes' chunking does not change the answer, and a closed connection gives back its share of
the server-wide budgets. CI-sized: a bounded number of examples and no deadline per example.
"""

from __future__ import annotations

import struct

import hpack
import hpack.exceptions
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_h2_bounds_unit import request_block
from test_h2_connection import METHOD, echo_upper, frame, grpc_message

from dlb.transport.h2 import PREFACE, ConnectionTerminated, FrameType, H2Connection
from dlb.transport.headers import CachingDecoder, parse_head
from dlb.transport.limits import H2Limits, TransportStats

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
#: Small bounds, so that examples reach them.
LIMITS = H2Limits(max_concurrent_streams=4, header_cache_bytes=2048, header_cache_total_bytes=4096,
                  max_buffered=4096, max_buffered_total=8192, closed_streams_remembered=4, control_frame_allowance=50)

stream_ids = st.sampled_from([0, 1, 2, 3, 5, 7, 9, 11, 0x7FFFFFFF])
payloads = st.one_of(
    st.binary(max_size=40),
    st.builds(request_block, st.text(alphabet="abc", max_size=600)),  # a real (cacheable) header block
    st.builds(grpc_message, st.binary(max_size=30)),  # a gRPC message
    st.builds(lambda n: grpc_message(b"x" * 30)[:n], st.integers(0, 20)),  # a partial one
    st.builds(lambda k, v: struct.pack(">HI", k, v), st.integers(0, 8), st.integers(0, 2**32 - 1)),  # a SETTINGS entry
    st.builds(lambda v: struct.pack(">I", v), st.integers(0, 2**32 - 1)),  # WINDOW_UPDATE / RST_STREAM / PRIORITY-ish
)
any_frame = st.builds(lambda t, f, s, p: frame(t, f, s, p), st.integers(0, 11), st.integers(0, 255), stream_ids, payloads)


def _headers(sid: int, end: bool, grpc: bool, pad: int | None, pad_text: str) -> bytes:
    block = request_block(pad_text) if grpc else request_block(pad_text).replace(b"application/grpc", b"text/plain/xxx..")
    flags = 0x4 | (0x1 if end else 0)
    if pad is not None:
        return frame(FrameType.HEADERS, flags | 0x8, sid, bytes([pad]) + block + b"\x00" * pad)
    return frame(FrameType.HEADERS, flags, sid, block)


_data_bodies = st.one_of(st.builds(grpc_message, st.binary(max_size=30)),
                        st.builds(lambda n: grpc_message(b"keep" * 8)[:n], st.integers(0, 37)))


@st.composite
def conversations(draw) -> list[bytes]:
    """Mostly what a client sends, in an order a client could (streams opened with rising ids, DATA
    and WINDOW_UPDATE on streams it opened), so examples open streams, exchange messages and block
    on windows; one action in ten is any frame at all."""
    out: list[bytes] = []
    next_sid, opened = 1, [0]
    for _ in range(draw(st.integers(0, 30))):
        kind = draw(st.sampled_from(["open", "open", "data", "data", "data", "window", "settings", "rst", "ping", "any"]))
        sid = draw(st.sampled_from(opened))
        if kind == "open":
            end = draw(st.integers(0, 3)) == 0
            out.append(_headers(next_sid, end, draw(st.integers(0, 4)) > 0,
                                draw(st.none() | st.integers(0, 8)), draw(st.text("ab", max_size=40))))
            if not end:
                opened.append(next_sid)
            next_sid += 2 * draw(st.integers(1, 2))
        elif kind == "data" and sid:
            end = draw(st.integers(0, 3)) == 0
            out.append(frame(FrameType.DATA, 0x1 if end else 0, sid, draw(_data_bodies)))
            if end:
                opened.remove(sid)
        elif kind == "window":
            out.append(frame(FrameType.WINDOW_UPDATE, 0, sid, struct.pack(">I", draw(st.integers(1, 1 << 20)))))
        elif kind == "settings":
            key = draw(st.sampled_from([1, 3, 4, 5, 6]))
            value = draw(st.sampled_from([16384, 20000]) if key == 5 else st.sampled_from([0, 0, 1, 100, 65535, 1 << 20]))
            out.append(frame(FrameType.SETTINGS, 0, 0, struct.pack(">HI", key, value)))
        elif kind == "rst" and sid:
            out.append(frame(FrameType.RST_STREAM, 0, sid, struct.pack(">I", 8)))
        elif kind == "ping":
            out.append(frame(FrameType.PING, 0, 0, b"12345678"))
        elif kind == "any":
            out.append(draw(any_frame))
    return out


frames = st.one_of(any_frame, conversations().map(b"".join))


def parse_frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """Our output as (type, flags, stream, payload); fails on anything that is not whole frames."""
    out, pos = [], 0
    while pos < len(data):
        assert pos + 9 <= len(data), "truncated frame header in our output"
        n = int.from_bytes(data[pos:pos + 3], "big")
        ftype, flags = data[pos + 3], data[pos + 4]
        sid = struct.unpack(">I", data[pos + 5:pos + 9])[0]
        assert n <= 16384 and sid < 2**31
        assert pos + 9 + n <= len(data), "truncated frame payload in our output"
        out.append((ftype, flags, sid, data[pos + 9:pos + 9 + n]))
        pos += 9 + n
    return out


def check_bounds(conn: H2Connection, stats: TransportStats) -> None:
    assert len(conn.streams) <= LIMITS.max_concurrent_streams
    assert conn.buffered == sum(len(s.buf) for s in conn.streams.values()) == stats.buffered_bytes
    assert conn.buffered <= LIMITS.max_buffered
    assert 0 <= conn.decoder.cache_bytes <= LIMITS.header_cache_bytes
    assert stats.header_cache_bytes == conn.decoder.cache_bytes <= LIMITS.header_cache_total_bytes
    assert len(conn.closed) <= LIMITS.closed_streams_remembered
    assert set(conn.conn_blocked) <= set(conn.streams) and set(conn.watchers) <= set(conn.streams)
    assert len(conn.continuation[2] if conn.continuation else b"") <= LIMITS.max_header_list


def fresh() -> tuple[H2Connection, TransportStats]:
    stats = TransportStats()
    conn = H2Connection(METHOD.encode(), echo_upper, stats, LIMITS)
    conn.initiate()
    return conn, stats


@FUZZ
@given(conversations())
def test_any_frame_sequence_keeps_every_bound_and_answers_in_frames(seq: list[bytes]) -> None:
    """Whatever frames arrive: no exception, whole frames out, bounds hold after each, GOAWAY last
    once terminated and nothing accepted after, the server-wide gauges back to 0 on close."""
    conn, stats = fresh()
    out = conn.data_to_send()
    conn.receive_data(PREFACE)
    for f in seq:
        events = conn.receive_data(f)
        out += conn.data_to_send()
        check_bounds(conn, stats)
        if conn.terminated:
            assert any(isinstance(e, ConnectionTerminated) for e in events)
            break
    sent = parse_frames(out)
    if conn.terminated:
        assert sent[-1][0] == FrameType.GOAWAY
        assert conn.receive_data(frame(FrameType.PING, 0, 0, b"12345678")) == () and conn.data_to_send() == b""
    conn.connection_lost()
    assert stats.buffered_bytes == 0 and stats.header_cache_bytes == 0


@FUZZ
@given(conversations(), st.lists(st.integers(1, 64), max_size=40))
def test_the_answer_does_not_depend_on_how_the_bytes_are_split(seq: list[bytes], cuts: list[int]) -> None:
    """The same bytes fed whole or in arbitrary pieces produce the same output (the parser keeps no
    state that depends on read boundaries)."""
    data = PREFACE + b"".join(seq)
    whole, _ = fresh()
    whole.receive_data(data)
    expected = whole.data_to_send()
    pieces, _ = fresh()
    got, pos = b"", 0
    for n in [*cuts, len(data)]:
        pieces.receive_data(data[pos:pos + n])
        got += pieces.data_to_send()
        pos += n
        if pos >= len(data):
            break
    pieces.receive_data(data[pos:])
    got += pieces.data_to_send()
    assert got == expected


@FUZZ
@given(st.binary(max_size=400))
def test_random_bytes_after_the_preface_never_escape_as_exceptions(data: bytes) -> None:
    conn, stats = fresh()
    conn.receive_data(PREFACE + data)
    parse_frames(conn.data_to_send())
    check_bounds(conn, stats)


headers = st.lists(st.tuples(st.sampled_from(["x-a", "x-b", ":path", "content-type", "user-agent", "x-long"]),
                             st.text(alphabet="abcXYZ/", max_size=300)), min_size=1, max_size=6)


@FUZZ
@given(st.lists(st.tuples(headers, st.booleans(), st.sampled_from([None, 0, 64, 4096])), min_size=1, max_size=12))
@example([([("x-a", "")], True, None), ([("x-a", "X" * 30)], True, 64)])  # a block that evicts the entry it names
def test_the_bounded_cache_decodes_exactly_as_hpack(blocks) -> None:
    """With a tiny cache (entries refused, evicted, cleared by table changes) every block decodes to
    what a plain hpack.Decoder gives, and the cache stays within its bound."""
    enc, plain = hpack.Encoder(), hpack.Decoder()
    stats = TransportStats()
    cached = CachingDecoder(1 << 20, stats, H2Limits(header_cache_bytes=1500, header_cache_total_bytes=1500))
    for fields, index, table_size in blocks:
        if table_size is not None:
            enc.header_table_size = table_size
        block = enc.encode([(k, v) if index else hpack.NeverIndexedHeaderTuple(k, v) for k, v in fields])
        for _ in range(2):  # the second time may be a cache hit
            # Decoding a block twice is not always valid HPACK: a block that evicts the entry it names
            # (a literal larger than the table) cannot be decoded again. Then both decoders must refuse it.
            try:
                want = plain.decode(block, raw=True)
            except hpack.exceptions.HPACKError as e:
                with pytest.raises(type(e)):
                    cached.decode(block)
            else:
                assert cached.decode(block) == want
            assert stats.header_cache_bytes == cached.cache_bytes <= 1500
    cached.release()
    assert stats.header_cache_bytes == 0


@FUZZ
@given(st.binary(max_size=200))
def test_garbage_header_blocks_raise_only_hpack_errors(block: bytes) -> None:
    decoder = CachingDecoder(4096)
    try:
        head = decoder.decode_head(block)
    except hpack.exceptions.HPACKError:
        return
    assert isinstance(head.malformed, str)


@FUZZ
@given(st.lists(st.tuples(st.binary(max_size=12), st.binary(max_size=12)), max_size=10))
def test_header_validation_never_raises_and_flags_what_rfc_9113_forbids(fields) -> None:
    """parse_head takes any field list; uppercase names and connection-specific fields are malformed."""
    head = parse_head(fields)
    names = [k for k, _ in fields]
    if any(k != k.lower() and not k.startswith(b":") for k in names) or b"connection" in names:
        assert head.malformed
    ok = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/p"), (b"content-type", b"application/grpc")]
    assert parse_head(ok).malformed == ""
