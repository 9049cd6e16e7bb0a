"""Per-node xDS delivery state: what was sent, what was ACKed, why something was NACKed.

Operators need to answer "which Envoys run which config, and which rejected it?" without reading
logs. :class:`StatusRegistry` observes the streams (it implements ``dlb.xds.callbacks.StreamCallbacks``)
and is read by the JSON status endpoint and a Prometheus collector (built at scrape time, so stale
label sets never linger). Other observers (the scale benchmark) are passed to the server as callbacks.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import time
from collections.abc import Callable, Iterator, Set
from dataclasses import asdict, dataclass, field
from typing import Any, cast

from aiohttp import web
from prometheus_client import CollectorRegistry, Metric, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

from dlb.errors import BindError
from dlb.xds import types

#: Subscribed names kept per node and type for ``/status`` (the count is kept too): a node may subscribe thousands.
SHOWN_NAMES = 100
#: The entry under which a node's type URLs the server does not serve are counted (``served_types``).
OTHER_TYPE = "other"
#: Nodes labelled one by one in ``/metrics``; the rest are summed under ``node="other"``. Node ids are the
#: clients' own text: 10,000 streams could otherwise make ~500,000 series. A fleet of 256 cells with root
#: and leaf Envoys and services in replicas stays well under it.
LABELLED_NODES = 2000
#: The status listener's bounds, as the services' /metrics listeners have (``dlb.service.metrics``): a peer
#: held connections open without end (aiohttp keeps an idle one ~1 h). A scrape or a look takes milliseconds.
STATUS_MAX_CONNECTIONS = 64  # open at once; beyond, a connection is closed at accept and counted
STATUS_IDLE_S = 10.0  # a connection with no complete request for this long is closed (a drip too)
STATUS_BACKLOG = 128


class _Refused(asyncio.Protocol):
    """What a connection past the cap gets: closed at once, nothing read."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cast(asyncio.Transport, transport).abort()  # uvloop's transports are not asyncio.Transport subclasses


@dataclass
class TypeStatus:
    sent_version: str = ""
    sent_nonce: str = ""
    acked_version: str = ""
    last_nack_version: str = ""
    last_nack_reason: str = ""
    responses: int = 0
    acks: int = 0
    nacks: int = 0
    last_ack_unix: float = 0.0
    subscribed: list[str] = field(default_factory=list)  # names the node asked for ("*" = wildcard), the first SHOWN_NAMES
    subscribed_count: int = 0


@dataclass
class NodeStatus:
    node_id: str
    cluster: str = ""
    streams: int = 0
    types: dict[str, TypeStatus] = field(default_factory=dict)
    last_seen_unix: float = 0.0
    closed_monotonic: float | None = None  # when its last stream closed (None: connected)
    seen_seq: int = 0  # strictly increasing with every touch (orders nodes even within one clock tick)

    def type(self, type_url: str) -> TypeStatus:
        st = self.types.get(type_url)  # (an unserved type arrives here as OTHER_TYPE: StatusRegistry._type)
        if st is None:
            st = self.types[type_url] = TypeStatus()
        return st


