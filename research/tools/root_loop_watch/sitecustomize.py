"""Row 8 diagnosis: where a long ping of ``dlb bench hostile`` spent its time, root or bench.

Why: the bench's loop block is the round trip of a ping from the bench's process, so it also holds
that process's and the kernel's delays. Put this folder first on PYTHONPATH and every Python process
imports it. In ``dlb serve root`` it times a 5-ms heartbeat on the root's own loop (lags over 10 ms)
and each collection over 5 ms (wall and CPU); in ``dlb bench hostile`` each collection over 3 ms and,
per measured window, every ping over 25 ms. Lines (CLOCK_MONOTONIC seconds, comparable across
processes) go to ``/tmp/loop-watch-{root,bench}-PID.txt``. Other processes are left alone.

    PYTHONPATH=research/tools/root_loop_watch dlb bench hostile --scale full --attacks slot-squat
"""

from __future__ import annotations

import gc
import os
import sys
import time
from typing import Any


def _log(role: str) -> Any:
    return open(f"/tmp/loop-watch-{role}-{os.getpid()}.txt", "w", buffering=1)


def _gc_timer(out: Any, role: str, over_ms: float) -> None:
    started: list[tuple[float, float]] = []

    def timed(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[:] = [(time.monotonic(), time.thread_time())]
        elif started:
            (w0, c0), = started
            started.clear()
            wall = (time.monotonic() - w0) * 1e3
            if wall > over_ms:
                out.write(f"{w0:.3f} {role}gc{info['generation']} wall {wall:.1f} cpu {(time.thread_time() - c0) * 1e3:.1f}\n")

    gc.callbacks.append(timed)


if "root" in sys.argv and "serve" in " ".join(sys.argv):
    import asyncio

    import uvloop

    _out = _log("root")
    _gc_timer(_out, "root", 5.0)

    async def _heartbeat() -> None:
        while True:
            t = time.monotonic()
            await asyncio.sleep(0.005)
            lag = (time.monotonic() - t) * 1e3 - 5
            if lag > 10:
                _out.write(f"{t:.3f} rootlag {lag:.1f}\n")

    def _watched(run: Any) -> Any:
        def watched_run(main: Any, **kw: Any) -> Any:
            async def with_heartbeat() -> Any:
                asyncio.get_running_loop().create_task(_heartbeat())
                return await main

            return run(with_heartbeat(), **kw)

        return watched_run

    uvloop.run = _watched(uvloop.run)  # what dlb/service/runner.py calls

elif "bench" in sys.argv and "hostile" in sys.argv:
    import dlb.bench.hostile_measure as _measure

    _out = _log("bench")
    _gc_timer(_out, "bench", 3.0)
    _worst = _measure.Monitor.worst_ping_ms

    def _logged_worst(self: Any, t0: float, t1: float) -> float | None:
        _out.write(f"{t0:.3f} window_start\n{t1:.3f} window_end\n")
        for t, ms in self.pings:
            if t0 - 1 <= t <= t1 + 1 and ms > 25:
                _out.write(f"{t:.3f} ping {ms:.1f}\n")
        return _worst(self, t0, t1)

    _measure.Monitor.worst_ping_ms = _logged_worst
