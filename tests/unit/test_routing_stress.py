"""The root router under stress: aversion that cannot herd or wind up the flow vector, a cost that
sees overflow, and a flow step sized for the servers' own queue dynamics."""

from __future__ import annotations

import numpy as np
import pytest

from dlb.core.aversion import AversionConfig, cap_to_headroom, fold_into_split
from dlb.core.costs import Cost, offered_inflation
from dlb.core.flow import FlowConfig, adapt_gain, lead_horizon
from dlb.core.latency_model import LatencyParams
from dlb.core.router import Mechanism, PolicyConfig, RootRouter
from dlb.core.topology import Topology

P = LatencyParams(a=1.0, b=0.05, c=8.0, s=1.0)  # capacity 20 req/s per cell


def two_cells() -> Topology:
    return Topology.build(["a", "b"], [4, 4], [[0.0, 0.01], [0.01, 0.0]])


def probe_all(r: RootRouter, now: float, rif: list[float], errors: list[float]) -> None:
    for j, (n, e) in enumerate(zip(rif, errors, strict=True)):
        r.on_probe(j, now, n, P, e, seen_until=now)


def test_headroom_cap_scales_rates_to_what_the_healthy_cells_can_take() -> None:
    rates = np.array([0.4, 0.2, 0.0])
    inflow = np.array([10.0, 10.0, 5.0])
    np.testing.assert_allclose(cap_to_headroom(rates, inflow, 100.0), rates)  # 6 req/s fit
    np.testing.assert_allclose(cap_to_headroom(rates, inflow, 3.0), rates * 0.5)
    np.testing.assert_allclose(cap_to_headroom(rates, inflow, 0.0), 0.0)


def test_fold_moves_the_averted_share_pro_rata_within_the_mask() -> None:
    x = np.array([0.5, 0.3, 0.2])
    out = fold_into_split(x, np.array([0.5, 0.0, 0.0]), np.array([True, True, False]))
    np.testing.assert_allclose(out, [0.25 / 0.55, 0.3 / 0.55, 0.0])
    np.testing.assert_allclose(fold_into_split(x, np.ones(3), np.ones(3, bool)), x)  # nothing left: unchanged


def test_offered_inflation_is_one_over_the_admitted_fraction_and_capped() -> None:
    assert offered_inflation(0.0) == 1.0
    assert offered_inflation(0.5) == pytest.approx(2.0)
    assert offered_inflation(1.0) == pytest.approx(10.0)
    assert offered_inflation(-0.1) == 1.0


def test_a_cell_rejecting_at_its_buffer_costs_more_than_an_equally_full_one_that_does_not() -> None:
    """Probed RIF is capped at the buffer: two cells at the cap look equal unless the rejections count."""
    r = RootRouter(two_cells(), 0, PolicyConfig(Mechanism.DISCRETE, Cost.RIF), P, np.random.default_rng(0))
    probe_all(r, 0.0, [40.0, 40.0], [0.5, 0.0])
    assert [r.pick(0.01) for _ in range(5)] == [1] * 5


def test_flow_aversion_lives_in_x_so_the_vector_is_the_split_served() -> None:
    """A failing cell loses share in x itself, and pick samples x without skipping averted cells: no
    hidden diversion for the flow integrator to wind up against."""
    pol = PolicyConfig(Mechanism.FLOW, Cost.RIF, aversion=AversionConfig(period_s=1.0))
    r = RootRouter(two_cells(), 0, pol, P, np.random.default_rng(0))
    now = 0.0
    while now < 5.0:  # cell b fails 30 % of its requests; the probed load stays the same
        probe_all(r, now, [10.0, 10.0], [0.0, 0.3])
        r.tick(now)
        now += 0.2
    assert r.aversion[1] > 0 and not r._aversion_on
    assert r.x[1] < 0.45
    probe_all(r, now, [10.0, 10.0], [0.0, 0.3])
    picks = np.array([r.pick(now) for _ in range(4000)])
    assert np.mean(picks == 1) == pytest.approx(r.x[1], abs=0.03)


def aversion_after(errors: list[float], rif: float, periods: int) -> np.ndarray:
    """The aversion rates of a discrete root over three equal cells probed with ``errors`` and ``rif``."""
    topo = Topology.build(["a", "b", "c"], [4, 4, 4], np.full((3, 3), 0.01) - 0.01 * np.eye(3))
    r = RootRouter(topo, 0, PolicyConfig(Mechanism.DISCRETE, Cost.LATENCY), P, np.random.default_rng(0))
    for k in range(periods):
        for j, e in enumerate(errors):
            r.on_probe(j, float(k), rif, P, e, seen_until=float(k))
        r.tick(float(k))
    return r.aversion


def test_when_every_cell_overflows_aversion_does_not_herd() -> None:
    """Every cell past capacity and failing about equally: nowhere to divert to, so no cell is averted
    (the old rule raised every rate but the best cell's toward the cap)."""
    np.testing.assert_allclose(aversion_after([0.20, 0.30, 0.32], 400.0, 10), 0.0)


