"""How faithfully a live emulator follows its own latency model on this machine.

Runs an emulator as a child process, sends waves of N simultaneous requests from this process, and
compares the client-measured mean end-to-end latency and time to first token with the pure model's
prediction for the same wave (:func:`dlb.emulator.engine.simulate`). The ratio exposes the
emulator's own overhead (Python, HTTP, one SSE chunk per token): near 1.0 the emulator is a good
stand-in for the profile's GPU; when it grows, use fewer concurrent streams or a larger
``--time-scale`` (slower steps hide the per-chunk cost).

    dlb bench emulator-fidelity --profile llama-8b-h100 --concurrency 1 4 16 32 64
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from dataclasses import asdict, dataclass

import aiohttp

from dlb.bench import harness
from dlb.emulator.engine import Arrival, Engine, simulate
from dlb.emulator.openai import CHARS_PER_TOKEN
from dlb.emulator.profile import load_profile
from dlb.testbed.emulator import EmulatorProcess


@dataclass(frozen=True)
class Row:
    concurrency: int
    model_e2e_s: float
    measured_e2e_s: float
    model_ttft_s: float
    measured_ttft_s: float
    server_cpu_us_per_token: float | None  # emulator CPU time per streamed token (Linux /proc), None elsewhere

    @property
    def e2e_ratio(self) -> float:
        return self.measured_e2e_s / self.model_e2e_s

    @property
    def ttft_ratio(self) -> float:
        return self.measured_ttft_s / self.model_ttft_s


async def _one(s: aiohttp.ClientSession, url: str, prompt: str, tokens: int) -> tuple[float, float]:
    body = {"prompt": prompt, "max_tokens": tokens, "stream": True}
    t0 = time.monotonic()
    ttft = None
    async with s.post(url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.content:
            if ttft is None and line.startswith(b"data: {"):
                ttft = time.monotonic() - t0
    assert ttft is not None
    return time.monotonic() - t0, ttft


async def _wave(url: str, n: int, prompt: str, tokens: int, waves: int) -> tuple[float, float]:
    e2e: list[float] = []
    ttft: list[float] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        await _one(s, url, prompt, 2)  # warm the connection pool and the server
        for _ in range(waves):
            res = await asyncio.gather(*[_one(s, url, prompt, tokens) for _ in range(n)])
            e2e += [r[0] for r in res]
            ttft += [r[1] for r in res]
            await asyncio.sleep(0.05)
    return statistics.fmean(e2e), statistics.fmean(ttft)


def _cpu_seconds(pid: int) -> float | None:
    """User+system CPU time of a process (Linux), to report the emulator's own cost per token."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def measure(profile: str, concurrency: list[int], prompt_tokens: int, output_tokens: int, waves: int,
            time_scale: float) -> list[Row]:  # fmt: skip
    prof = load_profile(profile)
    max_batch = max(concurrency)
    prompt = "x" * (prompt_tokens * CHARS_PER_TOKEN)
    rows = []
    with EmulatorProcess(profile=profile, max_batch=max_batch, max_queue=max_batch, time_scale=time_scale,
                         server_id="fidelity") as p:  # fmt: skip
        for n in concurrency:
            sim = simulate(Engine(prof, max_batch=max_batch, max_queue=max_batch),
                           [Arrival(0.0, prompt_tokens, output_tokens)] * n)  # fmt: skip
            model_e2e = statistics.fmean(r.e2e for r in sim) * time_scale
            model_ttft = statistics.fmean(r.ttft for r in sim) * time_scale
            assert p.proc is not None
            cpu0 = _cpu_seconds(p.proc.pid)
            e2e, ttft = asyncio.run(_wave(p.url, n, prompt, output_tokens, waves))
            cpu1 = _cpu_seconds(p.proc.pid)
            tokens = n * output_tokens * waves
            cpu = None if cpu0 is None or cpu1 is None else (cpu1 - cpu0) / tokens * 1e6
            rows.append(Row(n, model_e2e, e2e, model_ttft, ttft, cpu))
    return rows


def run(a: argparse.Namespace) -> int:
    record = harness.start()
    rows = measure(a.profile, a.concurrency, a.prompt_tokens, a.output_tokens, a.waves, a.time_scale)
    print(f"profile={a.profile} prompt={a.prompt_tokens} output={a.output_tokens} waves={a.waves} time_scale={a.time_scale}")
    print(f"{'N':>4} {'model e2e ms':>13} {'meas e2e ms':>12} {'ratio':>6} {'model ttft ms':>14} {'meas ttft ms':>13} {'ratio':>6} {'cpu us/tok':>10}")
    for r in rows:
        print(f"{r.concurrency:>4} {r.model_e2e_s * 1e3:>13.1f} {r.measured_e2e_s * 1e3:>12.1f} {r.e2e_ratio:>6.2f} "
              f"{r.model_ttft_s * 1e3:>14.1f} {r.measured_ttft_s * 1e3:>13.1f} {r.ttft_ratio:>6.2f} "
              f"{'-' if r.server_cpu_us_per_token is None else f'{r.server_cpu_us_per_token:.0f}':>10}")  # fmt: skip
    figures = [{**asdict(r), "e2e_ratio": r.e2e_ratio, "ttft_ratio": r.ttft_ratio} for r in rows]
    return harness.finish(record, figures, json_path=a.json)
