"""The softplus latency model and its derived rates, checked against independent numerics."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlb.core import latency_model as lm
from dlb.core.latency_model import LatencyParams

params_st = st.builds(
    lambda a, b, frac, s: LatencyParams(a, b, frac * a / b, s),
    st.floats(0.05, 20.0),
    st.floats(1e-3, 1.0),
    st.floats(0.0, 0.98),
    st.floats(0.05, 20.0),
)


def test_flat_then_linear_shape() -> None:
    p = LatencyParams(a=1.0, b=0.1, c=8.0, s=0.5)
    assert float(lm.latency(0.0, *p.as_array())) == pytest.approx(1.0, abs=1e-6)
    # Far past the knee: slope b, offset a - b c.
    n = np.array([100.0, 200.0])
    ell = lm.latency(n, *p.as_array())
    assert ell[1] - ell[0] == pytest.approx(0.1 * 100, rel=1e-9)
    assert ell[0] == pytest.approx(1.0 + 0.1 * (100 - 8), rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(params_st, st.floats(0.0, 500.0))
def test_derivatives_match_finite_differences(p: LatencyParams, n: float) -> None:
    a, b, c, s = p.as_array()
    # Central differences (the formulas are smooth through N = 0, so N − h < 0 is fine): O(h²) error.
    h = 1e-5 * max(1.0, n)
    num_dl = (lm.latency(n + h, a, b, c, s) - lm.latency(n - h, a, b, c, s)) / (2 * h)
    assert float(lm.d_latency(n, a, b, c, s)) == pytest.approx(float(num_dl), rel=1e-4, abs=1e-9)
    num_dmu = (lm.service_rate(n + h, a, b, c, s) - lm.service_rate(n - h, a, b, c, s)) / (2 * h)
    assert float(lm.d_service_rate(n, a, b, c, s)) == pytest.approx(float(num_dmu), rel=1e-4, abs=1e-7)


@settings(max_examples=200, deadline=None)
@given(params_st, st.floats(0.0, 1000.0))
def test_service_rate_increasing_and_bounded(p: LatencyParams, n: float) -> None:
    """Assumption 1 of the paper holds for any parameters with c < a/b."""
    a, b, c, s = p.as_array()
    assert float(lm.d_service_rate(n, a, b, c, s)) > 0
    assert float(lm.service_rate(n, a, b, c, s)) < 1.0 / b
    inv = float(lm.inv_marginal_rate(n, a, b, c, s))
    exact = 1.0 / float(lm.d_service_rate(n, a, b, c, s))
    ell = float(lm.latency(n, a, b, c, s))
    # Exact below the utilisation floor; past it, ℓ/(1 − ρ_max), never more than the exact value.
    assert inv == pytest.approx(min(exact, ell / (1.0 - lm.GRAD_MAX_RHO)), rel=1e-6)


def test_gradient_cost_past_the_knee_is_insensitive_to_dither_in_a() -> None:
    """A full cell whose fitted a is within 5 % of b·c: the exact 1/μ' swings several-fold with a ±5 %
    change of a while ℓ moves ~2 %; the floored cost moves with ℓ only."""
    b, c, s, n = 0.05, 40.0, 2.0, 120.0
    exact, floored, ells = [], [], []
    for a in (2.0 * 1.05, 2.0 * 1.10, 2.0 * 1.15):
        ell = float(lm.latency(n, a, b, c, s))
        ells.append(ell)
        exact.append(1.0 / float(lm.d_service_rate(n, a, b, c, s)))
        floored.append(float(lm.inv_marginal_rate(n, a, b, c, s)))
    assert max(exact) / min(exact) > 2.0
    assert max(floored) / min(floored) == pytest.approx(max(ells) / min(ells), rel=1e-9)


def test_inv_marginal_rate_is_clipped() -> None:
    # Parameters violating c < a/b make ℓ − Nℓ' negative at large N; the cost must stay finite.
    a, b, c, s = 1.0, 1.0, 5.0, 0.1
    v = lm.inv_marginal_rate(100.0, a, b, c, s, eps=1e-3)
    assert np.isfinite(v) and v > 0


def test_softplus_no_overflow() -> None:
    assert float(lm.softplus(1e4)) == pytest.approx(1e4)
    assert float(lm.softplus(-1e4)) == 0.0


@settings(max_examples=100, deadline=None)
@given(params_st, st.floats(0.01, 0.99))
def test_workload_for_rate_inverts_mu(p: LatencyParams, frac: float) -> None:
    a, b, c, s = p.as_array()
    lam = frac / b
    n = lm.workload_for_rate(lam, a, b, c, s)
    assert float(lm.service_rate(n, a, b, c, s)) == pytest.approx(lam, rel=1e-7)
    assert math.isinf(lm.workload_for_rate(1.0 / b, a, b, c, s))


def test_params_validation() -> None:
    with pytest.raises(ValueError):
        LatencyParams(0.0, 1.0, 1.0, 1.0)
    assert LatencyParams(1.0, 0.1, 5.0, 1.0).is_stable_shape()
    assert not LatencyParams(1.0, 0.1, 20.0, 1.0).is_stable_shape()
