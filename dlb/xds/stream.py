"""What SotW and delta streams share: node caching, watch lifetime, wake-ups, authorisation, nonces.

A stream is two tasks: the reader applies each request to the stream state as it arrives and sets
the wake event if a push may be due; the writer, when woken, computes one push from the *newest*
snapshot and current subscriptions. So neither a burst of requests nor a burst of snapshots produces
more than one response per type.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field

import grpc
from envoy.config.core.v3 import base_pb2

from dlb.log import get_logger
from dlb.xds import types
from dlb.xds.cache import SnapshotCache, Watch
from dlb.xds.snapshot import Resource, Snapshot, supports_wrapper
from dlb.xds.status import StatusRegistry

# authorizer(node, type_url, resource_name) -> may this node read it?
Authorizer = Callable[[base_pb2.Node, str, str], bool]

log = get_logger("dlb.xds.server")


class StreamError(Exception):
    """A protocol violation by the client; the stream is closed with ``code``."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class ServerContext:
    """Everything a stream needs from its server."""

    cache: SnapshotCache
    status: StatusRegistry = field(default_factory=StatusRegistry)
    authorizer: Authorizer | None = None
    make_before_break: bool = True
    body_cache: "BodyCache" = field(default_factory=lambda: BodyCache(64 * 1024 * 1024))
    _diffs: "collections.OrderedDict[tuple, tuple[list[Resource], list[str]]]" = field(
        default_factory=collections.OrderedDict)

    def view_diff(self, type_url: str, old_digest: str, old: Mapping[str, Resource], new_digest: str,
                  new: Mapping[str, Resource]) -> tuple[list[Resource], list[str]]:
        """(changed or added, removed) between two whole-type views, computed once for all streams.

        Streams that were in sync with the previous snapshot (the common case) then pay O(changes),
        not O(resources), per push.
        """
        key = (type_url, old_digest, new_digest)
        hit = self._diffs.get(key)
        if hit is None:
            changed = [r for n, r in new.items() if (o := old.get(n)) is None or o.version != r.version]
            hit = self._diffs[key] = (changed, [n for n in old if n not in new])
            if len(self._diffs) > 256:
                self._diffs.popitem(last=False)
        return hit


class BodyCache:
    """LRU of response bodies shared by streams that see the same view of the same snapshot.

    Bounded by total bytes, not entries: one wildcard CDS body can be megabytes.
    """

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._items: collections.OrderedDict[tuple, bytes] = collections.OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple, build: Callable[[], bytes]) -> bytes:
        body = self._items.get(key)
        if body is not None:
            self._items.move_to_end(key)
            self.hits += 1
            return body
        self.misses += 1
        body = build()
        if len(body) <= self.capacity_bytes // 4:  # a huge one-off body is not worth evicting others for
            self._items[key] = body
            self._bytes += len(body)
            while self._bytes > self.capacity_bytes:
                self._bytes -= len(self._items.popitem(last=False)[1])
        return body


