"""``native-discrete``: the discrete decision as least-request weights a root Envoy applies itself.

What must hold: a costlier cell (slower, more loaded) gets a smaller weight; an averted cell gets the
share the ext_proc's skip would leave it; residency keeps a forbidden cell out of the cluster; a stale
cell is unhealthy unless every cell is (fail-open); and the control plane serves a root whose native
endpoint has no ext_proc hop.
"""

from __future__ import annotations

import asyncio
import itertools

import numpy as np
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from google.protobuf import any_pb2

from dlb.config import config_from_dict
from dlb.core.native_discrete import WEIGHT_SCALE, native_weights
from dlb.xds import types

ALL = np.array([True, True, True])


def test_weights_fall_with_cost_and_follow_replicas_at_equal_cost():
    w = native_weights(np.array([1.0, 2.0, 1.0]), np.array([1.0, 1.0, 2.0]), np.zeros(3), ALL, ALL)
    assert w.weights == (WEIGHT_SCALE // 2, WEIGHT_SCALE // 8, WEIGHT_SCALE)  # γ = 2: twice the cost, a quarter
    assert w.healthy == (True, True, True)


def test_aversion_skips_a_share_and_residency_removes_a_cell():
    """Two equal cells, one averted at 0.5: it is skipped half the time, so it serves a quarter."""
    w = native_weights(np.ones(3), np.ones(3), np.array([0.0, 0.5, 0.0]), ALL, np.array([True, True, False]))
    assert w.weights == (WEIGHT_SCALE, WEIGHT_SCALE // 3, 0)


def _skip_then_choose(split: np.ndarray, aversion: np.ndarray, cells: np.ndarray, n: int = 200_000) -> np.ndarray:
    """The ext_proc's rule, sampled: skip each cell with probability a_j, choose among the kept by ``split``."""
    rng = np.random.default_rng(7)
    s = np.where(cells, split, 0.0)
    kept = (rng.random((n, len(s))) >= aversion) & cells
    kept[~kept.any(axis=1)] = cells  # every cell skipped: all of them again
    p = kept * s
    return (p / p.sum(axis=1, keepdims=True)).mean(axis=0)


def test_averted_split_is_the_ext_procs_skip_then_choose():
    """Exact (≤ 12 averted cells) and sampled (more) against the rule sampled here, on random splits."""
    from dlb.core.native_discrete import averted_split

    rng = np.random.default_rng(3)
    for n in (2, 3, 5, 14):
        for _ in range(4):
            split = rng.random(n) ** 4
            aversion = np.where(rng.random(n) < 0.7, rng.random(n), 0.0)
            cells = rng.random(n) < 0.9
            cells[0] = True
            got = averted_split(split, aversion, cells)
            assert abs(got.sum() - 1.0) < 1e-9 and (got[~cells] == 0).all()
            assert np.abs(got - _skip_then_choose(split / split[cells].sum(), aversion, cells)).max() < 0.01


def test_an_averted_cheaper_cell_keeps_what_the_ext_proc_would_send_it():
    """At γ = 32 a factor (1 − a) on the sharpened split left a cheaper cell averted at the cap ~97 %
    of the traffic; the ext_proc sends it 10 %. Neither cell averted: the split is unchanged."""
    cost = np.array([1.0, 1.2])
    plain = native_weights(cost, np.ones(2), np.zeros(2), np.ones(2, bool), np.ones(2, bool), sharpness=32.0)
    assert plain.weights == (WEIGHT_SCALE, 3)
    w = native_weights(cost, np.ones(2), np.array([0.9, 0.0]), np.ones(2, bool), np.ones(2, bool), sharpness=32.0)
    assert abs(w.weights[0] / sum(w.weights) - 0.1) < 0.005


def test_a_stale_cell_is_unhealthy_unless_none_is_usable():
    w = native_weights(np.array([1.0, 5.0, 1.0]), np.ones(3), np.zeros(3), np.array([True, True, False]), ALL)
    assert w.healthy == (True, True, False) and w.weights[2] == 1
    w = native_weights(np.ones(3), np.array([1.0, 2.0, 1.0]), np.zeros(3), np.zeros(3, bool), ALL)
    assert w.healthy == (True, True, True) and w.weights == (500, 1000, 500)  # fail-open: replicas


def test_rif_costs_of_zero_keep_finite_weights_with_the_offset():
    w = native_weights(np.array([0.0, 1.0]), np.ones(2), np.zeros(2), np.ones(2, bool), np.ones(2, bool), offset=1.0)
    assert w.weights == (1000, 250)


def _doc(native: bool = True, affinity: bool = False, pick: str | None = None) -> dict:
    cells = [{"name": n, "leaf": {"address": f"127.0.0.1:{1000 + i}", "probe": f"127.0.0.1:{2000 + i}"},
              "servers": [f"127.0.0.1:{3000 + i}"], "root": {"address": f"127.0.0.1:{4000 + i}"}} for i, n in enumerate(["a", "b"])]
    mech = {"type": "native-discrete" if native else "discrete", "parameters": {"cost": "latency"} | ({"pick": pick} if pick else {})}
    plugins = [mech, {"type": "affinity", "parameters": {"enabled": affinity, "header": "x-session"}}]
    return {"version": 1, "cells": cells, "network": {"one_way_ms": {"a": {"b": 10}}},
            "endpoints": [{"name": "chat", "match": {"prefix": "/v1/"}, "policy": {"plugins": plugins}}]}


def _root_snapshot(doc: dict, probes: dict[str, float] | None = None, fleet: bool = False):
    """The control plane's snapshot for root a after ``probes`` (cell → probed latency); with ``fleet``, its
    ``/fleet`` JSON instead."""
    import json

    from dlb.control_plane.service import ControlPlane, root_key
    from dlb.probe.target import ProbeTarget
    from dlb.proto import probe_pb2

    async def scenario():
        cp = ControlPlane(config_from_dict(doc), probe=False, flow_loop=False, clock=lambda: 100.0)
        for j, (name, latency) in enumerate((probes or {}).items()):
            resp = probe_pb2.ProbeResponse(cell=name, rif=0)
            resp.model.a_s, resp.model.b_s, resp.model.c, resp.model.s = latency, 0.01, 8, 1
            resp.model.confidence, resp.model.samples = 1.0, 100
            cp._on_probe(ProbeTarget(j, name, ""), resp, 100.0)
        if probes:
            cp.flow.step(100.0)
            cp.rebuild()
        if fleet:
            return json.loads((await cp._fleet(None)).text)
        return cp.cache.get_snapshot(root_key("a"))

    return asyncio.run(scenario())


def _unpack(res, cls):
    from envoy.service.discovery.v3 import discovery_pb2

    a = any_pb2.Any.FromString(res.any_bytes)
    if a.type_url.endswith("discovery.v3.Resource"):
        a = discovery_pb2.Resource.FromString(a.value).resource
    return cls.FromString(a.value)


def test_the_control_plane_serves_a_native_root_least_request_over_cells_with_no_ext_proc():
    snap = _root_snapshot(_doc())
    clusters = {n: _unpack(r, cluster_pb2.Cluster) for n, r in snap.get(types.CLUSTER).items()}
    assert clusters["dlb-native.chat"].lb_policy == cluster_pb2.Cluster.LEAST_REQUEST
    assert "dlb-ext-proc" not in " ".join(clusters)  # no ext_proc cluster: nothing on the request path but Envoy
    listener = _unpack(next(iter(snap.get(types.LISTENER).values())), listener_pb2.Listener)
    assert "ext_proc" not in str(listener)
    cla = _unpack(snap.get(types.ENDPOINT)["dlb-native.chat"], endpoint_pb2.ClusterLoadAssignment)
    assert [h.load_balancing_weight.value for h in cla.endpoints[0].lb_endpoints] == [WEIGHT_SCALE] * 2  # by replicas until probed


def test_a_native_routes_retry_may_refuse_the_failed_cell_as_often_as_the_weights_need():
    """Envoy's weighted schedule picks a weight-1 host once per ``WEIGHT_SCALE`` picks of the top one, so
    the retry's reselections must outlast that, else it goes back to the cell that failed."""
    from envoy.config.route.v3 import route_pb2

    snap = _root_snapshot(_doc(pick="round-robin"))
    routes = [r for rc in snap.get(types.ROUTE).values() for vh in _unpack(rc, route_pb2.RouteConfiguration).virtual_hosts
              for r in vh.routes if r.route.cluster == "dlb-native.chat"]
    assert routes and all(r.route.retry_policy.host_selection_retry_max_attempts > WEIGHT_SCALE
                          and r.route.retry_policy.retry_host_predicate for r in routes), routes


def test_probed_costs_reach_the_eds_weights_slow_cell_down():
    snap = _root_snapshot(_doc(), probes={"a": 0.1, "b": 0.4})
    cla = _unpack(snap.get(types.ENDPOINT)["dlb-native.chat"], endpoint_pb2.ClusterLoadAssignment)
    w = [h.load_balancing_weight.value for h in cla.endpoints[0].lb_endpoints]
    assert w[0] == WEIGHT_SCALE and w[1] < WEIGHT_SCALE / 10, w  # b: 4x the latency (+20 ms RTT) -> under 1/16 of a's


def test_fleet_shows_the_native_weights_the_roots_were_pushed():
    """They were only in each root Envoy's admin: /fleet's flow_weights is empty for a native endpoint."""
    fleet = _root_snapshot(_doc(), probes={"a": 0.1, "b": 0.4}, fleet=True)
    chat = fleet["native_weights"]["chat"]
    assert chat["a"]["a"] == {"weight": WEIGHT_SCALE, "healthy": True} and chat["a"]["b"]["weight"] < WEIGHT_SCALE / 10, chat


def test_the_round_robin_pick_pushes_round_robin_and_sharper_weights():
    """``pick: round-robin``: the native cluster is Envoy's weighted round robin (no active-request term)
    and the weights use γ = 32, so a cell 4 × slower gets Envoy's smallest weight (1), not 1/16 of the best."""
    snap = _root_snapshot(_doc(pick="round-robin"), probes={"a": 0.1, "b": 0.4})
    cluster = _unpack(snap.get(types.CLUSTER)["dlb-native.chat"], cluster_pb2.Cluster)
    assert cluster.lb_policy == cluster_pb2.Cluster.ROUND_ROBIN
    cla = _unpack(snap.get(types.ENDPOINT)["dlb-native.chat"], endpoint_pb2.ClusterLoadAssignment)
    assert [h.load_balancing_weight.value for h in cla.endpoints[0].lb_endpoints] == [WEIGHT_SCALE, 1]


def test_fill_split_is_the_argmin_counting_its_own_sends():
    """Water-filling: 4 requests onto two one-replica cells at RIF 0 and 2 go 2 to the idle cell until the
    costs meet, then alternate (1 each): 3/4 : 1/4, where cost ratios would send all to the cheaper."""
    from dlb.core.costs import Cost
    from dlb.core.native_discrete import fill_split

    split = fill_split(Cost.RIF, np.array([0.0, 2.0]), np.ones(2), None, np.zeros(2), np.ones(2, bool), 4.0)
    assert list(split) == [0.75, 0.25]


def _lat_router(rif_a: float):
    from dlb.core.latency_model import LatencyParams
    from dlb.core.router import PolicyConfig, RootRouter
    from dlb.core.topology import Topology

    topo = Topology.build(["a", "b"], [2, 2], [[0.0, 0.015], [0.015, 0.0]])
    r = RootRouter(topo, 0, PolicyConfig.from_name("Disc-Lat"), LatencyParams(1.0, 0.1, 4.0, 1.0), np.random.default_rng(1))
    model = LatencyParams(1.2, 0.05, 6.0, 1.0)
    r.on_probe(0, 10.0, rif_a, model, replicas=2.0)
    r.on_probe(1, 10.0, 15.0, model, replicas=2.0)
    return r


def test_fill_weights_do_not_swing_on_one_request_of_probed_rif():
    """The measured mechanism of ``round-robin``'s residual gap: at γ = 32 one request more or less in a
    probe moves a cell's weight 2–4 × (1000 : 210 → 1000 : 562 → 685 : 1000; the fill: 1000 : 684 → 1000 : 882 → 882 : 1000), so the split follows probe
    noise. ``round-robin-fill`` water-fills the fleet's next 0.5 s of arrivals instead: the weights
    move only as far as the costs' levels do."""
    from dlb.core.native_discrete import PICKS, router_weights

    def largest_step(pick: str) -> float:
        w = [router_weights(_lat_router(rif), 10.0, PICKS[pick], 0.0).weights for rif in (14.0, 15.0, 16.0)]
        ratio = [x[0] / x[1] for x in w]
        return max(max(a / b, b / a) for a, b in itertools.pairwise(ratio))

    assert largest_step("round-robin") > 2.0 and largest_step("round-robin-fill") < 1.4


def test_the_fill_pick_pushes_round_robin_from_the_same_function_the_simulator_runs():
    """Whatever the control plane pushes is what the simulator models: both call ``router_weights``."""
    from dlb.core.native_discrete import NativeDiscreteRoot, router_weights

    snap = _root_snapshot(_doc(pick="round-robin-fill"), probes={"a": 0.1, "b": 0.4})
    assert _unpack(snap.get(types.CLUSTER)["dlb-native.chat"], cluster_pb2.Cluster).lb_policy == cluster_pb2.Cluster.ROUND_ROBIN
    cla = _unpack(snap.get(types.ENDPOINT)["dlb-native.chat"], endpoint_pb2.ClusterLoadAssignment)
    assert [h.load_balancing_weight.value for h in cla.endpoints[0].lb_endpoints] == [WEIGHT_SCALE, 1]
    root = NativeDiscreteRoot(_lat_router(14.0), np.random.default_rng(2), pick="round-robin-fill")
    root.tick(10.0)
    assert tuple(int(x) for x in root.weights) == router_weights(_lat_router(14.0), 10.0, root.pick_rule, 0.0).weights


def test_an_unknown_pick_is_a_config_error():
    from dlb.config import ConfigError

    doc = _doc(pick="fastest")
    try:
        config_from_dict(doc)
    except ConfigError as e:
        assert "pick" in str(e) and "round-robin" in str(e)
    else:
        raise AssertionError("an unknown pick was accepted")


def test_affinity_keeps_a_native_discrete_endpoint_on_the_ext_proc():
    snap = _root_snapshot(_doc(affinity=True))
    assert "dlb-native.chat" not in snap.get(types.CLUSTER)
    listener = _unpack(next(iter(snap.get(types.LISTENER).values())), listener_pb2.Listener)
    assert "ext_proc" in str(listener)


# -- the mechanism in the simulator ----------------------------------------------------------------


def test_a_simulated_native_root_spreads_by_weight_over_its_own_active_requests():
    """``NativeDiscreteRoot``: Envoy's effective weight ``w / (active + 1)``: at equal weights each pick goes
    where this root has fewer requests out; an answer frees its slot; weights follow the router's costs only
    at each refresh (the control plane's cadence), not between."""
    from dlb.core.latency_model import LatencyParams
    from dlb.core.native_discrete import NativeDiscreteRoot
    from dlb.core.router import PolicyConfig, RootRouter
    from dlb.core.topology import Topology

    topo = Topology.build(["a", "b"], [1, 1], [[0.0, 0.001], [0.001, 0.0]])
    prior = LatencyParams(1.0, 0.1, 4.0, 1.0)
    root = NativeDiscreteRoot(RootRouter(topo, 0, PolicyConfig.from_name("Disc-RIF"), prior, np.random.default_rng(1)),
                              np.random.default_rng(2), period_s=1.0)
    for j in range(2):
        root.on_probe(j, 0.0, 0.0, replicas=1.0)
    picks = [root.pick(0.0) for _ in range(40)]
    assert abs(picks.count(0) - picks.count(1)) <= 6 and list(root.active) == [picks.count(0), picks.count(1)]
    root.on_cell_reply(0.1, 0, True)
    assert root.active[0] == picks.count(0) - 1
    root.on_probe(1, 0.5, 30.0, replicas=1.0)  # b looks loaded, but the weights wait for the refresh
    assert list(root.weights) == [1000.0, 1000.0]
    root.tick(1.0)
    assert root.weights[1] < root.weights[0] / 100


def test_envoys_weighted_schedules_as_envoy_runs_them():
    """:class:`EnvoyLb`: ``ROUND_ROBIN`` serves unequal weights exactly in proportion (EDF, no active term);
    ``LEAST_REQUEST`` divides a host's weight by its active requests + 1 when it is picked, so with
    nothing answered a 3:1 weight ends near √3:1 rather than 3:1; equal weights: round robin / P2C."""
    from dlb.core.envoy_lb import LEAST_REQUEST, ROUND_ROBIN, EnvoyLb

    rr = EnvoyLb(np.array([3.0, 1.0]), np.random.default_rng(1), ROUND_ROBIN)
    picks = [rr.pick() for _ in range(400)]
    assert abs(picks.count(0) - 300) <= 1
    lr = EnvoyLb(np.array([3.0, 1.0]), np.random.default_rng(1), LEAST_REQUEST)
    picks = [lr.pick() for _ in range(400)]
    assert 1.5 < picks.count(0) / picks.count(1) < 2.0  # √3 ≈ 1.73: (a0 + 1)·(a1 + 1)⁻¹ ≈ 3·a1/a0
    eq = EnvoyLb(np.array([5.0, 5.0, 0.0]), np.random.default_rng(1), ROUND_ROBIN)
    picks = [eq.pick() for _ in range(10)]
    assert picks.count(0) == picks.count(1) == 5
    eq.update(np.array([5.0, 5.0, 5.0]), np.array([True, False, True]))  # an unhealthy host is never picked
    assert 1 not in [eq.pick() for _ in range(10)]


def test_the_simulator_runs_native_discrete_without_leaking_active_requests(monkeypatch) -> None:
    """Every request of a native-discrete run is answered back to its root (the active counts return to 0),
    outages to zero servers included, and the policies stay out of ``dlb sim``'s default set."""
    from dataclasses import replace

    from dlb.sim import engine
    from dlb.sim.policies import ALL_POLICIES, POLICIES
    from dlb.sim.scenario import Disruption, generate

    assert {"Disc-Lat-native", "Disc-RIF-native", "Disc-Grad-native"} <= set(ALL_POLICIES) - set(POLICIES)
    sc = generate(2, duration_s=30.0)
    k = list(sc.servers)
    k[0] = 0
    sc = replace(sc, disruption=Disruption("outage", 10.0, 18.0, outage_servers=tuple(k)))
    built = []
    real = engine.build_roots
    monkeypatch.setattr(engine, "build_roots", lambda *a: built.append(real(*a)) or built[-1])
    r = engine.simulate(sc, "Disc-Lat-native")
    assert r.completed > 0.9 * r.arrivals
    assert built and all(float(np.abs(root.active).sum()) == 0.0 for roots in built for root in roots)


def test_the_fill_pick_sends_an_averted_cells_skipped_share_to_the_next_cheapest():
    """The fill can put every request on one cell; averted at 0.9 that cell must keep ~10 %, as the
    ext_proc's skip would leave it, not all of it (a factor (1 − a) on a split of 1 : 0 changes nothing)."""
    from dlb.core.native_discrete import PICKS, router_weights

    r = _lat_router(0.0)
    assert router_weights(r, 10.0, PICKS["round-robin-fill"], 0.0).weights == (WEIGHT_SCALE, 1)
    r.aversion[0] = 0.9
    w = router_weights(r, 10.0, PICKS["round-robin-fill"], 0.0).weights
    assert abs(w[0] / sum(w) - 0.1) < 0.005


def test_the_fill_pick_with_nothing_to_fill_keeps_the_replica_split(monkeypatch):
    """No arrivals expected (config keeps the rate floor above 0, so only a broken estimate gets here): the
    fill is empty, and the weights are the usable cells' replicas, not a division by zero."""
    from dlb.core import native_discrete
    from dlb.core.native_discrete import PICKS, router_weights

    monkeypatch.setattr(native_discrete, "fleet_rate", lambda *a: 0.0)
    assert router_weights(_lat_router(0.0), 10.0, PICKS["round-robin-fill"], 0.0).weights == (WEIGHT_SCALE, WEIGHT_SCALE)
