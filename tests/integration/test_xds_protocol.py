"""xDS protocol behaviour of dlb.xds (docs/design.md §5) driven by a raw gRPC client (xds-protos stubs).

Absence of a push is proven with ``RawStream.barrier`` (no sleeps, no timed assertions).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.request
from collections.abc import Iterator

import grpc
import pytest
from bounded_wait import until_in_loop
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.route.v3 import route_pb2
from envoy.service.cluster.v3 import cds_pb2_grpc
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import struct_pb2

from dlb.errors import BindError
from dlb.xds import Snapshot, SnapshotCache, StatusServer, XdsServer, types
from dlb.xds.callbacks import NoCallbacks
from dlb.xds.snapshot import Resource
from dlb.xds.testing import RawStream, ack, decode, eds_cluster, http_listener, load_assignment, nack, names_of, node, route_config, sotw_request

CDS, EDS, LDS, RDS = types.CLUSTER, types.ENDPOINT, types.LISTENER, types.ROUTE
CUSTOM = "type.googleapis.com/google.protobuf.Struct"
N1 = node("n1")


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


#: The transport every test here runs on (the ``transport`` fixture sets it: each test runs on both).
TRANSPORT = ["h2"]


@pytest.fixture(autouse=True, params=["h2", "grpc"])
def transport(request: pytest.FixtureRequest) -> Iterator[str]:
    TRANSPORT[0] = request.param
    yield request.param
    TRANSPORT[0] = "h2"


class Env:
    def __init__(self, **kw) -> None:
        self.cache = SnapshotCache(**{k: v for k, v in kw.items() if k == "node_key"})
        kw.setdefault("transport", TRANSPORT[0])
        self.server = XdsServer(self.cache, **{k: v for k, v in kw.items() if k != "node_key"})
        self.streams: list[RawStream] = []

    def stream(self, delta: bool = False) -> RawStream:
        s = RawStream(self.channel, delta=delta)
        self.streams.append(s)
        return s


@contextlib.asynccontextmanager
async def xds(**kw):
    env = Env(**kw)
    port = await env.server.start()
    env.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield env
    finally:
        for s in env.streams:
            await s.close()
        await env.channel.close()
        await env.server.stop(None)


def snap(clusters=("c1",), eds=None, routes=None, listeners=(), custom=None) -> Snapshot:
    items = [eds_cluster(c) for c in clusters]
    items += [load_assignment(c, [p]) for c, p in (eds or {}).items()]
    items += [route_config(r, cluster=c) for r, c in (routes or {}).items()]
    items += [http_listener(name, 10000 + i, "r") for i, name in enumerate(listeners)]
    items += [(n, s) for n, s in (custom or {}).items()]
    return Snapshot.build(items, extra_types=[CDS, LDS])


async def cds_stream(env: Env) -> tuple[str, RawStream]:
    """Snapshot with cluster c1 for n1, a stream subscribed to CDS (wildcard), ACKed and settled."""
    v1 = env.cache.set_snapshot("n1", snap(clusters=("c1",)))
    s = env.stream()
    await s.send(sotw_request(CDS, node=N1))
    await s.send(ack(await s.recv()))
    assert await s.barrier() == []
    return v1, s


def struct(**fields) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(fields)
    return s


# --- SotW ---------------------------------------------------------------------------------------

def test_wildcard_cds_full_state_nonce_and_version():
    """A wildcard CDS stream gets full state with a fresh nonce per response; an ACK is not answered; the ACKed version is exposed per node."""
    async def main():
        async with xds() as env:
            v1 = env.cache.set_snapshot("n1", snap(clusters=("c1", "c2")))
            s = env.stream()
            await s.send(sotw_request(CDS, node=N1))  # legacy wildcard: empty names on the first CDS request
            r1 = await s.recv()
            assert r1.type_url == CDS and r1.version_info == v1 and r1.nonce
            assert sorted(names_of(r1, cluster_pb2.Cluster)) == ["c1", "c2"]
            await s.send(ack(r1))
            assert await s.barrier() == []  # an ACK is not answered
            v2 = env.cache.set_snapshot("n1", snap(clusters=("c1",)))  # deletion: full state without c2
            r2 = await s.recv()
            assert r2.version_info == v2 and names_of(r2, cluster_pb2.Cluster) == ["c1"]
            assert r2.nonce != r1.nonce
            await s.send(ack(r2))
            await s.barrier()
            assert env.server.status.nodes["n1"].types[CDS].acked_version == v2
    run(main())


def test_type_url_required_and_node_required():
    """A request without type_url, or a first request without node, fails INVALID_ARGUMENT; the first request's node serves the stream."""
    async def main():
        async with xds() as env:
            env.cache.set_snapshot("n1", snap())
            s = env.stream()
            await s.send(sotw_request("", node=N1))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await s.recv()
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "type_url" in err.value.details()
            s2 = env.stream()
            await s2.send(sotw_request(CDS))  # no node on the first request
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await s2.recv()
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "node" in err.value.details()
            s3 = env.stream()  # node only on the first request: later requests reuse it
            await s3.send(sotw_request(CDS, node=N1))
            r = await s3.recv()
            await s3.send(ack(r))
            await s3.send(sotw_request(EDS, ["c1"]))
            assert await s3.barrier() == []  # c1 has no endpoints yet: nothing, but the stream lives
    run(main())


