"""The policy surface: every routing knob a ``{type, parameters}`` entry resolved through one registry.

In-process: the config checks, the registry, the moved flags' errors, the ``dlb.v1.LeafPolicy``
resource and a leaf applying a new pick rule.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import yaml
from test_config import minimal, problems_of

from dlb.cli import main
from dlb.config import ConfigError, Cost, Mechanism, config_from_dict, parse_config
from dlb.config import resources as dr
from dlb.config.model import DeploymentPolicy, LeafPolicy, Policy, ProbeParams
from dlb.config.policy import DEPLOYMENT, ENDPOINT, REGISTRY, policy_plugins, set_plugins
from dlb.core.shedding import ShedConfig
from dlb.ext_proc.leaf_setup import state_from_config
from dlb.proto import resources_pb2 as pb

FULL = {
    "apiVersion": "dlb.v1",
    "plugins": [
        {"type": "rif", "parameters": {"choices": 3}},
        {"type": "latency-fit", "parameters": {"window_s": 10, "refit_period_s": 1}},
        {"type": "background-probe", "parameters": {"min_interval_ms": 500, "max_interval_ms": 5000, "budget": 0.01,
                                                    "max_tokens": 30, "model": "m"}},
        {"type": "mnlb", "parameters": {"period_s": 5, "rho": 0.9}},
    ],
}


def test_no_policy_section_is_the_old_behaviour() -> None:
    cfg = config_from_dict(minimal())
    assert cfg.policy == DeploymentPolicy()
    assert (cfg.policy.leaf.pick, cfg.policy.leaf.pick_params.choices, cfg.policy.weights) == ("prequal", 2, "flow-routers")


def test_every_deployment_knob_is_read_from_the_plugins() -> None:
    pol = config_from_dict(minimal(policy=FULL)).policy
    assert pol.api_version == "dlb.v1"
    assert (pol.leaf.pick, pol.leaf.pick_params.choices) == ("rif", 3)
    assert (pol.leaf.fit.window_s, pol.leaf.fit.refit_period_s) == (10.0, 1.0)
    bg = pol.leaf.background_probe
    assert (bg.min_interval_ms, bg.max_interval_ms, bg.budget, bg.max_tokens, bg.model) == (500.0, 5000.0, 0.01, 30, "m")
    assert (pol.weights, pol.mnlb.period_s, pol.mnlb.rho) == ("mnlb", 5.0, 0.9)


def test_registry_types_have_defaults_and_a_scope() -> None:
    for t in REGISTRY.values():
        assert t.scope in (DEPLOYMENT, ENDPOINT)
        t.params()  # every parameter has a default
    slots = {t.slot for t in REGISTRY.values()}
    assert {"leaf.pick", "leaf.fit", "leaf.background-probe", "leaf.admission", "weights", "mechanism", "aversion", "affinity",
            "shed"} == slots


OLD = {"mechanism": "flow", "cost": "gradient", "flow": {"period_ms": 100, "kappa": 0.5},
       "aversion": {"enabled": False, "margin": 0.05}, "affinity": {"enabled": True, "header": "x-user", "ttl_s": 30}}
NEW = {"plugins": [{"type": "flow", "parameters": {"cost": "gradient", "period_ms": 100, "kappa": 0.5}},
                   {"type": "aversion", "parameters": {"enabled": False, "margin": 0.05}},
                   {"type": "affinity", "parameters": {"enabled": True, "header": "x-user", "ttl_s": 30}}]}


def _endpoint_policy(policy: dict[str, Any]) -> Policy:
    return config_from_dict(minimal(endpoints=[{"name": "m", "match": {"prefix": "/"}, "policy": policy}])).endpoints[0].policy


def test_old_endpoint_shape_and_plugins_shape_give_the_same_policy() -> None:
    old, new = _endpoint_policy(OLD), _endpoint_policy(NEW)
    assert old == new
    assert (new.mechanism, new.cost, new.flow.period_ms, new.aversion.enabled, new.affinity.header) == (
        Mechanism.FLOW, Cost.GRADIENT, 100.0, False, "x-user")
    assert _endpoint_policy({"plugins": policy_plugins(old)}) == old  # the shown form loads back
    assert _endpoint_policy({"plugins": []}) == Policy()  # every slot at its default


def test_policy_problems_name_path_and_line() -> None:
    doc = minimal(policy={"apiVersion": "dlb.v2", "plugins": [
        {"type": "prequel"},
        {"type": "prequal", "parameters": {"choices": 0}},
        {"type": "rif"},
        {"type": "aversion"},
        {"type": "latency-fit", "parameters": {"window": 5}},
    ]})
    found = problems_of(yaml.safe_dump(doc, sort_keys=False))
    paths = {p: (r, line) for p, r, line in found}
    assert "not supported" in paths["policy.apiVersion"][0]
    assert "did you mean 'prequal'" in paths["policy.plugins[0].type"][0]
    assert "must be >= 1" in paths["policy.plugins[1].parameters.choices"][0]
    assert "already set by policy.plugins[1]" in paths["policy.plugins[2].type"][0]
    assert "endpoints[].policy.plugins" in paths["policy.plugins[3].type"][0]
    assert "did you mean 'window_s'" in paths["policy.plugins[4].parameters.window"][0]
    assert all(line is not None for _, line in paths.values())


def test_policy_needs_an_api_version_and_endpoint_plugins_do_not_mix_with_old_keys() -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict(minimal(policy={"plugins": []}))
    assert [p.path for p in info.value.problems] == ["policy.apiVersion"]
    bad = {"plugins": [{"type": "discrete"}, {"type": "rif"}], "cost": "rif"}
    with pytest.raises(ConfigError) as info:
        config_from_dict(minimal(endpoints=[{"name": "m", "match": {"prefix": "/"}, "policy": bad}]))
    got = {p.path: p.reason for p in info.value.problems}
    assert "cannot be mixed with plugins" in got["endpoints[0].policy.cost"]
    assert "policy.plugins" in got["endpoints[0].policy.plugins[1].type"]


def test_set_plugins_replaces_the_slot() -> None:
    raw = minimal(policy=copy.deepcopy(FULL))
    set_plugins(raw, {"type": "prequal", "parameters": {"choices": 8}}, {"type": "flow-routers"})
    pol = config_from_dict(raw).policy
    assert (pol.leaf.pick, pol.leaf.pick_params.choices, pol.weights) == ("prequal", 8, "flow-routers")
    assert pol.leaf.fit.window_s == 10.0  # other slots kept


@pytest.mark.parametrize(("argv", "where"), [
    (["serve", "leaf", "--config", "x.yaml", "--cell", "a", "--pick", "rif"], "[{type: rif}]"),
    (["serve", "leaf", "--config", "x.yaml", "--cell", "a", "--choices", "4"], "parameters.choices"),
    (["serve", "leaf", "--config", "x.yaml", "--cell", "a", "--window-s", "10"], "latency-fit"),
    (["serve", "leaf", "--config", "x.yaml", "--cell", "a", "--background-probe-min-interval-ms", "0"], "background-probe"),
    (["serve", "control-plane", "--config", "x.yaml", "--mnlb"], "{type: mnlb}"),
])
def test_a_removed_routing_flag_says_where_the_knob_lives(argv: list[str], where: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "is no longer a flag" in err and where in err and "policy" in err


def test_leaf_policy_resource_round_trips_and_bad_values_are_refused() -> None:
    cfg = config_from_dict(minimal(policy=FULL))
    msg = dr.leaf_policy(cfg)
    assert dr.leaf_policy_from_pb(msg) == cfg.policy.leaf
    assert dr.leaf_policy_from_pb(dr.leaf_policy(config_from_dict(minimal()))) == LeafPolicy()
    for field, value in (("pick", "random"), ("choices", 0), ("window_s", 0.0), ("api_version", "dlb.v2"),
                         ("background_budget", 2.0), ("refit_period_s", float("nan"))):
        bad = pb.LeafPolicy()
        bad.CopyFrom(msg)
        setattr(bad, field, value)
        with pytest.raises(dr.ResourceError):
            dr.leaf_policy_from_pb(bad)


def _big_then_small(state: Any) -> list[int]:
    """One long request, then five short ones: RIF balances counts, Prequal keeps off the long one's server."""
    state.pick(0.0, "big", 400_000)
    for k in range(1, 6):
        state.pick(0.01 * k, f"s{k}", 40)
    return [s.rif for s in state.servers]


