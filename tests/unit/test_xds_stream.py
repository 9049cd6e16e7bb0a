"""The xDS stream state machine in-process: requests in, decoded responses out (docs/design.md §5).

No sockets and no event loop: a stream's ``handle`` (apply one request, say whether a push is due)
and ``push`` (the responses one wake-up sends) are synchronous, so each rule is checked at the
decision itself. That matters for wake-ups: over gRPC, ``RawStream.barrier``'s own request makes
the server evaluate a push of every type, which hides a missing wake-up (the delta
unsubscribe-while-wildcard defect was invisible to tests/test_xds_protocol.py for that reason).

One rule per test, the rule as its docstring; each rule runs for CDS, LDS and a ``dlb.v1`` type.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2
from google.protobuf.message import Message

from dlb.proto import resources_pb2
from dlb.xds import Snapshot, SnapshotCache, types
from dlb.xds.callbacks import NoCallbacks
from dlb.xds.delta import DeltaStream
from dlb.xds.snapshot import resource_name, unwrap
from dlb.xds.sotw import SotwStream
from dlb.xds.stream import ServerContext, StreamBase, Wake
from dlb.xds.testing import eds_cluster, http_listener, load_assignment, node, route_config

CDS, EDS, LDS, RDS = types.CLUSTER, types.ENDPOINT, types.LISTENER, types.ROUTE
DLB = types.type_url_of("dlb.v1.CellAversion")
TYPES = pytest.mark.parametrize("type_url", [CDS, LDS, DLB], ids=["CDS", "LDS", "dlb.v1"])
N1 = node("n1")


def resource(type_url: str, name: str, variant: int = 0) -> tuple[str, Message]:
    """A resource of ``type_url`` named ``name``; a different ``variant`` is different content."""
    if type_url == CDS:
        return name, eds_cluster(name, connect_timeout_s=1.0 + variant)
    if type_url == LDS:
        return name, http_listener(name, 10000 + variant, "r")
    return name, resources_pb2.CellAversion(cell=name, error_rate=variant)


def snapshot(type_url: str, names: dict[str, int] | list[str]) -> Snapshot:
    """A snapshot holding ``names`` of ``type_url`` (a dict gives each name's content variant)."""
    variants = names if isinstance(names, dict) else dict.fromkeys(names, 0)
    return Snapshot.build([resource(type_url, n, v) for n, v in variants.items()], extra_types=[type_url])


@dataclass
class Sent:
    """One decoded response: what a client would apply."""

    type_url: str
    nonce: str
    version: str
    names: list[str]
    removed: list[str] = field(default_factory=list)


_CLASSES: dict[str, type[Message]] = {CDS: cluster_pb2.Cluster, LDS: listener_pb2.Listener,
                                      EDS: endpoint_pb2.ClusterLoadAssignment, RDS: route_pb2.RouteConfiguration}


def _name(entry: any_pb2.Any) -> str:
    """A SotW entry's name: from the discovery Resource wrapper, or from inside the message."""
    name, inner = unwrap(entry)
    return name if name is not None else resource_name(_CLASSES[inner.type_url].FromString(inner.value))


class Harness:
    """One stream of a server whose cache holds one snapshot for node n1."""

    def __init__(self, delta: bool, fixed_type: str | None = None, **ctx: object) -> None:
        self.delta = delta
        self.cache = SnapshotCache()
        self.ctx = ServerContext(cache=self.cache, **ctx)  # type: ignore[arg-type]
        cls: type[StreamBase] = DeltaStream if delta else SotwStream
        self.stream = cls(self.ctx, fixed_type, "in-process")
        self.first = True

    def set(self, snap: Snapshot) -> str:
        return self.cache.set_snapshot(N1.id, snap)

    def request(self, type_url: str, *, names: list[str] | None = None, unsubscribe: list[str] | None = None,
                nonce: str = "", version: str = "", error: str | None = None,
                initial: dict[str, str] | None = None) -> bool:
        """Send one request; True if the stream says a push is now due."""
        if self.delta:
            req: Message = discovery_pb2.DeltaDiscoveryRequest(
                type_url=type_url, resource_names_subscribe=names or [], resource_names_unsubscribe=unsubscribe or [],
                response_nonce=nonce, initial_resource_versions=initial or {})
        else:
            req = discovery_pb2.DiscoveryRequest(type_url=type_url, resource_names=names or [], response_nonce=nonce,
                                                 version_info=version)
        if self.first:
            req.node.CopyFrom(N1)  # type: ignore[attr-defined]
            self.first = False
        if error is not None:
            req.error_detail.message = error  # type: ignore[attr-defined]
        return self.stream.handle(req)

    def push(self) -> list[Sent]:
        out = []
        for body in self.stream.push():
            if self.delta:
                d = discovery_pb2.DeltaDiscoveryResponse.FromString(body)
                out.append(Sent(d.type_url, d.nonce, d.system_version_info, sorted(r.name for r in d.resources),
                                sorted(d.removed_resources)))
            else:
                s = discovery_pb2.DiscoveryResponse.FromString(body)
                names = sorted(_name(a) for a in s.resources)
                out.append(Sent(s.type_url, s.nonce, s.version_info, names))
        return out

    def ack(self, sent: Sent, names: list[str] | None = None) -> bool:
        return self.request(sent.type_url, nonce=sent.nonce, version=sent.version, names=names)

    def settled(self, type_url: str, names: list[str] | None = None) -> Sent:
        """Subscribe (wildcard unless ``names``), receive the first response and ACK it."""
        assert self.request(type_url, names=names)
        (first,) = self.push()
        self.ack(first, names)
        assert self.push() == []
        return first


# --- delta --------------------------------------------------------------------------------------


@TYPES
def test_delta_unsubscribe_while_wildcard_resends_the_resource(type_url: str) -> None:
    """Delta: a wildcard-subscribed client that unsubscribes a name explicitly drops it locally, so the
    server sends it again at once (it is still covered by the wildcard).

    xDS protocol, "Delta xDS": unsubscribing a name only removes the explicit interest; the wildcard
    subscription still covers it (go-control-plane issue 558 states what Envoy expects).
    """
    h = Harness(delta=True)
    h.set(snapshot(type_url, ["a", "b"]))
    h.settled(type_url, names=["*"])
    assert h.request(type_url, unsubscribe=["a"]), "the unsubscribe must wake the stream"
    (resent,) = h.push()
    assert resent.names == ["a"] and resent.removed == []


@TYPES
def test_delta_legacy_wildcard_on_a_first_request_without_names(type_url: str) -> None:
    """Delta: a first request that subscribes to nothing is a wildcard subscription (legacy wildcard)."""
    h = Harness(delta=True)
    h.set(snapshot(type_url, ["a", "b"]))
    assert h.request(type_url)
    (first,) = h.push()
    assert first.names == ["a", "b"]


@TYPES
def test_delta_explicit_wildcard_alongside_names(type_url: str) -> None:
    """Delta: ``*`` subscribes to everything, also when the request names resources too."""
    h = Harness(delta=True)
    h.set(snapshot(type_url, ["a", "b", "c"]))
    assert h.request(type_url, names=["a", "*"])
    (first,) = h.push()
    assert first.names == ["a", "b", "c"]


@TYPES
def test_delta_named_first_request_is_not_wildcard(type_url: str) -> None:
    """Delta: a first request naming resources subscribes to those only."""
    h = Harness(delta=True)
    h.set(snapshot(type_url, ["a", "b"]))
    assert h.request(type_url, names=["a"])
    (first,) = h.push()
    assert first.names == ["a"]


@TYPES
def test_delta_unsubscribe_named_is_silent(type_url: str) -> None:
    """Delta: unsubscribing an explicitly subscribed name (no wildcard) makes no push due and its later
    changes and removal are never sent."""
    h = Harness(delta=True)
    h.set(snapshot(type_url, ["a", "b"]))
    h.settled(type_url, names=["a", "b"])
    assert not h.request(type_url, unsubscribe=["a"]) or type_url in (CDS, LDS)
    assert h.push() == []
    h.set(snapshot(type_url, {"b": 0}))
    assert h.push() == []


@TYPES
def test_delta_resubscribe_after_unsubscribe_resends(type_url: str) -> None:
    """Delta: a name subscribed again after an unsubscribe is sent again (the client dropped it)."""
    h = Harness(delta=True)
    h.set(snapshot(type_url, ["a", "b"]))
    h.settled(type_url, names=["a", "b"])
    h.request(type_url, unsubscribe=["a"])
    assert h.push() == []
    assert h.request(type_url, names=["a"])
    (again,) = h.push()
    assert again.names == ["a"]


@TYPES
def test_delta_unsubscribe_wildcard_keeps_explicit_names(type_url: str) -> None:
    """Delta: unsubscribing ``*`` ends the wildcard; explicitly named resources stay subscribed, the
    others are forgotten (a later wildcard sends them again)."""
    h = Harness(delta=True)
    h.set(snapshot(type_url, ["a", "b"]))
    h.settled(type_url, names=["*", "a"])
    h.request(type_url, unsubscribe=["*"])
    assert h.push() == []
    h.set(snapshot(type_url, {"a": 1, "b": 1}))
    (update,) = h.push()
    assert update.names == ["a"]
    assert h.request(type_url, names=["*"])
    (rewild,) = h.push()
    assert rewild.names == ["b"]


@TYPES
def test_delta_initial_resource_versions_skip_current_resources(type_url: str) -> None:
    """Delta: a reconnecting client's ``initial_resource_versions`` are what it holds: current ones
    are not sent again, changed ones are, and ones that no longer exist are removed."""
    old = Harness(delta=True)
    old.set(snapshot(type_url, ["a", "b", "gone"]))
    held = old.stream.states  # what the first stream's client held
    old.settled(type_url)
    versions = dict(held[type_url].client)
    h = Harness(delta=True)
    h.set(snapshot(type_url, {"a": 0, "b": 1}))
    assert h.request(type_url, initial=versions)
    (first,) = h.push()
    assert first.names == ["b"] and first.removed == ["gone"]


@TYPES
def test_delta_subscription_change_applies_with_a_stale_nonce(type_url: str) -> None:
    """Delta: a request with a stale nonce still changes the subscription (dropping a delta would
    lose it for good)."""
    h = Harness(delta=True)
    h.set(snapshot(type_url, ["a", "b"]))
    assert h.request(type_url, names=["a"])
    h.push()
    assert h.request(type_url, names=["b"], nonce="stale")
    (more,) = h.push()
    assert more.names == ["b"]
    assert h.ctx.status.stale_nonces == 1


@TYPES
def test_delta_nacked_content_is_not_resent(type_url: str) -> None:
    """Delta: a NACK leaves the rejected content as what the client holds: it is not sent again, new
    content is."""
    h = Harness(delta=True)
    h.set(snapshot(type_url, ["a"]))
    first = h.settled(type_url)
    h.set(snapshot(type_url, {"a": 1}))
    (bad,) = h.push()
    h.request(type_url, nonce=bad.nonce, error="rejected")
    assert h.push() == []
    h.set(snapshot(type_url, {"a": 2}))
    (fixed,) = h.push()
    assert fixed.names == ["a"] and first.nonce != fixed.nonce


# --- SotW ---------------------------------------------------------------------------------------


@TYPES
def test_sotw_legacy_wildcard_on_an_empty_first_request(type_url: str) -> None:
    """SotW: an empty request before any named one is a wildcard subscription (legacy wildcard)."""
    h = Harness(delta=False)
    h.set(snapshot(type_url, ["a", "b"]))
    assert h.request(type_url)
    (first,) = h.push()
    assert first.names == ["a", "b"]


@TYPES
def test_sotw_empty_request_after_names_is_not_wildcard(type_url: str) -> None:
    """SotW: once the client has named resources, an empty request subscribes to nothing (legacy
    wildcard applies only before any explicit subscription)."""
    h = Harness(delta=False)
    h.set(snapshot(type_url, ["a", "b"]))
    first = h.settled(type_url, names=["a"])
    h.request(type_url, names=[], nonce=first.nonce, version=first.version)
    assert h.push() == []  # withdrawn names are forgotten silently
    h.set(snapshot(type_url, {"a": 1, "b": 1, "c": 0}))
    assert h.push() == []


@TYPES
def test_sotw_explicit_wildcard_alongside_names(type_url: str) -> None:
    """SotW: ``*`` among the names subscribes to everything."""
    h = Harness(delta=False)
    h.set(snapshot(type_url, ["a", "b", "c"]))
    assert h.request(type_url, names=["a", "*"])
    (first,) = h.push()
    assert first.names == ["a", "b", "c"]


@TYPES
def test_sotw_new_names_answered_at_an_unchanged_version(type_url: str) -> None:
    """SotW: a request naming a new resource makes a push due and is answered without a snapshot change."""
    h = Harness(delta=False)
    h.set(snapshot(type_url, ["a", "b"]))
    first = h.settled(type_url, names=["a"])
    assert h.request(type_url, names=["a", "b"], nonce=first.nonce, version=first.version)
    (more,) = h.push()
    assert more.names == ["a", "b"] and more.version == first.version


@TYPES
def test_sotw_stale_nonce_is_ignored(type_url: str) -> None:
    """SotW: a request carrying a superseded nonce changes nothing and makes no push due."""
    h = Harness(delta=False)
    h.set(snapshot(type_url, ["a", "b"]))
    h.settled(type_url, names=["a"])
    assert not h.request(type_url, names=["a", "b"], nonce="stale")
    assert h.push() == []
    assert h.ctx.status.stale_nonces == 1


@TYPES
def test_sotw_nacked_content_is_not_resent(type_url: str) -> None:
    """SotW: a NACKed response is never sent again; different content is."""
    h = Harness(delta=False)
    h.set(snapshot(type_url, ["a"]))
    first = h.settled(type_url)
    h.set(snapshot(type_url, {"a": 1}))
    (bad,) = h.push()
    h.request(type_url, nonce=bad.nonce, version=first.version, error="rejected")
    assert h.push() == []
    h.set(snapshot(type_url, {"a": 2}))
    (fixed,) = h.push()
    assert fixed.names == ["a"]


@TYPES
@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
def test_unchanged_snapshot_is_not_pushed(type_url: str, delta: bool) -> None:
    """A new snapshot version whose content for a type is unchanged sends nothing of that type."""
    h = Harness(delta=delta)
    h.set(snapshot(type_url, ["a"]))
    h.settled(type_url)
    h.set(Snapshot.build([resource(type_url, "a"), ("x", resources_pb2.CellAversion(cell="x"))],
                         extra_types=[type_url]) if type_url != DLB else
          Snapshot.build([resource(type_url, "a"), eds_cluster("x")], extra_types=[type_url]))
    assert h.push() == []


@TYPES
@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
def test_plain_ack_makes_no_push_due_when_nothing_is_held(type_url: str, delta: bool) -> None:
    """An ACK of the current response makes no push due unless make-before-break holds something its
    answer may release (a CDS or route ACK with nothing held woke the writer for an empty push)."""
    h = Harness(delta=delta)
    h.set(snapshot(type_url, ["a"]))
    assert h.request(type_url)
    (first,) = h.push()
    assert not h.ack(first)


# --- make-before-break (ADS) ----------------------------------------------------------------------


def _mbb_snapshot(cluster: str) -> Snapshot:
    return Snapshot.build([eds_cluster(cluster), load_assignment(cluster, [1]), route_config("r", cluster=cluster)],
                          extra_types=[CDS])


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
def test_routes_wait_while_added_clusters_warm(delta: bool) -> None:
    """ADS: RDS is not sent while a CDS response that adds clusters is unanswered."""
    h = Harness(delta=delta)
    h.set(_mbb_snapshot("old"))
    h.settled(CDS)
    h.settled(RDS, names=["r"])
    h.set(_mbb_snapshot("new"))
    assert [s.type_url for s in h.push()] == [CDS]
    assert h.push() == []


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
def test_cluster_removal_waits_for_the_route_answer(delta: bool) -> None:
    """ADS: a removed cluster stays (SotW: a ``~partial`` CDS; delta: not yet in removed_resources)
    until the route that used it has been answered."""
    h = Harness(delta=delta)
    h.set(_mbb_snapshot("old"))
    h.settled(CDS)
    h.settled(RDS, names=["r"])
    h.set(_mbb_snapshot("new"))
    (cds,) = h.push()
    assert (cds.version.endswith("~partial") and cds.names == ["new", "old"]) if not delta else cds.removed == []
    assert h.ack(cds), "the CDS answer releases the waiting route: a push is due"
    (rds,) = h.push()
    assert rds.type_url == RDS
    assert h.ack(rds, ["r"]), "the route answer releases the held removal: a push is due"
    (final,) = h.push()
    assert final.type_url == CDS
    assert final.names == ["new"] if not delta else final.removed == ["old"]
    assert not h.ack(final), "nothing is held any more"


def test_per_type_service_has_no_gate() -> None:
    """A per-type service (not ADS) cannot see other types, so nothing is held for make-before-break."""
    h = Harness(delta=False, fixed_type=RDS)
    h.set(_mbb_snapshot("old"))
    h.settled(RDS, names=["r"])
    h.set(_mbb_snapshot("new"))
    assert [s.type_url for s in h.push()] == [RDS]


# --- observers -----------------------------------------------------------------------------------


class Recorder(NoCallbacks):
    def __init__(self) -> None:
        self.events: list[tuple[str, ...]] = []

    def stream_opened(self, node_id: str, cluster: str) -> None:
        self.events.append(("opened", node_id))

    def sent(self, node_id: str, type_url: str, version: str, nonce: str) -> None:
        self.events.append(("sent", nonce))

    def acked(self, node_id: str, type_url: str, version: str) -> None:
        self.events.append(("acked", version))

    def nacked(self, node_id: str, type_url: str, version: str, reason: str) -> None:
        self.events.append(("nacked", reason))

    def stale_nonce(self, node_id: str, type_url: str, nonce: str) -> None:
        self.events.append(("stale", nonce))


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
def test_callbacks_see_open_send_ack_nack_and_stale_nonce(delta: bool) -> None:
    """Every observer passed to the server sees the stream's events, in order, after the status registry."""
    rec = Recorder()
    h = Harness(delta=delta, callbacks=[rec])
    h.set(snapshot(DLB, ["a"]))
    first = h.settled(DLB)
    h.set(snapshot(DLB, {"a": 1}))
    (second,) = h.push()
    h.request(DLB, nonce="stale", version=first.version)
    h.request(DLB, nonce=second.nonce, version=first.version, error="bad")
    assert rec.events == [("opened", "n1"), ("sent", first.nonce), ("acked", first.version), ("sent", second.nonce),
                          ("stale", "stale"), ("nacked", "bad")]
    assert h.ctx.status.nodes["n1"].types[DLB].nacks == 1


def test_wake_is_an_event_for_one_waiter() -> None:
    """``Wake`` (the writer's wake-up flag): a set before the wait returns at once, a set during the wait
    ends it, and after ``clear`` a wait blocks until the next set."""

    async def scenario() -> None:
        wake = Wake()
        wake.set()
        await asyncio.wait_for(wake.wait(), 1)
        wake.clear()
        waiter = asyncio.create_task(wake.wait())
        await asyncio.sleep(0)
        assert not waiter.done()
        wake.set()
        await asyncio.wait_for(waiter, 1)
        wake.clear()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(wake.wait(), 0.05)

    asyncio.run(scenario())
