"""Histogram readings of a foreign cell → latency samples (dlb.core.foreign_latency), and those samples
fitted by the leaf's own estimator.

Rules: ΣΔsum/ΣΔcount over series and sources is the interval's mean latency; a restarted series counts
its new value, a new series on a known source counts whole, a new or returning source only sets a
baseline; an interval without completions gives no sample; the RIF is the mean over the arrival window.
"""

from __future__ import annotations

import math
import random

import pytest

from dlb.core.estimator import LatencyEstimator
from dlb.core.fit import MIN_SAMPLES
from dlb.core.foreign_latency import IntervalLatency, interval_totals, outlived
from dlb.core.latency_model import LatencyParams, latency


def test_deltas_are_summed_over_models_and_servers() -> None:
    prev = {"s1": {"m=a": (10.0, 5.0), "m=b": (4.0, 2.0)}, "s2": {"m=a": (1.0, 1.0)}}
    cur = {"s1": {"m=a": (16.0, 8.0), "m=b": (4.0, 2.0)}, "s2": {"m=a": (5.0, 3.0)}}
    assert interval_totals(prev, cur) == (10.0, 5.0)


def test_a_restarted_series_counts_its_new_value_and_a_new_series_counts_whole() -> None:
    prev = {"s1": {"m=a": (100.0, 50.0)}}
    cur = {"s1": {"m=a": (3.0, 2.0), "m=b": (2.0, 1.0)}}
    assert interval_totals(prev, cur) == (5.0, 3.0)


def test_a_source_not_read_last_time_only_sets_its_baseline() -> None:
    prev = {"s1": {"m=a": (1.0, 1.0)}}
    cur = {"s1": {"m=a": (2.0, 2.0)}, "s2": {"m=a": (500.0, 400.0)}}
    assert interval_totals(prev, cur) == (1.0, 1.0)


def test_non_finite_or_negative_values_count_as_absent() -> None:
    prev = {"s1": {"m=a": (1.0, 1.0), "m=b": (1.0, 1.0)}}
    cur = {"s1": {"m=a": (math.nan, 2.0), "m=b": (-1.0, 3.0)}}
    assert interval_totals(prev, cur) == (0.0, 0.0)


def test_first_reading_and_empty_intervals_give_no_sample() -> None:
    il = IntervalLatency()
    assert il.observe(0.0, 4.0, {"s": {"": (0.0, 0.0)}}) is None
    assert il.observe(1.0, 4.0, {"s": {"": (0.0, 0.0)}}) is None  # nothing completed
    assert il.observe(1.0, 4.0, {"s": {"": (9.0, 3.0)}}) is None  # time did not advance
    s = il.observe(2.0, 4.0, {"s": {"": (15.0, 5.0)}})
    assert s is not None and s.latency_s == pytest.approx(3.0) and s.completed == 2.0 and s.t == 2.0


def test_the_rif_is_the_mean_over_the_arrival_window() -> None:
    """Requests completing in [10, 11] after 5 s arrived in [5, 6], when the cell held 2, not the 20 it holds now."""
    il = IntervalLatency()
    for t in range(11):
        il.observe(float(t), 2.0 if t <= 7 else 20.0, {"s": {"": (5.0 * t, float(t))}})
    s = il.observe(11.0, 20.0, {"s": {"": (5.0 * 10 + 5.0, 11.0)}})
    assert s is not None and s.latency_s == pytest.approx(5.0) and s.rif == pytest.approx(2.0)


def test_history_is_bounded() -> None:
    il = IntervalLatency(history_s=10.0)
    for t in range(100):
        il.observe(float(t), float(t), {})
    assert len(il._rif_t) == 11 and il.mean_rif(-50.0, -40.0) == pytest.approx(89.0)  # the oldest kept


def test_the_leaf_estimator_fits_interval_samples_and_tracks_a_slowdown() -> None:
    """A simulated vLLM cell (ℓ known) read every 0.1 s: the fit's latency at the cell's RIF follows a 5× slowdown."""
    truth = LatencyParams(1.0, 0.05, 8.0, 1.0)
    prior = LatencyParams(2.0, 0.1, 8.0, 1.0)
    rng = random.Random(1)
    est = LatencyEstimator(prior, rng=random.Random(0))
    il = IntervalLatency()
    total_s = total_n = 0.0

    def run(t0: float, t1: float, scale: float) -> float:
        nonlocal total_s, total_n
        t = t0
        while t < t1:
            rif = rng.uniform(2.0, 14.0)
            n = rng.randint(0, 3)
            total_n += n
            total_s += sum(scale * float(latency(rif, truth.a, truth.b, truth.c, truth.s)) * rng.uniform(0.8, 1.2) for _ in range(n))
            s = il.observe(t, rif, {"srv": {'model_name="m"': (total_s, total_n)}})
            if s is not None:
                est.record(s.t, s.rif, s.latency_s)
            t += 0.1
        est.refit(t)
        return float(latency(8.0, est.params.a, est.params.b, est.params.c, est.params.s))

    assert est.confidence == 0.0
    fast = run(0.0, 30.0, 1.0)
    assert est.confidence > 0 and len(est) >= MIN_SAMPLES
    slow = run(30.0, 60.0, 5.0)
    assert 0.6 < fast / float(latency(8.0, truth.a, truth.b, truth.c, truth.s)) < 1.6, fast
    assert slow > 3.0 * fast, (fast, slow)