@dataclass
class StatusRegistry:
    """Delivery state per node, kept up to date as a :class:`~dlb.xds.callbacks.StreamCallbacks`."""

    nodes: dict[str, NodeStatus] = field(default_factory=dict)
    stale_nonces: int = 0
    streams_denied: int = 0  # refused by the server's admission check (mTLS identity ≠ claimed node)
    max_disconnected: int = 1000  # remembered nodes without streams (the oldest are forgotten)
    #: A node without streams is forgotten this long after its last stream closed (a restart within it keeps history).
    grace_s: float = 60.0
    #: Streams closed for going past a StreamLimits field, by field name (a bounded label set).
    limit_hits: dict[str, int] = field(default_factory=dict)
    #: The type URLs this server can answer (None: any). A client's other type URLs, which nothing will
    #: ever answer, are kept per node as one :data:`OTHER_TYPE` entry without names: their text became
    #: ``/status`` fields and Prometheus labels (a stranger's bogus types grew /metrics to 7.5 MB).
    served_types: frozenset[str] | None = None
    clock: Callable[[], float] = time.monotonic
    _seq: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    #: Nodes without streams, oldest close first: forgetting pops from the front (a scan of every node on
    #: every stream close cost 18 s of server time in a 5,000-stream run with reconnects).
    _gone: collections.OrderedDict[str, None] = field(default_factory=collections.OrderedDict)

    def node(self, node_id: str, cluster: str = "") -> NodeStatus:
        ns = self.nodes.get(node_id)
        if ns is None:
            ns = self.nodes[node_id] = NodeStatus(node_id=node_id, cluster=cluster)
        ns.last_seen_unix = time.time()
        ns.seen_seq = next(self._seq)
        return ns

    def stream_opened(self, node_id: str, cluster: str) -> None:
        ns = self.node(node_id, cluster)
        ns.streams += 1
        ns.closed_monotonic = None
        self._gone.pop(node_id, None)

    def stream_closed(self, node_id: str) -> None:
        ns = self.node(node_id)
        ns.streams -= 1
        if ns.streams <= 0:
            ns.closed_monotonic = self.clock()
            # Remembered for grace_s, but not the names it subscribed to (the count stays): 100 names of
            # 512 B per served type were ~0.5 MB per gone node, and 1,000 gone nodes grew /status to 219 MB
            # while the subscription budget counts open streams only.
            for st in ns.types.values():
                st.subscribed = []
            self._gone[node_id] = None
            self._gone.move_to_end(node_id)
        self.forget_gone()

    def forget_gone(self) -> None:
        """Drop nodes disconnected for longer than ``grace_s``, and the oldest past ``max_disconnected``
        (node ids churn as pods come and go: the memory stays bounded). Amortised O(1) per close."""
        now = self.clock()
        while self._gone:
            oldest = next(iter(self._gone))
            ns = self.nodes.get(oldest)
            closed = ns.closed_monotonic if ns is not None else None
            if ns is not None and ns.streams > 0:  # reconnected meanwhile: not gone
                self._gone.popitem(last=False)
                continue
            if len(self._gone) <= self.max_disconnected and closed is not None and now - closed <= self.grace_s:
                break
            self._gone.popitem(last=False)
            self.nodes.pop(oldest, None)

    def limit_hit(self, limit: str) -> None:
        self.limit_hits[limit] = self.limit_hits.get(limit, 0) + 1

    def _serves(self, type_url: str) -> bool:
        return self.served_types is None or type_url in self.served_types

    def _type(self, node_id: str, type_url: str) -> TypeStatus:
        return self.node(node_id).type(type_url if self._serves(type_url) else OTHER_TYPE)

    def subscribed(self, node_id: str, type_url: str, names: Set[str], wildcard: bool) -> None:
        if not self._serves(type_url):  # what a client asks of a type nobody serves: a count, no names
            self.node(node_id).type(OTHER_TYPE).subscribed_count = len(names)
            return
        st = self.node(node_id).type(type_url)
        shown = sorted(names) if len(names) <= SHOWN_NAMES else sorted(itertools.islice(names, SHOWN_NAMES))
        st.subscribed = (["*"] if wildcard else []) + shown
        st.subscribed_count = len(names)

    def sent(self, node_id: str, type_url: str, version: str, nonce: str) -> None:
        st = self._type(node_id, type_url)
        st.sent_version, st.sent_nonce = version, nonce
        st.responses += 1

    def acked(self, node_id: str, type_url: str, version: str) -> None:
        st = self._type(node_id, type_url)
        st.acked_version = version
        st.acks += 1
        st.last_ack_unix = time.time()

    def nacked(self, node_id: str, type_url: str, version: str, reason: str) -> None:
        st = self._type(node_id, type_url)
        st.last_nack_version, st.last_nack_reason = version, reason
        st.nacks += 1

    def stale_nonce(self, node_id: str, type_url: str, nonce: str) -> None:
        self.stale_nonces += 1

    def to_json(self) -> dict[str, Any]:
        self.forget_gone()
        return {
            "stale_nonces": self.stale_nonces,
            "limit_hits": dict(self.limit_hits),
            "streams_denied": self.streams_denied,
            "nodes": {nid: {"cluster": ns.cluster, "streams": ns.streams, "last_seen_unix": ns.last_seen_unix,
                            "types": {types.short(t): {"type_url": t, **asdict(st)} for t, st in sorted(ns.types.items())}}
                      for nid, ns in sorted(self.nodes.items())},
        }