def test_one_broken_cell_is_still_averted_when_the_others_have_room() -> None:
    rates = aversion_after([0.0, 0.0, 1.0], 10.0, 6)
    assert rates[2] == pytest.approx(0.9)
    assert rates[0] == rates[1] == 0.0


@pytest.mark.parametrize("relax", [False, True])
def test_flow_step_counts_the_queue_relaxation_time_in_its_delay(relax: bool) -> None:
    """A loaded cell's workload answers an inflow change with time constant 1/μ'(N): counted in τ̄, the
    first step from the same state is several times smaller than with the network delay alone."""
    moves = {}
    for flag in (False, True):
        pol = PolicyConfig(Mechanism.FLOW, Cost.LATENCY, flow=FlowConfig(relaxation_delay=flag))
        r = RootRouter(two_cells(), 0, pol, P, np.random.default_rng(0))
        probe_all(r, 0.0, [30.0, 14.0], [0.0, 0.0])
        x0 = r.x.copy()
        r.tick(0.0)
        moves[flag] = float(np.abs(r.x - x0).max())
    assert moves[True] > 0
    assert moves[True] * 3 < moves[False]


def test_adapt_gain_halves_on_a_reversal_and_regrows_while_the_direction_holds() -> None:
    cfg = FlowConfig()
    mask = np.array([True, True, False])
    gain, last = np.ones(3), np.array([1.0, 1.0, 1.0])
    gain, last = adapt_gain(gain, last, np.array([-0.1, 0.1, -0.1]), mask, cfg)
    np.testing.assert_allclose(gain, [0.5, 1.0, 1.0])  # cell 0 reversed; cell 2 is not in use
    gain, last = adapt_gain(gain, last, np.array([-0.1, 0.1, 0.0]), mask, cfg)
    np.testing.assert_allclose(gain, [0.5 * cfg.gain_up, 1.0, 1.0])
    for _ in range(20):
        gain, last = adapt_gain(gain, last, np.where(mask, -last, 0.0), mask, cfg)
    assert gain[0] == cfg.min_gain and gain[1] == cfg.min_gain


def test_flow_step_leads_a_rising_workload() -> None:
    """Two cells at the same probed RIF, one of them climbing: the step reads the climbing one as
    dearer (its queue will be longer by the time the move lands) and moves load off it. Without the
    lead the two look equal and x stays put."""
    moved = {}
    for lead in (0.0, 5.0):
        pol = PolicyConfig(Mechanism.FLOW, Cost.LATENCY, flow=FlowConfig(lead_s=lead))
        r = RootRouter(two_cells(), 0, pol, P, np.random.default_rng(0))
        probe_all(r, 0.0, [20.0, 30.0], [0.0, 0.0])
        r.tick(0.0)
        r.x = np.array([0.5, 0.5])
        probe_all(r, 0.2, [30.0, 30.0], [0.0, 0.0])
        r.tick(0.2)
        moved[lead] = float(r.x[0])
    assert moved[0.0] == pytest.approx(0.5, abs=0.005)
    assert moved[5.0] < 0.49


def test_lag_aware_lead_reaches_as_far_as_the_queue_is_slow_and_no_further() -> None:
    """lead_horizon: gain 0 is the fixed lead (capped at T); gain 1 is √(τ̄T/κ) within [lead_s, min(T, lead_max_s)]."""
    relax = np.array([2.0, 10.0, 1000.0, 1e6])
    np.testing.assert_allclose(lead_horizon(relax, 0.3, FlowConfig()), [2.0, 5.0, 5.0, 5.0])
    np.testing.assert_allclose(lead_horizon(relax, 0.3, FlowConfig(lead_gain=1.0)), [2.0, 5.0, np.sqrt(300.0), 60.0])


def test_lag_aware_lead_sheds_a_slow_climbing_cell_harder_and_leaves_a_flat_step_alone() -> None:
    """Both cells past saturation (T = 1/μ' of hundreds of seconds), cell 0 climbing: the lag-aware lead
    reads its trend further ahead than the fixed 5 s, so the step moves more load off it. With no trend
    the two rules take the same step: the step size itself is not touched, so shedding is not slowed."""
    moved = {}
    for gain in (0.0, 1.0):
        for start in (280.0, 300.0):  # climbing, flat
            pol = PolicyConfig(Mechanism.FLOW, Cost.LATENCY, flow=FlowConfig(lead_gain=gain))
            r = RootRouter(two_cells(), 0, pol, P, np.random.default_rng(0))
            probe_all(r, 0.0, [start, 300.0], [0.0, 0.0])
            r.tick(0.0)
            r.x = np.array([0.5, 0.5])
            probe_all(r, 0.2, [300.0, 300.0], [0.0, 0.0])
            r.tick(0.2)
            moved[gain, start] = float(r.x[0])
    assert moved[0.0, 280.0] < 0.5
    assert 0.5 - moved[1.0, 280.0] > 1.5 * (0.5 - moved[0.0, 280.0])  # lead √(0.21 s · 406 s) ≈ 9 s, not 5
    assert moved[1.0, 300.0] == pytest.approx(moved[0.0, 300.0], abs=1e-12)