def two_server_config(plugins: list[dict[str, Any]]) -> Any:
    doc = minimal()
    doc["cells"][1]["servers"] = ["127.0.0.1:8020", "127.0.0.1:8021"]
    return config_from_dict(set_plugins(doc, *plugins))


def test_the_pick_rule_decides_the_picks_and_set_policy_switches_it() -> None:
    prequal = state_from_config(two_server_config([{"type": "prequal"}]), "b", seed=0, pick_rule="prequal")
    rif = state_from_config(two_server_config([{"type": "rif"}]), "b", seed=0, pick_rule="rif")
    assert _big_then_small(prequal) == [1, 5]
    assert _big_then_small(rif) == [3, 3]
    switched = state_from_config(two_server_config([]), "b", seed=0, pick_rule="prequal")
    switched.set_policy("rif", 2, 10.0, 1.0)
    assert _big_then_small(switched) == [3, 3]
    assert switched.estimator.config.window_s == 10.0 and switched.estimator.config.refit_period_s == 1.0
    with pytest.raises(ValueError):
        switched.set_policy("random", 2, 10.0, 1.0)
    assert switched.pick_rule == "rif"


def test_leaf_xds_refuses_a_policy_it_cannot_apply_and_keeps_its_rule() -> None:
    from dlb.ext_proc.leaf_xds import LeafXdsSync
    from dlb.xds.client import ResourceValidationError

    cfg = two_server_config([])
    state = state_from_config(cfg, "b", seed=0, pick_rule="prequal")
    sync = LeafXdsSync(state, "127.0.0.1:1", "b")  # never started: the handler alone
    bad = dr.leaf_policy(cfg)
    bad.pick = "random"
    with pytest.raises(ResourceValidationError):
        sync._on_policy({"b": bad})
    assert state.pick_rule == "prequal"
    sync._on_policy({"b": dr.leaf_policy(two_server_config([{"type": "rif", "parameters": {"choices": 2}}]))})
    assert state.pick_rule == "rif" and sync.updates == 1