class StatusCollector:
    """Prometheus view of a :class:`StatusRegistry` (register it in a CollectorRegistry)."""

    def __init__(self, status: StatusRegistry, snapshot_count: Callable[[], int] | None = None) -> None:
        self.status = status
        self.snapshot_count = snapshot_count

    def collect(self) -> Iterator[Metric]:
        self.status.forget_gone()
        hits = CounterMetricFamily("dlb_xds_limit_hits", "xDS streams closed for going past a server limit", labels=["limit"])
        for limit, n in sorted(self.status.limit_hits.items()):
            hits.add_metric([limit], n)
        yield hits
        streams = GaugeMetricFamily("dlb_xds_streams", "open xDS streams per node (past 2,000 nodes, the rest as node=other)", labels=["node"])
        acked = InfoMetricFamily("dlb_xds_acked_version", "last version each node ACKed, per type", labels=["node", "type"])
        sent = InfoMetricFamily("dlb_xds_sent_version", "last version sent to each node, per type", labels=["node", "type"])
        responses = CounterMetricFamily("dlb_xds_responses", "responses sent", labels=["node", "type"])
        nacks = CounterMetricFamily("dlb_xds_nacks", "NACKs received", labels=["node", "type"])
        rest_streams, rest_counts = 0, collections.Counter[tuple[str, str]]()
        for k, (nid, ns) in enumerate(self.status.nodes.items()):
            if k >= LABELLED_NODES:  # summed: no versions (one per node), counts by type
                rest_streams += ns.streams
                for t, st in ns.types.items():
                    rest_counts[types.short(t), "responses"] += st.responses
                    rest_counts[types.short(t), "nacks"] += st.nacks
                continue
            streams.add_metric([nid], ns.streams)
            for t, st in ns.types.items():
                label = [nid, types.short(t)]
                if st.acked_version:
                    acked.add_metric(label, {"version": st.acked_version})
                if st.sent_version:
                    sent.add_metric(label, {"version": st.sent_version})
                responses.add_metric(label, st.responses)
                nacks.add_metric(label, st.nacks)
        if len(self.status.nodes) > LABELLED_NODES:
            streams.add_metric(["other"], rest_streams)
            for (t, what), n in rest_counts.items():
                (responses if what == "responses" else nacks).add_metric(["other", t], n)
        yield from (streams, acked, sent, responses, nacks)
        yield CounterMetricFamily("dlb_xds_stale_nonces", "requests ignored for a stale nonce", value=self.status.stale_nonces)
        yield CounterMetricFamily("dlb_xds_streams_denied", "streams refused: the client certificate's identity may not read the node it claims",
                                  value=self.status.streams_denied)
        if self.snapshot_count is not None:
            yield GaugeMetricFamily("dlb_xds_snapshots", "node keys with a snapshot", value=self.snapshot_count())


class _RefusedCollector:
    """``dlb_xds_status_http_refused``: the status listener's own bound, read at scrape time."""

    def __init__(self, server: StatusServer) -> None:
        self.server = server

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily("dlb_xds_status_http_refused", "Status connections closed at the cap (64)",
                                  value=self.server.refused)


class StatusServer:
    """Small HTTP endpoint: ``/status`` (JSON), ``/metrics`` (Prometheus), ``/healthz`` and ``/readyz``.

    ``/healthz`` is 200 while the process answers; ``/readyz`` is 200 only while ``ready()`` holds
    (503 otherwise), so an orchestrator sends no Envoy here before the server can serve it.
    """

    def __init__(self, status: StatusRegistry, snapshot_count: Callable[[], int] | None = None,
                 extra_routes: list[web.RouteDef] | None = None, ready: Callable[[], bool] | None = None) -> None:
        self.status = status
        self.ready = ready or (lambda: True)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(StatusCollector(status, snapshot_count))
        self.registry.register(_RefusedCollector(self))
        self.app = web.Application()
        self.app.add_routes([web.get("/status", self._status), web.get("/metrics", self._metrics),
                             web.get("/healthz", self._healthz), web.get("/readyz", self._readyz), *(extra_routes or [])])
        self._runner: web.AppRunner | None = None
        self._server: asyncio.Server | None = None
        self.port = 0
        #: Connections closed at accept because STATUS_MAX_CONNECTIONS were open (``dlb_xds_status_http_refused``).
        self.refused = 0

    async def _status(self, _req: web.Request) -> web.Response:
        return web.Response(text=json.dumps(self.status.to_json(), indent=1), content_type="application/json")

    async def _metrics(self, _req: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": "text/plain; version=0.0.4"})

    async def _healthz(self, _req: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _readyz(self, _req: web.Request) -> web.Response:
        return web.Response(text="ready") if self.ready() else web.Response(status=503, text="not ready")

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self._runner = web.AppRunner(self.app, access_log=None, keepalive_timeout=STATUS_IDLE_S)
        await self._runner.setup()
        handler = self._runner.server
        assert handler is not None

        def connection() -> asyncio.BaseProtocol:
            # aiohttp counts a connection once it is made, so one accept batch can pass the cap: still bounded.
            if len(handler.connections) >= STATUS_MAX_CONNECTIONS:
                self.refused += 1
                return _Refused()
            return handler()

        try:
            self._server = await asyncio.get_running_loop().create_server(connection, host, port, backlog=STATUS_BACKLOG)
        except OSError as exc:  # as the xDS port: one line naming the address, not a traceback
            await self._runner.cleanup()
            self._runner = None
            raise BindError(f"{host}:{port}", exc.strerror or str(exc)) from exc
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()  # no new connections; the runner's cleanup closes the open ones
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self._server = None
