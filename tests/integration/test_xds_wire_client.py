"""The xDS bench's lean HTTP/2 client against DLB's real xDS server (h2 transport, real sockets)."""

from __future__ import annotations

import asyncio

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.route.v3 import route_pb2

from dlb.bench.xds_wire_client import WireClient
from dlb.xds import types
from dlb.xds.cache import SnapshotCache
from dlb.xds.server import XdsServer
from dlb.xds.snapshot import Snapshot
from dlb.xds.testing import eds_cluster, node, route_config


async def _until(cond, what: str, timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        assert loop.time() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def _updates_and_acks() -> None:
    cache = SnapshotCache(node_key=lambda _n: "bench")
    cache.set_snapshot("bench", Snapshot.build([route_config("r", weights={"a": 1, "b": 2})]))
    server = XdsServer(cache, transport="h2")
    port = await server.start()
    clients = [WireClient("127.0.0.1", port, node(f"bench-{i}", "bench"), types.ROUTE, ["r"], route_pb2.RouteConfiguration)
               for i in range(3)]
    tasks = [asyncio.create_task(c.run()) for c in clients]
    try:
        await _until(lambda: all(c.updates == 1 for c in clients), "the first update")
        first = clients[0].version
        v2 = cache.set_snapshot("bench", Snapshot.build([route_config("r", weights={"a": 5, "b": 1})]))
        await _until(lambda: all(c.version == v2 for c in clients), "the second update")
        assert v2 != first
        # The server only pushes v3 to a stream that ACKed v2 with v2's nonce: getting it proves the ACK's bytes.
        v3 = cache.set_snapshot("bench", Snapshot.build([route_config("r", weights={"a": 1, "b": 9})]))
        await _until(lambda: all(c.version == v3 and c.updates == 3 for c in clients), "the third update")
        assert all(c.reconnects == 0 for c in clients)
    finally:
        for c in clients:
            c.stop()
        await asyncio.gather(*tasks)
        await server.stop(None)


async def _large_responses() -> None:
    # 2,000 clusters are ~200 KB per response: over HTTP/2's 65,535-byte default windows, so the client's
    # SETTINGS and WINDOW_UPDATE must have opened them, and its ACKs must fit the server's windows.
    def build(tag: int) -> Snapshot:
        clusters = [eds_cluster(f"cluster-{i:05d}-{'x' * 40}") for i in range(2000)]
        clusters[0].connect_timeout.FromMilliseconds(1000 + tag)
        return Snapshot.build(clusters, extra_types=[types.CLUSTER])

    cache = SnapshotCache(node_key=lambda _n: "bench")
    cache.set_snapshot("bench", build(0))
    server = XdsServer(cache, transport="h2")
    port = await server.start()
    client = WireClient("127.0.0.1", port, node("bench-0", "bench"), types.CLUSTER, [], cluster_pb2.Cluster)
    task = asyncio.create_task(client.run())
    try:
        await _until(lambda: client.updates == 1, "the first update")
        for tag in (1, 2, 3):
            v = cache.set_snapshot("bench", build(tag))
            await _until(lambda v=v: client.version == v, f"update {tag}")
        assert client.reconnects == 0
    finally:
        client.stop()
        await task
        await server.stop(None)


def test_wire_client_receives_updates_and_its_acks_reach_the_server():
    asyncio.run(asyncio.wait_for(_updates_and_acks(), 60))


def test_wire_client_takes_responses_larger_than_the_default_window():
    asyncio.run(asyncio.wait_for(_large_responses(), 60))