class StreamBase:
    """One xDS stream. Subclasses implement ``_handle`` (a request) and ``_push`` (responses)."""

    kind = "sotw"

    def __init__(self, ctx: ServerContext, fixed_type: str | None, peer: str) -> None:
        self.ctx = ctx
        self.fixed_type = fixed_type  # per-type service (CDS, EDS, ...) rather than ADS
        self.peer = peer
        self.node: base_pb2.Node | None = None
        self.wrap_ok = False  # may SotW responses wrap resources (names outside the message)?
        self.key: str | None = None
        self._watch: Watch | None = None
        self._wake = asyncio.Event()
        self._snapshot_changed = False
        self._push_due = False
        self._eof = False
        self._error: StreamError | None = None
        self._nonce = 0
        self._denied: set[tuple[str, str]] = set()
        self.log = log.bind(peer=peer, kind=self.kind, service=types.short(fixed_type) if fixed_type else "ADS")

    # --- helpers for subclasses -------------------------------------------------------------
    def next_nonce(self) -> str:
        self._nonce += 1
        return str(self._nonce)

    def type_of(self, request_type_url: str) -> str:
        if self.fixed_type is None:
            if not request_type_url:
                raise StreamError(grpc.StatusCode.INVALID_ARGUMENT, "type_url is required on ADS requests")
            return request_type_url
        if request_type_url and request_type_url != self.fixed_type:
            raise StreamError(grpc.StatusCode.INVALID_ARGUMENT,
                              f"type_url {request_type_url!r} on the {types.short(self.fixed_type)} service")
        return self.fixed_type

    def adopt_node(self, node: base_pb2.Node | None, has_node: bool) -> None:
        """Cache the node from the first request; later requests may omit it (and may not change it)."""
        if self.node is not None:
            return
        if not has_node or node is None or not node.id:
            raise StreamError(grpc.StatusCode.INVALID_ARGUMENT, "the first request on a stream must carry node.id")
        self.node = node
        self.wrap_ok = supports_wrapper(node)
        self.key = self.ctx.cache.node_key(node)
        self.log = self.log.bind(node=node.id)
        self._watch = self.ctx.cache.watch(self.key, self._on_snapshot)
        self.ctx.status.stream_opened(node.id, node.cluster)
        self.log.info("stream opened", key=self.key)

    def snapshot(self) -> Snapshot | None:
        return self.ctx.cache.get_snapshot(self.key) if self.key is not None else None

    def visible(self, snap: Snapshot, type_url: str, names: set[str], wildcard: bool) -> Mapping[str, Resource]:
        """Resources of ``type_url`` this stream asked for and may read (unknown names are skipped)."""
        all_res = snap.get(type_url)
        auth = self.ctx.authorizer
        if wildcard:
            if auth is None:
                return all_res
            return {n: r for n, r in all_res.items() if auth(self.node, type_url, n)}  # type: ignore[arg-type]
        out = {}
        for n in names:
            r = all_res.get(n)
            if r is None:
                continue
            if auth is None or auth(self.node, type_url, n):  # type: ignore[arg-type]
                out[n] = r
            elif (type_url, n) not in self._denied:
                self._denied.add((type_url, n))  # a security signal: log once per stream and name
                self.log.warning("read denied", type=types.short(type_url), resource=n)
        return out

    # --- the loop ---------------------------------------------------------------------------
    def _on_snapshot(self) -> None:
        self._snapshot_changed = True
        self._wake.set()

    async def _read(self, request_iterator: AsyncIterator) -> None:
        """Apply requests as they arrive; wake the writer only if a push may be due.

        Handling in the reader (not the writer) saves a task switch per ACK, the most common
        message; a plain ACK then costs no wake-up of the writer at all.
        """
        try:
            async for req in request_iterator:
                try:
                    if self._handle(req):
                        self._push_due = True
                        self._wake.set()
                except StreamError as exc:
                    self._error = exc
                    return
        except (asyncio.CancelledError, grpc.RpcError, grpc.aio.AioRpcError):
            pass
        except Exception as exc:  # a broken peer ends its own stream, nothing else
            self.log.warning("request stream failed", error=repr(exc))
        finally:
            self._eof = True
            self._wake.set()

    async def run(self, request_iterator: AsyncIterator) -> AsyncIterator[bytes]:
        reader = asyncio.create_task(self._read(request_iterator))
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                if self._error is not None:
                    raise self._error
                if self._eof:
                    return
                need_push = self._snapshot_changed or self._push_due
                self._snapshot_changed = self._push_due = False
                if self.node is None or not need_push:
                    continue
                for response in self._push():
                    yield response
        finally:
            reader.cancel()
            if self._watch is not None:
                self.ctx.cache.cancel(self._watch)
                self._watch = None
            if self.node is not None:
                self.ctx.status.stream_closed(self.node.id)
                self.log.info("stream closed")

    def _handle(self, req) -> bool:  # pragma: no cover - abstract
        """Apply one request; True if a push could now be due."""
        raise NotImplementedError

    def _push(self) -> list[bytes]:  # pragma: no cover - abstract
        raise NotImplementedError