def test_unchanged_snapshot_not_pushed_and_bursts_coalesced():
    """Unchanged config is never pushed, and a burst of snapshots is coalesced into one push of the newest."""
    async def main():
        async with xds() as env:
            v1, s = await cds_stream(env)
            assert env.cache.set_snapshot("n1", snap(clusters=("c1",))) == v1  # same content: same version
            assert await s.barrier() == []
            # A snapshot whose CDS view is unchanged (only custom resources moved) pushes no CDS.
            env.cache.set_snapshot("n1", snap(clusters=("c1",), custom={"x": struct(a=1)}))
            assert await s.barrier() == []
            last = ""
            for i in range(20):  # a burst without yielding to the loop: one push of the newest
                last = env.cache.set_snapshot("n1", snap(clusters=("c1", f"burst{i}")))
            r = await s.recv()
            assert r.version_info == last and sorted(names_of(r, cluster_pb2.Cluster)) == ["burst19", "c1"]
            await s.send(ack(r))
            assert await s.barrier() == []
    run(main())


def test_stale_nonce_ignored():
    """A request carrying a superseded nonce is ignored, names included; a new stream's first request is answered whatever its nonce."""
    async def main():
        async with xds() as env:
            env.cache.set_snapshot("n1", snap(eds={"a": 1, "b": 2}))
            s = env.stream()
            await s.send(sotw_request(EDS, ["a"], node=N1))
            r1 = await s.recv()
            env.cache.set_snapshot("n1", snap(eds={"a": 3, "b": 2}))
            r2 = await s.recv()
            # A request carrying the superseded nonce is ignored, names included.
            await s.send(sotw_request(EDS, ["a", "b"], r1.version_info, r1.nonce))
            assert await s.barrier() == []
            assert env.server.status.stale_nonces == 1
            assert env.server.status.nodes["n1"].types[EDS].acked_version == ""
            await s.send(ack(r2, ["a", "b"]))  # the current nonce: ACK + new name b is served
            r3 = await s.recv()
            assert r3.version_info == r2.version_info and sorted(names_of(r3, endpoint_pb2.ClusterLoadAssignment)) == ["a", "b"]
            assert env.server.status.nodes["n1"].types[EDS].acked_version == r2.version_info
            # A new stream whose first request carries a nonce from an old stream is still answered.
            s2 = env.stream()
            await s2.send(sotw_request(EDS, ["a"], r2.version_info, r2.nonce, node=N1))
            r4 = await s2.recv()
            assert names_of(r4, endpoint_pb2.ClusterLoadAssignment) == ["a"]
    run(main())