def test_requests_held_and_not_completed_since_are_lower_bounds() -> None:
    """Held 3 at t=0 and 2 completed by t=2: 1 of those is still running at t=5 (5 s old). Held 3 at t=2
    and none completed since: 2 more at least 3 s old. Held 5 from t=3: 2 more at least 2 s old."""
    il = IntervalLatency()
    il.observe(0.0, 3.0, {"s": {"": (0.0, 0.0)}})
    il.observe(2.0, 3.0, {"s": {"": (2.0, 2.0)}})
    for t in (3.0, 4.0, 5.0):
        assert il.observe(t, 5.0, {"s": {"": (2.0, 2.0)}}) is None
    c = il.in_flight(5.0, 5.0)
    assert c is not None and list(c.rif) == [3.0, 3.0, 3.0, 5.0, 5.0] and list(c.age) == [5.0, 3.0, 3.0, 2.0, 2.0]
    assert list(il.in_flight(5.0, 1.0).age) == [5.0]  # type: ignore[union-attr]  # at most what it holds now
    il.observe(6.0, 5.0, {"s": {"": (9.0, 3.0)}})  # one completion: it may have been any of them
    c = il.in_flight(6.0, 5.0)
    assert c is not None and list(c.rif) == [3.0, 3.0, 5.0, 5.0] and list(c.age) == [4.0, 4.0, 3.0, 3.0]


def test_a_trickle_of_completions_still_leaves_old_requests_known_to_run() -> None:
    """A cell held at 4 that completes one request every 5 s (read every second): the requests it held
    12 s ago cannot all have finished, so the oldest bound is far older than the last completion."""
    il = IntervalLatency()
    for t in range(13):
        il.observe(float(t), 4.0, {"s": {"": (20.0 * (t // 5), float(t // 5))}})
    c = il.in_flight(12.0, 4.0)
    assert c is not None and max(c.age) == 12.0 and len(c.age) == 4, c


def test_a_reading_that_holds_fewer_caps_the_bound() -> None:
    """Held 4, then a reading of 1 (e.g. requests the histograms do not count went away): at most 1 survives."""
    il = IntervalLatency()
    for t, rif in ((0.0, 4.0), (1.0, 1.0), (2.0, 4.0)):
        il.observe(t, rif, {"s": {"": (0.0, 0.0)}})
    c = il.in_flight(3.0, 4.0)
    assert c is not None and list(c.age) == [3.0, 1.0, 1.0, 1.0], c


def test_no_bound_when_a_source_came_or_went_or_the_cell_is_empty() -> None:
    il = IntervalLatency()
    il.observe(0.0, 3.0, {"s": {"": (0.0, 0.0)}})
    il.observe(1.0, 3.0, {"s": {"": (0.0, 0.0)}, "t": {"": (0.0, 0.0)}})  # t is new: its past is unknown, so from now
    assert list(il.in_flight(4.0, 3.0).age) == [3.0] * 3  # type: ignore[union-attr]
    il.observe(5.0, 3.0, {})
    assert il.in_flight(6.0, 3.0) is None
    il.observe(7.0, 0.0, {"s": {"": (0.0, 0.0)}})
    assert il.in_flight(9.0, 0.0) is None


def test_a_cell_that_stopped_completing_has_outlived_its_model() -> None:
    """Held 4 at ℓ ≈ 1 s and 1 completion in 5 s: Little's law expects ~20, so the model is too fast, by
    the survivors' age over ℓ at their RIF; since the reading they were held at."""
    model = LatencyParams(1.0, 0.01, 8.0, 1.0)
    il = IntervalLatency()
    il.observe(0.0, 4.0, {"s": {"": (0.0, 0.0)}})
    for t in range(1, 6):
        il.observe(float(t), 4.0, {"s": {"": (3.0, 1.0)}})
    bounds = il.in_flight(5.0, 4.0)
    assert bounds is not None
    late = outlived(5.0, bounds, model, 1e-4)
    assert late is not None and late.since == 0.0 and late.survivors == 3
    assert late.factor == pytest.approx(5.0 / float(latency(4.0, *model.as_array())))


def test_a_cell_completing_as_its_model_says_has_not() -> None:
    """The same cell completing 4 a second (its RIF ÷ ℓ): the survivors are younger than ℓ, nothing outlived."""
    model = LatencyParams(1.0, 0.01, 8.0, 1.0)
    il = IntervalLatency()
    for t in range(6):
        il.observe(float(t), 4.0, {"s": {"": (4.0 * t, 4.0 * t)}})
    bounds = il.in_flight(5.0, 4.0)
    assert bounds is None or outlived(5.0, bounds, model, 1e-4) is None
    il = IntervalLatency()  # held 1 for 3 s with no completion: a long request, not improbable at ℓ = 1 s
    for t in range(4):
        il.observe(float(t), 1.0, {"s": {"": (0.0, 0.0)}})
    bounds = il.in_flight(3.0, 1.0)
    assert bounds is not None and outlived(3.0, bounds, model, 1e-4) is None
