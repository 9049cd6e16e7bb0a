"""A small HTTP/1.1 load generator on asyncio protocols (uvloop), for the overhead benchmark.

Why not aiohttp: its client costs ~100 µs of Python per request, which on a 2-core machine would be
the bottleneck we measure. A raw ``asyncio.Protocol`` with pre-built request bytes and a minimal
response parser (status line + content-length) costs a few µs. Two modes:

- **closed loop**: ``connections`` workers, each sends its next request when the previous answer
  arrives — finds the saturation throughput.
- **open loop**: arrivals at a fixed mean rate (Poisson, seeded), independent of answers; latency is
  measured from the *scheduled* send time, so queueing inside the system under test is not hidden
  (no coordinated omission). Connections come from a pool and are opened on demand.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np


def build_request(host: str, port: int, path: str, body: bytes = b"{}", extra: dict[str, str] | None = None) -> bytes:
    head = [f"POST {path} HTTP/1.1", f"host: {host}:{port}", "content-type: application/json", f"content-length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in (extra or {}).items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class _Conn(asyncio.Protocol):
    __slots__ = ("buf", "closed", "pending", "transport")

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.pending: deque[asyncio.Future[int]] = deque()
        self.closed = False

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buf[:end]).lower()
            k = head.find(b"content-length:")
            if k < 0:
                length = 0
            else:
                e = head.find(b"\r\n", k)
                length = int(head[k + 15:e if e > 0 else None])
            total = end + 4 + length
            if len(buf) < total:
                return
            status = int(head[9:12])
            del buf[:total]
            if self.pending:
                fut = self.pending.popleft()
                if not fut.done():
                    fut.set_result(status)

    def connection_lost(self, exc) -> None:
        self.closed = True
        while self.pending:
            fut = self.pending.popleft()
            if not fut.done():
                fut.set_result(0)

    def send(self, data: bytes) -> asyncio.Future[int]:
        fut = asyncio.get_running_loop().create_future()
        self.pending.append(fut)
        assert self.transport is not None
        self.transport.write(data)
        return fut


async def _connect(host: str, port: int) -> _Conn:
    _, proto = await asyncio.get_running_loop().create_connection(_Conn, host, port)
    return proto


@dataclass
class LoadResult:
    latencies_s: np.ndarray
    errors: int
    duration_s: float
    statuses: dict[int, int] = field(default_factory=dict)
    dropped: int = 0  # open loop: arrivals not sent because max_connections were all busy

    @property
    def rps(self) -> float:
        return len(self.latencies_s) / self.duration_s if self.duration_s > 0 else 0.0

    def pct_ms(self, q: float) -> float:
        return float(np.percentile(self.latencies_s, q) * 1000) if len(self.latencies_s) else math.nan


async def closed_loop(host: str, port: int, request: bytes, connections: int, duration_s: float, warmup_s: float = 0.3) -> LoadResult:
    conns = [await _connect(host, port) for _ in range(connections)]
    lat: list[float] = []
    statuses: dict[int, int] = {}
    errors = 0
    perf = time.perf_counter
    start = perf()
    record_from = start + warmup_s
    stop = record_from + duration_s

    async def worker(c: _Conn) -> None:
        nonlocal errors
        while True:
            t0 = perf()
            if t0 >= stop or c.closed:
                return
            status = await c.send(request)
            t1 = perf()
            if t0 >= record_from:
                statuses[status] = statuses.get(status, 0) + 1
                if status == 200:
                    lat.append(t1 - t0)
                else:
                    errors += 1

    await asyncio.gather(*(worker(c) for c in conns))
    end = perf()
    for c in conns:
        if c.transport is not None:
            c.transport.close()
    return LoadResult(np.asarray(lat), errors, min(end, stop) - record_from, statuses)


async def open_loop(host: str, port: int, request: bytes, rate: float, duration_s: float, seed: int = 1,
                    max_connections: int = 512, warmup_s: float = 0.3) -> LoadResult:
    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    idle: deque[_Conn] = deque([await _connect(host, port) for _ in range(8)])
    open_conns = len(idle)
    lat: list[float] = []
    statuses: dict[int, int] = {}
    errors = 0
    dropped = 0
    tasks: set[asyncio.Task] = set()
    perf = time.perf_counter
    start = perf()
    record_from = start + warmup_s
    stop = record_from + duration_s

    async def one(scheduled: float) -> None:
        nonlocal errors, open_conns
        c = None
        while idle:
            c = idle.pop()
            if not c.closed:
                break
            c = None
        if c is None:
            c = await _connect(host, port)
        status = await c.send(request)
        t1 = perf()
        if scheduled >= record_from:
            statuses[status] = statuses.get(status, 0) + 1
            if status == 200:
                lat.append(t1 - scheduled)
            else:
                errors += 1
        if not c.closed:
            idle.append(c)

    next_t = start
    while next_t < stop:
        now = perf()
        while next_t <= now and next_t < stop:
            if len(tasks) >= max_connections:
                dropped += 1  # the system is saturated beyond any sane queue: reported separately
            else:
                t = loop.create_task(one(next_t))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
            next_t += rng.expovariate(rate)
        delay = next_t - perf()
        if delay > 0:
            await asyncio.sleep(delay)
    if tasks:
        await asyncio.wait(tasks, timeout=10)
    for c in idle:
        if c.transport is not None:
            c.transport.close()
    del open_conns
    return LoadResult(np.asarray(lat), errors, duration_s, statuses, dropped)