def test_named_subscriptions_new_withdrawn_and_missing_names():
    """Newly named resources go out at an unchanged version, withdrawn names get no responses, not-yet-existing names are remembered."""
    async def main():
        async with xds() as env:
            env.cache.set_snapshot("n1", snap(eds={"a": 1, "b": 2}))
            s = env.stream()
            await s.send(sotw_request(EDS, ["a"], node=N1))
            r1 = await s.recv()
            assert names_of(r1, endpoint_pb2.ClusterLoadAssignment) == ["a"]  # a subset, never held for b
            await s.send(ack(r1, ["a", "b"]))  # newly named b at an unchanged version is sent
            r2 = await s.recv()
            assert r2.version_info == r1.version_info
            assert sorted(names_of(r2, endpoint_pb2.ClusterLoadAssignment)) == ["a", "b"]
            await s.send(ack(r2, ["a", "zz"]))  # withdraw b, ask for zz which does not exist yet
            assert await s.barrier() == []  # (also makes sure the server has the request before we go on)
            env.cache.set_snapshot("n1", snap(eds={"a": 1, "b": 9}))  # change of a withdrawn name: silence
            assert await s.barrier() == []
            env.cache.set_snapshot("n1", snap(eds={"a": 1, "b": 9, "zz": 5}))  # remembered name appears
            r3 = await s.recv()
            assert sorted(names_of(r3, endpoint_pb2.ClusterLoadAssignment)) == ["a", "zz"]
            await s.send(ack(r3, []))  # empty names after explicit ones = unsubscribe all (not wildcard)
            assert await s.barrier() == []
            env.cache.set_snapshot("n1", snap(eds={"a": 7, "zz": 7}))
            assert await s.barrier() == []
    run(main())


def test_nack_logged_exposed_and_not_resent():
    """A NACKed version is never re-sent until a new snapshot changes that type; the NACK is exposed per node."""
    async def main():
        async with xds() as env:
            v1, s = await cds_stream(env)
            v2 = env.cache.set_snapshot("n1", snap(clusters=("c1", "bad")))
            r2 = await s.recv()
            await s.send(nack(r2, v1, "cluster bad: invalid"))
            assert await s.barrier() == []  # not re-sent in reply to the NACK
            env.cache.set_snapshot("n1", snap(clusters=("c1", "bad"), custom={"x": struct(a=1)}))
            assert await s.barrier() == []  # new snapshot, same rejected CDS content: still not re-sent
            st = env.server.status.nodes["n1"].types[CDS]
            assert (st.acked_version, st.sent_version, st.last_nack_version) == (v1, v2, v2)
            assert st.last_nack_reason == "cluster bad: invalid" and st.nacks == 1
            v4 = env.cache.set_snapshot("n1", snap(clusters=("c1", "good")))
            r4 = await s.recv()
            assert r4.version_info == v4 and sorted(names_of(r4, cluster_pb2.Cluster)) == ["c1", "good"]
    run(main())


def test_make_before_break_order_and_stale_cluster_removal():
    """Make-before-break: new cluster (CDS), its endpoints (EDS), then the route (RDS); the stale cluster goes after the RDS ACK."""
    async def main():
        async with xds() as env:
            env.cache.set_snapshot("n1", snap(clusters=("old",), eds={"old": 1}, routes={"r": "old"}, listeners=("l",)))
            s = env.stream()
            await s.send(sotw_request(CDS, node=N1))
            await s.send(ack(await s.recv()))
            assert await s.barrier() == []
            await s.send(sotw_request(EDS, ["old"]))
            await s.send(ack(await s.recv(), ["old"]))
            await s.send(sotw_request(LDS))
            await s.send(ack(await s.recv()))
            await s.send(sotw_request(RDS, ["r"]))
            await s.send(ack(await s.recv(), ["r"]))
            assert await s.barrier() == []
            # Switch the route from "old" to "new": add first, move the route, then remove.
            v2 = env.cache.set_snapshot("n1", snap(clusters=("new",), eds={"new": 2}, routes={"r": "new"}, listeners=("l",)))
            cds = await s.recv()
            assert cds.type_url == CDS and cds.version_info == v2 + "~partial"
            assert sorted(names_of(cds, cluster_pb2.Cluster)) == ["new", "old"]
            assert await s.barrier() == []  # the route waits: "new" is warming until CDS is ACKed
            await s.send(sotw_request(EDS, ["new", "old"], "v", await_nonce(env, s, EDS)))
            eds = await s.recv()  # the new cluster's endpoints
            assert eds.type_url == EDS and "new" in names_of(eds, endpoint_pb2.ClusterLoadAssignment)
            await s.send(ack(eds, ["new", "old"]))
            assert await s.barrier() == []
            await s.send(ack(cds))  # Envoy ACKs CDS once "new" has its endpoints
            rds = await s.recv()
            assert rds.type_url == RDS
            assert route_pb2.RouteConfiguration.FromString(rds.resources[0].value).virtual_hosts[0].routes[0].route.cluster == "new"
            assert await s.barrier() == []  # "old" still present until RDS is ACKed
            await s.send(ack(rds, ["r"]))
            final = await s.recv()
            assert final.type_url == CDS and final.version_info == v2 and names_of(final, cluster_pb2.Cluster) == ["new"]
            # A route change that needs no new cluster is not held.
            await s.send(ack(final))
            assert await s.barrier() == []
            env.cache.set_snapshot("n1", snap(clusters=("new",), eds={"new": 2}, routes={"r": "new"}, listeners=("l", "l2")))
            assert (await s.recv()).type_url == LDS
    run(main())


