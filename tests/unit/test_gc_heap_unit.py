"""The control plane freezes its start-up heap, so a full garbage collection walks only what came after.

Here: the tests that run in-process (no sockets, no processes);
the others: ``tests/integration/test_gc_heap.py``.
The rules and what the tests stand for: that file's docstring.
"""

from __future__ import annotations

import gc

from dlb.gc_heap import YOUNG_THRESHOLD, GcPauses, raise_young_threshold


def test_gc_pauses_counts_each_collection_by_generation() -> None:
    pauses = GcPauses("dlb_test").install()
    try:
        gc.collect(2)
        gc.collect(0)
    finally:
        pauses.uninstall()
    assert pauses.count[2] >= 1 and pauses.count[0] >= 1
    assert pauses.seconds[2] >= pauses.longest[2] > 0
    assert pauses._callback not in gc.callbacks


def test_raise_young_threshold_keeps_the_older_generations_ratios() -> None:
    before = gc.get_threshold()
    try:
        assert raise_young_threshold() == (YOUNG_THRESHOLD, before[1], before[2])
    finally:
        gc.set_threshold(*before)
