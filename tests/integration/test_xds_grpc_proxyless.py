"""A second, independent xDS client: grpcio's proxyless xDS (C-core) reads our control plane.

gRPC subscribes LDS/RDS/CDS/EDS *by name* (never wildcard) and skips weight-0 clusters, so this
checks the server answers named subsets of the snapshot at once, and that a route switch to a new cluster (add cluster, move route, remove the old
one) never fails an RPC on a client that keeps calling.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import grpc
from bounded_wait import until_in_loop
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from google.protobuf import any_pb2

from dlb.xds import Snapshot, SnapshotCache, XdsServer, types
from dlb.xds.testing import eds_cluster, load_assignment, route_config

# Calls xds:///echo every 20 ms; prints each reply or error code; exits after `want` is seen.
CLIENT = r"""
import sys, time, grpc
want = sys.argv[1]
ch = grpc.insecure_channel("xds:///echo")
ping = ch.unary_unary("/test.Echo/Ping")
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        reply = ping(b"hi", timeout=10, wait_for_ready=True).decode()
    except grpc.RpcError as e:
        reply = "ERR " + e.code().name
    print(reply, flush=True)
    if reply == want:
        break
    time.sleep(0.02)
"""


def api_listener(name: str, route: str) -> listener_pb2.Listener:
    hcm = hcm_pb2.HttpConnectionManager()
    hcm.rds.route_config_name = route
    hcm.rds.config_source.ads.SetInParent()
    router = any_pb2.Any()
    router.Pack(router_pb2.Router())
    hcm.http_filters.add(name="router", typed_config=router)
    lst = listener_pb2.Listener(name=name)
    lst.api_listener.api_listener.Pack(hcm)
    return lst


def endpoints(cluster: str, port: int):
    cla = load_assignment(cluster, [port])
    cla.endpoints[0].locality.zone = "z1"  # gRPC requires a locality with a non-zero weight
    cla.endpoints[0].load_balancing_weight.value = 1
    return cla


def snapshot(cluster: str, port: int, idle: tuple[str, int] | None = None) -> Snapshot:
    """The route sends everything to ``cluster``; ``idle`` adds a weight-0 cluster gRPC never asks for."""
    if idle is None:
        rc = route_config("echo-route", cluster=cluster)
        extra = []
    else:
        rc = route_config("echo-route", weights={cluster: 1, idle[0]: 0})
        extra = [eds_cluster(idle[0]), endpoints(*idle)]
    rc.virtual_hosts[0].domains[:] = ["echo"]
    return Snapshot.build([api_listener("echo", "echo-route"), rc, eds_cluster(cluster), endpoints(cluster, port), *extra])


async def _backend(reply: bytes) -> tuple[grpc.aio.Server, int]:
    async def ping(_req: bytes, _ctx) -> bytes:
        return reply

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "test.Echo", {"Ping": grpc.unary_unary_rpc_method_handler(ping)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


async def _scenario() -> None:
    b1, p1 = await _backend(b"one")
    b2, p2 = await _backend(b"two")
    cache = SnapshotCache()
    xds = XdsServer(cache)
    port = await xds.start()
    proc = None
    try:
        cache.set_snapshot("grpc-client", snapshot("echo-one", p1, idle=("echo-two", p2)))
        bootstrap = {"xds_servers": [{"server_uri": f"127.0.0.1:{port}", "channel_creds": [{"type": "insecure"}],
                                      "server_features": ["xds_v3"]}],
                     "node": {"id": "grpc-client", "cluster": "test"}}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CLIENT, "two", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
            env={**os.environ, "GRPC_XDS_BOOTSTRAP_CONFIG": json.dumps(bootstrap)})
        assert proc.stdout is not None
        first = (await proc.stdout.readline()).decode().strip()
        assert first == "one"
        # gRPC named the resources it wanted (no wildcard) and was answered. The client may send its
        # first RPC before its EDS ACK reaches us (it ACKs asynchronously): wait for the ACKs, bounded.
        status = xds.status.nodes["grpc-client"].types

        def acked() -> dict[str, str]:
            return {types.short(t): s.acked_version for t, s in status.items()}

        await until_in_loop(lambda: set(acked()) == {"LDS", "RDS", "CDS", "EDS"} and all(acked().values()), "every type ACKed",
                            timeout=30, period=0.01)
        # A subset of the snapshot's clusters (the weight-0 one is never requested), answered at once.
        assert status[types.CLUSTER].subscribed == ["echo-one"]
        assert status[types.LISTENER].subscribed == ["echo"]

        cache.set_snapshot("grpc-client", snapshot("echo-two", p2))  # new cluster, route moves, old goes
        replies = [first]
        while True:
            line = (await proc.stdout.readline()).decode().strip()
            assert line, f"client exited before reaching the new cluster: {replies[-5:]}"
            replies.append(line)
            if line == "two":
                break
        assert set(replies) == {"one", "two"}, f"RPCs failed during the switch: {sorted(set(replies))}"
        await proc.wait()
        cds = xds.status.nodes["grpc-client"].types[types.CLUSTER]
        assert cds.nacks == 0 and cds.acked_version == cache.get_snapshot("grpc-client").version
    finally:
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()
        await xds.stop(None)
        await b1.stop(None)
        await b2.stop(None)


def test_grpc_proxyless_client_reads_and_follows_a_route_switch():
    asyncio.run(asyncio.wait_for(_scenario(), 120))
