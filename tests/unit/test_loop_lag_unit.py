"""A service's event-loop lag (dlb/service/loop_lag.py): a heartbeat's actual wake minus its scheduled wake.

Rules: a loop blocked for B shows a lag of at least B - period, so ``block_bound_s(lag) >= B`` (a block
is never under-reported past the bound); the longest-lag gauge covers the last 60 s and a beat overdue
at scrape time counts so far; the families carry the service's prefix.

Here: the tests that run in-process (no sockets, no processes);
the others: ``tests/integration/test_loop_lag.py``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, cast

from prometheus_client.core import HistogramMetricFamily

from dlb.service.loop_lag import PERIOD_S, LoopLag, block_bound_s


class FakeLoop:
    """``call_later`` only: the test decides when the beat runs."""

    def __init__(self) -> None:
        self.pending: list[Callable[[], None]] = []

    def call_later(self, delay: float, cb: Callable[[], None]) -> Any:
        self.pending.append(cb)
        return self

    def cancel(self) -> None:
        pass

    def run_beat(self) -> None:
        self.pending.pop(0)()


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _started(clock: Clock) -> tuple[LoopLag, FakeLoop]:
    loop = FakeLoop()
    lag = LoopLag("dlb_test", clock=clock).start(cast(asyncio.AbstractEventLoop, loop))
    return lag, loop


def test_a_beat_run_late_by_the_block_records_the_block() -> None:
    """Injected clock: the beat due after PERIOD_S runs 0.3 s later than that; its lag is the 0.3 s."""
    clock = Clock()
    lag, loop = _started(clock)
    clock.t += PERIOD_S + 0.3
    loop.run_beat()
    assert lag.longest_s() >= 0.3 - 1e-9
    assert sum(lag.hist.counts) == 1
    assert lag.hist.counts[-1] == 0 and sum(lag.hist.counts[lag.hist.bounds.index(0.25) + 1:]) == 1  # in (0.25, 0.5]


def test_a_real_loop_blocked_by_sleep_shows_the_block_within_the_bound() -> None:
    """A real loop blocked by time.sleep(0.2): the worst lag's block bound is at least the 0.2 s."""
    block = 0.2

    async def main() -> LoopLag:
        lag = LoopLag("dlb_test").start()
        await asyncio.sleep(3 * PERIOD_S)  # a few beats first
        started = time.monotonic()
        time.sleep(block)  # noqa: ASYNC251 - the point: the loop is blocked, no beat can run
        blocked = time.monotonic() - started
        await asyncio.sleep(3 * PERIOD_S)  # the late beat runs, then more
        lag.stop()
        assert blocked >= block
        return lag

    lag = asyncio.run(main())
    assert block_bound_s(lag.longest_s()) >= block
    over = sum(c for b, c in zip(lag.hist.bounds, lag.hist.counts, strict=False) if b >= 0.1) + lag.hist.counts[-1]
    assert over >= 1  # the histogram has it too (a lag ≥ 0.19 s lands above the 0.1 bound)


def test_a_beat_overdue_at_scrape_time_counts_so_far() -> None:
    """The exporter thread reads the gauge while the loop is blocked: the block so far shows."""
    clock = Clock()
    lag, _ = _started(clock)
    clock.t += PERIOD_S + 2.0  # the beat has not run
    assert lag.longest_s() >= 2.0 - 1e-9


def test_the_longest_lag_gauge_forgets_after_sixty_seconds() -> None:
    clock = Clock()
    lag, loop = _started(clock)

    def on_time(seconds: float) -> None:
        for _ in range(round(seconds / PERIOD_S)):
            clock.t += PERIOD_S
            loop.run_beat()

    clock.t += PERIOD_S + 0.5
    loop.run_beat()
    on_time(50.0)
    assert lag.longest_s() >= 0.5 - 1e-9
    on_time(12.0)  # the 0.5-s lag is now over 60 s old
    assert lag.longest_s() < 0.5


def test_families_are_named_after_the_service() -> None:
    lag = LoopLag("dlb_root")
    fams = {f.name: f for f in lag.families()}
    assert set(fams) == {"dlb_root_loop_lag_seconds", "dlb_root_loop_lag_longest_seconds"}
    assert isinstance(fams["dlb_root_loop_lag_seconds"], HistogramMetricFamily)
    assert 0.03 in lag.hist.bounds  # the hostile bench judges "block ≤ 50 ms" as "lag ≤ 30 ms" on this bound
    assert block_bound_s(0.03) == 0.05
