"""Simplex projection: on the simplex, zero off the allowed arcs, idempotent, and equal to a QP."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize

from dlb.core.projection import project_simplex, project_simplex_scaled


@st.composite
def vec_and_mask(draw, max_n: int = 8):
    n = draw(st.integers(1, max_n))
    v = np.array(draw(st.lists(st.floats(-50, 50, allow_nan=False), min_size=n, max_size=n)))
    mask = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    assume(mask.any())
    return v, mask


@settings(max_examples=300, deadline=None)
@given(vec_and_mask())
def test_on_simplex_and_zero_off_mask(vm) -> None:
    v, mask = vm
    z = project_simplex(v, mask)
    assert np.all(z >= 0)
    assert z.sum() == pytest.approx(1.0, abs=1e-9)
    assert np.all(z[~mask] == 0.0)


@settings(max_examples=300, deadline=None)
@given(vec_and_mask())
def test_idempotent(vm) -> None:
    v, mask = vm
    z = project_simplex(v, mask)
    np.testing.assert_allclose(project_simplex(z, mask), z, atol=1e-12)


def brute_force_projection(v: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Exact projection by enumerating supports: on support S, z_S = v_S − θ with θ from Σ z = 1."""
    idx = np.flatnonzero(mask)
    best, best_d = None, np.inf
    for k in range(1, idx.size + 1):
        for support in itertools.combinations(idx, k):
            s = list(support)
            theta = (v[s].sum() - 1.0) / k
            z = np.zeros_like(v)
            z[s] = v[s] - theta
            if np.all(z[s] >= -1e-12):
                d = np.sum((z - v)[mask] ** 2)
                if d < best_d:
                    best, best_d = z, d
    assert best is not None
    return np.maximum(best, 0)


@settings(max_examples=150, deadline=None)
@given(vec_and_mask(max_n=6))
def test_matches_brute_force(vm) -> None:
    v, mask = vm
    np.testing.assert_allclose(project_simplex(v, mask), brute_force_projection(v, mask), atol=1e-9)


def test_matches_numerical_qp() -> None:
    rng = np.random.default_rng(3)
    for _ in range(20):
        n = 5
        v = rng.normal(size=n) * 3
        mask = rng.random(n) < 0.7
        if not mask.any():
            mask[0] = True
        res = minimize(
            lambda z: np.sum((z - v) ** 2),  # noqa: B023 - called within this iteration
            np.where(mask, 1.0 / mask.sum(), 0.0),
            constraints=[{"type": "eq", "fun": lambda z: z.sum() - 1}],
            bounds=[(0, None) if m else (0, 0) for m in mask],
            method="SLSQP",
            options={"ftol": 1e-14, "maxiter": 500},
        )
        np.testing.assert_allclose(project_simplex(v, mask), res.x, atol=1e-5)


def test_errors() -> None:
    with pytest.raises(ValueError):
        project_simplex(np.array([1.0, 2.0]), np.array([False, False]))
    with pytest.raises(ValueError):
        project_simplex(np.array([np.nan, 2.0]))


def test_shift_invariance() -> None:
    """Adding a constant on allowed coordinates does not change the projection (used by flow_step)."""
    v = np.array([0.3, -1.0, 2.0, 0.5])
    mask = np.array([True, False, True, True])
    np.testing.assert_allclose(project_simplex(v, mask), project_simplex(v + 7.0, mask), atol=1e-12)


def test_scaled_projection_matches_the_weighted_qp() -> None:
    """argmin Σ (z − v)²/w on the simplex, against a numerical QP; equal weights give the plain projection."""
    rng = np.random.default_rng(5)
    for _ in range(20):
        n = 5
        v = rng.normal(size=n) * 3
        w = np.exp(rng.uniform(-3, 3, n))  # weights over ~400×, as per-cell flow steps have
        mask = rng.random(n) < 0.7
        if not mask.any():
            mask[0] = True
        res = minimize(
            lambda z: np.sum((z - v) ** 2 / w),  # noqa: B023 - called within this iteration
            np.where(mask, 1.0 / mask.sum(), 0.0),
            constraints=[{"type": "eq", "fun": lambda z: z.sum() - 1}],
            bounds=[(0, None) if m else (0, 0) for m in mask],
            method="SLSQP",
            options={"ftol": 1e-14, "maxiter": 500},
        )
        np.testing.assert_allclose(project_simplex_scaled(v, w, mask), res.x, atol=1e-5)
        np.testing.assert_allclose(project_simplex_scaled(v, np.full(n, 2.5), mask), project_simplex(v, mask), atol=1e-12)


def test_scaled_projection_absorbs_a_shift_along_the_weights() -> None:
    """v + a·w projects like v: the flow step may centre its cost with the w-weighted mean."""
    v = np.array([0.3, -1.0, 2.0, 0.5])
    w = np.array([0.1, 1.0, 3.0, 0.7])
    mask = np.array([True, False, True, True])
    np.testing.assert_allclose(project_simplex_scaled(v, w, mask), project_simplex_scaled(v + 7.0 * w, w, mask), atol=1e-12)
    with pytest.raises(ValueError, match="> 0"):
        project_simplex_scaled(v, np.array([0.0, 1.0, 1.0, 1.0]), mask)
