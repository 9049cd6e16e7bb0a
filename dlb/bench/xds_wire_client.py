"""A lean SotW ADS client speaking HTTP/2 + gRPC framing directly: the xDS bench's stand-in for Envoy.

Why: ``dlb bench xds`` measures the control plane's push→ACK time at thousands of streams, and on the
2-core test box its clients share the CPU with the server. The clients were DLB's own ``XdsClient``
(grpc.aio), which spends ~260–290 µs of CPU per update — 2.5× the server's ~110 µs — in grpc's
thread hand-offs, so the measured p99 was mostly the clients' queue for a core. Envoy, the client
the control plane serves at that scale, runs its xDS client in C++ on its own machine. This client does
what Envoy does per update — read the response, decode every resource, send the ACK — and nothing
else: frames parsed by hand (9-byte header), no HPACK decoding (the server's header blocks are
literals without indexing; ``dlb.transport.h2``), windows opened wide once. ``--client-impl grpc``
keeps the old clients, so the two can be compared in one run.

Not a general HTTP/2 client: one stream per connection, SotW only, no TLS; a connection that ends is
reopened after ``RECONNECT_S`` (counted in :attr:`WireClient.reconnects`).
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass, field

import hpack
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf.message import Message

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
ADS_PATH = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7, 0x8
END_STREAM, ACK, PADDED = 0x1, 0x1, 0x8
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
MAX_WINDOW = 2**31 - 1
#: Receive credit is handed back once this much was read (the window opened at start is ``MAX_WINDOW``).
REFILL = 2**30
RECONNECT_S = 0.2
_HEAD = struct.Struct(">IBI")  # length (24 bits) and type in one 32-bit word, flags, stream id
STREAM = 1


def frame(ftype: int, flags: int, stream: int, payload: bytes) -> bytes:
    """One HTTP/2 frame (RFC 9113 §4.1)."""
    return struct.pack(">I", len(payload))[1:] + bytes((ftype, flags)) + struct.pack(">I", stream) + payload


def grpc_message(msg: bytes) -> bytes:
    """A gRPC length-prefixed message (uncompressed)."""
    return b"\x00" + struct.pack(">I", len(msg)) + msg


def _opening(authority: str, first_request: bytes) -> bytes:
    """Preface, SETTINGS (stream window at the maximum, no push), the connection window opened to the
    maximum, the ADS stream's HEADERS and its first request."""
    settings = struct.pack(">HI", SETTINGS_INITIAL_WINDOW_SIZE, MAX_WINDOW) + struct.pack(">HI", 0x2, 0)
    headers = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", ADS_PATH),
                                      (":authority", authority), ("content-type", "application/grpc"),
                                      ("te", "trailers")])
    return (PREFACE + frame(SETTINGS, 0, 0, settings)
            + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", MAX_WINDOW - 65535))
            + frame(HEADERS, 0x4, STREAM, headers) + frame(DATA, 0, STREAM, grpc_message(first_request)))


