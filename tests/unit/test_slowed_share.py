"""A flow cell whose model slowed and recovered gets back the share it held (dlb.core.slowed_share)."""

from __future__ import annotations

import numpy as np
import pytest

from dlb.core.background import capacity_floor
from dlb.core.costs import Cost
from dlb.core.flow import FlowConfig
from dlb.core.latency_model import LatencyParams
from dlb.core.router import Mechanism, PolicyConfig, RootRouter
from dlb.core.slowed_share import SlowedShareConfig, SlowedShares
from dlb.core.topology import Topology

FAST = LatencyParams(a=1.0, b=0.05, c=8.0, s=1.0)
SLOW = LatencyParams(a=8.0, b=0.4, c=8.0, s=1.0)  # the same servers 8x slower
PERIOD = 0.2


def test_a_slowed_cell_holds_its_peak_share_of_the_window_and_gets_it_back_when_it_recovers() -> None:
    cfg = SlowedShareConfig(ratio=2.0, recover_ratio=1.25, window_s=10.0, memory_s=600.0)
    m = SlowedShares(2, cfg)
    yes = np.array([True, True])
    assert m.observe(0.0, np.array([0.6, 0.4]), np.array([20.0, 20.0]), yes) is None
    # The queue shows first: the share falls while the model is still fast.
    assert m.observe(5.0, np.array([0.3, 0.7]), np.array([20.0, 20.0]), yes) is None
    # The refit: capacity 4 < 20/2 — slowed, holding 0.6 (the largest within 10 s), not 0.3.
    assert m.observe(6.0, np.array([0.2, 0.8]), np.array([4.0, 20.0]), yes) is None
    assert m.slowed[0] and m.held[0] == pytest.approx(0.6)
    # Partly back (12 < 20/1.25): still slowed.
    assert m.observe(20.0, np.array([0.05, 0.95]), np.array([12.0, 20.0]), yes) is None
    # Not measured (unusable, or a configured prior): neither remembered nor judged.
    assert m.observe(21.0, np.array([0.05, 0.95]), np.array([20.0, 20.0]), np.array([False, True])) is None
    shares = m.observe(22.0, np.array([0.05, 0.95]), np.array([19.0, 20.0]), yes)
    assert shares is not None and shares[0] == pytest.approx(0.6) and shares[1] == 0.0 and not m.slowed[0]
    assert m.observe(23.0, np.array([0.6, 0.4]), np.array([19.0, 20.0]), yes) is None  # given once


def test_a_prior_is_never_the_best_and_a_held_share_expires() -> None:
    cfg = SlowedShareConfig(window_s=5.0, memory_s=100.0)
    m = SlowedShares(1, cfg)
    # A configured prior promising 50 req/s, then a measured 10: not a slowdown.
    assert m.observe(0.0, np.array([1.0]), np.array([50.0]), np.array([False])) is None
    assert m.observe(1.0, np.array([1.0]), np.array([10.0]), np.array([True])) is None and not m.slowed[0]
    assert m.observe(2.0, np.array([1.0]), np.array([4.0]), np.array([True])) is None and m.slowed[0]
    assert m.observe(103.0, np.array([1.0]), np.array([4.0]), np.array([True])) is None and not m.slowed[0]
    with np.errstate(divide="ignore"):  # no model, no capacity
        assert np.isfinite(capacity_floor(np.array([1.0]), np.array([0.0]), np.array([0.0]))).sum() == 0


def test_config_is_checked() -> None:
    with pytest.raises(ValueError, match="recover_ratio"):
        SlowedShareConfig(ratio=2.0, recover_ratio=3.0)
    assert not SlowedShareConfig(ratio=0.0).enabled


def _router(slowed: SlowedShareConfig) -> RootRouter:
    topo = Topology.build(["a", "b"], [4, 4], [[0, 0.01], [0.01, 0]])
    pol = PolicyConfig(Mechanism.FLOW, Cost.GRADIENT, flow=FlowConfig(period_s=PERIOD, warmup_s=0.0, slowed_share=slowed))
    return RootRouter(topo, 0, pol, FAST, np.random.default_rng(0))


def _run(r: RootRouter, t0: float, t1: float, rif: tuple[float, float], model_a: LatencyParams) -> float:
    t = t0
    while t < t1:
        r.on_probe(0, t, rif[0], model_a, seen_until=t)
        r.on_probe(1, t, rif[1], FAST, seen_until=t)
        r.tick(t)
        t = round(t + PERIOD, 9)
    return t


@pytest.mark.parametrize("on", [True, False])
def test_a_cell_whose_model_recovers_gets_its_share_back_within_a_step(on: bool) -> None:
    """Cell a slows 8x (its queue grows, then its refitted model says so), its share drains; when its model
    is fast again both cells sit below their knees and only the round trip tells them apart, so the step
    alone gives the idle cell back almost nothing (the fault bench's Flow-Grad: ~0.001 a second)."""
    r = _router(SlowedShareConfig() if on else SlowedShareConfig(ratio=0.0))
    t = _run(r, 0.0, 10.0, (4.0, 4.0), FAST)
    held = float(r.x[0])
    assert held > 0.3
    t = _run(r, t, 15.0, (30.0, 4.0), FAST)  # the slowdown's queue, before the refit
    t = _run(r, t, 40.0, (30.0, 4.0), SLOW)  # the refit: a drains
    assert r.x[0] < 0.5 * held
    t = _run(r, t, t + PERIOD, (0.0, 6.0), FAST)  # recovered and idle
    if on:
        assert r.x[0] >= 0.8 * held
    else:
        assert r.x[0] < 0.5 * held
    np.testing.assert_allclose(r.x.sum(), 1.0)


def test_a_reconfiguration_keeps_the_memory_of_the_cells_it_keeps() -> None:
    """``RootRouter.carry_over`` (a config change builds new routers) hands each kept cell's memory to its new index."""
    old = SlowedShares(2)
    yes = np.array([True, True])
    old.observe(0.0, np.array([0.6, 0.4]), np.array([20.0, 20.0]), yes)
    old.observe(1.0, np.array([0.6, 0.4]), np.array([4.0, 20.0]), yes)  # cell 0 slowed, holding 0.6
    new = SlowedShares(3)
    new.adopt(old, [(0, 2), (1, 0)])  # old cell 0 is new cell 2
    assert new.slowed[2] and new.held[2] == pytest.approx(0.6) and not new.slowed[0]
    shares = new.observe(2.0, np.array([0.3, 0.3, 0.4]), np.array([20.0, 20.0, 19.0]), np.array([True, True, True]))
    assert shares is not None and shares[2] == pytest.approx(0.6)
