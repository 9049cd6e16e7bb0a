"""A real Envoy that knows only the control plane's address, driven by the DLB config.

The root Envoy of cell ``a`` is bootstrapped by ``dlb.envoy.ads_bootstrap.ads_bootstrap``; every listener,
route, cluster and endpoint comes from ``dlb.control_plane.service.ControlPlane``. Stand-in "leaf"
servers answer with their cell's name, so the traffic split is measured per cell. The root ext_proc
address has nothing listening: with ``failure_mode_allow`` the request keeps its fail-open route, the
``weighted_clusters`` the control plane computes — the path flow endpoints take natively.

Sequence (each step checked in Envoy's admin): initial version served; flow weights changed and
followed within a stated tolerance; a new cell added; a cell removed; a route Envoy rejects (NACK,
never re-sent, ``update_rejected`` only for it); a valid version accepted again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from bounded_wait import until_async as wait_for
from service_fixtures import CellPorts
from service_fixtures import split as traffic_split

from dlb.config import load_config
from dlb.config.model import HostPort
from dlb.control_plane.service import ControlPlane, root_key
from dlb.envoy.ads_bootstrap import ads_bootstrap
from dlb.envoy.binary import EnvoyProcess
from dlb.envoy.root_token import token_secret
from dlb.procutil import free_port
from dlb.xds import types
from dlb.xds.snapshot import Resource, Snapshot

pytestmark = pytest.mark.envoy

#: Share tolerance for N = 800 requests: 4σ of a binomial at p = 0.5 is 0.071; we allow 0.08.
N_REQUESTS = 800
TOLERANCE = 0.08


def write_config(make_config: Callable[..., Path], cells: dict[str, int], root_port: int, ext_proc_port: int) -> Path:
    """Cells with stand-in leaves on ``cells``' ports (their servers unused: the stand-in answers itself), root in a."""
    names = list(cells)
    return make_config({n: CellPorts(leaf=port) for n, port in cells.items()},
                       [{"name": "gen", "match": {"prefix": "/"}, "policy": {"mechanism": "flow", "cost": "latency"}}],
                       roots={"a": {"address": root_port, "ext_proc": ext_proc_port}},
                       network={"one_way_ms": {names[0]: dict.fromkeys(names[1:], 10)}, "default_one_way_ms": 10})


async def split(port: int, n: int = N_REQUESTS) -> dict[str, float]:
    return await traffic_split(port, n)


def dump_versions(envoy: EnvoyProcess) -> dict[str, str]:
    dump = json.loads(envoy.admin_get("/config_dump"))
    out = {}
    for cfg in dump["configs"]:
        t = cfg["@type"].rsplit(".", 1)[-1]
        if t == "RoutesConfigDump":
            out["RDS"] = [r["version_info"] for r in cfg.get("dynamic_route_configs", [])]
        elif t == "ClustersConfigDump":
            out["CDS"] = cfg.get("version_info", "")
            out["clusters"] = sorted(c["cluster"]["name"] for c in cfg.get("dynamic_active_clusters", []))
        elif t == "ListenersConfigDump":
            out["LDS"] = cfg.get("version_info", "")
    return out


def set_weights(cp: ControlPlane, x: list[float]) -> str:
    """Put the flow controller's vector for (gen, a) — what its flow step would produce — and push."""
    assert cp.flow is not None
    cp.flow.routers[("gen", 0)].x = np.array(x)
    return cp.rebuild()[root_key("a")]


def rejected(envoy: EnvoyProcess) -> int:
    return sum(int(v) for k, v in envoy.stats("rds").items() if k.endswith("update_rejected"))


def test_envoy_follows_the_control_plane(make_config, control_plane, envoy, leaves) -> None:
    asyncio.run(_scenario(make_config, control_plane, envoy, leaves))


async def _scenario(make_config, control_plane, start_envoy, leaves) -> None:
    ports = {"a": free_port(), "b": free_port(), "c": free_port()}
    root_port, ext_proc_port, admin_port = free_port(), free_port(), free_port()
    cfg_path = write_config(make_config, {"a": ports["a"], "b": ports["b"]}, root_port, ext_proc_port)
    cfg = load_config(cfg_path)
    async with leaves(ports), control_plane(cfg) as running:
        cp, status_port = running.cp, running.status_port
        boot = ads_bootstrap("root", "a", HostPort("127.0.0.1", running.xds_port), admin_port, node_id="root-a-test",
                             token=token_secret(cfg))
        async with start_envoy(boot, name="root") as envoy:
            await _follows(cp, envoy, make_config, ports, root_port, ext_proc_port, status_port)


