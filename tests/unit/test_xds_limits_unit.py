"""What one xDS client can make the control plane keep, log or show is bounded (issue 14 row 6).

Here: the tests that run in-process (no sockets, no processes);
the others: ``tests/integration/test_xds_limits.py``.
The rules and what the tests stand for: that file's docstring.
"""

from __future__ import annotations

from test_xds_limits import Clock

from dlb.xds.server import LogBudget


def test_rejection_logs_are_rate_limited_and_count_what_they_drop() -> None:
    clock = Clock()
    budget = LogBudget(per_s=1.0, burst=3, clock=clock)
    assert [budget.allow() for _ in range(10)] == [True] * 3 + [False] * 7
    clock.now += 1.0
    assert budget.allow() and budget.take_suppressed() == 7 and not budget.allow()
