"""A real Envoy (1.40) bootstrapped only from dlb.xds over ADS: dynamic LDS/CDS, RDS and EDS.

Checks that Envoy reports the pushed versions in /config_dump, serves traffic through the pushed
route, NACKs a cluster that parses but fails Envoy's validation (``update_rejected``), that the
server never re-sends the rejected content, and that Envoy then accepts a valid update.
"""

from __future__ import annotations

import asyncio
import functools
import http.server
import json
import threading
import urllib.error
import urllib.request

import pytest
from bounded_wait import until_in_loop

from dlb.procutil import free_port
from dlb.xds import Resource, Snapshot, SnapshotCache, XdsServer, types
from dlb.xds.testing import eds_cluster, grpc_source, http_listener, load_assignment, route_config

pytestmark = pytest.mark.envoy


class _Backend(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"backend-ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def bootstrap(admin_port: int, xds_port: int, node_id: str, api_type: str = "GRPC", use_ads: bool = True) -> dict:
    if use_ads:
        ads = {"ads": {}, "resource_api_version": "V3"}
    else:  # the per-type services (CDS, LDS, ... each on its own stream)
        ads = {"resource_api_version": "V3", "api_config_source": {
            "api_type": api_type, "transport_api_version": "V3", "grpc_services": [{"envoy_grpc": {"cluster_name": "xds"}}]}}

    return {
        "node": {"id": node_id, "cluster": "test"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "dynamic_resources": {
            "ads_config": {"api_type": api_type, "transport_api_version": "V3", "set_node_on_first_message_only": True,
                           "grpc_services": [{"envoy_grpc": {"cluster_name": "xds"}}]},
            "cds_config": ads, "lds_config": ads,
        },
        "static_resources": {"clusters": [{
            "name": "xds", "type": "STATIC", "connect_timeout": "1s",
            "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}}}},
            "load_assignment": {"cluster_name": "xds", "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
                "socket_address": {"address": "127.0.0.1", "port_value": xds_port}}}}]}]},
        }]},
    }


def cluster(name: str, connect_timeout_s: float = 1.0, src=None):
    c = eds_cluster(name, connect_timeout_s, source=src)
    c.eds_cluster_config.eds_config.initial_fetch_timeout.SetInParent()  # 0s: wait for EDS forever
    return c


def resources(backend_port: int, listener_port: int, extra_clusters=(), tag: str = "a", src=None) -> Snapshot:
    rc = route_config("local_route", cluster="backend")
    rc.response_headers_to_add.add().header.key = "x-config"
    rc.response_headers_to_add[0].header.value = tag
    return Snapshot.build([cluster("backend", src=src), load_assignment("backend", [backend_port]),
                           http_listener("http", listener_port, "local_route", source=src), rc, *extra_clusters])


@pytest.mark.parametrize(("api_type", "use_ads"), [("GRPC", True), ("DELTA_GRPC", True), ("GRPC", False)],
                         ids=["ads-sotw", "ads-delta", "per-type-sotw"])
def test_envoy_acks_nacks_and_never_gets_rejected_config_again(api_type: str, use_ads: bool, envoy):
    backend = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Backend)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    try:
        asyncio.run(asyncio.wait_for(_scenario(backend.server_address[1], api_type, use_ads, envoy), 120))
    finally:
        backend.shutdown()
        backend.server_close()


