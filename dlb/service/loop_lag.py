"""How late a service's event loop runs: a heartbeat timer's lag, exported to ``/metrics``.

Why: everything a service does — ext_proc decisions, probes, xDS updates — waits while its loop is
blocked (a long collection, a burst of accepts, CPU the box gives elsewhere), and nothing else shows
it: a client's round trip also holds the client's and the network's delays. A timer on the loop fires
every :data:`PERIOD_S`; its lag is the time it actually ran minus the time it was due.

A block of ``B`` seconds shows as a lag between ``B - PERIOD_S`` (the block began just after a beat)
and ``B``, so a block is at most ``lag + PERIOD_S``: the bound :func:`block_bound_s` gives and
``dlb bench hostile`` judges. The beat is a bare ``call_later`` callback (no task, no future): one timer
handle per beat, one ``bisect`` and two additions. :data:`PERIOD_S` and its measured cost:
research/loop-lag.md.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from dlb.service.metrics import FastHistogram

#: 20 ms: a block is known to within 20 ms of the 50-ms loop-block target, for 50 beats a second. A beat
#: costs 3.1 µs on a loop awake anyway (0.016 % of a core at this period) and ~120 µs where it wakes an
#: idle loop (VM wake-up included): 1.2 % of a core at 10 ms, over the 1 % the rule set (research/loop-lag.md).
PERIOD_S = 0.02

#: Lag buckets (seconds): 5-ms steps up to 50 ms, where the hostile bench's 50-ms target is judged
#: (``block_bound_s`` ≤ 50 ms is a lag ≤ 30 ms, a bucket bound), then coarser up to 5 s.
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.045, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

#: The ``..._loop_lag_longest_seconds`` gauge covers the last 60 s, in one-second slots: longer than
#: any usual scrape interval, so ``max_over_time`` over the gauge misses no lag.
WINDOW_SLOTS = 60
SLOT_S = 1.0


def block_bound_s(lag_s: float, period_s: float = PERIOD_S) -> float:
    """The longest the loop can have been blocked when the heartbeat's worst lag was ``lag_s``."""
    return lag_s + period_s


class LoopLag:
    """The heartbeat and what it saw: a histogram of every beat's lag and the longest lag per slot.

    ``prefix`` names the families after the service (``dlb_root`` → ``dlb_root_loop_lag_seconds``).
    ``clock`` is injectable for tests; it must be the clock the loop's timers follow in rate (monotonic).
    Updates happen on the loop thread only; a scrape from the exporter thread may read a value mid-beat.
    """

    __slots__ = ("_clock", "_due", "_handle", "_loop", "_slot", "_slot_end", "_slots", "hist", "period_s", "prefix")

    def __init__(self, prefix: str, period_s: float = PERIOD_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.prefix = prefix
        self.period_s = period_s
        self.hist = FastHistogram(LAG_BUCKETS)
        self._slots = [0.0] * WINDOW_SLOTS
        self._slot = 0
        self._clock = clock
        self._slot_end = clock() + SLOT_S
        self._due = 0.0
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> LoopLag:
        """Beat on ``loop`` (default: the running one) until :meth:`stop`."""
        self._loop = loop or asyncio.get_running_loop()
        self._arm(self._clock())
        return self

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _arm(self, now: float) -> None:
        assert self._loop is not None
        self._due = now + self.period_s
        self._handle = self._loop.call_later(self.period_s, self._beat)

    def _beat(self) -> None:
        now = self._clock()
        self.record(now - self._due, now)
        self._arm(now)

    def record(self, lag_s: float, now: float) -> None:
        """One beat's lag, seen at ``now`` (a timer fired early counts as 0)."""
        lag_s = max(lag_s, 0.0)
        self.hist.observe(lag_s)
        if now >= self._slot_end:
            self._advance(now)
        self._slots[self._slot] = max(self._slots[self._slot], lag_s)

    def _advance(self, now: float) -> None:
        """Move to the slot holding ``now``, clearing the slots passed (all of them after a long block)."""
        steps = int((now - self._slot_end) // SLOT_S) + 1
        for _ in range(min(steps, WINDOW_SLOTS)):
            self._slot = (self._slot + 1) % WINDOW_SLOTS
            self._slots[self._slot] = 0.0
        self._slot_end += steps * SLOT_S

    def longest_s(self) -> float:
        """The longest lag in the last ``WINDOW_SLOTS * SLOT_S`` seconds (to a slot), a beat overdue now included.

        Read from the exporter thread, so a scrape while the loop is blocked shows the block so far.
        """
        now = self._clock()
        worst = max(0.0, now - self._due) if self._handle is not None else 0.0
        for back in range(WINDOW_SLOTS):  # slot ``back`` steps before the current one ended at slot_end - back * SLOT_S
            if self._slot_end - back * SLOT_S <= now - WINDOW_SLOTS * SLOT_S:
                break
            worst = max(worst, self._slots[(self._slot - back) % WINDOW_SLOTS])
        return worst

    def families(self) -> Iterator[Metric]:
        yield self.hist.family(f"{self.prefix}_loop_lag_seconds", "how late the event loop ran a heartbeat timer")
        yield GaugeMetricFamily(f"{self.prefix}_loop_lag_longest_seconds", "the longest event-loop lag in the last 60 s, one still running included",
                                value=self.longest_s())
