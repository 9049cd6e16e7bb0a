"""A minimal gRPC-over-HTTP/2 server for one bidirectional-streaming method, on the asyncio loop.

Why this exists next to grpc.aio: the root's ext_proc hop is the hottest path in DLB (one gRPC
stream per user request). Measured on the 2-core test box (h2load, one stream at a time, constant
reply, ``docs/data-plane.md``): a grpc.aio servicer answers in 0.81 ms p50 and saturates at
~2.7k streams/s; the pure-Python ``h2`` state machine in 0.51 ms / ~3.2k/s; a plain asyncio
protocol doing only HTTP/2 framing in 0.17 ms / ~27k/s. grpc.aio's cost is its thread hand-offs
(C-core poller → asyncio), not our code, and no grpc option changed it (poll strategy,
EventEngine experiments, sync server: all within noise). Envoy's ext_proc client speaks plain
HTTP/2 + gRPC framing, and the subset it needs from a server is small:

- one method (``:path`` checked), messages framed as 1 flag byte + 4 length bytes;
- replies that are pre-serialised bytes, sent as HEADERS / DATA / trailers with a constant HPACK
  encoding (static-table references and literals *without* indexing, so our encoder never has
  state; the first header block on a connection sets our dynamic table size to 0);
- request header blocks decoded by the ``hpack`` library (it keeps the peer's dynamic table);
- flow control both ways (RFC 9113 §5.2), SETTINGS, PING, RST_STREAM, GOAWAY, CONTINUATION,
  padding and priority flags; protocol violations end the connection with GOAWAY and the right
  error code, a broken stream gets RST_STREAM, a bad message gets a gRPC status — never a crash.

The handler is synchronous: ``handler(message: bytes) -> (reply: bytes | None, end: bool)``. The
root decides from cached state without awaiting, so running it inline in ``data_received`` is what
makes the hop cheap; a handler that must wait belongs on grpc.aio (``--transport grpc``).

Structure (after python-hyper/h2): :class:`H2Connection` is the protocol with no I/O at all — bytes
in (``receive_data``), events and bytes out (``data_to_send``) — so tests feed it frames directly;
:class:`H2GrpcProtocol` is the thin ``asyncio.Protocol`` that moves bytes between it and a socket.
A stream's life is a :class:`StreamState` changed only through :data:`TRANSITIONS`; frame types,
error codes and gRPC statuses are IntEnums, and protocol errors are :class:`H2Error` subclasses that
carry the error code they end the connection with.
"""

from __future__ import annotations

import asyncio
import enum
import ssl as ssl_module
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import hpack
import hpack.exceptions

from dlb.errors import DlbError
from dlb.log import get_logger

if TYPE_CHECKING:
    from prometheus_client import Metric

log = get_logger("dlb.h2server")

#: The request path of a service: one serialised message in, ``(reply or None, end_of_call)`` out.
Handler = Callable[[bytes], "tuple[bytes | None, bool]"]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

class FrameType(enum.IntEnum):
    """RFC 9113 §6."""

    DATA = 0x0
    HEADERS = 0x1
    PRIORITY = 0x2
    RST_STREAM = 0x3
    SETTINGS = 0x4
    PUSH_PROMISE = 0x5
    PING = 0x6
    GOAWAY = 0x7
    WINDOW_UPDATE = 0x8
    CONTINUATION = 0x9


class ErrorCode(enum.IntEnum):
    """RFC 9113 §7 (RST_STREAM and GOAWAY codes)."""

    NO_ERROR = 0x0
    PROTOCOL_ERROR = 0x1
    INTERNAL_ERROR = 0x2
    FLOW_CONTROL_ERROR = 0x3
    SETTINGS_TIMEOUT = 0x4
    STREAM_CLOSED = 0x5
    FRAME_SIZE_ERROR = 0x6
    REFUSED_STREAM = 0x7
    CANCEL = 0x8
    COMPRESSION_ERROR = 0x9
    CONNECT_ERROR = 0xA
    ENHANCE_YOUR_CALM = 0xB
    INADEQUATE_SECURITY = 0xC
    HTTP_1_1_REQUIRED = 0xD


class SettingCode(enum.IntEnum):
    """RFC 9113 §6.5.2."""

    HEADER_TABLE_SIZE = 0x1
    ENABLE_PUSH = 0x2
    MAX_CONCURRENT_STREAMS = 0x3
    INITIAL_WINDOW_SIZE = 0x4
    MAX_FRAME_SIZE = 0x5
    MAX_HEADER_LIST_SIZE = 0x6