async def _scenario(backend_port: int, api_type: str, use_ads: bool, start_envoy) -> None:
    src = None if use_ads else grpc_source("xds")
    res = functools.partial(resources, src=src)
    clu = functools.partial(cluster, src=src)
    loop = asyncio.get_running_loop()
    run = lambda f, *a: loop.run_in_executor(None, f, *a)
    cache = SnapshotCache()
    server = XdsServer(cache)
    xds_port = await server.start()
    admin_port, listener_port = free_port(), free_port()
    v1 = cache.set_snapshot("envoy-1", res(backend_port, listener_port))
    try:
        async with start_envoy(bootstrap(admin_port, xds_port, "envoy-1", api_type, use_ads), name="bootstrap") as envoy:
            status = server.status

            def acked(type_url: str) -> str:
                ns = status.nodes.get("envoy-1")
                return ns.types[type_url].acked_version if ns and type_url in ns.types else ""

            async def all_acked(version: str) -> bool:
                return all(acked(t) == version for t in (types.CLUSTER, types.ENDPOINT, types.LISTENER, types.ROUTE))

            await until_in_loop(lambda: all_acked(v1), "Envoy to ACK every type at v1")

            def shown(version: str, type_url: str, name: str) -> str:
                """The version Envoy's config_dump shows: SotW the response version, delta the resource hash."""
                return version if api_type == "GRPC" else cache.get_snapshot("envoy-1").get(type_url)[name].version

            async def served() -> bool:
                try:
                    body = await run(lambda: urllib.request.urlopen(f"http://127.0.0.1:{listener_port}/", timeout=2).read())
                    return body == b"backend-ok"
                except OSError:
                    return False

            await until_in_loop(served, "traffic through the pushed listener/route/cluster")
            dump = json.loads(await run(envoy.admin_get, "/config_dump?resource=dynamic_active_clusters"))
            assert {c["cluster"]["name"]: c["version_info"] for c in dump["configs"]} == {"backend": shown(v1, types.CLUSTER, "backend")}
            dump = json.loads(await run(envoy.admin_get, "/config_dump?resource=dynamic_listeners"))
            assert [(c["name"], c["active_state"]["version_info"]) for c in dump["configs"]] == [("http", shown(v1, types.LISTENER, "http"))]

            # A cluster that parses but breaks Envoy's validation rules (connect_timeout must be > 0).
            bad = eds_cluster("bad", source=src)
            bad.connect_timeout.seconds = -1
            v2 = cache.set_snapshot("envoy-1", res(backend_port, listener_port, [bad]))
            await until_in_loop(lambda: _true(status.nodes["envoy-1"].types[types.CLUSTER].nacks == 1), "Envoy's NACK")
            cds = status.nodes["envoy-1"].types[types.CLUSTER]
            assert cds.last_nack_version == v2 and cds.acked_version == v1
            assert "positive duration" in cds.last_nack_reason  # Envoy's own reason, kept for operators
            stats = await run(envoy.stats, "cluster_manager.cds")
            assert stats["cluster_manager.cds.update_rejected"] == "1"
            cds_responses = cds.responses

            # A new snapshot with a new route but the same rejected cluster set: RDS goes out, CDS does not.
            v3 = cache.set_snapshot("envoy-1", res(backend_port, listener_port, [bad], tag="b"))
            await until_in_loop(lambda: _true(acked(types.ROUTE) == v3), "Envoy to ACK the new route")
            assert cds.responses == cds_responses
            stats = await run(envoy.stats, "cluster_manager.cds")
            assert stats["cluster_manager.cds.update_rejected"] == "1"
            dump = json.loads(await run(envoy.admin_get, "/config_dump?resource=dynamic_route_configs"))
            assert dump["configs"][0]["version_info"] == shown(v3, types.ROUTE, "local_route")

            # A valid update is accepted.
            v4 = cache.set_snapshot("envoy-1", res(backend_port, listener_port, [clu("good"), load_assignment("good", [backend_port])], tag="b"))
            await until_in_loop(lambda: _true(acked(types.CLUSTER) == v4), "Envoy to ACK the valid clusters")
            dump = json.loads(await run(envoy.admin_get, "/config_dump?resource=dynamic_warming_clusters"))
            dump_active = json.loads(await run(envoy.admin_get, "/config_dump?resource=dynamic_active_clusters"))
            names = {c["cluster"]["name"]: c["version_info"] for c in dump_active.get("configs", []) + dump.get("configs", [])}
            assert names == {"backend": shown(v1, types.CLUSTER, "backend"), "good": shown(v4, types.CLUSTER, "good")}
            assert (await run(envoy.stats, "cluster_manager.cds"))["cluster_manager.cds.update_rejected"] == "1"
            assert await served()

            # Changing an EDS cluster makes Envoy re-create (re-warm) it; the server re-sends its
            # endpoints right after the CDS response, so the cluster activates with the new version.
            changed = clu("backend", connect_timeout_s=2.0)
            items = res(backend_port, listener_port, [clu("good"), load_assignment("good", [backend_port])], tag="b")
            v5 = cache.set_snapshot("envoy-1", Snapshot.of({**items.resources, types.CLUSTER: {
                **items.get(types.CLUSTER), "backend": Resource.from_message(changed)}}))
            await until_in_loop(lambda: _true(acked(types.CLUSTER) == v5), "Envoy to ACK the changed cluster")

            async def active_backend_version() -> str:
                dump = json.loads(await run(envoy.admin_get, "/config_dump?resource=dynamic_active_clusters"))
                return {c["cluster"]["name"]: c["version_info"] for c in dump["configs"]}.get("backend", "")

            await until_in_loop(lambda: _eq(active_backend_version(), shown(v5, types.CLUSTER, "backend")),
                        "the changed cluster to become active")
            assert await served()
    finally:
        await server.stop(None)


