"""RecentErrors: aversion sees a cell's error EMA only while the cell's error counter keeps rising."""

from __future__ import annotations

import pytest

from dlb.core.aversion import RecentErrors


def test_errors_that_stop_report_zero_after_the_hold() -> None:
    r = RecentErrors(2, hold_s=2.0)
    assert r.observe(0, 10, 0.4, 0.0) == 0.4  # first sight of a failing cell: trust its EMA
    assert r.observe(0, 12, 0.4, 1.0) == 0.4
    assert r.observe(0, 12, 0.4, 3.0) == 0.4  # 2 s since the last new error: still within the hold
    assert r.observe(0, 12, 0.4, 3.5) == 0.0  # stopped: the lingering EMA no longer counts
    assert r.observe(0, 13, 0.4, 4.0) == 0.4  # one new error brings it back
    assert r.observe(1, 0, 0.0, 4.0) == 0.0


def test_a_restarted_leaf_counter_is_a_new_baseline_not_an_error() -> None:
    r = RecentErrors(1, hold_s=1.0)
    r.observe(0, 50, 0.3, 0.0)
    assert r.observe(0, 0, 0.3, 5.0) == 0.0  # counter went down: the leaf restarted
    assert r.observe(0, 1, 0.3, 5.5) == 0.3


def test_negative_hold_is_rejected() -> None:
    with pytest.raises(ValueError, match="hold_s"):
        RecentErrors(1, hold_s=-1.0)
