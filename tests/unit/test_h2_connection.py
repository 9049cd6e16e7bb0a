"""The sans-I/O HTTP/2 connection (:class:`dlb.transport.h2.H2Connection`), fed frames directly.

No sockets, no event loop, no threads: bytes go from the ``h2`` library's client state machine
(python-hyper, an independent implementation) straight into ``receive_data`` and back from
``data_to_send``; hand-built frames cover what a well-behaved client never sends. One rule per test,
the rule as its docstring. ``tests/test_ext_proc_h2.py`` keeps the same transport over real sockets.
"""

from __future__ import annotations

import struct

import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlb.errors import DlbError
from dlb.ext_proc.protocol import PROCESS_METHOD
from dlb.transport.h2 import (
    CALL,
    PREFACE,
    TRANSITIONS,
    CompressionError,
    ConnectionTerminated,
    DenialOfServiceError,
    ErrorCode,
    FlowControlError,
    FrameSizeError,
    FrameType,
    GrpcStatus,
    H2Connection,
    H2Error,
    ProtocolError,
    StreamInput,
    StreamReset,
    StreamState,
    StreamStateError,
    TransportStats,
    _Stream,
)

METHOD = PROCESS_METHOD


def echo_upper(message: bytes) -> tuple[bytes | None, bool]:
    """Replies the message upper-cased and ends the call; ``b"keep..."`` keeps it open, ``b"boom"`` raises."""
    if message == b"boom":
        raise RuntimeError("handler bug")
    return message.upper(), not message.startswith(b"keep")


def frame(ftype: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return struct.pack(">BHBBI", n >> 16, n & 0xFFFF, ftype, flags, sid) + payload


def grpc_message(body: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(body)) + body


class Pair:
    """Our server connection and an ``h2`` client, wired back to back in memory."""

    def __init__(self, handler=echo_upper, client_settings: dict[int, int] | None = None) -> None:
        self.stats = TransportStats()
        self.server = H2Connection(METHOD.encode(), handler, self.stats)
        self.server.initiate()
        self.client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.client.initiate_connection()
        if client_settings:
            self.client.update_settings(client_settings)
        self.events: list[h2.events.Event] = []
        self.server_events: list[object] = []
        self.pump()

    def pump(self) -> None:
        """Move bytes both ways until neither side has anything to send."""
        while True:
            up = self.client.data_to_send()
            if up:
                self.server_events += self.server.receive_data(up)
            down = self.server.data_to_send()
            if not up and not down:
                return
            if down:
                self.events += self.client.receive_data(down)

    def raw(self, data: bytes) -> bytes:
        """Feed hand-built bytes to the server; returns what it answers."""
        self.server_events += self.server.receive_data(data)
        return self.server.data_to_send()

    def request(self, sid: int, body: bytes | None, end_stream: bool = False, path: str = METHOD,
                extra: tuple[tuple[str, str], ...] = ()) -> None:
        headers = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "dlb"),
                   ("content-type", "application/grpc"), ("te", "trailers"), *extra]
        self.client.send_headers(sid, headers)
        if body is not None:
            self.client.send_data(sid, grpc_message(body), end_stream=end_stream)
        self.pump()

    def of(self, kind: type, sid: int) -> list:
        return [e for e in self.events if isinstance(e, kind) and getattr(e, "stream_id", None) == sid]

    def status(self, sid: int) -> str:
        headers: dict[str, str] = {}
        for e in self.of(h2.events.TrailersReceived, sid) + self.of(h2.events.ResponseReceived, sid):
            headers.update(dict(e.headers))
        return headers["grpc-status"]


def test_a_call_is_answered_with_the_reply_and_grpc_status_ok() -> None:
    """A request message gets the handler's reply as DATA, then trailers with grpc-status 0."""
    p = Pair()
    p.request(1, b"hello")
    (data,) = p.of(h2.events.DataReceived, 1)
    assert data.data == grpc_message(b"HELLO")
    assert p.status(1) == str(int(GrpcStatus.OK))