def test_parse_config_reports_policy_lines() -> None:
    text = yaml.safe_dump(minimal(policy={"apiVersion": "dlb.v1", "plugins": [{"type": "mnlb", "parameters": {"rho": 3}}]}),
                          sort_keys=False)
    with pytest.raises(ConfigError) as info:
        parse_config(text, "t.yaml")
    (p,) = info.value.problems
    assert p.path == "policy.plugins[0].parameters.rho"
    assert p.line == 1 + next(i for i, line in enumerate(text.splitlines()) if line.strip() == "rho: 3")


def test_demo_writes_its_leaf_and_mnlb_knobs_into_the_config(tmp_path: Any) -> None:
    """What the demo once passed as flags (--refit-period-s 1 --window-s 10, --mnlb) is in the file it writes."""
    import argparse

    from dlb.cli import build_parser
    from dlb.config import load_config
    from dlb.testbed.demo import prepare

    args = build_parser().parse_args(["demo", "--out", str(tmp_path)])
    _, _, path = prepare(args, tmp_path / "dlb")
    pol = load_config(path).policy
    assert (pol.leaf.fit.window_s, pol.leaf.fit.refit_period_s, pol.weights) == (10.0, 1.0, "flow-routers")
    _, _, path = prepare(argparse.Namespace(**{**vars(args), "weights": "mnlb"}), tmp_path / "mnlb")
    assert load_config(path).policy.weights == "mnlb"
    _, _, path = prepare(argparse.Namespace(**{**vars(args), "weights": "hub-score"}), tmp_path / "hub")
    assert load_config(path).policy.weights == "hub-score"


def test_the_control_planes_weight_source_follows_the_config_and_a_reload() -> None:
    """``mnlb`` and ``rand`` plugins pick the fail-open weights' source; a reload switches it (was --mnlb, a restart)."""
    import asyncio

    from dlb.control_plane.service import ControlPlane

    flow = [{"name": "m", "match": {"prefix": "/"}, "policy": {"plugins": [{"type": "flow"}]}}]

    def cfg(*plugins: dict[str, Any]) -> Any:
        doc = minimal(endpoints=flow)
        doc["cells"][0]["root"] = {"address": "127.0.0.1:10001"}
        return config_from_dict(set_plugins(doc, *plugins) if plugins else doc)

    async def scenario() -> None:
        cp = ControlPlane(cfg(), probe=False, flow_loop=False)
        assert cp.mnlb is None
        cp.reload(cfg({"type": "mnlb", "parameters": {"period_s": 3, "rho": 0.5}}))
        assert cp.mnlb is not None and (cp.mnlb.period_s, cp.mnlb.rho) == (3.0, 0.5) and not cp.weights_frozen
        cp.reload(cfg({"type": "rand"}))
        assert cp.mnlb is not None and cp.weights_frozen
        assert cp.mnlb.weights()["m"][0].tolist() == pytest.approx([1 / 3, 2 / 3])  # replica split: a has 1, b 2
        cp.reload(cfg({"type": "flow-routers"}))
        assert cp.mnlb is None

    asyncio.run(scenario())


