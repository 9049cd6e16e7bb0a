"""The gradient cost's floor on 1 − ρ read from the spread of each cell's recent models."""

from __future__ import annotations

import numpy as np
import pytest

from dlb.core.costs import Cost
from dlb.core.grad_floor import GradFloorConfig, ModelSpread, headroom
from dlb.core.latency_model import GRAD_MAX_RHO, LatencyParams, d_latency, inv_marginal_rate, latency
from dlb.core.router import Mechanism, PolicyConfig, RootRouter
from dlb.core.topology import Topology

#: A cell near its stability boundary (a/b = 20, knee at 19.5): at N = 40, 1 − ρ ≈ 0.012.
NEAR = LatencyParams(a=1.0, b=0.05, c=19.5, s=0.5)
N = 40.0


def test_headroom_is_one_minus_rho_of_the_vectorised_model() -> None:
    a, b, c, s = NEAR.as_array()
    ell = latency(N, a, b, c, s)
    want = float((ell - N * d_latency(N, a, b, c, s)) / ell)
    assert headroom(N, a, b, c, s) == pytest.approx(want, rel=1e-12)
    assert 0.005 < want < 0.05  # the regime the fixed floor cuts off


def test_models_that_do_not_move_reach_the_low_floor_after_one_window() -> None:
    cfg = GradFloorConfig(enabled=True)
    sp = ModelSpread(1, cfg)
    for k in range(int(cfg.window_s)):
        sp.observe(0, float(k), *NEAR.as_array())
        assert sp.floor(0, N) == cfg.max_floor  # not yet observed for a window
    sp.observe(0, cfg.window_s, *NEAR.as_array())
    assert sp.floor(0, N) == cfg.min_floor


def test_a_dithering_fit_keeps_z_standard_deviations_clipped_to_the_fixed_floor() -> None:
    cfg = GradFloorConfig(enabled=True, z=2.0)
    a, b, c, s = NEAR.as_array()
    small = ModelSpread(1, cfg)
    large = ModelSpread(1, cfg)
    us = []
    for k in range(int(cfg.window_s) + 1):  # a refit every second
        da = 0.01 * (k % 3)
        small.observe(0, float(k), a + da, b, c, s)
        if k > cfg.window_s - cfg.models:
            us.append(headroom(N, a + da, b, c, s))
        large.observe(0, float(k), a * (1.3 if k % 2 else 0.8), b, c, s)
    sd = float(np.std(us, ddof=1))
    assert small.floor(0, N) == pytest.approx(2.0 * sd, rel=1e-9)  # over the newest 16 models
    assert cfg.min_floor < small.floor(0, N) < cfg.max_floor
    assert large.floor(0, N) == cfg.max_floor


def test_a_fit_that_alternates_at_the_probe_period_is_not_read_as_steady() -> None:
    cfg = GradFloorConfig(enabled=True)
    sp = ModelSpread(1, cfg)
    a, b, c, s = NEAR.as_array()
    for k in range(200):  # two models, swapped every 3.75 s (what one-model-per-slot sampling would alias)
        sp.observe(0, k * 0.25, a * (1.3 if (k // 15) % 2 else 0.8), b, c, s)
    assert sp.floor(0, N) == cfg.max_floor


def test_old_models_leave_the_window() -> None:
    cfg = GradFloorConfig(enabled=True)
    sp = ModelSpread(1, cfg)
    a, b, c, s = NEAR.as_array()
    for k in range(int(cfg.window_s) + 1):
        sp.observe(0, float(k), a * (1.3 if k % 2 else 0.8), b, c, s)
    assert sp.floor(0, N) == cfg.max_floor
    for k in range(int(cfg.window_s) + 1, 3 * int(cfg.window_s)):  # then the fit settles
        sp.observe(0, float(k), a, b, c, s)
    assert sp.floor(0, N) == cfg.min_floor


def test_disabled_is_the_fixed_floor() -> None:
    cfg = GradFloorConfig(enabled=False)
    sp = ModelSpread(1, cfg)
    for k in range(100):
        sp.observe(0, float(k), *NEAR.as_array())
    assert sp.floor(0, N) == pytest.approx(1.0 - GRAD_MAX_RHO)


@pytest.mark.parametrize("bad", [{"min_floor": 0.0}, {"min_floor": 0.1, "max_floor": 0.05}, {"models": 1},
                                 {"window_s": 0.0}, {"z": -1.0}])
def test_invalid_settings_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        GradFloorConfig(**bad)


def _router(mechanism: Mechanism, cost: Cost = Cost.GRADIENT) -> RootRouter:
    topo = Topology.build(["a", "b"], [1, 1], [[0.0, 0.0], [0.0, 0.0]])
    return RootRouter(topo, 0, PolicyConfig(mechanism, cost, grad_floor=GradFloorConfig(enabled=True)), NEAR,
                      np.random.default_rng(0))


@pytest.mark.parametrize("mechanism", list(Mechanism))
def test_a_router_given_steady_models_follows_the_gradient_past_95_percent(mechanism: Mechanism) -> None:
    """The fixed floor made a cell at ρ ≈ 0.99 cost ℓ/0.05; steady (exact) models get the true ℓ/(1 − ρ)."""
    r = _router(mechanism)
    exact = float(inv_marginal_rate(N, *NEAR.as_array(), floor=1e-9))
    capped = float(latency(N, *NEAR.as_array())) / (1.0 - GRAD_MAX_RHO)
    r.on_probe(0, 0.0, N, NEAR, seen_until=0.0)
    assert r.costs(0.0)[0] == pytest.approx(capped)
    for k in range(1, 40):  # probes every second for 40 s; the model never changes
        now = float(k)
        r.on_probe(0, now, N, NEAR, seen_until=now)
        r.on_probe(1, now, 1.0, NEAR, seen_until=now)
    assert r.costs(now)[0] == pytest.approx(exact, rel=1e-9)
    assert r._cost_one(0) == pytest.approx(exact, rel=1e-9)  # the per-request scalar cost agrees
    assert exact > 3 * capped


def test_a_router_whose_cell_refits_wildly_keeps_the_fixed_floor() -> None:
    r = _router(Mechanism.DISCRETE)
    a, b, c, s = NEAR.as_array()
    for k in range(40):
        p = LatencyParams(a * (1.3 if k % 2 else 0.8), b, min(c, 0.7 * a / b), s)
        r.on_probe(0, float(k), N, p, seen_until=float(k))
    assert r.models.floor is not None and r.models.floor[0] == pytest.approx(1.0 - GRAD_MAX_RHO)


def test_other_costs_and_the_default_keep_no_ring() -> None:
    assert _router(Mechanism.DISCRETE, Cost.LATENCY)._spread is None
    assert _router(Mechanism.FLOW, Cost.RIF).models.floor is None
    topo = Topology.build(["a", "b"], [1, 1], [[0.0, 0.0], [0.0, 0.0]])
    assert RootRouter(topo, 0, PolicyConfig(Mechanism.FLOW, Cost.GRADIENT), NEAR).models.floor is None
