"""Rounding flow weights to Envoy's integers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlb.envoy.weights import round_weights


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.just(0.0), st.floats(1e-12, 1.0)), min_size=1, max_size=20), st.sampled_from([100, 1000, 10_000]))
def test_sum_exact_and_small_arcs_kept(xs, total) -> None:
    x = np.array(xs)
    if x.sum() <= 0:
        with pytest.raises(ValueError):
            round_weights(x, total)
        return
    w = np.array(round_weights(x, total))
    assert w.sum() == total
    assert np.all((w > 0) == (x > 0))  # no arc lost, no arc invented
    # Error bounded by one unit plus what the small arcs borrowed.
    borrowed = int(np.sum((x > 0) & (x / x.sum() * total < 1)))
    assert np.abs(w - x / x.sum() * total).max() <= 1 + borrowed


def test_examples() -> None:
    assert round_weights([0.5, 0.5], 10) == [5, 5]
    assert round_weights([1 / 3, 1 / 3, 1 / 3], 100) == [34, 33, 33]
    assert round_weights([1.0, 1e-9, 0.0], 1000) == [999, 1, 0]
    with pytest.raises(ValueError):
        round_weights([np.nan, 1.0])
    with pytest.raises(ValueError):
        round_weights([1.0, 1.0, 1.0], 2)