class GrpcStatus(enum.IntEnum):
    """gRPC status codes (grpc/doc/statuscodes.md)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


# Module-level names for the members the frame loop compares against: a global lookup, not an
# attribute lookup on the enum class, per frame (they are the same IntEnum members).
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = FrameType
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, STREAM_CLOSED, REFUSED_STREAM = (
    ErrorCode.NO_ERROR, ErrorCode.PROTOCOL_ERROR, ErrorCode.FLOW_CONTROL_ERROR, ErrorCode.STREAM_CLOSED, ErrorCode.REFUSED_STREAM)
GRPC_OK = GrpcStatus.OK
# Flags (RFC 9113 §6; END_STREAM and ACK share a bit on different frame types).
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20


class H2Error(DlbError):
    """A connection error: the peer broke HTTP/2; the connection ends with GOAWAY(``code``)."""

    code: ErrorCode = ErrorCode.INTERNAL_ERROR

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ProtocolError(H2Error):
    code = ErrorCode.PROTOCOL_ERROR


class FrameSizeError(ProtocolError):
    code = ErrorCode.FRAME_SIZE_ERROR


class FlowControlError(ProtocolError):
    code = ErrorCode.FLOW_CONTROL_ERROR


class CompressionError(ProtocolError):
    """HPACK state is lost: the connection cannot continue (RFC 9113 §4.3)."""

    code = ErrorCode.COMPRESSION_ERROR


class DenialOfServiceError(H2Error):
    """The peer exceeded a bound we set (header block or buffered bytes)."""

    code = ErrorCode.ENHANCE_YOUR_CALM


DEFAULT_WINDOW = 65535
MAX_WINDOW = 2**31 - 1
#: What we let the peer send before it must wait for a WINDOW_UPDATE, per stream and per connection.
RECV_WINDOW = 1 << 20
MAX_FRAME = 16384  # we keep the protocol default for frames we receive
MAX_CONCURRENT_STREAMS = 10000
MAX_HEADER_LIST = 256 * 1024
#: grpc's default receive limit; the ext_proc messages DLB needs are a few KB.
MAX_MESSAGE = 4 * 1024 * 1024
#: Bytes of incomplete messages one connection may hold across its streams.
MAX_BUFFERED = 16 * 1024 * 1024

_u32 = struct.Struct(">I")
_hdr = struct.Struct(">BHBBI")  # 24-bit length split as B+H, type, flags, stream id


def _frame(ftype: FrameType, flags: int, sid: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return _hdr.pack(n >> 16, n & 0xFFFF, ftype, flags, sid) + payload


def _block(*fields: tuple[str, str]) -> bytes:
    """A constant HPACK header block: literals *never indexed*, so neither side's dynamic table
    changes and the bytes mean the same on every stream of every connection (encoded by ``hpack``)."""
    return hpack.Encoder().encode([hpack.NeverIndexedHeaderTuple(k, v) for k, v in fields], huffman=False)


RESPONSE_HEADERS = _block((":status", "200"), ("content-type", "application/grpc"))
TABLE_SIZE_ZERO = b"\x20"  # RFC 7541 §6.3 dynamic table size update to 0: our encoder never indexes


def _trailers(status: GrpcStatus, message: str = "") -> bytes:
    fields = [("grpc-status", str(int(status)))]
    if message:
        fields.append(("grpc-message", _percent_encode(message).decode()))
    return _block(*fields)


def _percent_encode(message: str) -> bytes:
    """grpc-message encoding (PROTOCOL-HTTP2.md): printable ASCII except '%' as is, the rest %XX."""
    return "".join(c if " " <= c <= "~" and c != "%" else "".join(f"%{b:02X}" for b in c.encode()) for c in message).encode()


TRAILERS_OK = _trailers(GRPC_OK)


class CachingDecoder:
    """``hpack.Decoder`` plus an exact cache of header blocks that leave the dynamic table unchanged.

    Envoy's encoder sends the same bytes for every ext_proc stream once its dynamic table is warm
    (``:path`` as a literal *without* indexing, the rest as indexed fields), and ``hpack`` spends
    ~0.1 ms of pure Python on each such block. A block that neither adds an entry nor resizes the
    table decodes to the same fields for as long as the table is unchanged, and decoding it again
    would leave the table as it is — so the cache is exact. Any block that does change the table
    clears the cache (its entries may refer to indices that now mean something else).
    """

    MAX_ENTRIES = 64

    def __init__(self, max_header_list_size: int) -> None:
        self.decoder = hpack.Decoder()
        self.decoder.max_header_list_size = max_header_list_size
        self.cache: dict[bytes, list[tuple[bytes, bytes]]] = {}
        self.hits = 0

    def decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        hit = self.cache.get(block)
        if hit is not None:
            self.hits += 1
            return hit
        table = self.decoder.header_table
        entries = table.dynamic_entries
        first = entries[0] if entries else None
        size, maxsize = len(entries), table.maxsize
        # raw=True: every name and value stays bytes (hpack's annotation is the wider HeaderTuple)
        fields = cast("list[tuple[bytes, bytes]]", self.decoder.decode(block, raw=True))
        if len(entries) == size and (entries[0] if entries else None) is first and table.maxsize == maxsize:
            if len(self.cache) >= self.MAX_ENTRIES:
                self.cache.clear()
            self.cache[block] = fields
        else:
            self.cache.clear()
        return fields


@dataclass
class TransportStats:
    """Counters for the service's /metrics (read at scrape time, never on the request path)."""

    connections: int = 0
    streams: int = 0
    messages: int = 0
    grpc_errors: int = 0  # streams ended with a non-OK gRPC status
    stream_resets: int = 0  # RST_STREAM sent
    connection_errors: int = 0  # GOAWAY with an error code sent
    handler_errors: int = 0

    def families(self, prefix: str) -> list[Metric]:
        from prometheus_client.core import CounterMetricFamily

        return [CounterMetricFamily(f"{prefix}_h2_{name}", doc, value=getattr(self, name)) for name, doc in (
            ("connections", "HTTP/2 connections accepted from Envoy"),
            ("messages", "gRPC messages received"),
            ("grpc_errors", "Calls ended with a non-OK gRPC status"),
            ("stream_resets", "Streams reset with an error code"),
            ("connection_errors", "Connections closed for a protocol error (GOAWAY)"),
            ("handler_errors", "Messages whose handler raised"),
        )]


