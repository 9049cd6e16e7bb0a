"""DLB's HTTP/2 gRPC transport (:mod:`dlb.transport.h2`) against independent peers.

The ``h2`` library (python-hyper) plays the client for protocol corners a well-behaved gRPC client
never produces (CONTINUATION, padding, tiny flow-control windows, byte-by-byte delivery, bad
input); grpc's C-core client is the conformance check (``test_ext_proc_root.py``), and Envoy itself
is the peer in ``test_envoy_forwards_only_the_headers_the_root_reads`` and every end-to-end test.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections.abc import Iterator

import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest

from dlb.ext_proc.protocol import PROCESS_METHOD
from dlb.service.health import HealthState, h2_health_routes
from dlb.transport.server import H2GrpcServer

METHOD = PROCESS_METHOD


class ServerThread:
    """An H2GrpcServer on its own event loop thread (the tests talk to it with blocking sockets)."""

    def __init__(self, handler, loop_factory=asyncio.new_event_loop) -> None:
        # With the health service, as ExtProcServer serves it: the rendered bootstraps health-check ext_proc.
        self.server = H2GrpcServer(METHOD, handler, routes=h2_health_routes(HealthState()))
        self.loop = loop_factory()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self.server.start("127.0.0.1", 0), self.loop).result(10)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(0.5), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def echo_upper(message: bytes) -> tuple[bytes, bool]:
    """Replies the message upper-cased; ``b"keep..."`` keeps the call open, ``b"boom"`` raises."""
    if message == b"boom":
        raise RuntimeError("handler bug")
    return message.upper(), not message.startswith(b"keep")


@pytest.fixture
def server() -> Iterator[ServerThread]:
    s = ServerThread(echo_upper)
    try:
        yield s
    finally:
        s.close()


def grpc_frame(message: bytes, compressed: bool = False) -> bytes:
    return bytes([1 if compressed else 0]) + struct.pack(">I", len(message)) + message


class Client:
    """A blocking HTTP/2 client built on the h2 state machine."""

    def __init__(self, port: int, settings_overrides: dict | None = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.conn.initiate_connection()
        if settings_overrides:
            self.conn.update_settings(settings_overrides)
        self.flush()
        self.events: list[h2.events.Event] = []

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def request_headers(self, sid: int, path: str = METHOD, extra: list[tuple[str, str]] | None = None,
                        end_stream: bool = False, **kw) -> None:
        hdrs = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "dlb"),
                ("content-type", "application/grpc"), ("te", "trailers")] + (extra or [])
        self.conn.send_headers(sid, hdrs, end_stream=end_stream, **kw)
        self.flush()

    def pump(self, until, timeout: float = 5.0) -> None:
        """Read until ``until(events)`` holds; acknowledge data so windows never block the server."""
        self.sock.settimeout(timeout)
        while not until(self.events):
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("server closed the connection")
            for ev in self.conn.receive_data(data):
                if isinstance(ev, h2.events.DataReceived):
                    self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                self.events.append(ev)
            self.flush()

    def read_once(self, timeout: float = 5.0) -> None:
        self.sock.settimeout(timeout)
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("server closed the connection")
        for ev in self.conn.receive_data(data):
            self.events.append(ev)
        try:
            self.flush()
        except OSError:
            pass

    def call(self, sid: int, message: bytes) -> list[bytes]:
        """One unary-style call on stream ``sid``: the reply messages once the stream has ended."""
        self.request_headers(sid)
        self.conn.send_data(sid, grpc_frame(message))
        self.flush()
        self.pump(self.stream_done(sid))
        return messages(self.body(sid))

    def stream_done(self, sid: int):
        return lambda evs: any(isinstance(e, (h2.events.StreamEnded, h2.events.StreamReset)) and e.stream_id == sid for e in evs)

    def body(self, sid: int) -> bytes:
        return b"".join(e.data for e in self.events if isinstance(e, h2.events.DataReceived) and e.stream_id == sid)

    def trailers(self, sid: int) -> dict[str, str]:
        out: dict[str, str] = {}
        for e in self.events:
            if isinstance(e, (h2.events.TrailersReceived, h2.events.ResponseReceived)) and e.stream_id == sid:
                out.update(dict(e.headers))
        return out

    def close(self) -> None:
        self.sock.close()


def messages(body: bytes) -> list[bytes]:
    out = []
    while body:
        n = struct.unpack(">I", body[1:5])[0]
        out.append(body[5:5 + n])
        body = body[5 + n:]
    return out


def test_a_call_gets_headers_reply_and_ok_trailers(server):
    c = Client(server.port)
    assert c.call(1, b"hello") == [b"HELLO"]
    resp = next(e for e in c.events if isinstance(e, h2.events.ResponseReceived))
    assert dict(resp.headers)[":status"] == "200" and dict(resp.headers)["content-type"] == "application/grpc"
    assert c.trailers(1)["grpc-status"] == "0"
    c.close()


def test_byte_by_byte_delivery_and_a_message_split_over_frames(server):
    c = Client(server.port)
    c.request_headers(1)
    frame = grpc_frame(b"split me")
    c.conn.send_data(1, frame[:3])
    c.conn.send_data(1, frame[3:7])
    c.conn.send_data(1, frame[7:])
    raw = c.conn.data_to_send()
    for i in range(len(raw)):  # every TCP read delivers one byte
        c.sock.sendall(raw[i:i + 1])
    c.pump(c.stream_done(1))
    assert messages(c.body(1)) == [b"SPLIT ME"]
    c.close()


def test_several_messages_on_one_open_call_then_client_half_close(server):
    c = Client(server.port)
    c.request_headers(1)
    c.conn.send_data(1, grpc_frame(b"keep-1") + grpc_frame(b"keep-2"))
    c.flush()
    c.pump(lambda evs: len(messages(c.body(1))) == 2)
    c.conn.end_stream(1)  # the client is done: the call ends OK
    c.flush()
    c.pump(c.stream_done(1))
    assert messages(c.body(1)) == [b"KEEP-1", b"KEEP-2"]
    assert c.trailers(1)["grpc-status"] == "0"
    c.close()


def test_continuation_padding_and_priority(server):
    c = Client(server.port)
    big = [("x-meta", "v" * 40000)]  # larger than a 16 KiB frame: HEADERS + CONTINUATION
    c.request_headers(1, extra=big)
    c.conn.send_data(1, grpc_frame(b"padded"), pad_length=33)
    c.request_headers(3, priority_weight=200, priority_depends_on=0)  # (h2 cannot combine it with CONTINUATION)
    c.conn.send_data(3, grpc_frame(b"prio"))
    c.flush()
    c.pump(lambda evs: c.stream_done(1)(evs) and c.stream_done(3)(evs))
    assert messages(c.body(1)) == [b"PADDED"] and messages(c.body(3)) == [b"PRIO"]
    c.close()


def test_interleaved_streams_each_get_their_own_reply(server):
    c = Client(server.port)
    for sid in (1, 3, 5):
        c.request_headers(sid)
    for sid in (5, 1, 3):
        c.conn.send_data(sid, grpc_frame(f"s{sid}".encode()))
    c.flush()
    c.pump(lambda evs: all(c.stream_done(s)(evs) for s in (1, 3, 5)))
    assert {s: messages(c.body(s)) for s in (1, 3, 5)} == {1: [b"S1"], 3: [b"S3"], 5: [b"S5"]}
    c.close()


def test_reply_waits_for_the_peers_flow_control_window(server):
    c = Client(server.port, {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 16})
    c.pump(lambda evs: any(isinstance(e, h2.events.SettingsAcknowledged) for e in evs))
    c.request_headers(1)
    c.conn.send_data(1, grpc_frame(b"x" * 200))
    c.flush()
    # Only the window's 16 bytes arrive; the rest and the trailers wait for WINDOW_UPDATE, which
    # ``pump`` sends as it acknowledges data, so the whole reply arrives in 16-byte steps.
    c.pump(c.stream_done(1))
    chunks = [len(e.data) for e in c.events if isinstance(e, h2.events.DataReceived) and e.stream_id == 1]
    assert max(chunks) <= 16 and sum(chunks) == 205
    assert messages(c.body(1)) == [b"X" * 200]
    assert c.trailers(1)["grpc-status"] == "0"
    c.close()


@pytest.mark.parametrize("case, status", [("unknown-method", "12"), ("compressed", "12"), ("handler-raises", "13"),
                                          ("half-close-inside-message", "13")])
def test_bad_calls_end_with_a_grpc_status_and_the_connection_keeps_serving(server, case, status):
    c = Client(server.port)
    if case == "unknown-method":
        c.request_headers(1, path="/some.Service/Other")
    else:
        c.request_headers(1)
        payload = {"compressed": grpc_frame(b"zz", compressed=True), "handler-raises": grpc_frame(b"boom"),
                   "half-close-inside-message": grpc_frame(b"truncated")[:7]}[case]
        c.conn.send_data(1, payload, end_stream=case == "half-close-inside-message")
        c.flush()
    c.pump(c.stream_done(1))
    assert c.trailers(1)["grpc-status"] == status
    assert c.call(3, b"ok") == [b"OK"]  # the same connection still serves a good call
    c.close()


def test_ping_is_acknowledged(server):
    c = Client(server.port)
    c.conn.ping(b"12345678")
    c.flush()
    c.pump(lambda evs: any(isinstance(e, h2.events.PingAckReceived) for e in evs))
    ack = next(e for e in c.events if isinstance(e, h2.events.PingAckReceived))
    assert ack.ping_data == b"12345678"
    c.close()


def test_protocol_violations_get_goaway_and_do_not_hurt_other_connections(server):
    bad = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    bad.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")  # not HTTP/2 at all
    got = b""
    while True:
        chunk = bad.recv(65536)
        if not chunk:
            break
        got += chunk
    bad.close()
    # Our SETTINGS + WINDOW_UPDATE, then GOAWAY (type 7) with PROTOCOL_ERROR (1), then close.
    assert b"\x07\x00\x00\x00\x00\x00" in got and got.endswith(b"not an HTTP/2 connection preface")
    # A client stream id that is even is a connection error too.
    c = Client(server.port)
    c.sock.sendall(struct.pack(">I", 5)[1:] + bytes([1, 0x5]) + struct.pack(">I", 2) + b"\x82\x86\x84\x41\x00")
    c.pump(lambda evs: any(isinstance(e, h2.events.ConnectionTerminated) for e in evs))
    term = next(e for e in c.events if isinstance(e, h2.events.ConnectionTerminated))
    assert term.error_code == h2.errors.ErrorCodes.PROTOCOL_ERROR
    c.close()
    good = Client(server.port)
    assert good.call(1, b"fine") == [b"FINE"]
    good.close()
    assert server.server.stats.connection_errors == 2


def test_a_peer_parking_partial_messages_is_cut_off(server):
    """Half-sent messages are the one unbounded state: past 16 MiB the connection is closed."""
    from dlb.transport.h2 import MAX_BUFFERED

    c = Client(server.port)
    per_stream = 3 * 1024 * 1024  # each below the 4 MiB message limit, never completed
    sid, sent = 1, 0

    def terminated() -> bool:
        return any(isinstance(e, h2.events.ConnectionTerminated) for e in c.events)

    try:
        while sent <= MAX_BUFFERED + per_stream and not terminated():
            c.request_headers(sid)
            # The server's buffer counts every byte of a message, its 5-byte gRPC prefix included; so
            # must we, or ``sent`` lags the server's count by 5 bytes per stream.
            c.conn.send_data(sid, b"\x00" + struct.pack(">I", per_stream + 1))
            sent += 5
            remaining = per_stream
            while remaining and not terminated():
                n = min(remaining, c.conn.local_flow_control_window(sid), c.conn.max_outbound_frame_size)
                if n == 0:
                    c.read_once()  # the server re-opens the windows as bytes arrive
                    continue
                c.conn.send_data(sid, b"x" * n)
                remaining -= n
                sent += n  # counted before the flush: a flush the server cuts short may still deliver some
                c.flush()
            sid += 2
    except OSError:
        pass  # the server closed while we were still sending; its GOAWAY may be in the socket buffer
    while not terminated():
        c.read_once()
    term = next(e for e in c.events if isinstance(e, h2.events.ConnectionTerminated))
    assert term.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
    assert sent > MAX_BUFFERED
    c.close()


def test_stats_count_what_happened(server):
    c = Client(server.port)
    c.call(1, b"a")
    c.call(3, b"boom")
    c.close()
    s = server.server.stats
    assert (s.streams, s.messages, s.handler_errors, s.grpc_errors) == (2, 2, 1, 1)


# -- the HPACK cache is exact --------------------------------------------------------------------


# -- Envoy as the peer ------------------------------------------------------------------------------


def test_serves_on_uvloop() -> None:
    """The services run on uvloop (dlb.service.runner), whose transports are not asyncio.Transport
    subclasses: a call over a uvloop server gets its reply (an isinstance assert once dropped every
    connection there while the asyncio-loop tests passed)."""
    import uvloop

    s = ServerThread(echo_upper, loop_factory=uvloop.new_event_loop)
    try:
        c = Client(s.port)
        try:
            assert c.call(1, b"hello") == [b"HELLO"]
        finally:
            c.close()
    finally:
        s.close()