async def _eq(coro, want) -> bool:
    return await coro == want


async def _true(value: bool) -> bool:
    return value


@pytest.mark.parametrize("api_type", ["GRPC", "DELTA_GRPC"], ids=["ads-sotw", "ads-delta"])
def test_routes_wait_for_new_clusters_to_warm(api_type: str, envoy):
    """Make-before-break with a real Envoy: a route to a new cluster is pushed only once the cluster
    is warm. The new cluster's endpoints are withheld at first, so the cluster stays warming; the
    route must not move (traffic keeps flowing through the old cluster) until they arrive."""
    backend = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Backend)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    try:
        asyncio.run(asyncio.wait_for(_warming_scenario(backend.server_address[1], api_type, envoy), 120))
    finally:
        backend.shutdown()
        backend.server_close()


async def _warming_scenario(backend_port: int, api_type: str, start_envoy) -> None:
    loop = asyncio.get_running_loop()
    run = lambda f, *a: loop.run_in_executor(None, f, *a)
    cache = SnapshotCache()
    server = XdsServer(cache)
    xds_port = await server.start()
    admin_port, listener_port = free_port(), free_port()
    listener = http_listener("http", listener_port, "local_route")

    def snapshot(route_to: str, clusters: dict[str, bool]) -> Snapshot:
        items = [listener, route_config("local_route", cluster=route_to)]
        for name, with_endpoints in clusters.items():
            items.append(cluster(name))
            if with_endpoints:
                items.append(load_assignment(name, [backend_port]))
        return Snapshot.build(items)

    v1 = cache.set_snapshot("envoy-1", snapshot("old", {"old": True}))
    try:
        async with start_envoy(bootstrap(admin_port, xds_port, "envoy-1", api_type), name="bootstrap") as envoy:

            async def route_cluster() -> str:
                dump = json.loads(await run(envoy.admin_get, "/config_dump?resource=dynamic_route_configs"))
                configs = dump.get("configs", [])
                return configs[0]["route_config"]["virtual_hosts"][0]["routes"][0]["route"]["cluster"] if configs else ""

            async def warming() -> list[str]:
                dump = json.loads(await run(envoy.admin_get, "/config_dump?resource=dynamic_warming_clusters"))
                return [c["cluster"]["name"] for c in dump.get("configs", [])]

            async def status_code() -> int:
                try:
                    with await run(lambda: urllib.request.urlopen(f"http://127.0.0.1:{listener_port}/", timeout=2)) as r:
                        return r.status
                except urllib.error.HTTPError as e:
                    return e.code
                except OSError:
                    return 0

            await until_in_loop(lambda: _eq(route_cluster(), "old"), "the initial route")
            await until_in_loop(lambda: _eq(status_code(), 200), "traffic through the old cluster")
            # New cluster without endpoints yet + route moved to it, in one snapshot.
            cache.set_snapshot("envoy-1", snapshot("new", {"old": True, "new": False}))
            await until_in_loop(lambda: _eq(warming(), ["new"]), "the new cluster warming")
            assert await route_cluster() == "old"  # the route waits for the warm cluster
            assert await status_code() == 200
            cds = server.status.nodes["envoy-1"].types[types.CLUSTER]
            assert cds.acked_version == v1  # Envoy holds the CDS ACK until the cluster is warm
            # Endpoints arrive: the cluster warms, Envoy ACKs CDS, the route moves, "old" goes.
            v3 = cache.set_snapshot("envoy-1", snapshot("new", {"new": True}))
            await until_in_loop(lambda: _eq(route_cluster(), "new"), "the route to the new cluster")
            await until_in_loop(lambda: _true(cds.acked_version == v3), "the final CDS without the old cluster")
            assert await status_code() == 200
    finally:
        await server.stop(None)
