"""Reloads that never drop a request to reload: one runs at a time, and one more is queued.

A SIGHUP (or a config-file change) that arrives while a reload runs used to be dropped, and the
control plane then served an older config than the file on disk. Now it marks the reload pending;
when the running one ends, another reads the file again. Any number of signals during one reload
coalesce into that one rerun: each reload reads the file as it is then, so the latest file wins.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from dlb.log import get_logger

log = get_logger("dlb.control_plane.reload")


class Reloader:
    """Runs ``reload_now`` on :meth:`request`; requests made while it runs are coalesced into one rerun."""

    def __init__(self, reload_now: Callable[[], Awaitable[None]]) -> None:
        self._reload_now = reload_now
        self._task: asyncio.Task[None] | None = None
        self._pending = False
        self.runs = 0

    def request(self) -> None:
        """Start a reload now, or queue one if a reload is running (call on the event loop's thread)."""
        if self._task is not None and not self._task.done():
            if not self._pending:
                log.info("config_reload_queued", message="reload running; another follows it")
            self._pending = True
            return
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            self._pending = False
            self.runs += 1
            try:
                await self._reload_now()
            except Exception:  # reload_now reports its own refusals; a bug must not stop the queue
                log.exception("config_reload_failed")
            if not self._pending:
                return

    async def idle(self) -> None:
        """Wait until no reload runs or is queued (tests, shutdown)."""
        while self._task is not None and not self._task.done():
            await asyncio.wait({self._task})

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
