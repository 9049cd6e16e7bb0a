"""The operator baselines as the real path serves them: root resources, hub-score's weights, and the
comparison's scenarios and summary (pure parts; the Envoy behaviour is in tests/e2e)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from dlb.config import load_config
from dlb.config.policy import set_plugins
from dlb.control_plane import envoy_resources as er
from dlb.control_plane.hub_score import HubScoreLoop
from dlb.core.router import NO_CELL
from dlb.envoy import bootstrap as envoy_bootstrap
from dlb.envoy.operator_pool import POOL_CLUSTER, pool_order
from dlb.load.generator import Result
from dlb.load.workload import WorkloadSpec, generate, with_phases
from dlb.testbed import compare
from dlb.testbed.scenarios import SCENARIOS, trial_seed

EXAMPLE = Path(__file__).resolve().parents[2] / "envoy_configs" / "dlb.example.yaml"


def config_with(tmp_path: Path, weights: str):
    raw = yaml.safe_load(EXAMPLE.read_text())
    set_plugins(raw, {"type": weights})
    path = tmp_path / "dlb.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_config(path)


def routes_and_clusters(boot: dict) -> tuple[list[dict], dict[str, dict], list[str]]:
    listener = boot["static_resources"]["listeners"][0]
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
    clusters = {c["name"]: c for c in boot["static_resources"]["clusters"]}
    return routes, clusters, [f["name"] for f in hcm["http_filters"]]


@pytest.mark.parametrize("kind", ["lr-global", "locality-failover", "hub-score"])
def test_operator_roots_have_no_ext_proc_and_one_fallback_route_per_endpoint(tmp_path, kind) -> None:
    cfg = config_with(tmp_path, kind)
    routes, clusters, filters = routes_and_clusters(envoy_bootstrap.root_bootstrap(cfg, "us-east1", admin_port=0))
    assert filters == ["envoy.filters.http.credential_injector", "envoy.filters.http.router"]  # the root token, no ext_proc
    assert [r["name"] for r in routes] == [n for ep in cfg.endpoints for n in
                                           [f"{ep.name}-to-{c}" for c in ("us-east1", "us-west1", "eu-west1")] + [f"{ep.name}-fallback"]]
    fallback = [r for r in routes if r["name"].endswith("-fallback")]
    if kind == "hub-score":
        assert all("weighted_clusters" in r["route"] for r in fallback) and POOL_CLUSTER not in clusters
        # What Envoy alone runs, as the control plane serves it: the bare cells, no cross-cell retry of DLB's.
        native = [r for r in routes_and_clusters(envoy_bootstrap.root_bootstrap(cfg, "us-east1", admin_port=0, native_flow=True))[0]
                  if r["name"].endswith("-fallback")]
        assert all(".or." not in c["name"] for r in native for c in r["route"]["weighted_clusters"]["clusters"])
        assert all("retry_policy" not in r["route"] for r in native)
    else:
        assert all(r["route"]["cluster"] == POOL_CLUSTER for r in fallback)
        assert clusters[POOL_CLUSTER]["lb_policy"] == "LEAST_REQUEST"
        assert clusters[POOL_CLUSTER]["outlier_detection"] == {}


def test_lr_global_pool_is_every_allowed_cell_weighted_by_replicas_in_one_priority(tmp_path) -> None:
    cfg = config_with(tmp_path, "lr-global")
    pool = routes_and_clusters(envoy_bootstrap.root_bootstrap(cfg, "us-east1", admin_port=0))[1][POOL_CLUSTER]
    groups = pool["load_assignment"]["endpoints"]
    assert [g["locality"]["zone"] for g in groups] == ["us-east1", "us-west1", "eu-west1"]
    assert [g["lb_endpoints"][0]["load_balancing_weight"] for g in groups] == [3, 2, 2]
    assert all("priority" not in g for g in groups)
    # Residency: eu-west1 may only send to itself.
    eu = routes_and_clusters(envoy_bootstrap.root_bootstrap(cfg, "eu-west1", admin_port=0))[1][POOL_CLUSTER]
    assert [g["locality"]["zone"] for g in eu["load_assignment"]["endpoints"]] == ["eu-west1"]


def test_locality_failover_priorities_are_home_then_by_rtt_and_survive_xds(tmp_path) -> None:
    cfg = config_with(tmp_path, "locality-failover")
    assert pool_order(cfg, "us-west1") == ["us-west1", "us-east1", "eu-west1"]  # 31 ms before 66 ms
    rs = er.root_resources(cfg, "us-west1")
    pool = next(c for c in rs.clusters if c.name == POOL_CLUSTER)
    assert pool.type == pool.EDS  # served over ADS like every other cluster
    cla = next(e for e in rs.endpoints if e.cluster_name == POOL_CLUSTER)
    assert [(g.locality.zone, g.priority) for g in cla.endpoints] == [("us-west1", 0), ("us-east1", 1), ("eu-west1", 2)]
    assert cla.policy.overprovisioning_factor.value == 140
    check = pool.health_checks[0]
    assert check.http_health_check.path == "/v1/" and check.no_traffic_interval.seconds == 1


def _topology(tmp_path):
    return config_with(tmp_path, "hub-score").topology()


def test_hub_score_weights_put_everything_on_the_best_cell_and_move_with_the_signals(tmp_path) -> None:
    topo = _topology(tmp_path)  # us-east1 (3), us-west1 (2), eu-west1 (2); eu-west1 may only reach itself
    hub = HubScoreLoop(topo, ["chat"], [0, 1, 2])
    assert hub.on_probe(0, rif=0, waiting=9.0, kv_usage=0.9, healthy=3) is True  # only us-east1 seen yet: it is best
    hub.on_probe(1, rif=0, waiting=0.0, kv_usage=0.1, healthy=2)
    hub.on_probe(2, rif=0, waiting=0.0, kv_usage=0.1, healthy=2)
    assert hub.best() == {0: 1, 1: 1, 2: 2}
    w = hub.weights()["chat"]
    assert np.array_equal(w[0], [0, 1, 0]) and np.array_equal(w[2], [0, 0, 1])
    # us-west1's queue fills: us-east1's requests go home again; eu-west1 keeps its only cell.
    assert hub.on_probe(1, rif=0, waiting=20.0, kv_usage=0.95, healthy=2) is True
    assert hub.best()[0] != 1 and hub.best()[2] == 2
    # Waiting unknown (-1): the RIF per healthy server stands in for the queue.
    hub.on_probe(0, rif=30.0, waiting=-1.0, kv_usage=0.5, healthy=3)
    assert hub.roots[0].queue[0] == pytest.approx(10.0)


def test_hub_score_without_a_usable_cell_falls_back_to_the_replica_split(tmp_path) -> None:
    topo = _topology(tmp_path)
    hub = HubScoreLoop(topo, ["chat"], [2])
    hub.on_probe(2, rif=0, waiting=0, kv_usage=0, healthy=0)  # eu-west1's only cell has no live server
    assert hub.best() == {2: NO_CELL}
    assert np.allclose(hub.weights()["chat"][2], [0, 0, 1])  # Envoy's route must still name a cluster
    assert hub.on_probe_failure(2) is False


def test_scenarios_fix_their_windows_and_refuse_a_run_too_short() -> None:
    assert SCENARIOS["cell-outage"].fault_window(60) == (18.0, 43.0)
    assert SCENARIOS["burst"].phase_window(60) == (18.0, 30.0, 0.75)
    start, length, extra = SCENARIOS["overload"].phase_window(100)  # 110 % = 95 % + 15 % from 40 % to 70 %
    assert (start, round(length, 6), extra) == (40.0, 30.0, 0.15)
    with pytest.raises(ValueError, match="--duration: scenario burst"):
        SCENARIOS["burst"].check(40)
    assert trial_seed(SCENARIOS["steady"], 2) == SCENARIOS["steady"].seed + 2000


def test_phases_add_requests_without_touching_the_base_workload() -> None:
    base = generate(WorkloadSpec(rate_rps=5, duration_s=20, sources={"a": 1}, seed=3))
    extra = WorkloadSpec(rate_rps=5, duration_s=5, sources={"a": 1}, seed=503)
    merged = with_phases(base, [(10.0, extra)])
    added = [r for r in merged if r not in base]
    assert len(merged) == len(base) + len(generate(extra)) and added
    assert all(10.0 <= r.t < 15.0 for r in added)
    assert all(r.session == "" or r.session.endswith("@10") for r in added)  # no session clashes with the base
    assert [r.t for r in merged] == sorted(r.t for r in merged)


def _res(i: int, status: int, latency: float, cell: str = "a") -> Result:
    return Result(i, float(i), "chat", "a", "", status, latency, latency / 2, 0.0, 1, f"{cell}/0" if status else "")


def test_a_failed_or_shed_request_counts_as_the_timeout() -> None:
    rs = [_res(0, 200, 1.0), _res(1, 200, 3.0), _res(2, 429, 0.01), _res(3, 0, 0.5)]
    rec = compare.record("steady", "p", 0, rs, ["a"], timeout_s=60.0)
    assert (rec["ok"], rec["shed"], rec["errors"]) == (2, 1, 1)
    assert rec["mean_s"] == pytest.approx((1 + 3 + 60 + 60) / 4)
    assert rec["served_mean_s"] == pytest.approx(2.0)


def test_summary_gives_the_ci_of_the_mean_over_trials_and_the_ratio_to_the_best_operator() -> None:
    def rec(policy: str, trial: int, mean: float) -> dict:
        return {"scenario": "steady", "policy": policy, "trial": trial, "mean_s": mean, "p90_s": 2 * mean, "ttft_p50_s": 0.1,
                "requests": 100, "errors": 1, "shed": 0}

    rows = compare.summarize([rec("lr-global", t, m) for t, m in enumerate([4.0, 5.0, 6.0])]
                             + [rec("hub-score", t, 3.0) for t in range(3)] + [rec("Flow-Grad", 0, 1.5)])
    lr, hub, flow = rows
    assert lr["mean_s"] == pytest.approx(5.0)
    assert lr["ci95_s"] == pytest.approx(4.302653 * 1.0 / math.sqrt(3), rel=1e-5)  # t(0.975, 2) · sd / √n
    assert hub["ci95_s"] == 0.0 and math.isnan(flow["ci95_s"])
    assert flow["vs_best_operator"] == pytest.approx(0.5) and lr["error_rate"] == pytest.approx(0.01)
    assert "| steady | Flow-Grad | 1 | 1.50 |" in compare.table(rows)


def test_compare_options_name_the_bad_one() -> None:
    ns = argparse.Namespace(quick=False, scenarios="steady,typo", policies=None, trials=3)
    with pytest.raises(ValueError, match="--scenarios: unknown 'typo'"):
        compare.plan(ns)
    with pytest.raises(ValueError, match="--policies: unknown 'nope'"):
        compare.plan(argparse.Namespace(quick=False, scenarios=None, policies="nope", trials=3))
    with pytest.raises(ValueError, match="--trials"):
        compare.plan(argparse.Namespace(quick=False, scenarios=None, policies=None, trials=0))
    assert compare.plan(argparse.Namespace(quick=True, scenarios=None, policies=None, trials=3)) == (
        ["steady"], list(compare.QUICK_POLICIES), 1)