def await_nonce(env: Env, s: RawStream, type_url: str) -> str:
    return env.server.status.nodes["n1"].types[type_url].sent_nonce


def test_eds_resent_after_cluster_change():
    """A changed cluster has its EDS re-sent right after the CDS update, even with unchanged endpoints."""
    async def main():
        async with xds() as env:
            env.cache.set_snapshot("n1", snap(clusters=("c1",), eds={"c1": 1}))
            s = env.stream()
            await s.send(sotw_request(CDS, node=N1))
            await s.send(ack(await s.recv()))
            assert await s.barrier() == []
            await s.send(sotw_request(EDS, ["c1"]))
            e1 = await s.recv()
            await s.send(ack(e1, ["c1"]))
            assert await s.barrier() == []
            changed = Snapshot.build([eds_cluster("c1", connect_timeout_s=5), load_assignment("c1", [1])])
            v2 = env.cache.set_snapshot("n1", changed)
            cds, eds = await s.recv(), await s.recv()
            assert (cds.type_url, eds.type_url) == (CDS, EDS) and eds.version_info == v2
            assert eds.resources[0].value == e1.resources[0].value  # same endpoints, sent again for re-warming
    run(main())


def test_authorizer_and_per_node_snapshots():
    """A node reads only its own snapshot, and only what the authoriser allows, even when it asks by name."""
    def only_own_cell(nd, type_url, name):
        return name.startswith(nd.cluster + "-")

    async def main():
        async with xds(authorizer=only_own_cell) as env:
            env.cache.set_snapshot("a1", snap(clusters=("cellA-x", "cellB-secret"), eds={"cellA-x": 1, "cellB-secret": 2}))
            env.cache.set_snapshot("b1", snap(clusters=("cellB-y",)))
            sa, sb = env.stream(), env.stream()
            await sa.send(sotw_request(CDS, node=node("a1", "cellA")))
            await sb.send(sotw_request(CDS, node=node("b1", "cellB")))
            assert names_of(await sa.recv(), cluster_pb2.Cluster) == ["cellA-x"]
            assert names_of(await sb.recv(), cluster_pb2.Cluster) == ["cellB-y"]
            await sa.send(sotw_request(EDS, ["cellB-secret"]))  # asking by name does not help
            assert await sa.barrier() == []
    run(main())


def test_custom_types_over_ads_and_watch_cancelled_on_close():
    """Custom resource types are served over ADS, and a stream's watches are cancelled when it closes."""
    async def main():
        async with xds() as env:
            env.cache.set_snapshot("n1", snap(custom={"policy-a": struct(gain=2.0), "policy-b": struct(gain=1.0)}))
            s = env.stream()
            await s.send(sotw_request(CUSTOM, ["policy-a"], node=N1))
            r = await s.recv()
            assert r.type_url == CUSTOM and {k: v["gain"] for k, v in decode(r, struct_pb2.Struct).items()} == {"policy-a": 2.0}
            assert env.cache.watch_count == 1 and env.server.status.nodes["n1"].streams == 1
            await s.close()
            await until_in_loop(lambda: env.cache.watch_count == 0, "the closed stream's watch cancelled")
            assert env.server.status.nodes["n1"].streams == 0
    run(main())


