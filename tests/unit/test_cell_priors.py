"""Per-cell latency priors (``endpoints[].latency_prior_by_cell``): checked, and used where a prior is.

Why: an operator often knows a region is slower (older GPUs, a smaller model variant) before any
request has measured it; one prior per endpoint made every cell start equally fast.
"""

from __future__ import annotations

import pytest

from dlb.config import ConfigError, config_from_dict
from dlb.control_plane.flow_controller import FlowController, FlowEndpoint
from dlb.ext_proc.leaf_setup import state_from_config
from dlb.ext_proc.root import RootService
from dlb.probe.target import ProbeTarget
from dlb.proto import probe_pb2

PRIOR = {"a_s": 0.1, "b_s": 0.01, "c": 4, "s": 1}


def doc(by_cell):
    cells = [{"name": n, "leaf": {"address": f"127.0.0.1:{1000 + i}", "probe": f"127.0.0.1:{2000 + i}"},
              "servers": [f"127.0.0.1:{3000 + i}"]} for i, n in enumerate(["near", "far"])]
    return {"version": 1, "cells": cells, "network": {"one_way_ms": {"near": {"far": 20}}},
            "endpoints": [{"name": "chat", "match": {"prefix": "/v1/"}, "policy": {"mechanism": "discrete", "cost": "latency"},
                           "latency_prior": PRIOR, **({"latency_prior_by_cell": by_cell} if by_cell is not None else {})}]}


def test_a_cell_prior_takes_the_endpoints_fields_it_leaves_out():
    ep = config_from_dict(doc({"near": {"a_s": 1.2}})).endpoints[0]
    assert ep.prior_for("near").to_core().a == 1.2 and ep.prior_for("near").b_s == 0.01 and ep.prior_for("near").c == 4
    assert ep.prior_for("far") == ep.latency_prior


@pytest.mark.parametrize(("by_cell", "path", "reason"), [
    ({"mars": {"a_s": 1}}, "endpoints[0].latency_prior_by_cell.mars", "is not a cell (cells: near, far)"),
    ({"near": {"a": 1}}, "endpoints[0].latency_prior_by_cell.near.a", "unknown key"),
    ({"near": {"a_s": -1}}, "endpoints[0].latency_prior_by_cell.near.a_s", "must be > 0"),
    # inherits b_s = 0.01 and c = 4 from the endpoint: c must stay below a_s/b_s = 3
    # (the a_s given is blamed, and what it inherited is named)
    ({"near": {"a_s": 0.03}}, "endpoints[0].latency_prior_by_cell.near.a_s", "must be below a_s/b_s=3 (else throughput falls "
     "as load grows); not given here: b_s=0.01, c=4"),
    ([{"near": {}}], "endpoints[0].latency_prior_by_cell", "must be a mapping of cell name to latency prior"),
])
def test_bad_cell_priors_are_named_by_field(by_cell, path, reason):
    with pytest.raises(ConfigError) as info:
        config_from_dict(doc(by_cell))
    assert any(p.path == path and reason in p.reason for p in info.value.problems), info.value


def test_a_known_slower_cell_loses_the_latency_argmin_before_anything_is_measured():
    """Both cells probed with no model yet: each keeps its prior. Equal priors: the near cell wins (no RTT);
    the near cell known slower (1.2 s unloaded vs 0.1 s): the far one wins despite its 40 ms round trip."""
    for by_cell, expected in ((None, "near"), ({"near": {"a_s": 1.2}}, "far")):
        svc = RootService.from_config(config_from_dict(doc(by_cell)), "near", seed=1)
        for j, name in enumerate(svc.cell_names):
            svc.on_probe(ProbeTarget(j, name, ""), probe_pb2.ProbeResponse(cell=name, rif=0), 100.0)
        router = svc.endpoints[0].router
        assert svc.cell_names[router.pick(100.0)] == expected


def test_leaves_and_flow_routers_start_from_their_cells_prior():
    d = doc({"far": {"a_s": 2.0, "b_s": 0.1}})
    d["endpoints"][0]["policy"]["mechanism"] = "flow"
    cfg = config_from_dict(d)
    assert state_from_config(cfg, "far").prior.a == 2.0 and state_from_config(cfg, "near").prior.a == 0.1
    ep = cfg.endpoints[0]
    flow = FlowController(cfg.topology(), [FlowEndpoint("chat", ep.policy.to_core(cfg.probe), ep.latency_prior.to_core(), ep.cell_priors())], [0])
    models = flow.routers[("chat", 0)].models
    assert [models.row(j).a for j in range(2)] == [0.1, 2.0]


def test_the_control_plane_serves_each_cell_its_own_prior():
    """``CellLatencyModel``: a leaf's fleet prior and a root's curve for a cell with no model yet, per cell."""
    import asyncio

    from envoy.service.discovery.v3 import discovery_pb2
    from google.protobuf import any_pb2

    from dlb.config.resources import CELL_LATENCY_MODEL
    from dlb.control_plane.service import ControlPlane
    from dlb.proto import resources_pb2 as pb

    async def scenario() -> dict[str, float]:
        cp = ControlPlane(config_from_dict(doc({"far": {"a_s": 2.0}})), probe=False, flow_loop=False)
        out = {}
        for r in cp._state_resources():
            if r.type_url == CELL_LATENCY_MODEL:
                wrapped = discovery_pb2.Resource.FromString(any_pb2.Any.FromString(r.any_bytes).value)  # the state carries a TTL
                msg = pb.CellLatencyModel.FromString(wrapped.resource.value)
                out[msg.cell] = (msg.fleet_prior.a_s, msg.model.a_s)
        return out

    assert asyncio.run(scenario()) == {"near": (0.1, 0.1), "far": (2.0, 2.0)}


def test_a_root_that_follows_xds_gets_each_cells_prior_from_the_routing_policy():
    """``RoutingPolicy.latency_prior_by_cell``: a root configured by the control plane starts each cell from the
    same prior as one reading the file; a per-cell prior outside the model's domain is refused naming it."""
    from dlb.config import resources as dr
    from dlb.ext_proc.root_xds import specs_from_policies

    cfg = config_from_dict(doc({"near": {"a_s": 1.2}}))
    ep = cfg.endpoints[0]
    (spec,) = specs_from_policies({"chat": dr.routing_policy(cfg, ep)})
    assert dict(spec.cell_priors) == ep.cell_priors() and spec.priors(["near", "far"]) == [ep.prior_for(c).to_core() for c in ("near", "far")]
    assert spec.priors(["near", "far"])[0].a == 1.2
    bad = dr.routing_policy(cfg, ep)
    bad.latency_prior_by_cell["near"].s = -1
    with pytest.raises(dr.ResourceError, match=r"latency_prior_by_cell\['near'\]"):
        specs_from_policies({"chat": bad})


def test_a_foreign_cells_model_shrinks_toward_the_roots_prior_for_that_cell():
    """The root hands its probe client the first endpoint's prior per cell, the one a leaf there would use."""
    svc = RootService.from_config(config_from_dict(doc({"far": {"a_s": 2.0}})), "near")
    assert svc.cell_prior("far").a == 2.0 and svc.cell_prior("near").a == 0.1
