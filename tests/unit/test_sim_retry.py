"""The simulator's cross-cell retry (``SimConfig.cross_cell_retry``, ``dlb sim --retry``): a DLB root sends a
request a cell refused before serving it once more, to its fallback cell, as the root Envoy does."""

from __future__ import annotations

import numpy as np
import pytest

from dlb.sim.engine import SimConfig, simulate
from dlb.sim.scenario import Disruption, Scenario, Workload


def _far_cell_dies() -> Scenario:
    """Cells a and b, one batched server each, 0.5 s apart; every request starts at b, more than b's
    server serves alone, so b's root sends part of them to a. a's server is down from 30 to 60 s: what
    b's root sent there in the second before it heard finds no live server."""
    w = Workload(server_model="batched", decode_token_s=0.006, prefill_token_s=2e-5)
    two = np.array([2e-5, 2e-5])
    return Scenario(seed=9, names=("a", "b"), tau=np.array([[0.002, 0.5], [0.5, 0.002]]), servers=(1, 1),
                    prefill_token_s=two, decode_token_s=np.array([0.006, 0.006]), demand=np.array([0.0, 30.0]),
                    workload=w, utilization=0.5, duration_s=90.0, mod_amp=0.0, mod_period_s=np.array([100.0, 100.0]),
                    mod_phase=np.array([0.0, 0.0]), disruption=Disruption("outage", 30.0, 60.0, outage_servers=(0, 1)))


@pytest.mark.parametrize("policy", ["Disc-RIF", "Flow-Grad"])
def test_a_request_a_dead_cell_refused_is_served_by_the_fallback_cell(policy: str) -> None:
    sc = _far_cell_dies()
    off = simulate(sc, policy, 0, SimConfig(request_timeout_s=20.0, cross_cell_retry=False))
    on = simulate(sc, policy, 0, SimConfig(request_timeout_s=20.0, cross_cell_retry=True))
    assert off.retried == 0 and off.overflow > 0  # refused at a, lost
    assert on.retried == off.overflow and on.errors == 0  # each sent once more, to b, and served there
    assert on.summary()["client_failure_rate"] < off.summary()["client_failure_rate"]
    # The retried requests paid the way back to b's root and on to b (2 × 0.5 s at least) on top of serving.
    assert on.latency.size == on.arrivals and on.completed == on.arrivals
    assert on.rif_end.tolist() == [0, 0]
    assert on.summary()["retried_rate"] == pytest.approx(on.retried / on.arrivals)


@pytest.mark.parametrize("policy", ["Rand", "lr-global", "hub-score"])
def test_rand_and_the_operators_never_retry(policy: str) -> None:
    """Their real configurations have no retry policy: the switch changes nothing for them."""
    sc = _far_cell_dies()
    a = simulate(sc, policy, 0, SimConfig(request_timeout_s=20.0, cross_cell_retry=False))
    b = simulate(sc, policy, 0, SimConfig(request_timeout_s=20.0, cross_cell_retry=True))
    assert b.retried == 0 and (a.errors, a.completed) == (b.errors, b.completed)
    np.testing.assert_array_equal(a.latency, b.latency)
