"""The operator baselines run end to end in the simulator, through its root hooks."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from dlb.sim.engine import SimConfig, simulate
from dlb.sim.policies import BASELINES, DEFAULT_POLICIES, OPERATOR_BASELINES, build_roots
from dlb.sim.scenario import Scenario, generate


def easy(server_model: str) -> Scenario:
    """Every cell's own demand at 40 % of its capacity: no policy needs to lose a request."""
    sc = generate(3, duration_s=30.0, server_model=server_model)
    return replace(sc, demand=0.4 * sc.capacity())


@pytest.mark.parametrize("server_model", ["pipeline", "batched"])
@pytest.mark.parametrize("policy", OPERATOR_BASELINES)
def test_each_operator_baseline_loses_no_request_on_an_easy_scenario(policy: str, server_model: str) -> None:
    sc = easy(server_model)
    for root_replicas in (1, 2):
        res = simulate(sc, policy, 0, SimConfig(root_replicas=root_replicas))
        assert res.arrivals > 300
        assert res.errors == 0 and res.in_flight == 0 and res.completed == res.arrivals
        assert res.per_cell_served.sum() == res.completed
        rand = simulate(sc, "Rand", 0, SimConfig(root_replicas=root_replicas))
        assert res.latency.mean() < 1.5 * rand.latency.mean()


def test_locality_failover_keeps_traffic_local_when_healthy_and_lr_global_spreads_it() -> None:
    sc = easy("pipeline")
    local = simulate(sc, "locality-failover", 0)
    assert local.net_mean < 1e-3 + 2 * float(np.diag(sc.tau).max())  # every request served at home
    spread = simulate(sc, "lr-global", 0)
    share = spread.per_cell_served / spread.per_cell_served.sum()
    np.testing.assert_allclose(share, np.asarray(sc.servers) / sum(sc.servers), atol=0.05)  # one pool of servers


def test_lr_global_stops_sending_to_servers_an_outage_took_down() -> None:
    """Named servers that are down fail the request (connection refused) until the next probe
    tells the root's health check; that is a handful of requests, not the outage's share."""
    sc = generate(2, duration_s=60.0, disruption="outage", utilization=0.5)
    res = simulate(sc, "lr-global", 0)
    assert res.completed + res.errors == res.arrivals
    assert res.errors / res.arrivals < 0.01


def test_operator_baselines_are_baselines_run_by_default_on_the_batched_server() -> None:
    """``dlb sim`` with no options runs every policy, the operator baselines included, on the batched
    server; ``--server-model pipeline`` and a baseline name in ``--policies`` parse."""
    from dlb.cli import build_parser

    assert set(OPERATOR_BASELINES) <= set(BASELINES)
    assert set(OPERATOR_BASELINES) <= set(DEFAULT_POLICIES)
    args = build_parser(["sim"]).parse_args(["sim"])
    assert args.server_model == "batched"
    assert set(args.policies.split(",")) == set(DEFAULT_POLICIES) >= {"Rand", "Flow-Grad", "hub-score"}
    args = build_parser(["sim"]).parse_args(["sim", "--server-model", "pipeline", "--policies", "Rand,lr-global"])
    assert args.server_model == "pipeline" and args.policies == "Rand,lr-global"


def test_every_reply_reaches_the_root_that_sent_the_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """lr-global's active counts are per root: each root hears back about exactly its own requests,
    so after the drain every count is back to zero, overflowed requests included."""
    from dlb.sim import engine

    built: list = []

    def spy(*args: object, **kwargs: object) -> list:
        roots = build_roots(*args, **kwargs)  # type: ignore[arg-type]
        built.extend(roots)
        return roots

    monkeypatch.setattr(engine, "build_roots", spy)
    sc = generate(11, utilization=1.1, duration_s=15.0)
    sc = replace(sc, workload=replace(sc.workload, queue_limit=2))
    res = simulate(sc, "lr-global", 0, SimConfig(root_replicas=2))
    assert res.errors > 0 and res.in_flight == 0
    assert len(built) == 2 * sc.n
    assert all(a == 0 for root in built for a in root.active)
    ejected = sum(root.health.outliers.mult[h] > 0 for root in built for h in range(len(root.active)))
    assert ejected > 0  # overflow 5xx replies drove outlier detection
