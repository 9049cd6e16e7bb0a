"""The emulator's wall clock: steps that never end before their deadline.

uvloop (the emulator's loop when installed) keeps timers in whole milliseconds and ``loop.time()``
is the millisecond clock cached at the start of the loop's turn, so a step timed with them could end
up to ~1 ms early — a quarter of a 4-ms step of the fast test profile, and a server that is faster
than its own model. The engine therefore stamps arrivals and steps with ``time.monotonic()`` and
sleeps until that clock has passed the deadline (a last sub-millisecond wait is a few loop turns).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

now = time.monotonic


async def sleep_until(deadline: float) -> None:
    """Return once ``time.monotonic() >= deadline``, never before (uvloop may round a timer down)."""
    while (left := deadline - time.monotonic()) > 0:  # noqa: ASYNC110 - a deadline, not an event to wait for
        await asyncio.sleep(left)


class StepEnd:
    """A step's sleep that a fault change ends early (:meth:`move`): a slowdown reset must not wait out a
    step begun at 1000 ×. One future and one timer per wait, as ``asyncio.sleep`` (a timeout's cancel
    per step would cost more than the sleep)."""

    def __init__(self) -> None:
        self.moved = False
        self._waiter: asyncio.Future[None] | None = None

    def move(self) -> None:
        """The step's end may have moved: wake the sleep now."""
        self.moved = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def sleep_until(self, deadline: float) -> bool:
        """:func:`sleep_until` ``deadline``, or True as soon as :meth:`move` was called (and not cleared)."""
        loop = asyncio.get_running_loop()
        while (left := deadline - time.monotonic()) > 0:
            if self.moved:
                return True
            self._waiter = waiter = loop.create_future()
            timer = loop.call_later(left, _wake, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
        return False

    async def sleep_step(self, start: float, base: float, slowdown: Callable[[], float]) -> float:
        """Sleep until ``start + base × slowdown()``, reading ``slowdown()`` again at each :meth:`move` (a
        fault change); return the deadline the step ended at."""
        self.moved = False
        deadline = start + base * slowdown()
        while await self.sleep_until(deadline):
            self.moved = False
            deadline = start + base * slowdown()
        return deadline


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