def test_each_calls_traceparent_is_what_the_handler_sees_for_its_messages() -> None:
    """The gRPC call's ``traceparent`` (Envoy's span of the ext_proc call) is in ``CALL`` while the handler
    runs on that call's message, and None for a call without one, so a span's parent never leaks across calls."""
    seen: list[bytes | None] = []

    def record(message: bytes) -> tuple[bytes | None, bool]:
        seen.append(CALL.traceparent)
        return message, False

    p = Pair(record)
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    p.request(1, b"a", extra=(("traceparent", tp),))
    p.request(3, b"b")
    p.client.send_data(1, grpc_message(b"c"))
    p.pump()
    assert seen == [tp.encode(), None, tp.encode()]


def test_answer_before_the_client_ends_resets_with_no_error() -> None:
    """A reply that ends the call while the client's side is open is followed by RST_STREAM(NO_ERROR)
    (RFC 9113 §8.1), so no state is kept for the rest of a long generation."""
    p = Pair()
    p.request(1, b"hello")
    (reset,) = p.of(h2.events.StreamReset, 1)
    assert reset.error_code == ErrorCode.NO_ERROR
    assert 1 not in p.server.streams


def test_client_half_close_completes_a_kept_call() -> None:
    """A call the handler keeps open ends with grpc-status 0 when the client half-closes, without a reset."""
    p = Pair()
    p.request(1, b"keep going", end_stream=True)
    assert p.status(1) == "0" and p.of(h2.events.StreamReset, 1) == []


def test_handler_failure_fails_only_its_stream() -> None:
    """A handler that raises ends its stream with grpc-status INTERNAL; the connection keeps serving."""
    p = Pair()
    p.request(1, b"boom")
    p.request(3, b"next")
    assert p.status(1) == str(int(GrpcStatus.INTERNAL)) and p.status(3) == "0"
    assert p.stats.handler_errors == 1


def test_unknown_method_is_unimplemented() -> None:
    """A gRPC request to another path is answered trailers-only with grpc-status UNIMPLEMENTED."""
    p = Pair()
    p.request(1, None, path="/other.Service/Method")
    assert p.status(1) == str(int(GrpcStatus.UNIMPLEMENTED))


