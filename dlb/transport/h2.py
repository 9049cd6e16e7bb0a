"""A minimal gRPC-over-HTTP/2 server for one bidirectional-streaming method, on the asyncio loop.

Why this exists next to grpc.aio: the root's ext_proc hop is the hottest path in DLB (one gRPC
stream per user request). Measured on the 2-core test box (h2load, one stream at a time, constant
reply, ``docs/data-plane.md``): a grpc.aio servicer answers in 0.81 ms p50 and saturates at
~2.7k streams/s; the pure-Python ``h2`` state machine in 0.51 ms / ~3.2k/s; a plain asyncio
protocol doing only HTTP/2 framing in 0.17 ms / ~27k/s. grpc.aio's cost is its thread hand-offs
(C-core poller → asyncio), not our code, and no grpc option changed it (poll strategy,
EventEngine experiments, sync server: all within noise). Envoy's ext_proc client speaks plain
HTTP/2 + gRPC framing, and the subset it needs from a server is small:

- one method (``:path`` checked; more through :class:`Route`, e.g. the gRPC health service), messages
  framed as 1 flag byte + 4 length bytes; a request that is not gRPC gets HTTP 415 (405 without
  POST) as the gRPC protocol spec says, a malformed one (RFC 9113 §8) RST_STREAM(PROTOCOL_ERROR);
- replies that are pre-serialised bytes, sent as HEADERS / DATA / trailers with a constant HPACK
  encoding (static-table references and literals *without* indexing, so our encoder never has
  state; the first header block on a connection sets our dynamic table size to 0);
- request header blocks decoded by ``hpack_decoder`` (it keeps the peer's dynamic table; ``hpack``'s bounds and errors);
- flow control both ways (RFC 9113 §5.2), SETTINGS, PING, RST_STREAM, GOAWAY, CONTINUATION,
  padding and priority flags; protocol violations end the connection with GOAWAY and the right
  error code, a broken stream gets RST_STREAM, a bad message gets a gRPC status — never a crash.

The handler is synchronous: ``handler(message: bytes) -> (reply: bytes | None, end: bool)``. The
root decides from cached state without awaiting, so running it inline in ``data_received`` is what
makes the hop cheap; a handler that must wait belongs on grpc.aio (``--transport grpc``).

Structure (after python-hyper/h2): :class:`H2Connection` is the protocol with no I/O at all — bytes
in (``receive_data``), events and bytes out (``data_to_send``) — so tests feed it frames directly and
hypothesis fuzzes it; ``server.H2GrpcProtocol`` is the thin ``asyncio.Protocol`` that moves bytes
between it and a socket (with the connection cap and the timers); ``headers`` decodes and validates
header blocks; ``limits`` holds every bound (``H2Limits``) and the counters that show it was hit.
Passes h2spec 146/146 (``tests/integration/test_h2spec.py``).
A stream's life is a :class:`StreamState` changed only through :data:`TRANSITIONS`; frame types,
error codes and gRPC statuses are IntEnums, and protocol errors are :class:`H2Error` subclasses that
carry the error code they end the connection with.
"""

from __future__ import annotations

import enum
import functools
import heapq
import struct
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import hpack
import hpack.exceptions
from google.protobuf.message import DecodeError

from dlb.errors import DlbError
from dlb.log import get_logger
from dlb.transport.headers import CachingDecoder, HeaderBlock
from dlb.transport.limits import H2Limits, TransportStats

log = get_logger("dlb.h2server")



class Pending(Protocol):
    """A reply that is not ready yet (an ``asyncio.Future[bytes]`` fits): resolved, or cancelled by us."""

    def add_done_callback(self, fn: Callable[[Any], object], /) -> None: ...
    def cancel(self) -> bool: ...
    def cancelled(self) -> bool: ...
    def result(self) -> bytes: ...


@dataclass(frozen=True, slots=True)
class Later:
    """A handler's answer that comes after the call returns (the leaf holding a request for a rank):
    ``now`` is sent at once (if not None), ``later``'s result when it resolves. If the stream ends first
    (Envoy reset it), ``later`` is cancelled, which tells the handler's owner the request is gone."""

    now: bytes | None
    later: Pending


#: The request path of a service: one serialised message in, ``(reply or None, end_of_call)`` out.
Handler = Callable[[bytes], "tuple[bytes | Later | None, bool]"]


class StreamCall(Protocol):
    """A long-lived bidirectional call (xDS's ADS): told each message, the client's half-close and
    the stream's end; it answers whenever it likes through its :class:`CallHandle`."""

    def on_message(self, message: bytes) -> None: ...
    def on_half_close(self) -> None: ...
    def on_closed(self) -> None: ...