class StreamState(enum.IntEnum):
    """A stream's life on our side (RFC 9113 §5.1, as a gRPC server uses it)::

                   recv END_STREAM                      finish (trailers queued)
        OPEN ──────────────────────> HALF_CLOSED_REMOTE ──────────────> CLOSING_REMOTE_ENDED
          │ finish                                                            │ trailers written
          v           recv END_STREAM                                         v
        CLOSING ─────────────────────────────────────> CLOSING_REMOTE_ENDED   CLOSED
          │ trailers written: also RST_STREAM(NO_ERROR), the client need not send more
          v
        CLOSED          (RESET from any state → CLOSED; a CLOSED stream leaves the table)

    "Closing" is our trailers queued behind flow control; the root answers the first message, so
    most streams go OPEN → CLOSING → CLOSED while the client's side is still open.
    """

    # IntEnum, not Enum: states are hashed on every call (table lookups, set membership) and
    # Enum.__hash__ is Python code; int's is not (measured: 1.5 µs per call with Enum).
    OPEN = 0
    HALF_CLOSED_REMOTE = 1  # the client ended its side; our reply is not finished
    CLOSING = 2  # our trailers are queued; the client may still send (its bytes are dropped)
    CLOSING_REMOTE_ENDED = 3  # trailers queued and the client's side ended
    CLOSED = 4


class StreamInput(enum.IntEnum):
    RECV_END_STREAM = 0
    FINISH = 1  # our side of the call is over: trailers queued
    TRAILERS_WRITTEN = 2
    RESET = 3  # RST_STREAM sent or received