def test_trailers_wait_for_flow_control_window() -> None:
    """With no send window the reply and its trailers are held (state CLOSING), and go out in order
    once the client opens the window."""
    p = Pair(client_settings={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
    p.request(1, b"hello")
    assert p.server.streams[1].state is StreamState.CLOSING
    assert p.of(h2.events.DataReceived, 1) == []
    p.client.increment_flow_control_window(1 << 16, stream_id=1)
    p.pump()
    assert p.of(h2.events.DataReceived, 1)[0].data == grpc_message(b"HELLO") and p.status(1) == "0"


def test_data_after_the_clients_end_stream_is_a_stream_error() -> None:
    """DATA on a stream whose client side has ended gets RST_STREAM(STREAM_CLOSED) (RFC 9113 §5.1)."""
    p = Pair(client_settings={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
    p.request(1, b"hello", end_stream=True)  # reply held by the window: the stream stays
    assert p.server.streams[1].state is StreamState.CLOSING_REMOTE_ENDED
    p.raw(frame(FrameType.DATA, 0, 1, grpc_message(b"more")))
    assert StreamReset(1, ErrorCode.STREAM_CLOSED) in p.server_events
    assert 1 not in p.server.streams


@pytest.mark.parametrize(("data", "code"), [
    (frame(FrameType.DATA, 0, 0, b"x"), ErrorCode.PROTOCOL_ERROR),
    (frame(FrameType.HEADERS, 0x4, 0, b""), ErrorCode.PROTOCOL_ERROR),
    (frame(FrameType.PING, 0, 0, b"short"), ErrorCode.FRAME_SIZE_ERROR),
    (frame(FrameType.SETTINGS, 0, 0, b"12345"), ErrorCode.FRAME_SIZE_ERROR),
    (frame(FrameType.WINDOW_UPDATE, 0, 0, b"\x00\x00\x00\x00"), ErrorCode.PROTOCOL_ERROR),
    (frame(FrameType.PUSH_PROMISE, 0x4, 1, b"\x00\x00\x00\x02"), ErrorCode.PROTOCOL_ERROR),
    (frame(FrameType.DATA, 0, 0, b"x" * 16385), ErrorCode.FRAME_SIZE_ERROR),
    (frame(FrameType.HEADERS, 0x4, 1, b"\xff\xff\xff\xff"), ErrorCode.COMPRESSION_ERROR),
], ids=["data-stream-0", "headers-stream-0", "short-ping", "settings-length", "zero-window-update", "push-promise",
        "oversized-frame", "bad-hpack"])
def test_connection_errors_end_with_goaway_and_their_code(data: bytes, code: ErrorCode) -> None:
    """A connection error answers GOAWAY with the error's code, reports ConnectionTerminated, and the
    connection accepts nothing more."""
    p = Pair()
    out = p.raw(data)
    assert out[3] == FrameType.GOAWAY  # the type byte follows the 3-byte length
    assert struct.unpack(">I", out[13:17])[0] == code
    (terminated,) = [e for e in p.server_events if isinstance(e, ConnectionTerminated)]
    assert terminated.error_code is code
    assert p.server.receive_data(frame(FrameType.PING, 0, 0, b"12345678")) == ()


def test_not_an_http2_preface_is_a_protocol_error() -> None:
    """Bytes that are not the HTTP/2 client preface end the connection with PROTOCOL_ERROR."""
    conn = H2Connection(METHOD.encode(), echo_upper, TransportStats())
    (ev,) = conn.receive_data(b"GET / HTTP/1.1\r\n\r\n")
    assert ev == ConnectionTerminated(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 connection preface")


def test_preface_split_anywhere_is_accepted() -> None:
    """The client preface may arrive in pieces."""
    conn = H2Connection(METHOD.encode(), echo_upper, TransportStats())
    for i in range(len(PREFACE)):
        assert conn.receive_data(PREFACE[i:i + 1]) == ()
    assert conn.preface_seen


def test_graceful_close_sends_goaway_no_error() -> None:
    """close() queues GOAWAY(NO_ERROR) naming the last stream we saw, once."""
    p = Pair()
    p.request(5, b"x")
    p.server.close()
    p.server.close()
    p.pump()
    (goaway,) = [e for e in p.events if isinstance(e, h2.events.ConnectionTerminated)]
    assert goaway.error_code == ErrorCode.NO_ERROR and goaway.last_stream_id == 5


def test_every_error_carries_its_code_under_the_project_root() -> None:
    """Each protocol error class carries the HTTP/2 code it ends the connection (or stream) with."""
    expected = {ProtocolError: ErrorCode.PROTOCOL_ERROR, FrameSizeError: ErrorCode.FRAME_SIZE_ERROR,
                FlowControlError: ErrorCode.FLOW_CONTROL_ERROR, CompressionError: ErrorCode.COMPRESSION_ERROR,
                DenialOfServiceError: ErrorCode.ENHANCE_YOUR_CALM, StreamStateError: ErrorCode.STREAM_CLOSED}
    for cls, code in expected.items():
        err = cls("why")
        assert isinstance(err, H2Error) and isinstance(err, DlbError) and err.code is code and err.reason == "why"


@given(st.lists(st.sampled_from(list(StreamInput)), max_size=6))
def test_stream_state_follows_the_transition_table(inputs: list[StreamInput]) -> None:
    """Every input either moves a stream to the state the table lists or, where the table lists none,
    raises StreamStateError and leaves the state unchanged; CLOSED accepts nothing."""
    stream = _Stream(1)
    for event in inputs:
        before = stream.state
        expected = TRANSITIONS[before].get(event)
        if expected is None:
            with pytest.raises(StreamStateError):
                stream.apply(event)
            assert stream.state is before
        else:
            assert stream.apply(event) is expected


def test_the_table_covers_every_state() -> None:
    """Every state has a row, every state but CLOSED can be reset, and CLOSED is reachable from all."""
    assert set(TRANSITIONS) == set(StreamState)
    for state, row in TRANSITIONS.items():
        if state is not StreamState.CLOSED:
            assert row[StreamInput.RESET] is StreamState.CLOSED
    assert TRANSITIONS[StreamState.CLOSED] == {}


def test_a_unary_call_ending_with_its_message_keeps_the_connection() -> None:
    """A client that sends its one message with END_STREAM (grpc's unary calls, e.g. Health/Check) gets
    the reply and trailers, and the connection stays up for the next call."""
    p = Pair()
    for sid in (1, 3):
        p.request(sid, b"hello", end_stream=True)
        assert p.status(sid) == "0" and p.of(h2.events.DataReceived, sid)[0].data == grpc_message(b"HELLO")
        assert not p.of(h2.events.StreamReset, sid)  # the client had ended its side: no RST_STREAM needed
    assert not p.server.terminated and p.stats.connection_errors == 0