class FailsFor(NoCallbacks):
    """An observer with a bug that shows for one node: it raises whenever a response is sent to it."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id

    def sent(self, node_id: str, type_url: str, version: str, nonce: str) -> None:
        if node_id == self.node_id:
            raise RuntimeError("observer bug")


def test_a_push_that_raises_fails_only_its_own_stream():
    """A bug while pushing to one stream ends that stream with an error; the other streams keep getting
    every snapshot (on h2 all pushes share one queue, which must not stop)."""
    async def main():
        async with xds(callbacks=[FailsFor("bad")]) as env:
            bad, good = env.stream(), env.stream()
            for n in ("bad", "good"):
                env.cache.set_snapshot(n, snap(clusters=("c1",)))
            await bad.send(sotw_request(CDS, node=node("bad")))
            await good.send(sotw_request(CDS, node=node("good")))
            await good.send(ack(await good.recv()))
            with pytest.raises(grpc.aio.AioRpcError):
                await bad.recv()
            for round_no in range(2):  # the queue goes on after the failure
                v = env.cache.set_snapshot("good", snap(clusters=(f"c{round_no + 2}",)))
                r = await good.recv()
                assert r.version_info == v
                await good.send(ack(r))
    run(main())


def test_status_endpoint_and_metrics():
    """The status endpoint and the metrics expose, per node and type, the sent and ACKed versions and the last NACK."""
    async def main():
        async with xds() as env:
            status = StatusServer(env.server.status, snapshot_count=lambda: len(env.cache.keys()))
            port = await status.start()
            try:
                v1 = env.cache.set_snapshot("n1", snap(clusters=("c1",)))
                s = env.stream()
                await s.send(sotw_request(CDS, node=N1))
                await s.send(ack(await s.recv()))
                assert await s.barrier() == []
                v2 = env.cache.set_snapshot("n1", snap(clusters=("c2",)))
                await s.send(nack(await s.recv(), v1, "no good"))
                await s.barrier()
                loop = asyncio.get_running_loop()
                body = await loop.run_in_executor(None, lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/status").read())
                cds = json.loads(body)["nodes"]["n1"]["types"]["CDS"]
                assert (cds["sent_version"], cds["acked_version"], cds["last_nack_reason"]) == (v2, v1, "no good")
                assert json.loads(body)["nodes"]["n1"]["streams"] == 1 and cds["subscribed"] == ["*"]
                metrics = (await loop.run_in_executor(None, lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read())).decode()
                assert f'dlb_xds_acked_version_info{{node="n1",type="CDS",version="{v1}"}} 1.0' in metrics
                assert 'dlb_xds_nacks_total{node="n1",type="CDS"} 1.0' in metrics
            finally:
                await status.stop()
    run(main())


# --- delta --------------------------------------------------------------------------------------

def delta_req(type_url, sub=(), unsub=(), nonce="", node=None, initial=None, error=None):
    req = discovery_pb2.DeltaDiscoveryRequest(type_url=type_url, resource_names_subscribe=list(sub),
                                              resource_names_unsubscribe=list(unsub), response_nonce=nonce,
                                              initial_resource_versions=initial or {})
    if node is not None:
        req.node.CopyFrom(node)
    if error is not None:
        req.error_detail.message = error
    return req


def test_delta_wildcard_updates_removals_and_named_subscriptions():
    """Delta sends only changes, deletions in removed_resources, only newly subscribed names, and nothing for unsubscribed ones."""
    async def main():
        async with xds() as env:
            v1 = env.cache.set_snapshot("n1", snap(clusters=("c1", "c2"), eds={"c1": 1, "c2": 2}))
            s = env.stream(delta=True)
            await s.send(delta_req(CDS, node=N1))
            r1 = await s.recv()
            assert r1.system_version_info == v1 and sorted(r.name for r in r1.resources) == ["c1", "c2"]
            assert all(r.version == Resource.from_message(eds_cluster(r.name)).version for r in r1.resources)
            await s.send(delta_req(CDS, nonce=r1.nonce))
            assert await s.barrier() == []
            env.cache.set_snapshot("n1", snap(clusters=("c1", "c3"), eds={"c1": 1, "c2": 2}))
            r2 = await s.recv()
            assert [r.name for r in r2.resources] == ["c3"] and list(r2.removed_resources) == ["c2"]
            await s.send(delta_req(CDS, nonce=r2.nonce))
            await s.send(delta_req(EDS, sub=["c1"]))
            e1 = await s.recv()
            assert [r.name for r in e1.resources] == ["c1"]
            await s.send(delta_req(EDS, sub=["c2"], nonce=e1.nonce))
            e2 = await s.recv()
            assert [r.name for r in e2.resources] == ["c2"]  # only the newly subscribed one
            await s.send(delta_req(EDS, unsub=["c2"], nonce=e2.nonce))
            assert await s.barrier() == []
            env.cache.set_snapshot("n1", snap(clusters=("c1", "c3"), eds={"c1": 1, "c2": 5}))
            assert await s.barrier() == []  # withdrawn: no response
    run(main())


def test_delta_reconnect_with_initial_resource_versions():
    """A delta reconnect with initial_resource_versions gets only what changed, and the removal of what is gone."""
    async def main():
        async with xds() as env:
            env.cache.set_snapshot("n1", snap(clusters=("c1", "c2")))
            held = {"c1": Resource.from_message(eds_cluster("c1")).version,  # current
                    "c2": "stale-version", "gone": "x"}
            s = env.stream(delta=True)
            await s.send(delta_req(CDS, node=N1, initial=held))
            r = await s.recv()
            assert [x.name for x in r.resources] == ["c2"] and list(r.removed_resources) == ["gone"]
    run(main())


def test_delta_nack_not_resent():
    """A delta NACK is not answered, and the rejected resources are not re-sent until a new snapshot changes them."""
    async def main():
        async with xds() as env:
            env.cache.set_snapshot("n1", snap(clusters=("c1",)))
            s = env.stream(delta=True)
            await s.send(delta_req(CDS, node=N1))
            r1 = await s.recv()
            await s.send(delta_req(CDS, nonce=r1.nonce))
            assert await s.barrier() == []
            env.cache.set_snapshot("n1", snap(clusters=("c1", "bad")))
            r2 = await s.recv()
            await s.send(delta_req(CDS, nonce=r2.nonce, error="bad cluster"))
            assert await s.barrier() == []
            env.cache.set_snapshot("n1", snap(clusters=("c1", "bad"), custom={"x": struct(a=1)}))
            assert await s.barrier() == []
            assert env.server.status.nodes["n1"].types[CDS].last_nack_reason == "bad cluster"
    run(main())


def test_delta_make_before_break_and_eds_resend():
    """Delta keeps make-before-break (removal held until the RDS ACK) and re-sends EDS after a cluster change."""
    async def main():
        async with xds() as env:
            env.cache.set_snapshot("n1", snap(clusters=("old",), eds={"old": 1}, routes={"r": "old"}, listeners=("l",)))
            s = env.stream(delta=True)
            await s.send(delta_req(CDS, node=N1))
            c1 = await s.recv()
            await s.send(delta_req(CDS, nonce=c1.nonce))
            await s.send(delta_req(EDS, sub=["old"]))
            e1 = await s.recv()
            await s.send(delta_req(EDS, nonce=e1.nonce))
            await s.send(delta_req(RDS, sub=["r"]))
            r1 = await s.recv()
            await s.send(delta_req(RDS, nonce=r1.nonce))
            assert await s.barrier() == []
            env.cache.set_snapshot("n1", snap(clusters=("new",), eds={"new": 2}, routes={"r": "new"}, listeners=("l",)))
            cds = await s.recv()
            assert cds.type_url == CDS
            assert [r.name for r in cds.resources] == ["new"] and list(cds.removed_resources) == []  # removal held
            assert await s.barrier() == []  # the route waits for the new cluster's CDS ACK
            await s.send(delta_req(EDS, sub=["new"]))
            eds = await s.recv()
            assert [r.name for r in eds.resources] == ["new"]
            await s.send(delta_req(EDS, nonce=eds.nonce))
            await s.send(delta_req(CDS, nonce=cds.nonce))
            rds = await s.recv()
            assert rds.type_url == RDS and [r.name for r in rds.resources] == ["r"]
            assert await s.barrier() == []
            await s.send(delta_req(RDS, nonce=rds.nonce))  # route moved: now the stale cluster goes
            final, final_eds = await s.recv(), await s.recv()
            assert final.type_url == CDS and list(final.removed_resources) == ["old"] and not final.resources
            assert final_eds.type_url == EDS and list(final_eds.removed_resources) == ["old"]
            await s.send(delta_req(CDS, nonce=final.nonce))
            await s.send(delta_req(EDS, nonce=final_eds.nonce))
            assert await s.barrier() == []
            # A changed EDS cluster makes its endpoints go out again, right after the CDS update.
            env.cache.set_snapshot("n1", Snapshot.build([eds_cluster("new", 9), load_assignment("new", [2]),
                                                         route_config("r", cluster="new"), http_listener("l", 10000, "r")]))
            cds2, eds2 = await s.recv(), await s.recv()
            assert (cds2.type_url, [r.name for r in cds2.resources]) == (CDS, ["new"])
            assert (eds2.type_url, [r.name for r in eds2.resources]) == (EDS, ["new"])
    run(main())


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
def test_per_type_service_without_ads(delta: bool):
    """The per-type services (CDS without ADS, SotW and delta) serve the type implied by the service."""
    async def main():
        async with xds() as env:
            env.cache.set_snapshot("n1", snap(clusters=("c1",)))
            q: asyncio.Queue = asyncio.Queue()

            async def reqs():
                while (item := await q.get()) is not None:
                    yield item

            stub = cds_pb2_grpc.ClusterDiscoveryServiceStub(env.channel)
            call = (stub.DeltaClusters if delta else stub.StreamClusters)(reqs())
            # type_url implied by the service
            await q.put(discovery_pb2.DeltaDiscoveryRequest(node=N1) if delta else discovery_pb2.DiscoveryRequest(node=N1))
            r = await asyncio.wait_for(call.read(), 20)
            names = [x.name for x in r.resources] if delta else names_of(r, cluster_pb2.Cluster)
            assert r.type_url == CDS and names == ["c1"]
            await q.put(None)
            call.cancel()
    run(main())


def test_streams_with_the_same_view_share_one_serialized_body():
    """Streams with the same view of a snapshot share one serialized response body."""
    async def main():
        async with xds() as env:
            env.cache.set_snapshot("shared", snap(clusters=("c1", "c2")))
            env.cache.node_key = lambda _n: "shared"
            streams = [env.stream() for _ in range(3)]
            for i, s in enumerate(streams):
                await s.send(sotw_request(CDS, node=node(f"n{i}")))
            bodies = [await s.recv() for s in streams]
            assert all(b.resources == bodies[0].resources for b in bodies)
            assert env.server.ctx.body_cache.misses == 1 and env.server.ctx.body_cache.hits == 2
    run(main())


def test_set_snapshot_from_another_thread_wakes_streams():
    """A snapshot set from another thread wakes the streams on the server's event loop."""
    async def main():
        async with xds() as env:
            _, s = await cds_stream(env)
            v2 = await asyncio.to_thread(env.cache.set_snapshot, "n1", snap(clusters=("c1", "c2")))
            r = await s.recv()
            assert r.version_info == v2 and sorted(names_of(r, cluster_pb2.Cluster)) == ["c1", "c2"]
    run(main())


