"""ADS (SotW and delta) and the per-type discovery services on DLB's own HTTP/2 transport.

Why: at 5,000 streams grpc.aio's per-message work (a Cython callback, a future and a loop wake-up for
each receive and each send) was most of the server's CPU per update, beside 35–50 µs of xDS logic
(research/xds.md). Here a request is parsed and applied inside the socket's ``data_received``
(:class:`~dlb.transport.h2.StreamCall`), and a stream has no task: a new snapshot puts the woken
streams on one :class:`PushQueue`, which pushes a bounded batch per loop turn, so ACKs keep being read
while a fan-out runs and a burst of snapshots still coalesces into one push per stream.

The stream state machine is the same :class:`~dlb.xds.stream.StreamBase` grpc.aio drives
(``dlb.xds.server``); only the driving differs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc
from envoy.service.discovery.v3 import discovery_pb2

from dlb.log import get_logger
from dlb.transport.h2 import CallHandle, GrpcStatus, Route
from dlb.xds.stream import ServerContext, StreamBase, StreamError

log = get_logger("dlb.xds.server")

#: Streams pushed per loop turn: large enough that a fan-out is not dominated by loop turns, small
#: enough that the ACKs arriving meanwhile are read between batches (one push is ~50 µs of CPU).
PUSH_BATCH = 256


class PushQueue:
    """Streams with a push due, pushed from the loop in batches of :data:`PUSH_BATCH`, oldest first."""

    def __init__(self) -> None:
        self._due: dict[XdsCall, None] = {}  # insertion-ordered set
        self._scheduled = False

    def add(self, call: XdsCall) -> None:
        self._due[call] = None
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._run)

    def discard(self, call: XdsCall) -> None:
        self._due.pop(call, None)

    def _run(self) -> None:
        due = self._due
        for _ in range(min(PUSH_BATCH, len(due))):
            call = next(iter(due))
            del due[call]
            try:
                call.push()
            except Exception:  # a bug fails its stream, never the queue (every other stream's pushes)
                log.exception("xds_push_failed")
                call.handle.finish(GrpcStatus.INTERNAL, "push failed")
        if due:
            asyncio.get_running_loop().call_soon(self._run)
        else:
            self._scheduled = False


class _Waker:
    """A stream's waker: queue its call for a push (``StreamBase`` calls ``set``)."""

    __slots__ = ("call", "queue")

    def __init__(self, queue: PushQueue) -> None:
        self.queue = queue
        self.call: XdsCall | None = None

    def set(self) -> None:
        if self.call is not None:
            self.queue.add(self.call)


class XdsCall:
    """One xDS stream on the h2 transport: requests applied as they arrive, pushes from the queue."""

    __slots__ = ("closed", "handle", "on_error", "parse", "queue", "refused", "stream", "waker")

    def __init__(self, stream: StreamBase, handle: CallHandle, parse: Callable[[bytes], Any], queue: PushQueue,
                 on_error: Callable[[StreamBase, StreamError], None], waker: _Waker) -> None:
        self.stream, self.handle, self.parse, self.queue, self.on_error = stream, handle, parse, queue, on_error
        self.waker = waker
        self.closed = False
        #: Over the server's stream limit: answered at the first request (a status sent before the client
        #: has sent its request reached grpc's client as INTERNAL, the RST_STREAM(NO_ERROR) cutting its send).
        self.refused: StreamError | None = None

    def on_message(self, message: bytes) -> None:
        if self.refused is not None:
            self.handle.finish(status_of(self.refused.code), str(self.refused))
            return
        req = self.parse(message)  # DecodeError: the transport ends the call INVALID_ARGUMENT
        try:
            self.stream.receive(req)
        except StreamError as exc:
            self.fail(exc)

    def on_half_close(self) -> None:
        # As on grpc.aio: the client's end of requests ends the stream.
        refused = self.refused
        self.handle.finish(GrpcStatus.OK if refused is None else status_of(refused.code), str(refused or ""))

    def on_closed(self) -> None:
        self.waker.call = None  # breaks call -> stream -> waker -> call: freed now, not by a collection
        if not self.closed:
            self.closed = True
            self.queue.discard(self)
            self.stream.end()

    def push(self) -> None:
        stream, handle = self.stream, self.handle
        if self.closed or not stream.take_due():
            return
        for response in stream.push():
            handle.send(response)

    def fail(self, exc: StreamError) -> None:
        self.on_error(self.stream, exc)
        self.handle.finish(status_of(exc.code), str(exc))


def call_route(ctx: ServerContext, cls: type[StreamBase], fixed: str | None, queue: PushQueue,
               on_error: Callable[[StreamBase, StreamError], None]) -> Route:
    """The transport route of one discovery method: each stream a ``cls`` driven by an :class:`XdsCall`."""
    parse = (discovery_pb2.DeltaDiscoveryRequest.FromString if cls.kind == "delta"
             else discovery_pb2.DiscoveryRequest.FromString)

    def open_call(handle: CallHandle) -> XdsCall:
        waker = _Waker(queue)
        stream = cls(ctx, fixed, handle.peer, waker)
        stream.peer_auth = handle.peer_auth
        call = XdsCall(stream, handle, parse, queue, on_error, waker)
        try:
            stream.begin()
        except StreamError as exc:
            call.closed = True  # never counted: nothing to undo
            call.refused = exc
            on_error(stream, exc)
            return call
        waker.call = call
        return call

    return Route.bidi(open_call)


def status_of(code: grpc.StatusCode) -> GrpcStatus:
    """The transport's status for a grpc.aio one (the same numbers)."""
    return GrpcStatus(code.value[0])