async def _follows(cp: ControlPlane, envoy: EnvoyProcess, make_config, ports: dict[str, int], root_port: int, ext_proc_port: int,
                   status_port: int) -> None:
    """The scenario proper, once the stand-in leaves, the control plane and the root Envoy run."""
    v1 = cp.cache.get_snapshot(root_key("a")).version
    await wait_for(lambda: dump_versions(envoy).get("RDS") == [v1], what="initial RDS version")
    got = dump_versions(envoy)
    assert got["CDS"] == v1 and got["LDS"] == v1
    # Its one endpoint is flow without affinity, which runs natively (weighted_clusters): a root whose every
    # endpoint runs natively gets no ext_proc filter and no ext_proc cluster at all (issue 11, root-native).
    # Each cell, and each with its fallback (the route retries there once).
    assert got["clusters"] == ["cell-a", "cell-a.or.b", "cell-b", "cell-b.or.a"]
    share = await split(root_port)
    assert set(share) == {"a", "b"}  # Rand's start: by replicas (1:1)
    assert abs(share["a"] - 0.5) < TOLERANCE

    # Weights changed: Envoy follows; measure the push-to-applied time through the admin API.
    t0 = time.monotonic()
    v2 = set_weights(cp, [0.8, 0.2])
    await wait_for(lambda: dump_versions(envoy).get("RDS") == [v2], what="weights version")
    applied_ms = (time.monotonic() - t0) * 1000
    share = await split(root_port)
    assert abs(share["a"] - 0.8) < TOLERANCE and abs(share["b"] - 0.2) < TOLERANCE, share
    print(f"weight change applied by Envoy after {applied_ms:.1f} ms")
    # Unchanged state: no new version, nothing pushed.
    assert cp.rebuild()[root_key("a")] == v2

    # A new cell: clusters first (make-before-break), then routes that use it.
    cp.reload(load_config(write_config(make_config, ports, root_port, ext_proc_port)))
    v3 = set_weights(cp, [0.4, 0.3, 0.3])
    await wait_for(lambda: dump_versions(envoy).get("RDS") == [v3], what="3-cell version")
    assert _cells(dump_versions(envoy)["clusters"]) == ["cell-a", "cell-b", "cell-c"]
    share = await split(root_port)
    assert set(share) == {"a", "b", "c"} and abs(share["c"] - 0.3) < TOLERANCE, share

    # A cell removed: routes stop naming it and its cluster goes.
    cp.reload(load_config(write_config(make_config, {"a": ports["a"], "c": ports["c"]}, root_port, ext_proc_port)))
    v4 = set_weights(cp, [0.5, 0.5])
    await wait_for(lambda: dump_versions(envoy).get("CDS") == v4 and dump_versions(envoy).get("RDS") == [v4], what="cell removal")
    assert dump_versions(envoy)["clusters"] == ["cell-a", "cell-a.or.c", "cell-c", "cell-c.or.a"]
    share = await split(root_port, 200)
    assert set(share) == {"a", "c"}, share
    assert rejected(envoy) == 0  # every valid version accepted

    # An invalid route (a regex Envoy cannot compile): NACKed, never re-sent, old config kept.
    snap = cp.cache.get_snapshot(root_key("a"))
    route = [r for r in snap.get(types.ROUTE).values()][0]
    from envoy.config.route.v3 import route_pb2
    from google.protobuf import any_pb2

    rc = route_pb2.RouteConfiguration()
    any_pb2.Any.FromString(route.any_bytes).Unpack(rc)
    rc.virtual_hosts[0].routes[0].match.ClearField("prefix")
    rc.virtual_hosts[0].routes[0].match.safe_regex.regex = "(unclosed"
    bad = {t: dict(rs) for t, rs in snap.resources.items()}
    bad[types.ROUTE] = {rc.name: Resource.from_message(rc)}
    v_bad = cp.cache.set_snapshot(root_key("a"), Snapshot.of(bad))
    rds = cp.server.status.nodes["root-a-test"].types[types.ROUTE]
    # Envoy counts the rejection before its NACK reaches the server: wait for both.
    await wait_for(lambda: rejected(envoy) == 1 and rds.nacks == 1, what="Envoy NACK")
    assert rds.nacks == 1 and rds.last_nack_version == v_bad and "(unclosed" in rds.last_nack_reason
    assert rds.acked_version == v4
    await asyncio.sleep(1.0)
    assert rejected(envoy) == 1  # not re-sent
    assert dump_versions(envoy).get("RDS") == [v4]
    share = await split(root_port, 100)
    assert set(share) == {"a", "c"}  # still served by the last good config

    # A valid version again is accepted.
    v5 = set_weights(cp, [0.9, 0.1])
    assert v5 != v_bad
    await wait_for(lambda: dump_versions(envoy).get("RDS") == [v5], what="recovery version")
    assert rejected(envoy) == 1
    status = json.loads(await asyncio.to_thread(lambda: __import__("urllib.request").request.urlopen(
        f"http://127.0.0.1:{status_port}/status", timeout=5).read()))
    assert status["nodes"]["root-a-test"]["types"]["RDS"]["acked_version"] == v5