def test_custom_type_deletion_reaches_sotw_clients():
    """A SotW custom-type update that only removes a resource still reaches wildcard clients (full state)."""
    async def main():
        async with xds() as env:
            env.cache.set_snapshot("n1", snap(custom={"cell-a": struct(x=1), "cell-b": struct(x=2)}))
            s = env.stream()
            await s.send(sotw_request(CUSTOM, node=N1))  # wildcard
            r1 = await s.recv()
            assert sorted(decode(r1, struct_pb2.Struct)) == ["cell-a", "cell-b"]
            await s.send(ack(r1))
            assert await s.barrier() == []
            env.cache.set_snapshot("n1", snap(custom={"cell-a": struct(x=1)}))  # only a removal
            r2 = await s.recv()
            assert sorted(decode(r2, struct_pb2.Struct)) == ["cell-a"]
    run(main())


def test_resource_wrapper_only_for_clients_that_support_it():
    """Resources go wrapped in discovery.v3.Resource only to clients that announce support for it."""
    async def main():
        async with xds() as env:
            env.cache.node_key = lambda _n: "shared"
            env.cache.set_snapshot("shared", snap(custom={"topology": struct(cells=3)}))
            with_wrapper, plain = env.stream(), env.stream()
            await with_wrapper.send(sotw_request(CUSTOM, node=node("w")))
            await plain.send(sotw_request(CUSTOM, node=node("p", wrapper=False)))
            rw, rp = await with_wrapper.recv(), await plain.recv()
            assert decode(rw, struct_pb2.Struct)["topology"]["cells"] == 3  # name travels in the wrapper
            assert rw.resources[0].type_url.endswith("discovery.v3.Resource")
            assert rp.resources[0].type_url == CUSTOM and struct_pb2.Struct.FromString(rp.resources[0].value)["cells"] == 3
    run(main())


def test_second_server_on_the_same_address_fails():
    """A second server on an address already bound fails with BindError naming the port."""
    async def main():
        async with xds() as env:
            other = XdsServer(SnapshotCache(), transport=TRANSPORT[0])
            try:
                with pytest.raises(BindError, match=str(env.server.port)):
                    await other.start(f"127.0.0.1:{env.server.port}")
            finally:
                await other.stop(None)
    run(main())