class CallHandle:
    """What a :class:`StreamCall` answers through: messages at any time, then one status.

    Why not a task and a queue per call: a grpc.aio stream costs a future and a thread hand-off per
    message each way; here a message is a method call inside ``data_received`` and a send is a queued
    frame written at once (``on_output``), so 5,000 xDS streams cost no task while idle.
    """

    __slots__ = ("_conn", "_stream")

    def __init__(self, conn: H2Connection, stream: _Stream) -> None:
        self._conn, self._stream = conn, stream

    @property
    def peer(self) -> str:
        return self._conn.peer

    @property
    def peer_auth(self) -> Mapping[str, Sequence[bytes]]:
        """The verified client certificate's SANs (gRPC's auth-context keys); empty on plaintext."""
        return self._conn.peer_auth

    @property
    def open(self) -> bool:
        return self._stream.state not in LOCAL_DONE and self._conn.streams.get(self._stream.sid) is self._stream

    def send(self, message: bytes) -> None:
        """Send one message (flow-controlled: queued while the peer's window is shut)."""
        conn = self._conn
        conn._send_message(self._stream, message)
        conn.flush_later()

    def finish(self, status: GrpcStatus, message: str = "") -> None:
        """End the call with a gRPC status (trailers)."""
        conn = self._conn
        conn._finish(self._stream, status, message)
        conn.flush_later()


@dataclass(slots=True)
class CallContext:
    """What the transport knows of the call whose message a handler is running on (set before each call).

    Why not an argument: the handler's one-argument contract is the hot path of every service; only the
    tracing wrapper reads this. One process serves on one thread, so one instance is enough.
    """

    #: The gRPC call's ``traceparent`` metadata: Envoy's span of the ext_proc call, when Envoy traces.
    traceparent: bytes | None = None
    #: The handler's own state for this call: None at its first message, then what the handler left here
    #: at the previous one (the transport keeps it with the call; the leaf's stream token count).
    state: Any = None


CALL = CallContext()

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
_SELF_DEPENDENT = 0x100  # (not a wire flag) a HEADERS frame whose priority names its own stream


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
#: grpc's default receive limit (``H2Limits.max_message``'s default).
MAX_MESSAGE = 4 * 1024 * 1024
_DEFAULTS = H2Limits()
# The defaults under their historical names (tests and callers that predate H2Limits).
MAX_CONCURRENT_STREAMS = _DEFAULTS.max_concurrent_streams
MAX_HEADER_LIST = _DEFAULTS.max_header_list
MAX_BUFFERED = _DEFAULTS.max_buffered

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
#: Answers to requests that are not gRPC (PROTOCOL-HTTP2.md: "If Content-Type does not begin with
#: application/grpc, gRPC servers SHOULD respond with HTTP status of 415"; a gRPC content type with a
#: method other than POST gets 405): a status block and a short text body.
PLAIN_REPLY = {
    status: (_block((":status", str(status)), ("content-type", "text/plain")), text) for status, text in (
        (415, b"this is a gRPC server: content-type must be application/grpc\n"),
        (405, b"gRPC requests use POST\n"))
}


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
_OPEN, _CLOSING, _CLOSING_REMOTE_ENDED, _CLOSED = _S.OPEN, _S.CLOSING, _S.CLOSING_REMOTE_ENDED, _S.CLOSED
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
    route: Route | None = None
    state: StreamState = StreamState.OPEN
    #: Our send window minus the peer's SETTINGS_INITIAL_WINDOW_SIZE: a SETTINGS change then moves
    #: every stream's window at once without visiting any of them (issue 14, row 2).
    window_delta: int = 0
    recv_unacked: int = 0
    buf: bytearray = field(default_factory=bytearray)
    headers_sent: bool = False
    pending: list[bytes] = field(default_factory=list)  # DATA payloads waiting for flow-control window
    later: Pending | None = None  # a reply the handler owes (:class:`Later`), cancelled if the stream ends
    #: The block that ends the stream, sent once ``pending`` is empty: trailers (HEADERS with
    #: END_STREAM), or b"" for an empty DATA frame with END_STREAM (the end of a plain HTTP reply).
    trailers: bytes | None = None
    window_blocked: bool = False  # in H2Connection.window_blocked (waiting for its own window)
    reject: int = 0  # not a gRPC request: the HTTP status it gets once the client has sent it all
    head_only: bool = False  # a HEAD request: the reply has no body
    content_length: int | None = None  # as the client declared it (checked against the DATA received)
    counted: bool = False  # count DATA bytes (content_length set, or a reject): gRPC calls skip it
    received: int = 0
    client_ending: bool = False  # the frame being processed carries END_STREAM
    held: int = 0  # bytes of ``buf`` counted in H2Connection.buffered and the server's total
    traceparent: bytes | None = None  # the call's trace context (HeaderBlock.traceparent)
    call_state: Any = None  # the handler's per-call state (CallContext.state)
    call: StreamCall | None = None  # a bidirectional call's handler (Route.open_call), told when the stream ends

    def apply(self, event: StreamInput) -> StreamState:
        """Move to the state :data:`TRANSITIONS` gives; raises :class:`StreamStateError` if none."""
        nxt = TRANSITIONS[self.state].get(event)
        if nxt is None:
            raise StreamStateError(f"stream {self.sid}: {event.name} in state {self.state.name}")
        self.state = nxt
        return nxt


