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


@pytest.mark.timeout(120)
def test_a_client_leaves_a_frozen_control_plane_for_another_replica_within_about_15_s(tmp_path) -> None:
    """A frozen replica (SIGSTOP: its kernel still accepts and ACKs) is noticed by the keepalive ping. gRPC
    times that ping out after ``grpc.http2.ping_timeout_ms``, 60 s by default whatever the keepalive timeout
    says: services took 61-92 s to re-home (measured 87 s with the old options, 10.5 s with these)."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time
    import urllib.request

    from envoy.config.cluster.v3 import cluster_pb2
    from envoy.config.core.v3 import base_pb2

    from dlb.procutil import free_port
    from dlb.xds import types

    cfg = tmp_path / "dlb.yaml"
    cfg.write_text(json.dumps({"version": 1, "cells": [{"name": "a", "leaf": {"address": "127.0.0.1:10010", "probe": "127.0.0.1:9010"},
                                                        "servers": ["127.0.0.1:8010"]}],
                               "endpoints": [{"name": "chat", "match": {"prefix": "/v1/"},
                                              "policy": {"mechanism": "discrete", "cost": "rif"}}]}))
    ports = [(free_port(), free_port()) for _ in range(2)]
    procs = [subprocess.Popen([sys.executable, "-m", "dlb.cli", "serve", "control-plane", "--config", str(cfg), "--no-probe",
                               "--xds", f"127.0.0.1:{x}", "--status", f"127.0.0.1:{s}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for x, s in ports]

    def serves(i: int) -> bool:  # replica i has the test's node on a stream
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ports[i][1]}/status", timeout=2) as r:
                return b"frozen-test" in r.read()
        except OSError:
            return False

    async def main() -> float:
        root_a = base_pb2.Node(id="frozen-test", cluster="dlb-root", locality=base_pb2.Locality(zone="a"))  # cell a's root
        client = XdsClient(",".join(f"127.0.0.1:{x}" for x, _ in ports), root_a)  # the default options
        client.subscribe(types.CLUSTER, cluster_pb2.Cluster, lambda resources: None)
        async with client:
            await until_in_loop(lambda: serves(0) or serves(1), "the client on a replica", timeout=30, period=0.25)
            home = 0 if serves(0) else 1
            os.kill(procs[home].pid, signal.SIGSTOP)
            t0, connects = time.monotonic(), client.connects
            try:
                await until_in_loop(lambda: client.connects > connects and serves(1 - home), "the client on the other replica",
                                    timeout=60, period=0.25)
            finally:
                os.kill(procs[home].pid, signal.SIGCONT)
            return time.monotonic() - t0

    try:
        took = asyncio.run(asyncio.wait_for(main(), 100))
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
    assert took < 25.0, f"re-homed {took:.1f} s after the freeze"
