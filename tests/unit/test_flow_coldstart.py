"""The flow cold start (FlowConfig.warmup_s): discrete picks until the warm-up ends, ``x`` following their
split, then the flow loop from there; routers that never pick (the control plane's) step as before."""

from __future__ import annotations

import numpy as np
import pytest
from test_config import minimal

from dlb.config import config_from_dict
from dlb.config import resources as dr
from dlb.control_plane.flow_controller import FlowController, FlowEndpoint
from dlb.core.costs import Cost
from dlb.core.flow import FlowConfig
from dlb.core.latency_model import LatencyParams
from dlb.core.router import Mechanism, PolicyConfig, RootRouter
from dlb.core.topology import Topology
from dlb.proto import resources_pb2 as pb
from dlb.sim.policies import REGISTRY

P = LatencyParams(a=1.0, b=0.05, c=8.0, s=1.0)
PERIOD = 0.2


def topo2() -> Topology:
    return Topology.build(["a", "b"], [4, 4], [[0, 0.01], [0.01, 0]])


def flow_router(warmup_s: float, seed: int = 0) -> RootRouter:
    pol = PolicyConfig(Mechanism.FLOW, Cost.LATENCY, flow=FlowConfig(period_s=PERIOD, warmup_s=warmup_s))
    return RootRouter(topo2(), 0, pol, P, np.random.default_rng(seed))


def probe(r: RootRouter, now: float, rif: tuple[float, float]) -> None:
    for j, n in enumerate(rif):
        r.on_probe(j, now, n, P, seen_until=now)
    r.tick(now)


def drive(r: RootRouter, until: float, rif: tuple[float, float] = (100.0, 60.0), per_period: int = 4) -> list[int]:
    """Probe every period (both cells past the knee, a busier than b) and route ``per_period`` requests after each."""
    picks = []
    t = 0.0
    while t < until:
        probe(r, t, rif)
        picks += [r.pick(t + 0.01) for _ in range(per_period)]
        t = round(t + PERIOD, 9)
    return picks


def test_warmup_picks_follow_the_costs_from_the_first_probe() -> None:
    """With the warm-up, the first requests after the first probe go to the cheaper cell; from the
    replica split (the old start) a good part of them still went to the busier one."""
    cold = drive(flow_router(warmup_s=10.0), until=2.0)
    assert cold.count(1) == len(cold)
    old = drive(flow_router(warmup_s=0.0), until=2.0)
    assert old.count(0) > 0.2 * len(old)


def test_x_follows_the_discrete_split_and_the_flow_starts_from_it() -> None:
    r = flow_router(warmup_s=4.0)
    drive(r, until=4.0)
    assert r.x[1] > 0.85  # the EMA of the picks (all on b) after 2 smoothing times, from 0.5
    assert r.warming(3.9) and not r.warming(4.1)
    x_handed = r.x.copy()
    drive_from = 4.0
    probe(r, drive_from, (100.0, 60.0))  # first step after the hand-over: a flow step from the picks' split
    assert not r.warming(drive_from)
    assert r.x[1] >= x_handed[1]
    assert r.pick(drive_from + 0.01) in (0, 1)  # sampled from x now


def test_old_start_is_still_near_the_replica_split_after_the_same_time() -> None:
    """The behaviour the warm-up removes: the flow step from the replica split moves slowly."""
    r = flow_router(warmup_s=0.0)
    drive(r, until=2.0)
    assert r.x[1] < 0.7


def test_a_router_that_never_picks_steps_as_without_warmup() -> None:
    """The control plane's routers: no picks, so no discrete split to follow; x is the flow's."""
    xs = []
    for w in (0.0, 10.0):
        r = flow_router(warmup_s=w)
        t = 0.0
        while t < 3.0:
            probe(r, t, (40.0, 0.0))
            t = round(t + PERIOD, 9)
        xs.append(r.x.copy())
        assert not r.warming(1.0)
    np.testing.assert_allclose(xs[0], xs[1])


