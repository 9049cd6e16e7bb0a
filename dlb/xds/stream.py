"""What SotW and delta streams share: subscriptions, the make-before-break gate, node caching,
watch lifetime, wake-ups, authorisation, nonces.

On grpc.aio a stream is two tasks: the reader applies each request to the stream state as it arrives
and sets the wake event if a push may be due; the writer, when woken, computes one push from the
*newest* snapshot and current subscriptions. On the h2 transport (``dlb.xds.h2``) requests are applied
as they arrive and the waker queues the stream for a push, with no task. Either way neither a burst of
requests nor a burst of snapshots produces more than one response per type.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc
from envoy.config.core.v3 import base_pb2

from dlb.errors import DlbError
from dlb.log import get_logger
from dlb.xds import types
from dlb.xds.cache import SnapshotCache, Watch
from dlb.xds.callbacks import StreamCallbacks, combine
from dlb.xds.snapshot import Resource, Snapshot, supports_wrapper
from dlb.xds.status import StatusRegistry

# authorizer(node, type_url, resource_name) -> may this node read it?
Authorizer = Callable[[base_pb2.Node, str, str], bool]
# admission(node, peer auth context) -> None (the stream may go on) or why this peer may not be that node.
# The auth context is gRPC's (e.g. the verified client certificate's SANs under ``peer_uri``).
Admission = Callable[[base_pb2.Node, Mapping[str, Sequence[bytes]]], str | None]

log = get_logger("dlb.xds.server")


class StreamError(DlbError):
    """A protocol violation by the client; the stream is closed with ``code``.

    ``limit`` names the :class:`StreamLimits` field a client went past (a bounded metric label), if any.
    """

    def __init__(self, code: grpc.StatusCode, message: str, limit: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.limit = limit


@dataclass(frozen=True)
class StreamLimits:
    """What one client can make the server keep, log or show (issue 14 row 6).

    Without them 50 streams with 1 MB node ids and one stream subscribing 5,000 bogus type URLs x 100
    names cost +188 MB and +107 MB kept after disconnect, 100 MB of logs, a 201 MB ``/metrics`` and an
    86 MB ``/status``. Real Envoys use ids of tens of bytes, about 10 types and, here, tens of names.
    A stream past a limit is closed (RESOURCE_EXHAUSTED or INVALID_ARGUMENT); text the server only
    records (``version_info``, a NACK's message) is cut to ``text_bytes`` instead.
    """

    node_id_bytes: int = 512  # also node.cluster and node.locality.zone (the snapshot key)
    type_url_bytes: int = 256
    types: int = 16  # distinct type URLs per stream
    name_bytes: int = 512
    names: int = 10_000  # names subscribed per stream, all types together
    text_bytes: int = 1024
    streams: int = 10_000  # open streams per server
    #: Bytes of resource names subscribed by every stream together: the per-stream limits multiply by the
    #: stream count (a stranger's 40 streams x 10 bogus types x 999 names held +266 MB, +6.7 MB each, none
    #: past a limit). Real Envoys subscribe tens of names of tens of bytes: 5,000 streams use ~10 MB.
    subscribed_bytes: int = 64 * 1024 * 1024

    def clip(self, text: str) -> str:
        return text if len(text) <= self.text_bytes else text[: self.text_bytes] + f"... ({len(text)} chars)"


def utf8_len(text: str) -> int:
    """Bytes of ``text`` on the wire: the limits are in bytes (300 × 'é' passed a 512-byte limit as 300)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _too_long(what: str, value: str, limit: int, field_name: str) -> StreamError:
    return StreamError(grpc.StatusCode.INVALID_ARGUMENT, f"{what} is {utf8_len(value)} bytes: over the {limit}-byte limit",
                       limit=field_name)


@dataclass(frozen=True, slots=True)
class SubscriptionChange:
    """What one request did to a :class:`Subscription` (the stream decides from it whether to push)."""

    changed: bool  # names or wildcard differ: observers are told
    grew: bool  # it now covers names it did not: a push may be due
    narrowed: bool  # it no longer covers names it did: the client drops them; forget them, never respond for them
    resend: frozenset[str] = frozenset()  # delta: names the client dropped that the wildcard still covers


@dataclass
class Subscription:
    """What one stream asked for of one type: explicit names and whether it is wildcard-subscribed.

    Every subscription rule of the xDS protocol ("How the client specifies what resources to return")
    lives here, for both variants, so SotW and delta cannot drift apart:

    * legacy wildcard: an empty request is "everything" for types that allow it (``legacy_wildcard``),
      in SotW only until the client first names something, in delta only on the first request;
    * explicit wildcard: ``*`` among the names, alongside other names or not; in delta, unsubscribing
      ``*`` ends it and keeps the explicit names;
    * named: SotW replaces the whole set with each request, delta adds and removes;
    * unsubscribe while wildcard (delta): the client drops the name locally, yet the wildcard still
      covers it, so it must be sent again (``SubscriptionChange.resend``).
    """

    legacy_wildcard: bool  # the type allows legacy wildcard (ServerContext.legacy_wildcard)
    names: set[str] = field(default_factory=set)
    wildcard: bool = False
    explicit: bool = False  # SotW: the client has named something once, so legacy wildcard no longer applies

    def covers(self, name: str) -> bool:
        return self.wildcard or name in self.names

    def replace(self, resource_names: Iterable[str]) -> SubscriptionChange:
        """SotW: a request's ``resource_names`` is the whole new subscription."""
        names = set(resource_names)
        wildcard = types.WILDCARD in names
        names.discard(types.WILDCARD)
        if names or wildcard:
            self.explicit = True
        elif not self.explicit and self.legacy_wildcard:
            wildcard = True
        return self._become(names, wildcard, frozenset())

    def update(self, subscribe: Iterable[str], unsubscribe: Iterable[str], first: bool) -> SubscriptionChange:
        """Delta: apply ``resource_names_subscribe`` / ``_unsubscribe`` (``first``: the type's first request)."""
        sub, unsub = set(subscribe), set(unsubscribe)
        wildcard = self.wildcard or (first and not sub and self.legacy_wildcard) or types.WILDCARD in sub
        if types.WILDCARD in unsub:
            wildcard = False
        sub.discard(types.WILDCARD)
        unsub.discard(types.WILDCARD)
        names = (self.names | sub) - unsub
        return self._become(names, wildcard, frozenset(unsub) if wildcard else frozenset())

    def _become(self, names: set[str], wildcard: bool, resend: frozenset[str]) -> SubscriptionChange:
        if wildcard:
            grew, narrowed = not self.wildcard, False
        else:
            grew = not names <= self.names
            narrowed = self.wildcard or not self.names <= names
        change = SubscriptionChange(changed=wildcard != self.wildcard or names != self.names, grew=grew,
                                    narrowed=narrowed, resend=resend)
        self.names, self.wildcard = names, wildcard
        return change


@dataclass(frozen=True, slots=True)
class Gate:
    """Make-before-break on one ADS stream (xDS protocol, "eventual consistency considerations"):
    routes never point at a cluster Envoy does not have yet, and a cluster is not removed while
    routes may still use it. Decided once per push, except warming, which a CDS response of the same
    push can start."""

    ordered: bool = False  # ADS with make-before-break on: the rules apply
    hold_removals: bool = False  # cluster (and endpoint) removals wait: LDS/RDS changes are in flight

    def routes_wait(self, type_url: str, cds_adding: bool) -> bool:
        """LDS/RDS wait while a CDS response that adds clusters is unanswered (they are warming)."""
        return self.ordered and cds_adding and type_url in ROUTE_TYPES


OPEN_GATE = Gate()
ROUTE_TYPES = (types.LISTENER, types.ROUTE)  # what waits for warming clusters
# Types whose answer (ACK or NACK) can release something held by the gate, so it makes a push due
# (if the stream's last push held something: ``StreamBase.gate_held``).
GATE_TYPES = frozenset({types.CLUSTER, *ROUTE_TYPES})


@dataclass
class ServerContext:
    """Everything a stream needs from its server.

    ``callbacks`` are extra observers of every stream, told after ``status`` (see ``dlb.xds.callbacks``).
    ``legacy_wildcard`` says which types treat an empty request as "everything" (the xDS rule: the
    types a client may request without names, which are also the SotW full-state types).
    """

    cache: SnapshotCache
    status: StatusRegistry = field(default_factory=StatusRegistry)
    authorizer: Authorizer | None = None
    admission: Admission | None = None
    make_before_break: bool = True
    callbacks: Sequence[StreamCallbacks] = ()
    legacy_wildcard: Callable[[str], bool] = types.full_state
    limits: StreamLimits = field(default_factory=StreamLimits)
    open_streams: int = 0
    #: Bytes of resource names all open streams subscribe (``limits.subscribed_bytes``).
    subscribed_bytes: int = 0
    body_cache: BodyCache = field(default_factory=lambda: BodyCache(64 * 1024 * 1024))
    _diffs: collections.OrderedDict[tuple[str, str, str], tuple[list[Resource], list[str]]] = field(
        default_factory=collections.OrderedDict)
    observer: StreamCallbacks = field(init=False)

    def __post_init__(self) -> None:
        self.observer = combine([self.status, *self.callbacks])

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


# (type URL, version, wrapped?, the view: a type digest or the sorted (name, version) pairs)
BodyKey = tuple[str, str, bool, object]


class BodyCache:
    """LRU of response bodies shared by streams that see the same view of the same snapshot.

    Bounded by total bytes, not entries: one wildcard CDS body can be megabytes.
    """

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._items: collections.OrderedDict[BodyKey, bytes] = collections.OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, key: BodyKey, build: Callable[[], bytes]) -> bytes:
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


