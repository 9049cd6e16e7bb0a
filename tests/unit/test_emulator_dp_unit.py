"""The emulator's data-parallel mode over real sockets: G ranks on consecutive ports, lock-step steps

Here: the tests that run in-process (no sockets, no processes);
the others: ``tests/integration/test_emulator_dp.py``.
The rules and what the tests stand for: that file's docstring.
"""

from __future__ import annotations

import pytest
from test_emulator_dp import FAST

from dlb.emulator.dp import DpStep, rank_step_time


def test_rank_time_grows_with_resident_kv_and_the_step_is_the_slowest_rank() -> None:
    assert rank_step_time(FAST, 0, 0) == 0.0  # an empty rank computes nothing: it only waits
    light, heavy = rank_step_time(FAST, 4, 4_000), rank_step_time(FAST, 4, 40_000)
    assert heavy > light > FAST.base_ms / 1000
    step = DpStep((light, heavy))
    assert step.duration == heavy and step.idle(1) == 0.0 and step.idle(0) == pytest.approx(heavy - light)