_S, _I = StreamState, StreamInput
#: (state, input) → next state; a pair not listed is a peer error (frames on a stream it ended).
#: Nested dicts, not tuple keys: a transition allocates nothing on the request path.
TRANSITIONS: dict[StreamState, dict[StreamInput, StreamState]] = {
    _S.OPEN: {_I.RECV_END_STREAM: _S.HALF_CLOSED_REMOTE, _I.FINISH: _S.CLOSING, _I.RESET: _S.CLOSED},
    _S.HALF_CLOSED_REMOTE: {_I.FINISH: _S.CLOSING_REMOTE_ENDED, _I.RESET: _S.CLOSED},
    _S.CLOSING: {_I.RECV_END_STREAM: _S.CLOSING_REMOTE_ENDED, _I.TRAILERS_WRITTEN: _S.CLOSED, _I.RESET: _S.CLOSED},
    _S.CLOSING_REMOTE_ENDED: {_I.TRAILERS_WRITTEN: _S.CLOSED, _I.RESET: _S.CLOSED},
    _S.CLOSED: {},
}
# Module-level names for the states and inputs the request path uses (a global lookup per use).
_OPEN, _CLOSING, _CLOSING_REMOTE_ENDED = _S.OPEN, _S.CLOSING, _S.CLOSING_REMOTE_ENDED
_RECV_END_STREAM, _FINISH, _TRAILERS_WRITTEN, _RESET = _I
#: States in which the client may still send DATA (in CLOSING it is read and dropped).
REMOTE_OPEN = frozenset({_S.OPEN, _S.CLOSING})
#: States in which our side is over (trailers queued or the stream gone).
LOCAL_DONE = frozenset({_S.CLOSING, _S.CLOSING_REMOTE_ENDED, _S.CLOSED})


class StreamStateError(H2Error):
    """An input the stream's state does not accept (a stream error: RST_STREAM(STREAM_CLOSED))."""

    code = ErrorCode.STREAM_CLOSED


@dataclass(slots=True)
class _Stream:
    sid: int
    send_window: int
    state: StreamState = StreamState.OPEN
    recv_unacked: int = 0
    buf: bytearray = field(default_factory=bytearray)
    headers_sent: bool = False
    pending: list[bytes] = field(default_factory=list)  # DATA payloads waiting for flow-control window
    trailers: bytes | None = None  # the closing header block, sent once ``pending`` is empty

    def apply(self, event: StreamInput) -> StreamState:
        """Move to the state :data:`TRANSITIONS` gives; raises :class:`StreamStateError` if none."""
        nxt = TRANSITIONS[self.state].get(event)
        if nxt is None:
            raise StreamStateError(f"stream {self.sid}: {event.name} in state {self.state.name}")
        self.state = nxt
        return nxt


# --- events: what receive_data tells the I/O layer --------------------------------------------------
@dataclass(frozen=True, slots=True)
class ConnectionTerminated:
    """We sent GOAWAY with ``error_code``: write what is left, then close the socket."""

    error_code: ErrorCode
    reason: str


@dataclass(frozen=True, slots=True)
class StreamReset:
    """We reset a stream with ``error_code`` (RST_STREAM)."""

    stream_id: int
    error_code: ErrorCode


Event = ConnectionTerminated | StreamReset
_NO_EVENTS: tuple[Event, ...] = ()


