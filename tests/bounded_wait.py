"""One bounded wait for the tests: poll a condition until it holds or a deadline passes.

Why one helper: four test files carried their own copy of this loop. Waits are polls with a deadline,
never fixed sleeps or hand-written deadline loops, so a loaded CI box only makes a test slower, not red; the condition is checked
once more after the deadline, so a poll starved past it by the scheduler still sees a condition that
became true meanwhile. Import it as ``from bounded_wait import until`` (pytest puts tests/ on the path);
``until_async`` is the same for a test running an event loop (the condition runs in a thread, so a
blocking check — an Envoy admin call — does not stall the services on that loop); ``until_in_loop``
runs the condition on the loop itself, for one that reads the loop's own objects (not thread-safe) or
is a coroutine function.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable


def until(cond: Callable[[], object], what: str, timeout: float = 30.0, period: float = 0.05) -> object:
    """Return ``cond()``'s value once it is true; raise ``AssertionError`` naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if v := cond():
            return v
        time.sleep(period)
    if v := cond():
        return v
    raise AssertionError(f"timed out waiting for: {what}")


async def until_async(cond: Callable[[], object], what: str, timeout: float = 30.0, period: float = 0.05) -> object:
    """:func:`until` inside an event loop; returns the condition's (true) value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if v := await asyncio.to_thread(cond):
            return v
        await asyncio.sleep(period)
    if v := await asyncio.to_thread(cond):
        return v
    raise AssertionError(f"timed out waiting for: {what}")


async def until_in_loop(cond: Callable[[], object], what: str, timeout: float = 30.0, period: float = 0.02) -> object:
    """:func:`until_async` with the condition run on the event loop (awaited if it returns an awaitable)."""

    async def check() -> object:
        v = cond()
        return await v if inspect.isawaitable(v) else v

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if v := await check():
            return v
        await asyncio.sleep(period)
    if v := await check():
        return v
    raise AssertionError(f"timed out waiting for: {what}")
