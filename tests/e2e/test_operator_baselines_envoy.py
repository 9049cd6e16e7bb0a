"""The operator baselines (DESIGN §3) on a real root Envoy configured only by the control plane.

Each test names the behaviour that tells the baseline apart from Rand's replica split, so a baseline
that silently fell back to the weights (or to a DLB decision) fails:

- ``lr-global``: one slow cell holds its requests longer, so Envoy's least-request sends it far less
  than its replica share;
- ``locality-failover``: everything stays in the source cell while it is healthy (Rand would spread
  by replicas); when the source cell's leaf dies, traffic spills to the *nearest* other cell only;
- ``hub-score``: all traffic goes to the cell the probed queue and KV signals score best, and moves
  when the signals swap.

The root Envoy has no ext_proc filter at all (checked in its config dump): no DLB code is on the path.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from bounded_wait import until_async as wait_for
from service_fixtures import CellPorts, config_doc, split, start_leaf, write_config

from dlb.config import load_config
from dlb.config.model import HostPort
from dlb.envoy.ads_bootstrap import ads_bootstrap
from dlb.envoy.binary import EnvoyProcess
from dlb.envoy.root_token import token_secret
from dlb.procutil import free_port

pytestmark = pytest.mark.envoy

ENDPOINT = [{"name": "gen", "match": {"prefix": "/"}, "policy": {"mechanism": "flow", "cost": "latency"}}]
NETWORK: dict = {"one_way_ms": {"a": {"b": 10, "c": 30}}}


def config(tmp_path: Path, baseline: str, servers: dict[str, int], root_port: int) -> tuple[Path, dict[str, CellPorts]]:
    ports = {c: CellPorts() for c in servers}
    network = {"one_way_ms": {"a": {k: v for k, v in NETWORK["one_way_ms"]["a"].items() if k in servers}}, "default_one_way_ms": 40}
    doc = config_doc(ports, ENDPOINT, roots={"a": {"address": root_port}}, network=network,
                     policy={"apiVersion": "dlb.v1", "plugins": [{"type": baseline}]})
    for cell in doc["cells"]:
        cell["servers"] = [f"127.0.0.1:{free_port()}" for _ in range(servers[cell["name"]])]
    return write_config(tmp_path / "dlb.yaml", doc), ports


def no_ext_proc(envoy: EnvoyProcess) -> None:
    dump = envoy.admin_get("/config_dump?resource=dynamic_listeners")
    assert "ext_proc" not in dump, "the root Envoy of an operator baseline must have no ext_proc filter"


async def _root(control_plane, start_envoy, cfg_path: Path, root_port: int, body) -> None:
    cfg = load_config(cfg_path)
    async with control_plane(cfg, probe=True) as running:
        boot = ads_bootstrap("root", "a", HostPort("127.0.0.1", running.xds_port), free_port(), node_id="root-a-op",
                             token=token_secret(cfg))
        async with start_envoy(boot, name="root") as envoy:
            await wait_for(lambda: _serves(envoy), timeout=30, what="the root Envoy's listener from the control plane")
            no_ext_proc(envoy)
            await body(envoy, running.cp)


def _serves(envoy: EnvoyProcess) -> bool:
    dump = json.loads(envoy.admin_get("/config_dump?resource=dynamic_listeners"))
    return bool(dump.get("configs"))


def test_lr_global_sends_less_to_the_cell_that_holds_requests(tmp_path, control_plane, envoy) -> None:
    root_port = free_port()
    cfg_path, ports = config(tmp_path, "lr-global", {"a": 1, "b": 3, "c": 2}, root_port)

    async def main() -> None:
        runners = [await start_leaf("a", ports["a"].leaf), await start_leaf("b", ports["b"].leaf, delay_s=0.3),
                   await start_leaf("c", ports["c"].leaf)]
        try:
            async def body(proxy: EnvoyProcess, _cp) -> None:
                dump = proxy.admin_get("/config_dump?resource=dynamic_active_clusters")
                assert "dlb-operator-pool" in dump and "LEAST_REQUEST" in dump
                await wait_for(lambda: _pool_hosts(proxy) == 3, timeout=30, what="the pool's three cells")
                share = await split(root_port, 600)
                # Rand (or any fixed split by replicas) would give b 3/6; least-request sees b's requests
                # stay active 0.3 s while the others answer at once, and sends it a small fraction.
                assert share.get("b", 0) < 0.25, share
                assert share.get("a", 0) > 0.15 and share.get("c", 0) > 0.3, share
                assert sum(v for k, v in share.items() if k.startswith("status")) == 0, share

            await _root(control_plane, envoy, cfg_path, root_port, body)
        finally:
            for r in runners:
                await r.cleanup()

    asyncio.run(main())


def _pool_hosts(proxy: EnvoyProcess) -> int:
    """Hosts Envoy has in the pool cluster (``/clusters`` lines ``dlb-operator-pool::<host>::<stat>::<value>``)."""
    lines = proxy.admin_get("/clusters").splitlines()
    return len({line.split("::")[1] for line in lines if line.startswith("dlb-operator-pool::") and "::cx_active::" in line})


def test_locality_failover_stays_home_then_spills_to_the_nearest_cell(tmp_path, control_plane, envoy) -> None:
    root_port = free_port()
    cfg_path, ports = config(tmp_path, "locality-failover", {"a": 1, "b": 2, "c": 4}, root_port)

    async def main() -> None:
        runners = {c: await start_leaf(c, ports[c].leaf) for c in ("a", "b", "c")}
        try:
            async def body(proxy: EnvoyProcess, _cp) -> None:
                await wait_for(lambda: _pool_hosts(proxy) == 3, timeout=30, what="the pool's three cells")
                share = await split(root_port, 300)
                assert share == {"a": 1.0}, share  # Rand would send a only 1/7
                await runners.pop("a").cleanup()  # the source cell's leaf dies
                await asyncio.sleep(3.5)  # 2 failed checks at 1 s (plus outlier ejection on the failures)
                share = await split(root_port, 300)
                # Spill-over goes to priority 1, the nearest other cell (b at 10 ms), not c (30 ms, more servers).
                assert share.get("b", 0) > 0.97 and share.get("c", 0) == 0, share

            await _root(control_plane, envoy, cfg_path, root_port, body)
        finally:
            for r in runners.values():
                await r.cleanup()

    asyncio.run(main())


def test_hub_score_follows_the_probed_queue_and_kv_signals(tmp_path, control_plane, envoy) -> None:
    from leaf_stub import StaticProbe, serve_probe

    root_port = free_port()
    cfg_path, ports = config(tmp_path, "hub-score", {"a": 1, "b": 1}, root_port)
    cfg = load_config(cfg_path)
    probes = {"a": StaticProbe("a", rif=10.0, waiting=8.0, kv_usage=0.9), "b": StaticProbe("b", rif=0.0, waiting=0.0, kv_usage=0.1)}

    async def main() -> None:
        runners = [await start_leaf(c, ports[c].leaf) for c in ("a", "b")]
        servers = [await serve_probe(probes[c.name], str(c.leaf.probe)) for c in cfg.cells]
        try:
            async def body(proxy: EnvoyProcess, cp) -> None:
                await wait_for(lambda: cp.hub.best() == {0: 1}, timeout=10, what="hub-score picking b")
                await wait_for(lambda: _fallback_cells(proxy) == ["cell-b"], timeout=10, what="Envoy's route all on b")
                share = await split(root_port, 200)
                assert share == {"b": 1.0}, share  # Rand would split 1:1; a is the nearer cell
                probes["a"].waiting, probes["a"].kv_usage = 0.0, 0.1
                probes["b"].waiting, probes["b"].kv_usage = 8.0, 0.9
                await wait_for(lambda: _fallback_cells(proxy) == ["cell-a"], timeout=10, what="Envoy's route moving to a")
                share = await split(root_port, 200)
                assert share == {"a": 1.0}, share

            await _root(control_plane, envoy, cfg_path, root_port, body)
        finally:
            for s in servers:
                await s.stop(None)
            for r in runners:
                await r.cleanup()

    asyncio.run(main())


def _fallback_cells(proxy: EnvoyProcess) -> list[str]:
    dump = json.loads(proxy.admin_get("/config_dump?resource=dynamic_route_configs"))
    for cfg_ in dump["configs"]:
        for r in cfg_["route_config"]["virtual_hosts"][0]["routes"]:
            if r["name"] == "gen-fallback":
                return sorted(c["name"] for c in r["route"]["weighted_clusters"]["clusters"] if c.get("weight", 0) > 0)
    return []
