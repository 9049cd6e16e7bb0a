"""Row 8 (slot squat) in one process: what the root's event loop waits on while connections churn.

Why: ``dlb bench hostile`` gives the loop's worst wall-clock block on a shared box, where a collection
can wait for a core as long as it runs. This starts DLB's HTTP/2 server on uvloop, lets a child
process hold 4,300 preface+SETTINGS connections (reopening what the server closed, once a second)
and reports the loop's worst lags next to each garbage collection's wall-clock and CPU (thread) time.

    .venv/bin/python research/tools/squat_gc_probe.py [SECONDS]
"""

from __future__ import annotations

import asyncio
import gc
import resource
import sys
import time
from typing import Any

import uvloop

from dlb.transport.server import H2GrpcServer

SQUATTER = r"""
import resource, socket, struct, sys, time
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + struct.pack(">I", 0)[1:] + bytes([4, 0]) + struct.pack(">I", 0)
port, n, end = int(sys.argv[1]), int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
socks = []
while time.monotonic() < end:
    kept = []
    for s in socks:
        s.setblocking(False)
        try:
            alive = s.recv(65536) != b""
        except BlockingIOError:
            alive = True
        except OSError:
            alive = False
        (kept.append(s) if alive else s.close())
    socks = kept
    while len(socks) < n:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=2)
            s.sendall(hello)
        except OSError:
            break
        socks.append(s)
    time.sleep(1.0)
for s in socks:
    s.close()
"""


class Collections:
    """Each collection's generation, wall-clock ms and CPU ms (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, float, float]] = []
        self._wall = self._cpu = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._wall, self._cpu = time.perf_counter(), time.thread_time()
        else:
            self.seen.append((int(info["generation"]), (time.perf_counter() - self._wall) * 1e3, (time.thread_time() - self._cpu) * 1e3))


async def main(seconds: float) -> None:
    server = H2GrpcServer("/x", lambda _m: (b"", True))
    port = await server.start("127.0.0.1", 0)
    gc.collect()
    gc.freeze()  # as the root does after start-up (dlb/gc_heap.py)
    collections = Collections()
    gc.callbacks.append(collections)
    squatter = await asyncio.create_subprocess_exec(sys.executable, "-c", SQUATTER, str(port), "4300", str(seconds))
    done = asyncio.ensure_future(squatter.wait())
    lags: list[float] = []
    while not done.done():
        t = time.perf_counter()
        await asyncio.sleep(0.02)
        lags.append((time.perf_counter() - t) * 1e3 - 20)
    gc.callbacks.remove(collections)
    await server.stop()
    worst = sorted(collections.seen, key=lambda c: -c[1])[:5]
    print("worst loop lags ms:",
          [round(x, 1) for x in sorted(lags, reverse=True)[:5]])
    print("collections per generation:", [sum(1 for g, _, _ in collections.seen if g == k) for k in range(3)])
    print("worst collections (generation, wall ms, CPU ms):", [(g, round(w, 1), round(c, 1)) for g, w, c in worst])
    print("all collections: wall ms, CPU ms:", round(sum(w for _, w, _ in collections.seen), 1), round(sum(c for _, _, c in collections.seen), 1))


if __name__ == "__main__":
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    uvloop.run(main(float(sys.argv[1]) if len(sys.argv) > 1 else 20.0))