def test_shedding_is_on_by_default_a_plugin_switches_it_and_xds_carries_it() -> None:
    """The ``shed`` endpoint plugin: default on (no plugin, the old shape, an older control plane's
    resource without the message); ``enabled: false`` reaches the root's router, by file and over xDS."""
    assert _endpoint_policy({"plugins": []}).to_core(ProbeParams()).shed.enabled
    assert _endpoint_policy(OLD).shed.enabled
    off = _endpoint_policy({"plugins": [{"type": "shed", "parameters": {"enabled": False, "near_fill": 0.8}}]})
    core = off.to_core(ProbeParams())
    assert not core.shed.enabled and core.shed.near_fill == 0.8
    cfg = config_from_dict(minimal(endpoints=[{"name": "m", "match": {"prefix": "/"}, "policy": {"plugins": [
        {"type": "shed", "parameters": {"enabled": False, "max_age_ms": 200}}]}}]))
    msg = dr.routing_policy(cfg, cfg.endpoints[0])
    got, _, _ = dr.policy_from_pb(pb.RoutingPolicy.FromString(msg.SerializeToString()))
    assert not got.shed.enabled and got.shed.max_age_s == 0.2
    msg.ClearField("shed")  # a control plane from before the plugin
    assert dr.policy_from_pb(msg)[0].shed == ShedConfig()


def test_native_discrete_does_not_shed_and_says_so() -> None:
    """No root ext_proc, so nothing sheds: an explicit shed plugin was accepted and ignored; now refused by
    path, and the model says shed off (its shown form loads back). With affinity the ext_proc stays, and sheds."""
    native = {"type": "native-discrete", "parameters": {"cost": "latency"}}
    assert not _endpoint_policy({"plugins": [native]}).shed.enabled
    shown = policy_plugins(_endpoint_policy({"plugins": [native]}))
    assert not _endpoint_policy({"plugins": shown}).shed.enabled  # the shown form loads back
    doc = minimal(endpoints=[{"name": "m", "match": {"prefix": "/"}, "policy": {"plugins": [
        native, {"type": "shed", "parameters": {"enabled": True}}]}}])
    paths = {p: r for p, r, _ in problems_of(yaml.safe_dump(doc, sort_keys=False))}
    assert list(paths) == ["endpoints[0].policy.plugins[1]"] and "shed needs the root ext_proc" in paths["endpoints[0].policy.plugins[1]"]
    sticky = {"type": "affinity", "parameters": {"enabled": True, "header": "x-session"}}
    assert _endpoint_policy({"plugins": [native, sticky]}).shed.enabled


def test_a_malformed_shed_plugin_names_the_field_and_the_file() -> None:
    doc = minimal(endpoints=[{"name": "m", "match": {"prefix": "/"}, "policy": {"plugins": [
        {"type": "shed", "parameters": {"enabled": "yes", "fill": 0.5, "near_fill": 0.9, "min_error_rate": 0, "max_age": 1}}]}}])
    paths = {p: r for p, r, _ in problems_of(yaml.safe_dump(doc, sort_keys=False))}
    base = "endpoints[0].policy.plugins[0].parameters"
    assert set(paths) == {f"{base}.enabled", f"{base}.near_fill", f"{base}.min_error_rate", f"{base}.max_age"}, paths
    assert "must be <= fill=0.5" in paths[f"{base}.near_fill"] and "did you mean 'max_age_ms'" in paths[f"{base}.max_age"]


def test_the_deadline_is_the_endpoints_timeout_and_a_plugin_parameter_switches_it() -> None:
    """Deadline shedding compares with the endpoint's ``timeout_s`` (0: none), by file and over xDS;
    off by default (an older control plane's resource too), ``deadline: true`` turns it on."""
    def endpoint(timeout_s: float, **shed: object) -> dict:
        return {"name": "m", "match": {"prefix": "/"}, "timeout_s": timeout_s,
                "policy": {"plugins": [{"type": "shed", "parameters": shed}] if shed else []}}

    for timeout_s, want in ((45.0, 45.0), (0.0, math.inf)):
        cfg = config_from_dict(minimal(endpoints=[endpoint(timeout_s, deadline=True)]))
        ep = cfg.endpoints[0]
        assert ep.policy.to_core(cfg.probe, ep.timeout_s).shed.deadline_s == want
        got, _, _ = dr.policy_from_pb(pb.RoutingPolicy.FromString(dr.routing_policy(cfg, ep).SerializeToString()))
        assert got.shed.deadline and got.shed.deadline_s == want
    cfg = config_from_dict(minimal(endpoints=[endpoint(45.0)]))
    msg = dr.routing_policy(cfg, cfg.endpoints[0])
    got, _, _ = dr.policy_from_pb(msg)
    assert not got.shed.deadline and got.shed.enabled and got.shed.deadline_s == 45.0
    msg.ClearField("shed")
    assert not dr.policy_from_pb(msg)[0].shed.deadline