def test_seeded_weights_route_until_the_first_probe_and_start_the_split() -> None:
    """A restarted root with the control plane's last weights: those route before any probe (warm
    start), and the warm-up's split moves from them, not from the replica split."""
    r = flow_router(warmup_s=10.0, seed=1)
    r.x = np.array([0.1, 0.9])
    before = [r.pick(0.0) for _ in range(200)]
    assert 0.8 < before.count(1) / len(before) < 0.97
    probe(r, 0.0, (0.0, 40.0))  # now b is the loaded cell
    for _ in range(4):
        r.pick(0.01)
    probe(r, PERIOD, (0.0, 40.0))
    alpha = PERIOD / r.policy.flow.warmup_smoothing_s
    np.testing.assert_allclose(r.x, [0.1 + alpha * 0.9, 0.9 - alpha * 0.9])


def test_reconfiguration_does_not_restart_the_warmup() -> None:
    old = flow_router(warmup_s=4.0)
    drive(old, until=5.0)
    assert not old.warming(5.0)
    new = flow_router(warmup_s=4.0)
    new.carry_over(old, ["a", "b"], ["a", "b"])
    probe(new, 5.0, (40.0, 0.0))
    assert not new.warming(5.1)
    np.testing.assert_allclose(new.x.sum(), 1.0)


def test_warmup_config_is_validated() -> None:
    with pytest.raises(ValueError):
        FlowConfig(warmup_s=-1.0)
    with pytest.raises(ValueError):
        FlowConfig(warmup_smoothing_s=0.0)


def test_control_plane_weights_do_not_change_with_the_warmup() -> None:
    """The control plane's flow loop (Envoy applies its split, it never picks) steps as without it."""
    out = []
    for w in (0.0, 10.0):
        pol = PolicyConfig(Mechanism.FLOW, Cost.LATENCY, flow=FlowConfig(period_s=PERIOD, warmup_s=w))
        ctl = FlowController(topo2(), [FlowEndpoint("chat", pol, P)], [0, 1])
        t = 0.0
        while t < 3.0:
            for j, n in enumerate((100.0, 60.0)):
                ctl.on_probe(j, t, n, None, P, 1.0, 100, 0.0, 0.0)
            weights = ctl.step(t)
            t = round(t + PERIOD, 9)
        out.append(weights["chat"][0])
    assert out[0][1] > 0.5
    np.testing.assert_allclose(out[0], out[1])


def test_the_default_warmup_is_on_for_the_gradient_cost_only() -> None:
    """Unset (None), the cold start is the cost's default: 20 s for the gradient cost, off for the
    others (coldstart-grad-rule.md); an explicit value wins."""
    assert PolicyConfig(Mechanism.FLOW, Cost.GRADIENT).warmup_s == 20.0
    assert PolicyConfig(Mechanism.FLOW, Cost.LATENCY).warmup_s == 0.0
    assert PolicyConfig(Mechanism.FLOW, Cost.RIF).warmup_s == 0.0
    assert PolicyConfig(Mechanism.FLOW, Cost.GRADIENT, flow=FlowConfig(warmup_s=0.0)).warmup_s == 0.0
    assert PolicyConfig(Mechanism.FLOW, Cost.LATENCY, flow=FlowConfig(warmup_s=5.0)).warmup_s == 5.0


def default_router(cost: Cost) -> RootRouter:
    pol = PolicyConfig(Mechanism.FLOW, cost, flow=FlowConfig(period_s=PERIOD))
    return RootRouter(topo2(), 0, pol, P, np.random.default_rng(0))


def test_with_the_defaults_flow_grad_starts_discretely_and_flow_lat_as_before() -> None:
    grad = drive(default_router(Cost.GRADIENT), until=2.0)
    assert grad.count(1) == len(grad)
    lat, old = default_router(Cost.LATENCY), flow_router(warmup_s=0.0)
    assert drive(lat, until=2.0) == drive(old, until=2.0)
    np.testing.assert_array_equal(lat.x, old.x)