def test_flow_loop_weights_reach_envoy(make_config, control_plane, envoy, leaves) -> None:
    """Weights computed by the control plane's own flow loop from probes shift Envoy's traffic."""
    asyncio.run(_flow_loop_scenario(make_config, control_plane, envoy, leaves))


async def _flow_loop_scenario(make_config, control_plane, start_envoy, leaves) -> None:
    from leaf_stub import StaticProbe, serve_probe

    ports = {"a": free_port(), "b": free_port()}
    root_port, ext_proc_port, admin_port = free_port(), free_port(), free_port()
    cfg = load_config(write_config(make_config, ports, root_port, ext_proc_port))
    probes = {"a": StaticProbe("a", rif=40.0), "b": StaticProbe("b", rif=0.0)}  # a is overloaded
    async with leaves(ports):
        servers = [await serve_probe(probes[c.name], str(c.leaf.probe)) for c in cfg.cells]
        try:
            async with control_plane(cfg, probe=True, flow_loop=True) as running:
                boot = ads_bootstrap("root", "a", HostPort("127.0.0.1", running.xds_port), admin_port, node_id="root-a-flow",
                                     token=token_secret(cfg))
                async with start_envoy(boot, name="root") as envoy:
                    await _flow_weights_reach(running.cp, envoy, root_port)
        finally:
            for s in servers:
                await s.stop(None)


def _cells(clusters: list[str]) -> list[str]:
    """The cell clusters, once every aggregate (``cell-a.or.b``) is checked to name two of them."""
    cells = [c for c in clusters if ".or." not in c]
    assert all({a, "cell-" + b} <= set(cells) for a, _, b in (c.partition(".or.") for c in clusters if ".or." in c)), clusters
    return cells


def _by_cell(clusters: list[dict]) -> dict[str, int]:
    """A native flow route's weights by cell: each entry is a cell's aggregate with its fallback (``cell-a.or.b``)."""
    return {c["name"].split(".or.")[0]: c["weight"] for c in clusters}


async def _flow_weights_reach(cp: ControlPlane, envoy: EnvoyProcess, root_port: int) -> None:
    """The flow scenario proper: the control plane's weights move toward the idle cell, in Envoy and in traffic."""
    def b_share_in_config() -> float:
        dump = json.loads(envoy.admin_get("/config_dump?resource=dynamic_route_configs"))
        for cfg_ in dump["configs"]:
            for r in cfg_["route_config"]["virtual_hosts"][0]["routes"]:
                if r["name"] == "gen-fallback":
                    w = _by_cell(r["route"]["weighted_clusters"]["clusters"])
                    return w.get("cell-b", 0) / sum(w.values())
        return 0.0

    # Starting split is 1:1; the flow loop must move traffic to the idle cell b. The stand-in leaves'
    # state does not respond to the traffic, so the controller keeps moving at its (deliberately
    # conservative, see dlb.core.flow) rate; we wait for a clear shift, not convergence.
    await wait_for(lambda: b_share_in_config() > 0.65, timeout=60, what="flow weights toward the idle cell")
    share = await split(root_port, 400)
    assert share.get("b", 0) > 0.57, share  # ≥ 0.65 configured, minus 4σ of 400 samples
    x = cp.flow.weights()["gen"][0]
    assert x[1] > 0.65 and abs(x.sum() - 1) < 1e-9


