"""gRPC health and draining on DLB's HTTP/2 transport (issue 14 item 3, from issue 13).

The same contract as the grpc.aio servers (``dlb/service/health.py``): ``grpc.health.v1.Health``
Check and Watch answered by the ext_proc listener itself (a grpc C-core client here, an independent
implementation); when a drain starts the status turns NOT_SERVING and watchers hear it; stopping
sends GOAWAY, refuses new streams, lets the streams in flight finish, then closes.
"""

from __future__ import annotations

import asyncio
import socket
import threading

import grpc
import hpack
from test_h2_bounds import goaway_code, headers_frames, read_to_eof, request_block
from test_h2_connection import echo_upper, frame, grpc_message

from dlb.ext_proc.protocol import ExtProcServer
from dlb.service.health import NOT_SERVING, SERVING, decode_status
from dlb.transport.h2 import PREFACE, ErrorCode, FrameType

END_STREAM = 0x1


class Running:
    def __init__(self) -> None:
        self.server = ExtProcServer("h2", echo_upper)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self.server.bind("127.0.0.1:0"), self.loop).result(10)

    def set_serving(self, value: bool) -> None:
        async def run() -> None:
            self.server.health.serving = value
        asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def frames_of(data: bytes) -> list[tuple[int, int, int, bytes]]:
    out, pos = [], 0
    while pos + 9 <= len(data):
        n = int.from_bytes(data[pos:pos + 3], "big")
        if pos + 9 + n > len(data):
            break
        out.append((data[pos + 3], data[pos + 4], int.from_bytes(data[pos + 5:pos + 9], "big"), data[pos + 9:pos + 9 + n]))
        pos += 9 + n
    return out


def read_until(sock: socket.socket, got: bytearray, done) -> None:
    sock.settimeout(20)
    while not done(frames_of(bytes(got))):
        data = sock.recv(65536)
        assert data, "the server closed early"
        got += data


def test_check_and_watch_follow_the_serving_flag() -> None:
    """Check answers SERVING; a Watch gets SERVING at once and NOT_SERVING when the drain starts;
    stopping the server ends the watch."""
    r = Running()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{r.port}") as ch:
            check = ch.unary_unary("/grpc.health.v1.Health/Check", request_serializer=None, response_deserializer=None)
            assert decode_status(check(b"", timeout=10)) == SERVING
            watch = ch.unary_stream("/grpc.health.v1.Health/Watch", request_serializer=None, response_deserializer=None)
            updates = watch(b"", timeout=30)
            assert decode_status(next(updates)) == SERVING
            r.set_serving(False)
            assert decode_status(next(updates)) == NOT_SERVING
            assert decode_status(check(b"", timeout=10)) == NOT_SERVING
            assert r.server.stats.connection_errors == 0  # unary calls end with their message: no GOAWAY
            asyncio.run_coroutine_threadsafe(r.server.stop(5), r.loop).result(20)
            try:
                next(updates)
                raise AssertionError("the watch did not end when the server stopped")
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        r.close()


def test_stop_lets_the_stream_in_flight_finish_and_refuses_new_ones() -> None:
    """After GOAWAY the open call still gets its next reply and OK trailers; a new stream is refused;
    stop returns once the call is over and the socket closes."""
    r = Running()
    try:
        sock = socket.create_connection(("127.0.0.1", r.port))
        got = bytearray()
        sock.sendall(PREFACE + frame(FrameType.SETTINGS, 0, 0) + headers_frames(1, request_block(), end_stream=False)
                     + frame(FrameType.DATA, 0, 1, grpc_message(b"keep one")))
        read_until(sock, got, lambda fs: any(f[0] == FrameType.DATA and grpc_message(b"KEEP ONE") in f[3] for f in fs))
        stopping = asyncio.run_coroutine_threadsafe(r.server.stop(30), r.loop)
        read_until(sock, got, lambda fs: any(f[0] == FrameType.GOAWAY for f in fs))
        assert not stopping.done()  # the call in flight holds the stop
        sock.sendall(headers_frames(3, request_block(), end_stream=True)
                     + frame(FrameType.DATA, END_STREAM, 1, grpc_message(b"last")))
        read_until(sock, got, lambda fs: any(f[0] == FrameType.HEADERS and f[2] == 1 and f[1] & END_STREAM for f in fs))
        fs = frames_of(bytes(got))
        assert any(f[0] == FrameType.RST_STREAM and f[2] == 3 and int.from_bytes(f[3], "big") == ErrorCode.REFUSED_STREAM
                   for f in fs)
        assert any(f[0] == FrameType.DATA and f[2] == 1 and grpc_message(b"LAST") in f[3] for f in fs)
        decoder = hpack.Decoder()
        trailers = [dict(decoder.decode(f[3])) for f in fs if f[0] == FrameType.HEADERS]
        assert trailers[-1].get("grpc-status") == "0"
        stopping.result(20)
        read_to_eof(sock)
        assert goaway_code(bytes(got)) == ErrorCode.NO_ERROR
        sock.close()
    finally:
        r.close()