class Waker(Protocol):
    """Told that a stream may have a push due (its snapshot changed, or a request needs an answer)."""

    def set(self) -> None: ...


class Wake:
    """What ``asyncio.Event`` does for the one waiter a stream has (its writer), without the Event's
    waiter deque: 0.7 KB less per stream, and one future per wait instead of a future plus deque work.
    ``set`` must be called on the loop's thread (``Watch.wake`` hops there)."""

    __slots__ = ("_flag", "_waiter")

    def __init__(self) -> None:
        self._flag = False
        self._waiter: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._flag = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def clear(self) -> None:
        self._flag = False

    async def wait(self) -> None:
        if self._flag:
            return
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None


class StreamBase:
    """One xDS stream. Subclasses implement ``handle`` (a request) and ``push`` (responses)."""

    kind = "sotw"

    def __init__(self, ctx: ServerContext, fixed_type: str | None, peer: str, wake: Waker | None = None) -> None:
        self.ctx = ctx
        self.fixed_type = fixed_type  # per-type service (CDS, EDS, ...) rather than ADS
        self.peer = peer
        #: gRPC's auth context of the peer (empty on plaintext), read by ``ctx.admission``.
        self.peer_auth: Mapping[str, Sequence[bytes]] = {}
        self.node: base_pb2.Node | None = None
        self.wrap_ok = False  # may SotW responses wrap resources (names outside the message)?
        self.key: str | None = None
        self._watch: Watch | None = None
        #: Told when a push may be due: the writer task's :class:`Wake` (grpc.aio), or the h2 server's
        #: push queue (``dlb.xds.h2``), which pushes from the loop without a task per stream.
        self._wake: Waker = wake if wake is not None else Wake()
        self._snapshot_changed = False
        self._push_due = False
        self._eof = False
        self._error: StreamError | None = None
        self._nonce = 0
        #: The last push held something back for make-before-break (routes waiting for warming clusters,
        #: cluster removals waiting for the route answer). Only then can an answer to CDS/LDS/RDS make a
        #: push due: without this every route ACK woke the writer for an empty push, the second wake-up per
        #: update and stream (a fifth of the server's CPU at 5,000 streams).
        self.gate_held = False
        self._denied: set[tuple[str, str]] = set()
        #: Bytes of the names this stream subscribes, as counted in ``ctx.subscribed_bytes``.
        self._sub_bytes = 0
        self.log = log.bind(peer=peer, kind=self.kind, service=types.short(fixed_type) if fixed_type else "ADS")

    # --- helpers for subclasses -------------------------------------------------------------
    def subscription(self, type_url: str) -> Subscription:
        return Subscription(legacy_wildcard=self.ctx.legacy_wildcard(type_url))

    def gate(self, routes_busy: Callable[[], bool]) -> Gate:
        """The make-before-break gate for this push; only ADS streams order types (a per-type
        service cannot see the other types). ``routes_busy``: LDS/RDS changes are wanted or unanswered."""
        if not (self.ctx.make_before_break and self.fixed_type is None):
            return OPEN_GATE
        return Gate(ordered=True, hold_removals=routes_busy())

    def next_nonce(self) -> str:
        self._nonce += 1
        return str(self._nonce)

    def check_new_type(self, known: int) -> None:
        """A stream may use at most ``limits.types`` type URLs (each keeps state until the stream ends)."""
        if known >= self.ctx.limits.types:
            raise StreamError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"more than {self.ctx.limits.types} type URLs on one stream",
                              limit="types")

    def check_names(self, names: Iterable[str], subscriptions: Iterable[Subscription]) -> None:
        """Each name at most ``limits.name_bytes``; the stream's subscriptions together at most ``limits.names``."""
        lim = self.ctx.limits
        names = list(names)
        if len(names) > lim.names:
            raise StreamError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{len(names)} resource names in one request: over {lim.names}",
                              limit="names")
        for n in names:
            if utf8_len(n) > lim.name_bytes:
                raise _too_long("a resource name", n, lim.name_bytes, "name_bytes")
        subs = list(subscriptions)
        if sum(len(sub.names) for sub in subs) > lim.names:
            raise StreamError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"more than {lim.names} resource names on one stream",
                              limit="names")
        if subs:  # the stream's whole subscription, as it now stands: count its bytes against the server's budget
            held = sum(utf8_len(n) for sub in subs for n in sub.names)
            ctx = self.ctx
            if ctx.subscribed_bytes - self._sub_bytes + held > lim.subscribed_bytes:
                raise StreamError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                  f"the server's streams already subscribe {ctx.subscribed_bytes:,} bytes of resource names: "
                                  f"this stream's {held:,} would pass {lim.subscribed_bytes:,}", limit="subscribed_bytes")
            ctx.subscribed_bytes += held - self._sub_bytes
            self._sub_bytes = held

    def type_of(self, request_type_url: str) -> str:
        if utf8_len(request_type_url) > self.ctx.limits.type_url_bytes:
            raise _too_long("type_url", request_type_url, self.ctx.limits.type_url_bytes, "type_url_bytes")
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
        limit = self.ctx.limits.node_id_bytes
        for what, value in (("node.id", node.id), ("node.cluster", node.cluster), ("node.locality.zone", node.locality.zone)):
            if utf8_len(value) > limit:
                raise _too_long(what, value, limit, "node_id_bytes")
            if not value.isprintable():  # an ESC sequence reached /metrics labels and terminals reading logs raw
                raise StreamError(grpc.StatusCode.INVALID_ARGUMENT, f"{what} has a control character: {value[:80]!r}",
                                  limit="node_id_bytes")
        if self.ctx.admission is not None and (why := self.ctx.admission(node, self.peer_auth)) is not None:
            self.ctx.status.streams_denied += 1
            raise StreamError(grpc.StatusCode.PERMISSION_DENIED, why)
        self.node = node
        self.wrap_ok = supports_wrapper(node)
        self.key = self.ctx.cache.node_key(node)
        self.log = self.log.bind(node=node.id)
        self._watch = self.ctx.cache.watch(self.key, self._on_snapshot)
        self.ctx.observer.stream_opened(node.id, node.cluster)
        self.log.info("stream_opened", key=self.key)

    def snapshot(self) -> Snapshot | None:
        return self.ctx.cache.get_snapshot(self.key) if self.key is not None else None

    def visible(self, snap: Snapshot, type_url: str, names: set[str], wildcard: bool) -> Mapping[str, Resource]:
        """Resources of ``type_url`` this stream asked for and may read (unknown names are skipped)."""
        all_res = snap.get(type_url)
        auth = self.ctx.authorizer
        if wildcard:
            if auth is None:
                return all_res
            return {n: r for n, r in all_res.items() if auth(self.node, type_url, n)}
        out = {}
        for n in names:
            r = all_res.get(n)
            if r is None:
                continue
            if auth is None or auth(self.node, type_url, n):
                out[n] = r
            elif (type_url, n) not in self._denied:
                self._denied.add((type_url, n))  # a security signal: log once per stream and name
                self.log.warning("read_denied", type=types.short(type_url), resource=n)
        return out

    # --- the loop ---------------------------------------------------------------------------
    def _on_snapshot(self) -> None:
        self._snapshot_changed = True
        self._wake.set()

    async def _read(self, request_iterator: AsyncIterator[Any]) -> None:
        """Apply requests as they arrive; wake the writer only if a push may be due.

        Handling in the reader (not the writer) saves a task switch per ACK, the most common
        message; a plain ACK then costs no wake-up of the writer at all.
        """
        try:
            async for req in request_iterator:
                try:
                    self.receive(req)
                except StreamError as exc:
                    self._error = exc
                    return
        except (asyncio.CancelledError, grpc.RpcError, grpc.aio.AioRpcError):
            pass
        except Exception as exc:  # a broken peer ends its own stream, nothing else
            self.log.warning("request_stream_failed", error=repr(exc))
        finally:
            self._eof = True
            self._wake.set()

    def begin(self) -> None:
        """Count the stream against ``limits.streams`` (over it: RESOURCE_EXHAUSTED); pair with :meth:`end`."""
        if self.ctx.open_streams >= self.ctx.limits.streams:
            raise StreamError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"more than {self.ctx.limits.streams} open streams",
                              limit="streams")
        self.ctx.open_streams += 1

    def end(self) -> None:
        """The stream is over: uncount it, cancel its watch, tell the observers."""
        self.ctx.open_streams -= 1
        self.ctx.subscribed_bytes -= self._sub_bytes
        self._sub_bytes = 0
        if self._watch is not None:
            self.ctx.cache.cancel(self._watch)
            self._watch = None
        if self.node is not None:
            self.ctx.observer.stream_closed(self.node.id)
            self.log.info("stream_closed")

    def receive(self, req: Any) -> None:
        """Apply one request; tell the waker if a push may now be due (raises :class:`StreamError`)."""
        if self.handle(req):
            self._push_due = True
            self._wake.set()

    def take_due(self) -> bool:
        """Whether a push is due now (a new snapshot, or a request that may need an answer); clears it."""
        need_push = self._snapshot_changed or self._push_due
        self._snapshot_changed = self._push_due = False
        return need_push and self.node is not None

    async def run(self, request_iterator: AsyncIterator[Any]) -> AsyncIterator[bytes]:
        self.begin()
        reader = asyncio.create_task(self._read(request_iterator))
        wake = self._wake
        assert isinstance(wake, Wake)
        try:
            while True:
                await wake.wait()
                wake.clear()
                if self._error is not None:
                    raise self._error
                if self._eof:
                    return
                if not self.take_due():
                    continue
                for response in self.push():
                    yield response
        finally:
            reader.cancel()
            self.end()

    # --- the state machine (synchronous: tests/unit/test_xds_stream.py drives it without a loop) ---
    def handle(self, req: Any) -> bool:  # pragma: no cover - abstract
        """Apply one request; True if a push could now be due."""
        raise NotImplementedError

    def push(self) -> list[bytes]:  # pragma: no cover - abstract
        """The responses due now, from the newest snapshot (encoded, ready to write)."""
        raise NotImplementedError
