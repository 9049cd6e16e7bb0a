"""The leaf's measurement primitives (estimator.py) and the probe-reported replica count (router.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dlb.core.costs import Cost
from dlb.core.estimator import ErrorTracker, EstimatorConfig, LatencyEstimator
from dlb.core.latency_model import LatencyParams, latency
from dlb.core.router import Mechanism, PolicyConfig, RootRouter
from dlb.core.topology import Topology

TRUE = LatencyParams(a=1.0, b=0.1, c=8.0, s=1.5)
PRIOR = LatencyParams(a=0.5, b=0.05, c=4.0, s=1.0)


def test_estimator_recovers_curve_from_window() -> None:
    rng = np.random.default_rng(1)
    est = LatencyEstimator(PRIOR, EstimatorConfig(window_s=100.0, refit_period_s=1.0))
    for k in range(1500):
        n = float(rng.integers(0, 30))
        est.record(k * 0.05, n, float(latency(n, *TRUE.as_array())) * rng.lognormal(0, 0.05))
    assert est.maybe_refit(75.0)
    assert not est.maybe_refit(75.5)  # within the refit period
    grid = np.arange(0, 30)
    got = latency(grid, *est.params.as_array())
    want = latency(grid, *TRUE.as_array())
    assert np.max(np.abs(got - want) / want) < 0.1
    assert est.confidence > 0.5


def test_estimator_window_expires_old_samples_and_falls_back_to_prior() -> None:
    # No dithering: the published prior must be the configured one exactly.
    est = LatencyEstimator(PRIOR, EstimatorConfig(window_s=10.0, refit_period_s=1.0, dither=0.0))
    for k in range(50):
        est.record(float(k) * 0.1, 5.0, 2.0)
    est.refit(100.0)  # every sample is older than the window
    assert len(est) == 0
    assert est.params == PRIOR and est.confidence == 0.0


def test_estimator_bounded_samples() -> None:
    est = LatencyEstimator(PRIOR, EstimatorConfig(max_samples=10))
    for k in range(100):
        est.record(float(k), 1.0, 1.0)
    assert len(est) == 10


def test_estimator_config_validation() -> None:
    with pytest.raises(ValueError, match="window_s"):
        EstimatorConfig(window_s=0)


def test_error_tracker_fraction_and_decay() -> None:
    e = ErrorTracker(tau_s=1.0)
    assert e.rate(0.0) == 0.0
    for k in range(100):
        e.record(k * 0.01, k % 4 == 0)
    assert e.rate(1.0) == pytest.approx(0.25, abs=0.03)
    # Old errors fade once successes dominate the recent past.
    for k in range(100):
        e.record(10.0 + k * 0.01, False)
    assert e.rate(11.0) < 0.01
    with pytest.raises(ValueError):
        ErrorTracker(0)


def test_error_tracker_is_rate_independent() -> None:
    slow, fast = ErrorTracker(2.0), ErrorTracker(2.0)
    for k in range(50):
        slow.record(k * 0.2, k % 2 == 0)
    for k in range(1000):
        fast.record(k * 0.01, k % 2 == 0)
    assert math.isclose(slow.rate(10.0), fast.rate(10.0), abs_tol=0.05)


def test_probe_replicas_update_rif_cost() -> None:
    """Core fix: RIF cost N/k must use the live replica count a probe reports (outages)."""
    topo = Topology.build(["a", "b"], [10, 10], [[0, 0.01], [0.01, 0]])
    r = RootRouter(topo, 0, PolicyConfig(Mechanism.DISCRETE, Cost.RIF), PRIOR, np.random.default_rng(0))
    r.on_probe(0, 0.0, 5.0)
    r.on_probe(1, 0.0, 4.0)
    assert r.pick(0.0) == 1
    r.on_probe(0, 0.1, 5.0)
    r.on_probe(1, 0.1, 4.0, replicas=1)  # b lost 9 of its 10 servers
    assert r.pick(0.1) == 0
    assert topo.replicas[1] == 10  # the shared topology is untouched


def test_fit_near_saturation_stays_near_data() -> None:
    """Core fix (fit.py): the knee is fitted inside c < a/b instead of clamped afterwards.

    A window seen only near saturation, rising faster than the stable family allows, used to make
    the optimum violate c·b < a; the post-hoc clamp then moved the knee far left and the published
    curve overestimated latency ~10× at the observed RIF (seen in the simulator's busy cells).
    """
    from dlb.core.fit import fit_latency_model

    rng = np.random.default_rng(3)
    x = rng.uniform(150, 180, 400)
    y = (1.9 + 0.05 * np.maximum(0.0, x - 160)) * rng.lognormal(0, 0.3, x.size)
    prior = LatencyParams(a=1.4, b=0.011, c=111.0, s=28.0)
    res = fit_latency_model(x, y, prior)
    assert res.params.is_stable_shape()
    model = latency(np.array([155.0, 170.0]), *res.params.as_array())
    data = np.array([y[np.abs(x - 155) < 5].mean(), y[np.abs(x - 170) < 5].mean()])
    assert np.all(model < 1.5 * data), (model, data)
