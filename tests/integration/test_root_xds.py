"""The root service configured over xDS by a real control plane, hot-reloaded without dropping requests.

Real parts: ``ControlPlane`` (gRPC xDS server), the service's ``XdsClient`` (ADS, SotW and delta), the
probe client against stand-in leaves (real gRPC Probe servers). Decisions are taken through
``RootService.decide`` — the same call the ext_proc stream makes for each request's headers.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import yaml
from bounded_wait import until_in_loop
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from leaf_stub import StaticProbe, serve_probe
from service_fixtures import CellPorts

from dlb.config import load_config
from dlb.config import resources as dr
from dlb.config.model import CELL_CLUSTER_PREFIX
from dlb.control_plane.service import ControlPlane, root_key
from dlb.core.costs import Cost
from dlb.ext_proc.protocol import CONTINUE
from dlb.ext_proc.root import RootService
from dlb.ext_proc.root_xds import ProbeManager, RootXdsSync
from dlb.probe.client import ProbeTiming
from dlb.procutil import free_port
from dlb.xds.snapshot import Resource, Snapshot


def write_config(make_config, cells: dict[str, int], cost: str = "latency") -> Path:
    """Cells whose probe servers listen on ``cells``' ports, the root in a; written to the test's dlb.yaml."""
    return make_config({n: CellPorts(probe=port) for n, port in cells.items()}, [
        {"name": "chat", "match": {"prefix": "/v1/chat/"}, "policy": {"mechanism": "discrete", "cost": cost}},
        {"name": "rest", "match": {"prefix": "/"}, "policy": {"mechanism": "discrete", "cost": "rif"}},
    ], probe={"period_ms": 20})


def headers(path: str) -> list:
    return [base_pb2.HeaderValue(key=":path", raw_value=path.encode())]


def picked_cell(reply: bytes) -> str | None:
    resp = ep.ProcessingResponse.FromString(reply)
    for h in resp.request_headers.response.header_mutation.set_headers:
        if h.header.key == "x-dlb-cell":
            return h.header.raw_value.decode().removeprefix(CELL_CLUSTER_PREFIX)
    return None


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
def test_root_follows_the_control_plane(delta: bool, make_config) -> None:
    asyncio.run(_scenario(delta, make_config))


async def _scenario(delta: bool, make_config) -> None:
    ports = {"a": free_port(), "b": free_port(), "c": free_port()}
    stubs = {"a": StaticProbe("a", rif=30.0), "b": StaticProbe("b", rif=0.0), "c": StaticProbe("c", rif=0.0)}
    servers = [await serve_probe(stubs[n], f"127.0.0.1:{p}") for n, p in ports.items()]
    cfg_path = write_config(make_config, {"a": ports["a"], "b": ports["b"]})
    cp = ControlPlane(load_config(cfg_path), probe=False, flow_loop=False)
    xds_port, _ = await cp.start("127.0.0.1:0", "127.0.0.1:0")
    service = RootService(cell="a", cell_names=(), endpoints=[], responses=[], rng=np.random.default_rng(0))
    probes = ProbeManager(service, ProbeTiming(period_s=0.02), "a")
    sync = RootXdsSync(service, f"127.0.0.1:{xds_port}", "a", probes, delta=delta, node_id="root-svc-a")
    # Before any configuration: continue unchanged (Envoy's fail-open weights route).
    assert service.decide(headers("/v1/chat/completions")) == CONTINUE["request_headers"]
    await sync.start()
    decisions: list[str | None] = []
    stop = asyncio.Event()

    async def traffic() -> None:
        """Requests keep arriving through every reload; each must get a decision."""
        while not stop.is_set():
            decisions.append(picked_cell(service.decide(headers("/v1/chat/completions"))))
            await asyncio.sleep(0.002)

    try:
        await until_in_loop(lambda: [e.name for e in service.endpoints] == ["chat", "rest"], what="first configuration")
        # Both leaves' answers, not just a pick of b: until its first probe answer the router routes by the
        # replica split (warm start), which picks b half the time with nothing probed.
        await until_in_loop(lambda: np.isfinite(service.endpoints[0].router.view.last_probe).all(), what="probes of both leaves")
        assert picked_cell(service.decide(headers("/v1/chat/x"))) == "b"  # a (rif 30) is avoided once probed
        load = asyncio.create_task(traffic())
        n0 = len(decisions)

        # Hot reload 1: the chat endpoint's cost changes (latency → rif); routers rebuilt, state kept.
        write_config(make_config, {"a": ports["a"], "b": ports["b"]}, cost="rif")
        cp.reload(load_config(cfg_path))
        await until_in_loop(lambda: service.endpoints[0].router.policy.cost is Cost.RIF, what="policy reload")
        assert service.endpoints[0].router.view.last_probe.max() > 0  # probe state carried over

        # Hot reload 2: a new cell; the root probes it and uses it.
        write_config(make_config, ports)
        cp.reload(load_config(cfg_path))
        await until_in_loop(lambda: service.cell_names == ("a", "b", "c"), what="topology reload")
        await until_in_loop(lambda: stubs["c"].probes > 3, what="probes of the new cell")
        await until_in_loop(lambda: "c" in decisions[-50:], what="traffic to the new cell")

        # An invalid RoutingPolicy (latency prior outside the model's domain): NACKed, old config kept.
        snap = cp.cache.get_snapshot(root_key("a"))
        bad_policy = dr.routing_policy(load_config(cfg_path), load_config(cfg_path).endpoint("chat"))
        bad_policy.latency_prior.a_s = -1.0
        bad = {t: dict(rs) for t, rs in snap.resources.items()}
        bad[dr.ROUTING_POLICY] = dict(bad[dr.ROUTING_POLICY])
        bad[dr.ROUTING_POLICY]["chat"] = Resource.from_message(bad_policy, name="chat", type_url=dr.ROUTING_POLICY)
        cp.cache.set_snapshot(root_key("a"), Snapshot.of(bad))
        st = cp.server.status
        await until_in_loop(lambda: st.nodes["root-svc-a"].types[dr.ROUTING_POLICY].nacks == 1, what="NACK of the bad policy")
        assert "latency_prior" in st.nodes["root-svc-a"].types[dr.ROUTING_POLICY].last_nack_reason
        assert service.endpoints[0].router.models.a.min() > 0  # still the good configuration
        n_before = len(decisions)
        await asyncio.sleep(0.2)
        assert len(decisions) > n_before  # still deciding

        stop.set()
        await load
        assert len(decisions) - n0 > 50
        assert all(d in ("a", "b", "c") for d in decisions[n0:]), "a request got no decision during a reload"
    finally:
        stop.set()
        await sync.stop()
        await probes.stop()
        await cp.stop()
        for s in servers:
            await s.stop(None)


def test_leaf_follows_the_control_plane(make_config) -> None:
    asyncio.run(_leaf_scenario(make_config))


async def _leaf_scenario(make_config) -> None:
    from dlb.ext_proc.leaf_setup import state_from_config
    from dlb.ext_proc.leaf_state import Completion
    from dlb.ext_proc.leaf_xds import LeafXdsSync

    ports = {"a": free_port(), "b": free_port()}
    cfg_path = write_config(make_config, ports)
    cfg = load_config(cfg_path)
    cp = ControlPlane(cfg, probe=False, flow_loop=False)
    xds_port, _ = await cp.start("127.0.0.1:0", "127.0.0.1:0")
    state = state_from_config(cfg, "b", seed=0)
    first = state.servers[0].address
    assert state.pick(0.0, "req-1") == 0  # a request in flight on the only server
    sync = LeafXdsSync(state, f"127.0.0.1:{xds_port}", "b", node_id="leaf-svc-b")
    await sync.start()
    try:
        await until_in_loop(lambda: sync.updates >= 2, what="initial EDS and model")
        assert [s.address for s in state.servers] == [first]
        # Servers change: one added with weight 3. The in-flight record follows its server.
        doc = yaml.safe_load(Path(cfg_path).read_text())
        extra = f"127.0.0.1:{free_port()}"
        doc["cells"][1]["servers"] = [first, {"address": extra, "weight": 3}]
        with open(cfg_path, "w") as fh:
            yaml.safe_dump(doc, fh)
        cp.reload(load_config(cfg_path))
        await until_in_loop(lambda: len(state.servers) == 2, what="EDS update")
        assert [(s.address, s.weight) for s in state.servers] == [(first, 1.0), (extra, 3.0)]
        assert state.servers[0].rif == 1 and state.replicas == 2 and state.rif == 1
        # The first server removed while the request runs: the cell still counts it until it ends.
        doc["cells"][1]["servers"] = [{"address": extra, "weight": 3}]
        with open(cfg_path, "w") as fh:
            yaml.safe_dump(doc, fh)
        cp.reload(load_config(cfg_path))
        await until_in_loop(lambda: len(state.servers) == 1, what="server removal")
        assert state.rif == 1 and state.servers[0].rif == 0
        state.complete(1.0, Completion("req-1", first, 200, 0.5))
        assert state.rif == 0 and state.servers[0].rif == 0
        # A new fleet prior reaches the estimator.
        doc["endpoints"][0]["latency_prior"] = {"a_s": 2.5, "b_s": 0.1, "c": 6, "s": 1}
        with open(cfg_path, "w") as fh:
            yaml.safe_dump(doc, fh)
        cp.reload(load_config(cfg_path))
        await until_in_loop(lambda: state.prior.a == 2.5, what="prior update")
        assert state.estimator.prior.a == 2.5
    finally:
        await sync.stop()
        await cp.stop()


def test_leaf_takes_its_dp_groups_from_the_control_plane(make_config) -> None:
    """dp_ranks / policy / horizon reach a leaf over xDS (``dlb.v1.DpGroups``) as from the config file:
    the leaf, started from a file without them, picks ranks by the pushed policy, and a changed
    policy or horizon is applied on the next push (issue 15)."""
    asyncio.run(_dp_scenario(make_config))


async def _dp_scenario(make_config) -> None:
    from dlb.ext_proc.leaf_setup import state_from_config
    from dlb.ext_proc.leaf_xds import LeafXdsSync

    cfg_path = write_config(make_config, {"a": free_port(), "b": free_port()})
    plain = load_config(cfg_path)  # what the leaf's own file says: no DP server
    doc = yaml.safe_load(Path(cfg_path).read_text())
    base = free_port()
    doc["cells"][1]["servers"] = [{"address": f"127.0.0.1:{base}", "dp_ranks": 4, "policy": "jsq", "horizon": 50}]
    Path(cfg_path).write_text(yaml.safe_dump(doc))
    cp = ControlPlane(load_config(cfg_path), probe=False, flow_loop=False)
    xds_port, _ = await cp.start("127.0.0.1:0", "127.0.0.1:0")
    state = state_from_config(plain, "b", seed=0)
    assert state.dp_groups == []
    sync = LeafXdsSync(state, f"127.0.0.1:{xds_port}", "b", node_id="leaf-svc-b")
    await sync.start()
    try:
        await until_in_loop(lambda: len(state.servers) == 4 and len(state.dp_groups) == 1, what="EDS ranks and DP groups")
        bal, members = state.dp_groups[0]
        assert members == [f"127.0.0.1:{base + r}" for r in range(4)]
        assert (bal.ranks, bal.policy, bal.horizon) == (4, "jsq", 50)
        for k in range(8):  # JSQ over the ranks: two each
            state.pick(0.0, f"r{k}")
        assert list(bal.assigned) == [2, 2, 2, 2]
        doc["cells"][1]["servers"][0].update(policy="bf-io", horizon=7)
        Path(cfg_path).write_text(yaml.safe_dump(doc))
        cp.reload(load_config(cfg_path))
        await until_in_loop(lambda: state.dp_groups[0][0].policy == "bf-io", what="DP policy update")
        assert state.dp_groups[0][0].horizon == 7 and state.dp_groups[0][0] is not bal
    finally:
        await sync.stop()
        await cp.stop()