def test_envoy_push_bench_smoke() -> None:
    """CI-sized run of ``dlb bench envoy-push``: both protocols deliver every change to Envoy."""
    from dlb.bench.envoy_push import measure

    for delta in (False, True):
        rec = asyncio.run(measure(rounds=3, cells=2, delta=delta))
        assert rec["rounds"] == 3 and 0 < rec["p50_ms"] <= rec["max_ms"] < 10_000


def test_two_root_envoys_converge_to_the_in_process_split(make_config, control_plane, envoy, leaves) -> None:
    """One control plane, two root Envoys (cells a and b): each Envoy's native ``weighted_clusters``
    converge to the split an in-process :class:`RootRouter` of that cell computes from the same probes."""
    asyncio.run(_two_roots_scenario(make_config, control_plane, envoy, leaves))


async def _two_roots_scenario(make_config, control_plane, start_envoy, leaves) -> None:
    from leaf_stub import StaticProbe, serve_probe

    from dlb.core.latency_model import LatencyParams
    from dlb.core.router import RootRouter

    names = ("a", "b", "c")
    ports = {n: free_port() for n in names}
    roots = {n: (free_port(), free_port(), free_port()) for n in ("a", "b")}  # listener, ext_proc, admin
    cfg = load_config(make_config(
        {n: CellPorts(leaf=ports[n]) for n in names},
        [{"name": "gen", "match": {"prefix": "/"}, "policy": {"mechanism": "flow", "cost": "latency"}}],
        roots={n: {"address": listen, "ext_proc": ext} for n, (listen, ext, _admin) in roots.items()},
        # a is far from c, b is near it: the two sources' best cells differ.
        network={"one_way_ms": {"a": {"b": 10, "c": 100}, "b": {"c": 10}}}))
    probes = {"a": StaticProbe("a", rif=6.0), "b": StaticProbe("b", rif=6.0), "c": StaticProbe("c", rif=0.0)}

    # The in-process reference: the router a root service in that cell would run, fed the stubs'
    # answers (the same model and RIF) every flow period until it stops moving.
    policy = cfg.endpoints[0].policy.to_core(cfg.probe)
    model = LatencyParams(0.5, 0.05, 4.0, 1.0)  # what StaticProbe reports
    reference = {}
    for n in roots:
        r = RootRouter(cfg.topology(), names.index(n), policy, cfg.endpoints[0].latency_prior.to_core())
        for k in range(600):
            now = 0.2 * k
            for j, c in enumerate(names):
                r.on_probe(j, now, probes[c].rif, model, replicas=1.0)
            r.tick(now)
        reference[n] = r.x.copy()
    assert reference["a"].argmax() == 0 and reference["b"].argmax() == 2  # a non-trivial, per-source answer

    def configured(envoy: EnvoyProcess) -> np.ndarray:
        dump = json.loads(envoy.admin_get("/config_dump?resource=dynamic_route_configs"))
        for cfg_ in dump["configs"]:
            for route in cfg_["route_config"]["virtual_hosts"][0]["routes"]:
                if route["name"] == "gen-fallback":
                    w = _by_cell(route["route"]["weighted_clusters"]["clusters"])
                    v = np.array([w.get(f"cell-{c}", 0) for c in names], float)
                    return v / v.sum()
        return np.zeros(len(names))

    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(leaves(ports))
        servers = [await serve_probe(probes[c.name], str(c.leaf.probe)) for c in cfg.cells]
        stack.push_async_callback(_stop_all, servers)
        running = await stack.enter_async_context(control_plane(cfg, probe=True, flow_loop=True))
        cp = running.cp
        envoys = {}
        for n, (_listen, _ext, admin) in roots.items():
            boot = ads_bootstrap("root", n, HostPort("127.0.0.1", running.xds_port), admin, node_id=f"root-{n}-two",
                                 token=token_secret(cfg))
            envoys[n] = await stack.enter_async_context(start_envoy(boot, name=f"root-{n}"))
        for n, e in envoys.items():
            await wait_for(lambda e=e, n=n: np.abs(configured(e) - reference[n]).max() < 0.01, timeout=90,
                           what=f"root {n}'s Envoy at the in-process split {reference[n]}")
        for n in roots:  # the control plane's own router agrees too, and traffic follows the weights
            np.testing.assert_allclose(cp.flow.weights()["gen"][names.index(n)], reference[n], atol=0.01)
            share = await split(roots[n][0], 200)
            best = names[int(reference[n].argmax())]
            assert share.get(best, 0) > 0.9, (n, share)


async def _stop_all(servers: list) -> None:
    for s in servers:
        await s.stop(None)
