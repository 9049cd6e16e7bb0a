"""Rand and MNLB baselines."""

from __future__ import annotations

import numpy as np
import pytest

from dlb.core.baselines import WeightedRouter, mnlb_solve, rand_weights, without_dead_cells
from dlb.core.topology import Topology


def test_rand_weights_by_replicas_on_allowed_arcs() -> None:
    t = Topology.build(["a", "b", "c"], [1, 3, 6], np.zeros((3, 3)), [[1, 1, 0], [1, 1, 1], [0, 0, 1]])
    w = rand_weights(t)
    np.testing.assert_allclose(w[0], [0.25, 0.75, 0])
    np.testing.assert_allclose(w[1], [0.1, 0.3, 0.6])
    np.testing.assert_allclose(w[2], [0, 0, 1])


def test_mnlb_keeps_local_when_capacity_allows() -> None:
    t = Topology.build(["a", "b"], [1, 1], [[0, 0.05], [0.05, 0]])
    y = mnlb_solve(t, np.array([10.0, 10.0]), np.array([100.0, 100.0]))
    np.testing.assert_allclose(y, np.eye(2), atol=1e-9)


def test_mnlb_respects_capacity_and_minimises_network_cost() -> None:
    t = Topology.build(["a", "b", "c"], [1, 1, 1], [[0, 0.01, 0.1], [0.01, 0, 0.1], [0.1, 0.1, 0]])
    lam = np.array([90.0, 10.0, 10.0])
    cap = np.array([50.0, 100.0, 100.0])
    y = mnlb_solve(t, lam, cap, rho=0.8)
    load = lam @ y
    assert np.all(load <= 0.8 * cap + 1e-6)
    np.testing.assert_allclose(y.sum(axis=1), 1.0)
    # Cell a overflows to the nearest cell b, not c.
    assert y[0, 1] > 0.5 and y[0, 2] < 1e-9
    # By hand: a keeps 0.8·50 = 40 of its 90 req/s and sends the other 50 to b at τ = 10 ms.
    assert lam[0] * (t.tau[0] @ y[0]) == pytest.approx(50 * 0.01, abs=1e-9)


def test_mnlb_overload_uses_slack_not_failure() -> None:
    t = Topology.build(["a", "b"], [1, 1], [[0, 0.05], [0.05, 0]], [[1, 0], [1, 1]])
    y = mnlb_solve(t, np.array([500.0, 1.0]), np.array([10.0, 10.0]))
    np.testing.assert_allclose(y[0], [1.0, 0.0])  # residency: a can only use a


def test_weighted_router_samples_weights() -> None:
    r = WeightedRouter(np.array([0.2, 0.0, 0.8]), np.random.default_rng(0))
    counts = np.bincount([r.pick(0.0) for _ in range(5000)], minlength=3) / 5000
    np.testing.assert_allclose(counts, [0.2, 0.0, 0.8], atol=0.02)
    with pytest.raises(ValueError):
        r.set_weights(np.zeros(3))


@pytest.mark.parametrize("seed", range(5))
def test_weighted_router_picks_the_cell_numpy_searchsorted_picks(seed: int) -> None:
    """The per-request pick bisects a Python list; it must name the cell the cumulative-weight rule
    (numpy searchsorted, side right) names for the same draw, zero weights and the last cell included,
    or every Rand and MNLB result would change."""
    gen = np.random.default_rng(seed)
    w = gen.random(7) * (gen.random(7) > 0.3)
    w[gen.integers(7)] += 0.1  # at least one positive weight
    router = WeightedRouter(w, np.random.default_rng(seed))
    twin = np.random.default_rng(seed)
    cum = np.cumsum(router.weights)
    for _ in range(2000):
        j = int(np.searchsorted(cum, twin.random() * cum[-1], side="right"))
        assert router.pick(0.0) == min(j, cum.shape[0] - 1)


def test_a_cell_without_capacity_gets_no_share_even_from_a_source_without_demand() -> None:
    t = Topology.build(["a", "b", "c"], [2, 2, 2], [[0, 0.01, 0.02], [0.01, 0, 0.01], [0.02, 0.01, 0]])
    cap = np.array([10.0, 0.0, 10.0])
    y = without_dead_cells(t, mnlb_solve(t, np.array([0.0, 4.0, 4.0]), cap), cap, np.full((3, 3), 1 / 3))
    np.testing.assert_array_equal(y[:, 1], 0.0)
    np.testing.assert_allclose(y.sum(axis=1), 1.0)
    # A row the LP put entirely on the dead cell falls back to the usable allowed cells by replicas.
    only_b = np.array([[0.0, 1.0, 0.0]] * 3)
    np.testing.assert_allclose(without_dead_cells(t, only_b, cap, only_b)[0], [0.5, 0.0, 0.5])


def test_the_simulated_mnlb_stops_sending_to_a_cell_whose_servers_are_all_down() -> None:
    """As the control plane's loop: capacity × the leaf's healthy fraction, so after the first solve in
    an outage the dead cell gets nothing (the simulator used the model's capacity alone: 15.7 % of
    the cell-outage twin's requests failed, against Rand's 5.7 %)."""
    from dataclasses import replace

    from dlb.sim.engine import SimConfig, simulate
    from dlb.sim.scenario import Disruption, generate

    sc = generate(11, duration_s=60, utilization=0.6)
    down = tuple(0 if j == 0 else k for j, k in enumerate(sc.servers))
    sc = replace(sc, disruption=Disruption("outage", 12.0, 45.0, outage_servers=down))
    cfg = SimConfig(mnlb_period_s=5.0)
    res = simulate(sc, "MNLB", config=cfg)
    t, routed = res.arrival_t, res.routed
    late = (t >= 20.0 + 0.5) & (t < 45.0)  # after the first solve that saw the outage (at 15 or 20 s)
    assert late.sum() > 50
    assert (routed[late] == 0).sum() == 0
    before = (t >= 5.5) & (t < 12.0)
    assert (routed[before] == 0).sum() > 0  # the cell did get traffic while it was up
