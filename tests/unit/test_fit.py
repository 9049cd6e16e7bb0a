"""The latency-model fitter recovers known parameters and falls back to the prior when data is thin."""

from __future__ import annotations

import numpy as np
import pytest

from dlb.core.fit import MIN_SAMPLES, Censored, fit_latency_model, shrink_toward_prior
from dlb.core.latency_model import LatencyParams, latency

TRUE = LatencyParams(a=0.8, b=0.06, c=10.0, s=1.5)
PRIOR = LatencyParams(a=2.0, b=0.2, c=4.0, s=1.0)


def samples(n: int, n_max: float, noise: float, seed: int = 0, outliers: float = 0.0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, n_max, n)
    y = latency(x, *TRUE.as_array()) * rng.lognormal(0, noise, n)
    if outliers:
        k = int(outliers * n)
        y[:k] *= 20.0  # a few very long generations
    return x, y


def test_recovers_parameters_from_clean_data() -> None:
    x, y = samples(600, 40, 0.02)
    res = fit_latency_model(x, y, PRIOR)
    p = res.params
    assert res.converged
    assert p.a == pytest.approx(TRUE.a, rel=0.05)
    assert p.b == pytest.approx(TRUE.b, rel=0.05)
    assert p.c == pytest.approx(TRUE.c, abs=1.5)
    assert res.confidence > 0.8
    assert p.is_stable_shape()


def test_robust_to_outliers() -> None:
    x, y = samples(600, 40, 0.05, outliers=0.03)
    res = fit_latency_model(x, y, PRIOR)
    grid = np.linspace(0, 40, 50)
    err = np.abs(latency(grid, *res.params.as_array()) - latency(grid, *TRUE.as_array())) / latency(grid, *TRUE.as_array())
    assert err.max() < 0.15


def test_linear_loss_is_hurt_by_outliers() -> None:
    """The robust loss matters: with plain least squares the same outliers bias the fit more."""
    x, y = samples(600, 40, 0.05, outliers=0.03)
    grid = np.linspace(0, 40, 50)
    truth = latency(grid, *TRUE.as_array())

    def worst(loss: str) -> float:
        p = fit_latency_model(x, y, PRIOR, loss=loss).params
        return float((np.abs(latency(grid, *p.as_array()) - truth) / truth).max())

    assert worst("soft_l1") < worst("linear")


def test_few_samples_return_prior() -> None:
    x, y = samples(MIN_SAMPLES - 1, 40, 0.02)
    res = fit_latency_model(x, y, PRIOR)
    assert res.params == PRIOR and res.confidence == 0.0


def test_shrinkage_when_no_knee_seen() -> None:
    """Only low-load samples: the slope is unidentifiable, so it must stay near the prior."""
    x, y = samples(30, 3.0, 0.02)
    res = fit_latency_model(x, y, PRIOR)
    assert res.params.a == pytest.approx(TRUE.a, rel=0.1)  # the flat part is seen
    assert res.confidence < 0.5
    blended = shrink_toward_prior(res, PRIOR)
    assert min(res.params.b, PRIOR.b) <= blended.b <= max(res.params.b, PRIOR.b)


def test_ignores_bad_samples() -> None:
    x, y = samples(300, 40, 0.02)
    x = np.concatenate([x, [np.nan, -1.0, 5.0]])
    y = np.concatenate([y, [1.0, 1.0, np.inf]])
    res = fit_latency_model(x, y, PRIOR)
    assert res.samples == 300
    assert res.params.b == pytest.approx(TRUE.b, rel=0.1)


def test_window_only_past_the_knee_fits_the_slope_through_the_operating_point() -> None:
    """A busy cell's window holds no sample below its knee: the intercept cannot be told from the slope,
    so the fit keeps the prior's unloaded latency and knee and fits the slope (1/b = capacity) alone."""
    true = LatencyParams(a=1.1, b=1 / 56.0, c=60.0, s=15.0)
    prior = LatencyParams(a=1.05, b=1 / 67.0, c=63.0, s=15.8)  # a fleet prior, 20 % optimistic on capacity
    caps = []
    for seed in range(5):
        rng = np.random.default_rng(seed)
        x = rng.uniform(900, 1300, 200)
        y = latency(x, *true.as_array()) * rng.lognormal(0, 0.6, 200)  # output lengths vary: heavy noise
        res = fit_latency_model(x, y, prior)
        caps.append(res.params.capacity)
        assert res.params.a == pytest.approx(prior.a)
        assert res.params.is_stable_shape()
    assert np.median(caps) == pytest.approx(true.capacity, rel=0.15)
    assert max(caps) / min(caps) < 1.5  # the estimate does not swing between windows


@pytest.mark.parametrize("flat_share", [0.0, 0.3], ids=["slope-only", "full"])
def test_requests_still_running_move_the_fit_toward_the_uncensored_one(flat_share: float) -> None:
    """A queue that grew: every request that arrived is either done or still running, and at high RIF
    only the fast ones are done (the window reads the cell faster than it is). The running ones,
    each at least as slow as its age, move the slope toward the fit of every request's true latency,
    and never past it. The slope-only fit (saturated window) and the full fit both take them."""
    rng = np.random.default_rng(7)
    prior = LatencyParams(a=TRUE.a, b=0.05, c=TRUE.c, s=TRUE.s)
    k = int(flat_share * 600)
    x = np.concatenate([rng.uniform(0, TRUE.c, k), rng.uniform(100, 400, 600 - k)])
    y = latency(x, *TRUE.as_array()) * rng.lognormal(0, 0.4, x.size)
    now = 30.0  # the requests arrived evenly over the last `now` seconds
    age = np.where(x > TRUE.c, np.linspace(now, 0, x.size), now)
    done = y <= age
    plain = fit_latency_model(x[done], y[done], prior).params
    seen = fit_latency_model(x[done], y[done], prior, censored=Censored(x[~done], age[~done])).params
    truth = fit_latency_model(x, y, prior).params
    assert (~done).sum() > 100 and plain.b < 0.9 * truth.b  # the censoring bias this is about
    assert plain.b + (truth.b - plain.b) / 3 < seen.b <= 1.02 * truth.b


def test_requests_younger_than_the_curve_change_nothing() -> None:
    """An in-flight request says only "at least this long": one the fitted curve already outlasts is no evidence."""
    x, y = samples(300, 40, 0.05)
    running = np.linspace(5, 40, 50)
    young = 0.2 * latency(running, *TRUE.as_array())
    plain = fit_latency_model(x, y, PRIOR).params
    seen = fit_latency_model(x, y, PRIOR, censored=Censored(running, young)).params
    assert seen.as_array() == pytest.approx(plain.as_array(), rel=1e-6)