class H2Connection:
    """One HTTP/2 connection from Envoy, without I/O: bytes in, events and bytes out.

    ``receive_data`` parses frames, runs the handler inline for each complete gRPC message, and
    queues every frame to send; ``data_to_send`` drains them. After a :class:`ConnectionTerminated`
    event the connection accepts nothing more and the caller closes the socket.
    """

    def __init__(self, path: bytes, handler: Handler, stats: TransportStats) -> None:
        self.path = path
        self.handler = handler
        self.stats = stats
        self.buf = bytearray()
        self.preface_seen = False
        self.decoder = CachingDecoder(MAX_HEADER_LIST)
        self.streams: dict[int, _Stream] = {}
        self.last_sid = 0
        self.conn_send_window = DEFAULT_WINDOW
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_frame = MAX_FRAME
        self.conn_recv_unacked = 0
        self.table_size_sent = False
        self.continuation: tuple[int, int, bytearray] | None = None  # (sid, flags, block) while a header block is split
        self.goaway_sent = False
        self.terminated = False
        self.out: list[bytes] = []
        self._events: list[Event] = []

    # -- the API -------------------------------------------------------------------------------------
    def initiate(self) -> None:
        """Queue our SETTINGS and the connection window increase (the server's side of the preface)."""
        self.stats.connections += 1
        settings = b"".join(struct.pack(">HI", k, v) for k, v in (
            (SettingCode.ENABLE_PUSH, 0), (SettingCode.MAX_CONCURRENT_STREAMS, MAX_CONCURRENT_STREAMS),
            (SettingCode.INITIAL_WINDOW_SIZE, RECV_WINDOW), (SettingCode.MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST)))
        self.out.append(_frame(SETTINGS, 0, 0, settings) + _frame(WINDOW_UPDATE, 0, 0, _u32.pack(RECV_WINDOW - DEFAULT_WINDOW)))

    def data_to_send(self) -> bytes:
        """Everything queued since the last call, as one write."""
        if not self.out:
            return b""
        data = b"".join(self.out)
        self.out.clear()
        return data

    def close(self, code: ErrorCode = ErrorCode.NO_ERROR) -> None:
        """Graceful stop: GOAWAY(``code``) so Envoy opens new streams elsewhere."""
        self._goaway(code)

    def connection_lost(self) -> None:
        self.streams.clear()

    def receive_data(self, data: bytes) -> Sequence[Event]:
        """Feed bytes from the peer; returns what happened that the I/O layer must act on."""
        if self.terminated:
            return _NO_EVENTS
        buf = self.buf
        buf += data
        try:
            if not self.preface_seen:
                if len(buf) < len(PREFACE):
                    if not PREFACE.startswith(bytes(buf)):
                        raise ProtocolError("not an HTTP/2 connection preface")
                    return _NO_EVENTS
                if buf[:len(PREFACE)] != PREFACE:
                    raise ProtocolError("not an HTTP/2 connection preface")
                del buf[:len(PREFACE)]
                self.preface_seen = True
            pos, n = 0, len(buf)
            while n - pos >= 9:
                length = (buf[pos] << 16) | (buf[pos + 1] << 8) | buf[pos + 2]
                if length > MAX_FRAME:
                    raise FrameSizeError(f"frame of {length} bytes exceeds {MAX_FRAME}")
                end = pos + 9 + length
                if end > n:
                    break
                ftype, flags = buf[pos + 3], buf[pos + 4]
                sid = _u32.unpack_from(buf, pos + 5)[0] & 0x7FFFFFFF
                self._frame_in(ftype, flags, sid, bytes(buf[pos + 9:end]))
                pos = end
            del buf[:pos]
        except H2Error as exc:
            self._connection_error(exc)
        if not self._events:
            return _NO_EVENTS
        events, self._events = self._events, []
        return events

    # -- frames in -----------------------------------------------------------------------------------
    def _frame_in(self, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        if self.continuation is not None and ftype != CONTINUATION:
            raise ProtocolError("header block interrupted before END_HEADERS")
        if ftype == DATA:
            self._data(flags, sid, payload)
        elif ftype == HEADERS:
            self._headers(flags, sid, payload)
        elif ftype == CONTINUATION:
            if self.continuation is None or self.continuation[0] != sid:
                raise ProtocolError("unexpected CONTINUATION")
            block = self.continuation[2]
            block += payload
            if len(block) > MAX_HEADER_LIST:
                raise DenialOfServiceError("header block too large")
            if flags & END_HEADERS:
                first_flags = self.continuation[1]
                self.continuation = None
                self._header_block(first_flags, sid, bytes(block))
        elif ftype == SETTINGS:
            self._settings(flags, sid, payload)
        elif ftype == WINDOW_UPDATE:
            self._window_update(sid, payload)
        elif ftype == PING:
            if sid != 0:
                raise ProtocolError("PING on a stream")
            if len(payload) != 8:
                raise FrameSizeError("PING payload is not 8 bytes")
            if not flags & ACK:
                self.out.append(_frame(PING, ACK, 0, payload))
        elif ftype == RST_STREAM:
            if sid == 0:
                raise ProtocolError("RST_STREAM on stream 0")
            if len(payload) != 4:
                raise FrameSizeError("RST_STREAM payload is not 4 bytes")
            stream = self.streams.pop(sid, None)
            if stream is not None:
                stream.apply(StreamInput.RESET)
        elif ftype == GOAWAY:
            pass  # the peer opens no new streams and closes the connection when its calls are done
        elif ftype == PRIORITY:
            if sid == 0:
                raise ProtocolError("PRIORITY on stream 0")
        elif ftype == PUSH_PROMISE:
            raise ProtocolError("clients cannot push")
        # Unknown frame types are ignored (§5.5).

    @staticmethod
    def _strip_padding(flags: int, payload: bytes) -> bytes:
        if flags & PADDED:
            if not payload:
                raise ProtocolError("PADDED frame without pad length")
            pad = payload[0]
            if pad >= len(payload):
                raise ProtocolError("padding exceeds frame")
            return payload[1:len(payload) - pad]
        return payload

    def _headers(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise ProtocolError("HEADERS on stream 0")
        block = self._strip_padding(flags, payload)
        if flags & PRIORITY_FLAG:
            if len(block) < 5:
                raise FrameSizeError("HEADERS priority fields truncated")
            block = block[5:]
        if flags & END_HEADERS:
            self._header_block(flags, sid, block)
        else:
            self.continuation = (sid, flags, bytearray(block))

    def _header_block(self, flags: int, sid: int, block: bytes) -> None:
        try:
            fields = self.decoder.decode(block)
        except hpack.exceptions.HPACKError as exc:  # the shared table is now unknown: the connection is lost
            raise CompressionError(f"HPACK: {exc}") from None
        stream = self.streams.get(sid)
        if stream is not None:  # trailers from the client
            if not flags & END_STREAM:
                self._reset(stream, PROTOCOL_ERROR)
                return
            self._remote_end(stream)
            return
        if sid % 2 == 0:
            raise ProtocolError(f"client stream id {sid} is even")
        if sid <= self.last_sid:
            return  # a stream we already ended (and reset): frames in flight are dropped
        self.last_sid = sid
        if self.goaway_sent:
            return
        if len(self.streams) >= MAX_CONCURRENT_STREAMS:
            self.out.append(_frame(RST_STREAM, 0, sid, _u32.pack(REFUSED_STREAM)))
            self.stats.stream_resets += 1
            self._events.append(StreamReset(sid, REFUSED_STREAM))
            return
        stream = _Stream(sid, self.peer_initial_window)
        self.streams[sid] = stream
        self.stats.streams += 1
        method = path = ctype = None
        for k, v in fields:
            if k == b":path":
                path = v
            elif k == b":method":
                method = v
            elif k == b"content-type":
                ctype = v
        if method != b"POST" or ctype is None or not ctype.startswith(b"application/grpc"):
            self._reset(stream, PROTOCOL_ERROR)  # not a gRPC request at all
            return
        if path != self.path:
            self._finish(stream, GrpcStatus.UNIMPLEMENTED, f"unknown method {path.decode('latin-1') if path else ''}")
            return
        if flags & END_STREAM:
            self._remote_end(stream)

    def _data(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise ProtocolError("DATA on stream 0")
        size = len(payload)
        self.conn_recv_unacked += size
        if self.conn_recv_unacked > RECV_WINDOW:
            raise FlowControlError("peer exceeded the connection window")
        if self.conn_recv_unacked >= RECV_WINDOW // 2:
            self.out.append(_frame(WINDOW_UPDATE, 0, 0, _u32.pack(self.conn_recv_unacked)))
            self.conn_recv_unacked = 0
        stream = self.streams.get(sid)
        if stream is None:
            if sid > self.last_sid:
                raise ProtocolError(f"DATA on idle stream {sid}")
            return  # a stream we already finished or reset: the bytes are counted above and dropped
        if stream.state not in REMOTE_OPEN:
            self._reset(stream, STREAM_CLOSED)  # DATA after the client's END_STREAM (RFC 9113 §5.1)
            return
        data = self._strip_padding(flags, payload)
        stream.recv_unacked += size
        if stream.recv_unacked > RECV_WINDOW:
            self._reset(stream, FLOW_CONTROL_ERROR)
            return
        if stream.state is _OPEN:  # after our trailers, the client's remaining bytes are dropped
            buf = stream.buf
            buf += data
            while len(buf) >= 5 and stream.state is _OPEN:
                n = _u32.unpack_from(buf, 1)[0]
                if buf[0] != 0:
                    self._finish(stream, GrpcStatus.UNIMPLEMENTED, "compressed messages are not supported")
                    break
                if n > MAX_MESSAGE:
                    self._finish(stream, GrpcStatus.RESOURCE_EXHAUSTED, f"message of {n} bytes exceeds {MAX_MESSAGE}")
                    break
                if len(buf) < 5 + n:
                    break
                message = bytes(buf[5:5 + n])
                del buf[:5 + n]
                self._message(stream, message)
            if buf and len(buf) > 5 and sum(len(s.buf) for s in self.streams.values()) > MAX_BUFFERED:
                # Partial messages are the only unbounded state (the connection window is re-opened as
                # bytes arrive): a peer that parks more than this in half-sent messages is cut off.
                raise DenialOfServiceError(f"more than {MAX_BUFFERED} bytes of partial messages")
            if stream.recv_unacked >= RECV_WINDOW // 2 and stream.state is _OPEN and not flags & END_STREAM:
                self.out.append(_frame(WINDOW_UPDATE, 0, sid, _u32.pack(stream.recv_unacked)))
                stream.recv_unacked = 0
        if flags & END_STREAM:
            self._remote_end(stream)

    def _message(self, stream: _Stream, message: bytes) -> None:
        self.stats.messages += 1
        try:
            reply, end = self.handler(message)
        except Exception:  # a bug in the handler fails this stream (Envoy then fails open), not the server
            self.stats.handler_errors += 1
            if self.stats.handler_errors == 1 or self.stats.handler_errors % 1000 == 0:
                log.exception("ext_proc_handler_failed", errors=self.stats.handler_errors)
            self._finish(stream, GrpcStatus.INTERNAL, "handler failed")
            return
        if reply is not None:
            self._send_message(stream, reply)
        if end:
            self._finish(stream, GRPC_OK)

    def _remote_end(self, stream: _Stream) -> None:
        if stream.apply(_RECV_END_STREAM) is _CLOSING_REMOTE_ENDED:
            return  # trailers still waiting for window; _drain removes the stream
        if stream.buf:
            self._finish(stream, GrpcStatus.INTERNAL, "stream ended inside a message")
        else:
            self._finish(stream, GRPC_OK)  # the client half-closed: the call is complete

    def _settings(self, flags: int, sid: int, payload: bytes) -> None:
        if sid != 0:
            raise ProtocolError("SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise FrameSizeError("SETTINGS ACK with payload")
            return
        if len(payload) % 6:
            raise FrameSizeError("SETTINGS length not a multiple of 6")
        for i in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HI", payload, i)
            if key == SettingCode.INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise FlowControlError("INITIAL_WINDOW_SIZE too large")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for s in self.streams.values():
                    s.send_window += delta
            elif key == SettingCode.MAX_FRAME_SIZE:
                if not MAX_FRAME <= value <= 2**24 - 1:
                    raise ProtocolError("MAX_FRAME_SIZE out of range")
                self.peer_max_frame = value
            elif key == SettingCode.ENABLE_PUSH and value > 1:
                raise ProtocolError("ENABLE_PUSH must be 0 or 1")
            # HEADER_TABLE_SIZE: our encoder never indexes (table size 0), so any value is fine.
        self.out.append(_frame(SETTINGS, ACK, 0))
        for s in list(self.streams.values()):
            self._drain(s)

    def _window_update(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise FrameSizeError("WINDOW_UPDATE length")
        inc = _u32.unpack(payload)[0] & 0x7FFFFFFF
        if sid == 0:
            if inc == 0:
                raise ProtocolError("zero connection WINDOW_UPDATE")
            self.conn_send_window += inc
            if self.conn_send_window > MAX_WINDOW:
                raise FlowControlError("connection window overflow")
            for s in list(self.streams.values()):
                self._drain(s)
            return
        stream = self.streams.get(sid)
        if stream is None:
            return
        if inc == 0:
            self._reset(stream, PROTOCOL_ERROR)
            return
        stream.send_window += inc
        if stream.send_window > MAX_WINDOW:
            self._reset(stream, FLOW_CONTROL_ERROR)
            return
        self._drain(stream)

    # -- frames out ----------------------------------------------------------------------------------
    def _header_frame(self, sid: int, block: bytes, flags: int) -> bytes:
        if not self.table_size_sent:
            block = TABLE_SIZE_ZERO + block
            self.table_size_sent = True
        return _frame(HEADERS, flags | END_HEADERS, sid, block)

    def _send_message(self, stream: _Stream, message: bytes) -> None:
        if stream.state in LOCAL_DONE:
            return
        if not stream.headers_sent:
            self.out.append(self._header_frame(stream.sid, RESPONSE_HEADERS, 0))
            stream.headers_sent = True
        stream.pending.append(_u32.pack(len(message)).rjust(5, b"\x00") + message)
        self._drain(stream)

    def _finish(self, stream: _Stream, status: GrpcStatus, message: str = "") -> None:
        """End our side of the call with a gRPC status (trailers, or trailers-only before any reply)."""
        if stream.state in LOCAL_DONE:
            return
        if status != GRPC_OK:
            self.stats.grpc_errors += 1
        block = TRAILERS_OK if status == GRPC_OK and not message else _trailers(status, message)
        if not stream.headers_sent:
            block = RESPONSE_HEADERS + block  # trailers-only response
            stream.headers_sent = True
        stream.apply(_FINISH)
        stream.trailers = block
        stream.buf.clear()
        self._drain(stream)

    def _drain(self, stream: _Stream) -> None:
        """Send what flow control allows; after the last DATA, the trailers end the stream."""
        pending = stream.pending
        while pending:
            item = pending[0]
            n = min(len(item), stream.send_window, self.conn_send_window, self.peer_max_frame)
            if n <= 0:
                return  # wait for WINDOW_UPDATE
            self.out.append(_frame(DATA, 0, stream.sid, item[:n]))
            stream.send_window -= n
            self.conn_send_window -= n
            if n == len(item):
                pending.pop(0)
            else:
                pending[0] = item[n:]
        if stream.trailers is not None:
            self.out.append(self._header_frame(stream.sid, stream.trailers, END_STREAM))
            stream.trailers = None
            if stream.state is _CLOSING:
                # The response is complete while the client's side is still open (the root answers
                # the first message): RST_STREAM(NO_ERROR) tells it to stop sending (RFC 9113
                # §8.1), as grpc servers do, so no state is kept for a minutes-long generation.
                self.out.append(_frame(RST_STREAM, 0, stream.sid, _u32.pack(NO_ERROR)))
            stream.apply(_TRAILERS_WRITTEN)
            self.streams.pop(stream.sid, None)

    def _reset(self, stream: _Stream, code: ErrorCode) -> None:
        self.out.append(_frame(RST_STREAM, 0, stream.sid, _u32.pack(code)))
        self.stats.stream_resets += 1
        stream.apply(_RESET)
        stream.pending.clear()
        stream.trailers = None
        self.streams.pop(stream.sid, None)
        self._events.append(StreamReset(stream.sid, code))

    def _connection_error(self, exc: H2Error) -> None:
        self.stats.connection_errors += 1
        self._goaway(exc.code, exc.reason)
        self.terminated = True
        self._events.append(ConnectionTerminated(exc.code, exc.reason))

    def _goaway(self, code: ErrorCode, reason: str = "") -> None:
        if not self.goaway_sent:
            self.goaway_sent = True
            self.out.append(_frame(GOAWAY, 0, 0, _u32.pack(self.last_sid) + _u32.pack(code) + reason.encode()[:256]))


class H2GrpcProtocol(asyncio.Protocol):
    """The asyncio side of one connection: socket bytes to :class:`H2Connection` and back."""

    def __init__(self, path: bytes, handler: Handler, stats: TransportStats, on_close: Callable[[H2GrpcProtocol], None]) -> None:
        self.conn = H2Connection(path, handler, stats)
        self.on_close = on_close
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport; not an isinstance check: uvloop's TCPTransport does not derive from
        # asyncio.Transport (an assert here dropped every connection under uvloop).
        self.transport = stream = cast("asyncio.Transport", transport)
        self.conn.initiate()
        stream.write(self.conn.data_to_send())

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.connection_lost()
        self.on_close(self)

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
                if self.transport is not None:
                    self.transport.close()

    def _flush(self) -> None:
        out = self.conn.data_to_send()
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(out)

    def shutdown(self) -> None:
        """Graceful stop: GOAWAY(NO_ERROR) so Envoy opens new streams elsewhere, then close."""
        self.conn.close()
        self._flush()
        if self.transport is not None:
            self.transport.close()


@dataclass
class H2GrpcServer:
    """The listening socket and its connections (``start`` / ``stop`` like a grpc.aio server)."""

    path: str
    handler: Handler
    stats: TransportStats = field(default_factory=TransportStats)
    _server: asyncio.AbstractServer | None = None
    _conns: set[H2GrpcProtocol] = field(default_factory=set)

    async def start(self, host: str, port: int, reuse_port: bool = False, ssl: ssl_module.SSLContext | None = None) -> int:
        """Listen and return the bound port (``port=0`` picks a free one); with ``ssl``, TLS (its ALPN must offer h2)."""
        path = self.path.encode()

        def factory() -> H2GrpcProtocol:
            proto = H2GrpcProtocol(path, self.handler, self.stats, self._conns.discard)
            self._conns.add(proto)
            return proto

        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(factory, host, port, reuse_port=reuse_port or None, backlog=1024, ssl=ssl,
                                                ssl_handshake_timeout=10.0 if ssl is not None else None)
        # (asyncio and uvloop set TCP_NODELAY on accepted connections themselves.)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self, grace_s: float = 2.0) -> None:
        if self._server is not None:
            self._server.close()
        for proto in list(self._conns):
            proto.shutdown()
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), grace_s)
            except TimeoutError:
                pass