@dataclass(frozen=True, slots=True)
class Route:
    """How a ``:path`` is served: ``handler(message) -> (reply, end)`` for each request message.

    ``watch``: a server-streaming call (``grpc.health.v1.Health/Watch``): the client's half-close does
    not end it, and :meth:`H2Connection.notify` sends it each later message until the server ends it.
    ``open_call``: a bidirectional call (``handler`` unused): each stream gets its own :class:`StreamCall`,
    which ends it when it chooses; the server's stop ends it like a watch.
    """

    handler: Handler
    watch: bool = False
    open_call: Callable[[CallHandle], StreamCall] | None = None

    @classmethod
    def bidi(cls, open_call: Callable[[CallHandle], StreamCall]) -> Route:
        return cls(_no_handler, watch=True, open_call=open_call)


def _no_handler(_message: bytes) -> tuple[bytes | Later | None, bool]:  # pragma: no cover - never called
    raise AssertionError("a bidirectional route's messages go to its StreamCall")


def route_table(path: bytes, handler: Handler, routes: Mapping[bytes, Route] | None = None) -> dict[bytes, Route]:
    """``path`` served by ``handler``, beside ``routes``: what :class:`H2Connection` looks a ``:path`` up in."""
    return {path: Route(handler), **(routes or {})}


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


@functools.lru_cache(maxsize=8)
def server_preface(limits: H2Limits) -> bytes:
    """Our SETTINGS and the connection window increase: the same bytes for every connection under
    ``limits``, so built once (a squat opens 1,000+ connections a second)."""
    settings = b"".join(struct.pack(">HI", k, v) for k, v in (
        (SettingCode.ENABLE_PUSH, 0), (SettingCode.MAX_CONCURRENT_STREAMS, limits.max_concurrent_streams),
        (SettingCode.INITIAL_WINDOW_SIZE, RECV_WINDOW), (SettingCode.MAX_HEADER_LIST_SIZE, limits.max_header_list)))
    return _frame(SETTINGS, 0, 0, settings) + _frame(WINDOW_UPDATE, 0, 0, _u32.pack(RECV_WINDOW - DEFAULT_WINDOW))


#: Control frames a second the allowance regains (beyond its ``H2Limits.control_frame_allowance``
#: burst): ten times an Envoy's or a DLB service's keepalive rate, far below a flood's thousands.
CONTROL_REFILL_PER_S = 1.0