def test_a_root_gets_the_cost_default_over_xds_as_the_simulator_does() -> None:
    """The roots' policy arrives as a dlb.v1.RoutingPolicy (period and κ only for the flow): decoded, it
    resolves the same cold start as the simulator's Flow-Grad and Flow-Lat."""
    for cost, name in (("gradient", "Flow-Grad"), ("latency", "Flow-Lat")):
        cfg = config_from_dict(minimal(endpoints=[{"name": "m", "match": {"prefix": "/"}, "policy": {"plugins": [
            {"type": "flow", "parameters": {"cost": cost}}]}}]))
        msg = dr.routing_policy(cfg, cfg.endpoints[0])
        got, _, _ = dr.policy_from_pb(pb.RoutingPolicy.FromString(msg.SerializeToString()))
        sim = REGISTRY[name].factory(topo2(), 0, P, np.random.default_rng(0))
        assert got.warmup_s == sim.policy.warmup_s == (20.0 if cost == "gradient" else 0.0)  # type: ignore[attr-defined]


@pytest.mark.parametrize(("cost", "warmup"), [("gradient", 0.0), ("latency", 12.5)])
def test_a_config_sets_the_cold_start_and_roots_get_it_over_xds(cost: str, warmup: float) -> None:
    """``warmup_s`` in the flow plugin overrides the cost's default: 0 turns Flow-Grad's cold start off,
    a positive value turns Flow-Lat's on; the value crosses xDS unchanged (0 included: proto3 presence)."""
    cfg = config_from_dict(minimal(endpoints=[{"name": "m", "match": {"prefix": "/"}, "policy": {"plugins": [
        {"type": "flow", "parameters": {"cost": cost, "warmup_s": warmup}}]}}]))
    assert cfg.endpoints[0].policy.to_core(cfg.probe).warmup_s == warmup
    msg = dr.routing_policy(cfg, cfg.endpoints[0])
    got, _, _ = dr.policy_from_pb(pb.RoutingPolicy.FromString(msg.SerializeToString()))
    assert got.warmup_s == warmup


def test_a_negative_cold_start_is_refused_with_its_field() -> None:
    from dlb.config import ConfigError

    with pytest.raises(ConfigError, match=r"warmup_s.*must be >= 0"):
        config_from_dict(minimal(endpoints=[{"name": "m", "match": {"prefix": "/"}, "policy": {"plugins": [
            {"type": "flow", "parameters": {"cost": "gradient", "warmup_s": -1}}]}}]))


def test_a_cold_start_no_root_service_will_run_is_warned_about() -> None:
    """Under the control plane, flow without affinity runs in Envoy (no picks, so no cold start): a set
    ``warmup_s`` there is said, as is one on a discrete endpoint; with affinity the root service picks."""
    from dlb.config.policy import unused_warmup_warning

    def cfg(affinity: bool, mechanism: str = "flow", warmup: float = 20.0) -> object:
        return config_from_dict(minimal(endpoints=[{"name": "m", "match": {"prefix": "/"}, "policy": {
            "mechanism": mechanism, "cost": "gradient", "flow": {"warmup_s": warmup}, "affinity": {"enabled": affinity}}}]))

    assert "endpoint(s) m" in (unused_warmup_warning(cfg(False)) or "")
    assert unused_warmup_warning(cfg(True)) is None
    assert unused_warmup_warning(cfg(False, warmup=0.0)) is None
    assert "endpoint(s) m" in (unused_warmup_warning(cfg(True, mechanism="discrete")) or "")


def test_a_cell_that_comes_back_gets_the_share_it_held_when_it_left() -> None:
    """A cell unusable for a while (its leaf agent dead: no probe answers) drops out of ``x``; when it
    answers again it starts from the share it held, not from 0. Before, the gradient step brought it back
    at the pace sized for the fixed point: in ``dlb bench faults`` (Flow-Grad) cell a was not back to
    80 % of its earlier share 15 s after the restore in 11 of 12 runs (research/operations.md)."""
    r = flow_router(warmup_s=0.0)
    t = 0.0
    while t < 10.0:  # a steady split with both cells in use
        probe(r, t, (30.0, 30.0))
        t = round(t + PERIOD, 9)
    held = float(r.x[0])
    assert 0.3 < held < 0.7
    while t < 20.0:  # cell a silent: stale after 1 s, out of the split
        r.on_probe(1, t, 30.0, P, seen_until=t)
        r.tick(t)
        t = round(t + PERIOD, 9)
    assert r.x[0] == 0.0
    probe(r, t, (0.0, 30.0))  # back, idle: one step later it carries about what it held
    assert r.x[0] >= 0.8 * held
    np.testing.assert_allclose(r.x.sum(), 1.0)