@dataclass
class WireClient(asyncio.Protocol):
    """One ADS stream on its own connection, subscribed to ``names`` of ``type_url``; ACKs every response
    after decoding each resource as ``message_cls``."""

    host: str
    port: int
    node: base_pb2.Node
    type_url: str
    names: list[str]
    message_cls: type[Message]
    version: str = ""
    updates: int = 0
    reconnects: int = 0
    _transport: asyncio.Transport | None = field(default=None, repr=False)
    _buf: bytearray = field(default_factory=bytearray, repr=False)
    _msg: bytearray = field(default_factory=bytearray, repr=False)
    _send_window: int = 65535
    _stream_window: int = 65535
    _read: int = 0
    _pending: list[bytes] = field(default_factory=list, repr=False)
    _closed: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    #: Set once the first response was decoded and ACKed (the bench connects clients in batches on it).
    first_update: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    _stopping: bool = False

    def request(self, nonce: str = "") -> bytes:
        req = discovery_pb2.DiscoveryRequest(version_info=self.version, response_nonce=nonce,
                                             type_url=self.type_url, resource_names=self.names)
        if not nonce:
            req.node.CopyFrom(self.node)  # the first request on a stream carries the node
        return req.SerializeToString()

    async def run(self) -> None:
        """Connect, and reconnect after a lost connection, until :meth:`stop`."""
        loop = asyncio.get_running_loop()
        while not self._stopping:
            self._closed.clear()
            try:
                await loop.create_connection(lambda: self, self.host, self.port)
            except OSError:
                self._closed.set()
            await self._closed.wait()
            if not self._stopping:
                self.reconnects += 1
                await asyncio.sleep(RECONNECT_S)

    def stop(self) -> None:
        self._stopping = True
        if self._transport is not None:
            self._transport.close()
        self._closed.set()

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._buf.clear()
        self._msg.clear()
        self._send_window = self._stream_window = 65535
        self._read = 0
        self._pending.clear()
        transport.write(_opening(f"{self.host}:{self.port}", self.request()))

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._closed.set()

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos, end = 0, len(buf)
        out: list[bytes] = []
        while end - pos >= 9:
            word, flags, stream = _HEAD.unpack_from(buf, pos)
            length, ftype = word >> 8, word & 0xFF
            if end - pos < 9 + length:
                break
            payload = bytes(buf[pos + 9:pos + 9 + length])
            pos += 9 + length
            stream &= 0x7FFFFFFF
            if ftype == DATA:
                self._data(flags, payload, out)
            elif ftype == SETTINGS:
                if not flags & ACK:
                    self._settings(payload)
                    out.append(frame(SETTINGS, ACK, 0, b""))
            elif ftype == PING:
                if not flags & ACK:
                    out.append(frame(PING, ACK, 0, payload))
            elif ftype == WINDOW_UPDATE:
                inc = struct.unpack(">I", payload)[0] & 0x7FFFFFFF
                if stream:
                    self._stream_window += inc
                else:
                    self._send_window += inc
            elif ftype in (RST_STREAM, GOAWAY) or (ftype == HEADERS and flags & END_STREAM):
                self._abort()
                return
        del buf[:pos]
        self._flush(out)

    def _settings(self, payload: bytes) -> None:
        for k in range(0, len(payload) - 5, 6):
            ident, value = struct.unpack_from(">HI", payload, k)
            if ident == SETTINGS_INITIAL_WINDOW_SIZE:
                self._stream_window += value - 65535  # the stream was opened under the default

    def _data(self, flags: int, payload: bytes, out: list[bytes]) -> None:
        self._read += len(payload)
        if flags & PADDED:
            payload = payload[1:len(payload) - payload[0]]
        msg = self._msg
        msg += payload
        while len(msg) >= 5:
            size = struct.unpack_from(">I", msg, 1)[0]
            if len(msg) < 5 + size:
                break
            body = bytes(msg[5:5 + size])
            del msg[:5 + size]
            out.append(frame(DATA, 0, STREAM, grpc_message(self._on_response(body))))
        if self._read >= REFILL:
            refill = struct.pack(">I", self._read)
            out += [frame(WINDOW_UPDATE, 0, 0, refill), frame(WINDOW_UPDATE, 0, STREAM, refill)]
            self._read = 0

    def _on_response(self, body: bytes) -> bytes:
        """Decode the response and every resource in it (as Envoy does), then the ACK's bytes."""
        resp = discovery_pb2.DiscoveryResponse.FromString(body)
        for any_msg in resp.resources:
            if any_msg.type_url != self.type_url:
                raise ValueError(f"resource of type {any_msg.type_url} in a {self.type_url} response")
            self.message_cls.FromString(any_msg.value)
        self.version = resp.version_info
        self.updates += 1
        self.first_update.set()
        return self.request(resp.nonce)

    def _flush(self, out: list[bytes]) -> None:
        """Write control frames at once and DATA frames as far as both send windows allow."""
        if self._transport is None:
            return
        pending = self._pending
        pending += out
        keep: list[bytes] = []
        chunks: list[bytes] = []
        for f in pending:
            if f[3] == DATA and not keep:
                n = len(f) - 9
                if n > min(self._send_window, self._stream_window):
                    keep.append(f)
                    continue
                self._send_window -= n
                self._stream_window -= n
            elif f[3] == DATA:
                keep.append(f)  # DATA stays in order behind one that waits for credit
                continue
            chunks.append(f)
        self._pending = keep
        if chunks:
            self._transport.write(b"".join(chunks))

    def _abort(self) -> None:
        if self._transport is not None:
            self._transport.close()
