"""dlb.xds.client against dlb.xds.server: updates, NACK on validation errors, reconnect with last good."""

from __future__ import annotations

import asyncio

import pytest
from bounded_wait import until_in_loop
from google.protobuf import struct_pb2

from dlb.xds import Snapshot, SnapshotCache, XdsServer
from dlb.xds.client import Backoff, ResourceValidationError, XdsClient
from dlb.xds.testing import node

POLICY = "type.googleapis.com/google.protobuf.Struct"


def struct(**fields) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(fields)
    return s


def policies(**gains: float) -> Snapshot:
    return Snapshot.from_types({POLICY: [(name, struct(gain=g)) for name, g in gains.items()]})


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
def test_updates_nack_and_reconnect_keep_last_good(delta: bool):
    async def main():
        cache = SnapshotCache()
        server = XdsServer(cache)
        port = await server.start()
        v1 = cache.set_snapshot("root-1", policies(a=1.0, b=2.0))
        seen: list[dict[str, float]] = []

        def on_update(resources) -> None:
            gains = {n: m["gain"] for n, m in resources.items()}
            if any(g < 0 for g in gains.values()):
                raise ResourceValidationError(f"negative gain in {sorted(n for n, g in gains.items() if g < 0)}")
            seen.append(gains)

        client = XdsClient(f"127.0.0.1:{port}", node("root-1", "cellA"), backoff=Backoff(initial=0.05, maximum=0.2),
                           delta=delta)
        sub = client.subscribe(POLICY, struct_pb2.Struct, on_update)  # wildcard
        server2 = None
        async with client:
            await until_in_loop(lambda: server.status.nodes.get("root-1") and
                        server.status.nodes["root-1"].types[POLICY].acked_version == v1, "ACK of v1")
            assert seen == [{"a": 1.0, "b": 2.0}] and sub.version == v1

            v2 = cache.set_snapshot("root-1", policies(a=1.0, b=-1.0))  # the callback rejects it
            await until_in_loop(lambda: server.status.nodes["root-1"].types[POLICY].nacks == 1, "NACK of v2")
            st = server.status.nodes["root-1"].types[POLICY]
            assert st.last_nack_version == v2 and st.acked_version == v1 and "negative gain in ['b']" in st.last_nack_reason
            assert {n: m["gain"] for n, m in client.resources(POLICY).items()} == {"a": 1.0, "b": 2.0}

            v3 = cache.set_snapshot("root-1", policies(a=3.0))
            await until_in_loop(lambda: sub.version == v3, "v3 accepted")
            assert seen[-1] == {"a": 3.0}

            # Control plane restart: a new process (new boot id) on the same port.
            await server.stop(None)
            await until_in_loop(lambda: not client.connected.is_set(), "the client to notice the outage")
            assert {n: m["gain"] for n, m in client.resources(POLICY).items()} == {"a": 3.0}  # last good kept
            cache2 = SnapshotCache()
            v4 = cache2.set_snapshot("root-1", policies(a=4.0, c=5.0))
            server2 = XdsServer(cache2)
            await server2.start(f"127.0.0.1:{port}")
            await until_in_loop(lambda: sub.version == v4, "resubscription after reconnect")
            assert seen[-1] == {"a": 4.0, "c": 5.0} and client.connects >= 2

            # Named subscription change at runtime.
            await client.set_names(POLICY, ["c"])
            assert list(client.resources(POLICY)) == ["c"] and seen[-1] == {"c": 5.0}
            v5 = cache2.set_snapshot("root-1", policies(a=4.0, c=6.0))
            await until_in_loop(lambda: sub.version == v5, "update of the remaining name")
            assert seen[-1] == {"c": 6.0}
        await server.stop(None)
        if server2 is not None:
            await server2.stop(None)

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_client_finds_a_restarted_control_plane_within_about_a_second():
    """Both back-offs (the client loop's and gRPC's channel reconnect) are capped at 1 s: after a 4-s
    outage the default client is back within ~1 s of the new server (uncapped: up to 5 s + gRPC's own)."""

    async def main() -> float:
        cache = SnapshotCache()
        server = XdsServer(cache)
        port = await server.start()
        v1 = cache.set_snapshot("root-1", policies(a=1.0))
        client = XdsClient(f"127.0.0.1:{port}", node("root-1", "cellA"))  # default back-offs
        sub = client.subscribe(POLICY, struct_pb2.Struct, lambda resources: None)
        server2 = None
        async with client:
            await until_in_loop(lambda: sub.version == v1, "v1")
            await server.stop(None)
            await until_in_loop(lambda: not client.connected.is_set(), "the client to notice the outage")
            await asyncio.sleep(4.0)  # long enough for an uncapped back-off to grow past 1 s
            cache2 = SnapshotCache()
            v2 = cache2.set_snapshot("root-1", policies(a=2.0))
            server2 = XdsServer(cache2)
            await server2.start(f"127.0.0.1:{port}")
            t0 = asyncio.get_running_loop().time()
            await until_in_loop(lambda: sub.version == v2, "reconnect to the restarted server", timeout=10)
            took = asyncio.get_running_loop().time() - t0
        if server2 is not None:
            await server2.stop(None)
        return took

    took = asyncio.run(asyncio.wait_for(main(), 60))
    assert took < 2.0, f"reconnected {took:.2f} s after the restart"
