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

now = time.monotonic


async def sleep_until(deadline: float) -> None:
    """Return once ``time.monotonic() >= deadline``, never before (uvloop may round a timer down)."""
    while (left := deadline - time.monotonic()) > 0:  # noqa: ASYNC110 - a deadline, not an event to wait for
        await asyncio.sleep(left)