class H2Connection:
    """One HTTP/2 connection from Envoy, without I/O: bytes in, events and bytes out.

    ``receive_data`` parses frames, runs the handler inline for each complete gRPC message, and
    queues every frame to send; ``data_to_send`` drains them. After a :class:`ConnectionTerminated`
    event the connection accepts nothing more and the caller closes the socket.

    Work per frame is O(1) amortised, whatever the number of streams: send windows are kept relative
    to the peer's initial window (a SETTINGS change touches no stream); only streams with output
    waiting are visited when a window opens — those waiting for the connection window in FIFO order
    until it is spent, those waiting for their own window in a heap ordered by how far they are from
    it; partial messages are counted as they arrive, not summed per frame. Control frames beyond
    ``H2Limits.control_frame_allowance`` plus 10 per stream opened or DATA frame sent end the
    connection (a flood does no useful work).
    """

    def __init__(self, path: bytes, handler: Handler, stats: TransportStats, limits: H2Limits | None = None,
                 routes: Mapping[bytes, Route] | None = None, table: Mapping[bytes, Route] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits = limits or _DEFAULTS
        self.clock = clock
        #: A server passes the same table to all its connections (one object, not two per connection).
        self.routes: Mapping[bytes, Route] = table if table is not None else route_table(path, handler, routes)
        self.stats = stats
        self.buf = bytearray()
        self.preface_seen = False
        # Made at the first header block, as ``skipped`` at the first gap: a connection that never opens
        # a stream (a squatter's) holds ~16 objects the garbage collector walks, not ~22.
        self._decoder: CachingDecoder | None = None
        self.streams: dict[int, _Stream] = {}
        self.last_sid = 0
        self.streams_opened = 0
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
        #: Streams with output waiting for the connection window (FIFO: a dict keeps insertion order).
        self.conn_blocked: dict[int, _Stream] = {}
        #: (-window_delta, sid) of streams waiting for their own window; stale entries are skipped.
        self.window_blocked: list[tuple[int, int]] = []
        #: Streams closed at both ends or reset by the peer: frames on them are STREAM_CLOSED errors.
        #: Streams *we* reset are not here — frames the peer sent before it saw our RST are dropped.
        self.closed: dict[int, None] = {}
        self.skipped: deque[tuple[int, int]] | None = None  # stream id ranges the client never opened (16 kept)
        self.watchers: dict[int, _Stream] = {}
        self.buffered = 0  # bytes of partial messages on this connection
        self.control_budget = limits.control_frame_allowance
        self._budget_refilled = clock()
        #: Called when output was queued outside :meth:`receive_data` (a :class:`Later` reply): write it.
        self.on_output: Callable[[], None] | None = None
        self._receiving = False  # inside receive_data: output is written when it returns
        #: Set by the I/O layer: the peer's address and, under TLS, its verified certificate's SANs.
        self.peer = ""
        self.peer_auth: Mapping[str, Sequence[bytes]] = {}

    # -- the API -------------------------------------------------------------------------------------
    def initiate(self) -> None:
        """Queue our SETTINGS and the connection window increase (the server's side of the preface)."""
        self.stats.connections += 1
        self.out.append(server_preface(self.limits))

    def data_to_send(self) -> bytes:
        """Everything queued since the last call, as one write."""
        if not self.out:
            return b""
        data = b"".join(self.out)
        self.out.clear()
        return data

    def close(self, code: ErrorCode = ErrorCode.NO_ERROR) -> None:
        """Graceful stop: GOAWAY(``code``) so Envoy opens new streams elsewhere; streams already open
        continue, new ones are refused."""
        self._goaway(code)

    def notify(self, route: Route, message: bytes) -> None:
        """Send ``message`` on every open watch call of ``route`` (e.g. a health status change)."""
        for stream in list(self.watchers.values()):
            if stream.route is route:
                self._send_message(stream, message)

    def end_watches(self, status: GrpcStatus, message: str = "") -> None:
        """End every watch and bidirectional call (shutdown: they would otherwise never finish)."""
        for stream in list(self.watchers.values()):
            self._finish(stream, status, message)

    def flush_later(self) -> None:
        """Output was queued by a :class:`CallHandle`: write it now, unless ``receive_data`` will."""
        if not self._receiving and self.on_output is not None:
            self.on_output()

    @property
    def decoder(self) -> CachingDecoder:
        """The HPACK decoder and its cache, made on first use."""
        if self._decoder is None:
            self._decoder = CachingDecoder(self.limits.max_header_list, self.stats, self.limits)
        return self._decoder

    def connection_lost(self) -> None:
        """Forget every stream and give back the server-wide budget this connection held."""
        for stream in list(self.streams.values()):
            self._cancel_later(stream)
            self._end_call(stream)
        self.streams.clear()
        self.watchers.clear()
        self.conn_blocked.clear()
        self.window_blocked.clear()
        if self._decoder is not None:
            self._decoder.release()
        self.stats.buffered_bytes -= self.buffered
        self.buffered = 0

    def receive_data(self, data: bytes) -> Sequence[Event]:
        """Feed bytes from the peer; returns what happened that the I/O layer must act on."""
        if self.terminated:
            return _NO_EVENTS
        buf = self.buf
        buf += data
        self._receiving = True
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
        finally:
            self._receiving = False
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
                if sid in self.closed:
                    raise StreamStateError(f"CONTINUATION on closed stream {sid}")
                raise ProtocolError("unexpected CONTINUATION")
            if not payload:
                self._spend()  # an empty CONTINUATION does nothing but cost a frame
            block = self.continuation[2]
            block += payload
            if len(block) > self.limits.max_header_list:
                raise DenialOfServiceError("header block too large")
            if flags & END_HEADERS:
                first_flags = self.continuation[1]
                self.continuation = None
                self._header_block(first_flags, sid, bytes(block))
        else:
            self._spend()
            if ftype == SETTINGS:
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
                self._rst_stream(sid, payload)
            elif ftype == GOAWAY:
                if sid != 0:
                    raise ProtocolError("GOAWAY on a stream")
                # The peer opens no new streams and closes the connection when its calls are done.
            elif ftype == PRIORITY:
                self._priority(sid, payload)
            elif ftype == PUSH_PROMISE:
                raise ProtocolError("clients cannot push")
            # Unknown frame types are ignored (§5.5).

    def _spend(self) -> None:
        """One frame that does no work for a call (control, empty DATA or CONTINUATION)."""
        self.control_budget -= 1
        if self.control_budget < 0:
            # Refilled with time (read only here, when spent): a keepalive PING every 10 s on an xDS stream
            # that carries nothing spent a fixed allowance in ~28 h and was then cut as a flood.
            now = self.clock()
            refill = int((now - self._budget_refilled) * CONTROL_REFILL_PER_S)
            if refill > 0:
                self.control_budget = min(self.limits.control_frame_allowance, self.control_budget + refill)
                self._budget_refilled = now
            if self.control_budget < 0:
                self.stats.control_floods += 1
                raise DenialOfServiceError("control frame flood")

    def _closed_frame(self, sid: int, what: str) -> None:
        """A DATA or HEADERS frame for a stream that is not open (sid <= last_sid)."""
        if sid in self.closed:
            raise StreamStateError(f"{what} on closed stream {sid}")
        for lo, hi in self.skipped or ():
            if lo <= sid <= hi:
                raise ProtocolError(f"{what} on stream {sid}, lower than a stream already opened")
        # Otherwise a stream we reset (or forgot): the peer sent this before it saw our RST_STREAM.

    def _rst_stream(self, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise ProtocolError("RST_STREAM on stream 0")
        if len(payload) != 4:
            raise FrameSizeError("RST_STREAM payload is not 4 bytes")
        if sid > self.last_sid:
            raise ProtocolError(f"RST_STREAM on idle stream {sid}")
        stream = self.streams.get(sid)
        if stream is not None:
            stream.apply(_RESET)
            self._forget(stream)
            self._remember_closed(sid)

    def _priority(self, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise ProtocolError("PRIORITY on stream 0")
        if len(payload) != 5:
            self._reset_id(sid, ErrorCode.FRAME_SIZE_ERROR)  # a stream error (RFC 9113 §6.3)
        elif _u32.unpack_from(payload)[0] & 0x7FFFFFFF == sid:
            self._reset_id(sid, PROTOCOL_ERROR)  # a stream cannot depend on itself (§5.3.1)

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
            if _u32.unpack_from(block)[0] & 0x7FFFFFFF == sid:
                flags |= _SELF_DEPENDENT  # a stream error once the block is decoded (HPACK state must follow)
            block = block[5:]
        if flags & END_HEADERS:
            self._header_block(flags, sid, block)
        else:
            self.continuation = (sid, flags, bytearray(block))

    def _header_block(self, flags: int, sid: int, block: bytes) -> None:
        try:
            head = (self._decoder or self.decoder).decode_head(block)
        except hpack.exceptions.HPACKError as exc:  # the shared table is now unknown: the connection is lost
            raise CompressionError(f"HPACK: {exc}") from None
        stream = self.streams.get(sid)
        if stream is not None:  # trailers from the client
            if stream.state not in REMOTE_OPEN:
                self._reset(stream, STREAM_CLOSED)  # HEADERS after the client's END_STREAM (RFC 9113 §5.1)
                return
            if not flags & END_STREAM or head.has_pseudo:
                self._reset(stream, PROTOCOL_ERROR)
                return
            self._remote_end(stream)
            return
        if sid % 2 == 0:
            raise ProtocolError(f"client stream id {sid} is even")
        if sid <= self.last_sid:
            self._closed_frame(sid, "HEADERS")
            return
        if sid > self.last_sid + 2:
            if self.skipped is None:
                self.skipped = deque(maxlen=16)
            self.skipped.append((self.last_sid + 2, sid - 2))
        self.last_sid = sid
        if self.goaway_sent or len(self.streams) >= self.limits.max_concurrent_streams:
            self.stats.streams_refused += 1
            self._reset_id(sid, REFUSED_STREAM)
            return
        self._open(flags, sid, head)

    def _open(self, flags: int, sid: int, head: HeaderBlock) -> None:
        stream = _Stream(sid)
        self.streams[sid] = stream
        self.streams_opened += 1
        self.control_budget += 10
        self.stats.streams += 1
        if head.malformed or flags & _SELF_DEPENDENT:
            self._reset(stream, PROTOCOL_ERROR)  # a malformed request is a stream error (RFC 9113 §8.1.1)
            return
        stream.content_length = head.content_length
        stream.traceparent = head.traceparent
        stream.counted = head.content_length is not None
        ctype = head.content_type
        if ctype is None or not ctype.startswith(b"application/grpc"):
            stream.reject = 415
        elif head.method != b"POST":
            stream.reject = 405
        if stream.reject:
            self.stats.non_grpc_requests += 1
            stream.counted = True
            stream.head_only = head.method == b"HEAD"
        else:
            route = self.routes.get(head.path or b"")
            if route is None:
                self._finish(stream, GrpcStatus.UNIMPLEMENTED, f"unknown method {(head.path or b'').decode('latin-1')}")
                return
            stream.route = route
            if route.open_call is not None:
                self.watchers[sid] = stream
                try:
                    stream.call = route.open_call(CallHandle(self, stream))
                except Exception:  # a bug in the handler fails this stream, not the connection
                    self.stats.handler_errors += 1
                    log.exception("h2_call_open_failed", errors=self.stats.handler_errors)
                    self._finish(stream, GrpcStatus.INTERNAL, "handler failed")
                    return
                if stream.sid not in self.streams:
                    return  # the call refused itself at once (a server-wide stream limit)
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
        data = self._strip_padding(flags, payload)
        stream = self.streams.get(sid)
        if stream is None:
            if sid > self.last_sid:
                raise ProtocolError(f"DATA on idle stream {sid}")
            self._closed_frame(sid, "DATA")
            return  # a stream we already finished or reset: the bytes are counted above and dropped
        if stream.state not in REMOTE_OPEN:
            self._reset(stream, STREAM_CLOSED)  # DATA after the client's END_STREAM (RFC 9113 §5.1)
            return
        if not data and not flags & END_STREAM:
            self._spend()  # empty DATA does nothing but cost a frame
        stream.recv_unacked += size
        if stream.recv_unacked > RECV_WINDOW:
            self._reset(stream, FLOW_CONTROL_ERROR)
            return
        if stream.counted:
            stream.received += len(data)
            if stream.content_length is not None and stream.received > stream.content_length:
                self._reset(stream, PROTOCOL_ERROR)  # more DATA than content-length (RFC 9113 §8.1.1)
                return
        if flags & END_STREAM:
            stream.client_ending = True  # a reply that ends the call now needs no RST_STREAM after it
        if stream.state is _OPEN and not stream.reject:  # after our trailers, the client's remaining bytes are dropped
            buf = stream.buf
            buf += data
            while len(buf) >= 5 and stream.state is _OPEN:
                n = _u32.unpack_from(buf, 1)[0]
                if buf[0] != 0:
                    self._finish(stream, GrpcStatus.UNIMPLEMENTED, "compressed messages are not supported")
                    break
                if n > self.limits.max_message:
                    self._finish(stream, GrpcStatus.RESOURCE_EXHAUSTED, f"message of {n} bytes exceeds {self.limits.max_message}")
                    break
                if len(buf) < 5 + n:
                    break
                message = bytes(buf[5:5 + n])
                del buf[:5 + n]
                self._message(stream, message)
            # What stays in ``buf`` is counted once per frame, and only when it changed (a whole
            # message in one frame, the common case, costs nothing here).
            delta = len(buf) - stream.held
            if delta:
                self._count_held(stream, delta)
        if stream.recv_unacked >= RECV_WINDOW // 2 and stream.state is _OPEN and not flags & END_STREAM:
            self.out.append(_frame(WINDOW_UPDATE, 0, sid, _u32.pack(stream.recv_unacked)))
            stream.recv_unacked = 0
        if flags & END_STREAM and stream.state is not _CLOSED:  # (CLOSED: the handler already ended the call)
            self._remote_end(stream)

    def _count_held(self, stream: _Stream, delta: int) -> None:
        stream.held += delta
        self.buffered += delta
        stats = self.stats
        stats.buffered_bytes += delta
        if delta > 0 and (self.buffered > self.limits.max_buffered or stats.buffered_bytes > self.limits.max_buffered_total):
            # Partial messages are the only state that grows with what a peer sends (the connection
            # window is re-opened as bytes arrive): bounded per connection and per server.
            stats.buffer_limit_hits += 1
            raise DenialOfServiceError(f"more than {self.limits.max_buffered} bytes of partial messages "
                                       f"(or {self.limits.max_buffered_total} on the server)")

    def _message(self, stream: _Stream, message: bytes) -> None:
        self.stats.messages += 1
        route = stream.route
        assert route is not None  # a stream without a route was answered when it opened
        call = stream.call
        CALL.traceparent = stream.traceparent
        CALL.state = stream.call_state
        try:
            if call is not None:
                call.on_message(message)
                return
            reply, end = route.handler(message)
            stream.call_state = CALL.state
        except DecodeError as exc:  # what the peer sent: a line without a traceback (rate-limited, dlb.log)
            self.stats.handler_errors += 1
            log.warning("grpc_message_malformed", error=str(exc)[:200], errors=self.stats.handler_errors)
            self._finish(stream, GrpcStatus.INVALID_ARGUMENT, "malformed message")
            return
        except Exception:  # a bug in the handler fails this stream (Envoy then fails open), not the server
            self.stats.handler_errors += 1
            log.exception("grpc_handler_failed", errors=self.stats.handler_errors)
            self._finish(stream, GrpcStatus.INTERNAL, "handler failed")
            return
        if route.watch and not end:
            self.watchers[stream.sid] = stream
        if isinstance(reply, Later):
            if reply.now is not None:
                self._send_message(stream, reply.now)
            stream.later = reply.later
            reply.later.add_done_callback(lambda fut: self._later_done(stream, fut))
            return
        if reply is not None:
            self._send_message(stream, reply)
        if end:
            self._finish(stream, GRPC_OK)

    def _later_done(self, stream: _Stream, fut: Pending) -> None:
        """A :class:`Later` reply resolved: send it if the stream is still ours, then let the I/O layer write."""
        if stream.later is not fut or fut.cancelled() or self.streams.get(stream.sid) is not stream:
            return
        stream.later = None
        self._send_message(stream, fut.result())
        if self.on_output is not None:
            self.on_output()

    def _remote_end(self, stream: _Stream) -> None:
        if stream.apply(_RECV_END_STREAM) is _CLOSING_REMOTE_ENDED:
            return  # trailers still waiting for window; _drain removes the stream
        if stream.content_length is not None and stream.received != stream.content_length:
            self._reset(stream, PROTOCOL_ERROR)  # DATA shorter than content-length (RFC 9113 §8.1.1)
        elif stream.reject:
            self._reply_plain(stream)
        elif stream.buf:
            self._finish(stream, GrpcStatus.INTERNAL, "stream ended inside a message")
        elif stream.call is not None:
            try:
                stream.call.on_half_close()  # the call decides when it ends
            except Exception:
                self.stats.handler_errors += 1
                log.exception("h2_call_failed", errors=self.stats.handler_errors)
                self._finish(stream, GrpcStatus.INTERNAL, "handler failed")
        elif stream.sid not in self.watchers:
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
        opened = False
        for i in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HI", payload, i)
            if key == SettingCode.INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise FlowControlError("INITIAL_WINDOW_SIZE too large")
                opened = opened or value > self.peer_initial_window
                self.peer_initial_window = value  # every stream's window moves with it (window_delta)
            elif key == SettingCode.MAX_FRAME_SIZE:
                if not MAX_FRAME <= value <= 2**24 - 1:
                    raise ProtocolError("MAX_FRAME_SIZE out of range")
                self.peer_max_frame = value
            elif key == SettingCode.ENABLE_PUSH and value > 1:
                raise ProtocolError("ENABLE_PUSH must be 0 or 1")
            # HEADER_TABLE_SIZE: our encoder never indexes (table size 0), so any value is fine.
        self.out.append(_frame(SETTINGS, ACK, 0))
        if opened:
            self._unblock_windows()

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
            self._unblock_connection()
            return
        stream = self.streams.get(sid)
        if stream is None:
            if sid > self.last_sid:
                raise ProtocolError(f"WINDOW_UPDATE on idle stream {sid}")
            return  # a closed stream: the peer may not have seen its end yet
        if inc == 0:
            self._reset(stream, PROTOCOL_ERROR)
            return
        stream.window_delta += inc
        if self.peer_initial_window + stream.window_delta > MAX_WINDOW:
            self._reset(stream, FLOW_CONTROL_ERROR)
            return
        if stream.window_blocked:
            stream.window_blocked = False  # its heap entry is now stale
            self._drain(stream)

    def _unblock_connection(self) -> None:
        """The connection window opened: streams waiting for it send, oldest first, until it is spent.
        Every stream visited sends at least one byte or moves to the window heap."""
        blocked = self.conn_blocked
        while blocked and self.conn_send_window > 0:
            sid = next(iter(blocked))
            self._drain(blocked.pop(sid))

    def _unblock_windows(self) -> None:
        """The peer's initial window grew: pop the streams whose own window is now positive."""
        heap, streams = self.window_blocked, self.streams
        while heap and heap[0][0] < self.peer_initial_window:  # -window_delta < initial <=> window > 0
            key, sid = heapq.heappop(heap)
            stream = streams.get(sid)
            if stream is not None and stream.window_blocked and stream.window_delta == -key:
                stream.window_blocked = False
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
        if stream.held or stream.buf:
            self._unbuffer(stream)
        self._drain(stream)

    def _reply_plain(self, stream: _Stream) -> None:
        """Answer a request that is not gRPC with an HTTP status and a short text body."""
        block, body = PLAIN_REPLY[stream.reject]
        stream.apply(_FINISH)
        stream.headers_sent = True
        if stream.head_only:
            stream.trailers = block  # HEADERS with END_STREAM: a HEAD reply has no body
        else:
            self.out.append(self._header_frame(stream.sid, block, 0))
            stream.pending.append(body)
            stream.trailers = b""  # END_STREAM on an empty DATA frame after the body
        self._drain(stream)

    def _drain(self, stream: _Stream) -> None:
        """Send what flow control allows; after the last DATA, the trailers end the stream."""
        pending = stream.pending
        while pending:
            item = pending[0]
            window = self.peer_initial_window + stream.window_delta
            if window <= 0:
                if not stream.window_blocked:
                    stream.window_blocked = True
                    heap = self.window_blocked
                    if len(heap) > 2 * len(self.streams) + 64:  # drop stale entries (amortised O(1))
                        heap[:] = [(k, s) for k, s in heap if s in self.streams and self.streams[s].window_blocked]
                        heapq.heapify(heap)
                    heapq.heappush(heap, (-stream.window_delta, stream.sid))
                return  # wait for WINDOW_UPDATE or SETTINGS
            if self.conn_send_window <= 0:
                self.conn_blocked[stream.sid] = stream
                return  # wait for a connection WINDOW_UPDATE
            n = min(len(item), window, self.conn_send_window, self.peer_max_frame)
            self.out.append(_frame(DATA, 0, stream.sid, item[:n]))
            self.control_budget += 10
            stream.window_delta -= n
            self.conn_send_window -= n
            if n == len(item):
                pending.pop(0)
            else:
                pending[0] = item[n:]
        if stream.trailers is not None:
            if stream.trailers:
                self.out.append(self._header_frame(stream.sid, stream.trailers, END_STREAM))
            else:
                self.out.append(_frame(DATA, END_STREAM, stream.sid))
            stream.trailers = None
            if stream.state is _CLOSING and not stream.client_ending:
                # The response is complete while the client's side is still open (the root answers
                # the first message): RST_STREAM(NO_ERROR) tells it to stop sending (RFC 9113
                # §8.1), as grpc servers do, so no state is kept for a minutes-long generation.
                self.out.append(_frame(RST_STREAM, 0, stream.sid, _u32.pack(NO_ERROR)))
            else:
                self._remember_closed(stream.sid)  # both sides ended: later frames are errors
            stream.apply(_TRAILERS_WRITTEN)
            self._forget(stream)

    def _unbuffer(self, stream: _Stream) -> None:
        stream.buf.clear()
        if stream.held:
            self._count_held(stream, -stream.held)

    def _forget(self, stream: _Stream) -> None:
        """The stream is over: remove it from every table (its heap entry, if any, goes stale)."""
        sid = stream.sid
        self.streams.pop(sid, None)
        self._cancel_later(stream)
        self._end_call(stream)
        if self.conn_blocked:
            self.conn_blocked.pop(sid, None)
        if self.watchers:
            self.watchers.pop(sid, None)
        stream.window_blocked = False
        stream.pending.clear()
        stream.trailers = None
        if stream.held or stream.buf:
            self._unbuffer(stream)

    @staticmethod
    def _end_call(stream: _Stream) -> None:
        """Tell a bidirectional call its stream is gone (once: finished, reset or the connection lost)."""
        call, stream.call = stream.call, None
        if call is not None:
            try:
                call.on_closed()
            except Exception:
                log.exception("h2_call_close_failed")

    @staticmethod
    def _cancel_later(stream: _Stream) -> None:
        later, stream.later = stream.later, None
        if later is not None:
            later.cancel()

    def _remember_closed(self, sid: int) -> None:
        closed = self.closed
        closed[sid] = None
        if len(closed) > self.limits.closed_streams_remembered:
            del closed[next(iter(closed))]

    def _reset(self, stream: _Stream, code: ErrorCode) -> None:
        stream.apply(_RESET)
        self._forget(stream)
        self._reset_id(stream.sid, code)

    def _reset_id(self, sid: int, code: ErrorCode) -> None:
        self.out.append(_frame(RST_STREAM, 0, sid, _u32.pack(code)))
        self.stats.stream_resets += 1
        self._events.append(StreamReset(sid, code))

    def _connection_error(self, exc: H2Error) -> None:
        self.stats.connection_errors += 1
        self._goaway(exc.code, exc.reason)
        self.terminated = True
        self._events.append(ConnectionTerminated(exc.code, exc.reason))

    def _goaway(self, code: ErrorCode, reason: str = "") -> None:
        if not self.goaway_sent:
            self.goaway_sent = True
            self.out.append(_frame(GOAWAY, 0, 0, _u32.pack(self.last_sid) + _u32.pack(code) + reason.encode()[:256]))
