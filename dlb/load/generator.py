"""The open-loop OpenAI load generator behind ``dlb load`` (streaming, sessions, trace replay); its command is :mod:`dlb.load.cli`.

Every request is sent at its scheduled time whatever happened to earlier ones (open loop), so an
overloaded fleet shows up as latency and errors, not as a lower offered rate. Latency and TTFT are
measured from the **scheduled** time, so if this process itself falls behind, the delay is counted
against the system rather than hidden (the "coordinated omission" mistake); ``lag`` (actual send −
scheduled) is recorded per request so a run can prove the generator kept up (``dlb bench load``).

Cost per request is kept low so one Python process can drive hundreds of streams per second: one
shared aiohttp session per target (keep-alive), bodies built from one preallocated text, stream
chunks counted with ``bytes.count`` instead of parsing each SSE event, and one task per request
created by a single scheduler loop.
"""

from __future__ import annotations

import asyncio
import csv
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dlb.finite_json import dumps as json_dumps
from dlb.load.workload import WorkloadRequest

SERVER_HEADER = "x-dlb-server"
_TEXT = "abcd" * 32768  # prompt text: 4 chars per token (the emulator's estimate), sliced per request


@dataclass
class Result:
    """One request's outcome. Times in seconds; ``t`` is the scheduled send time after the run start."""

    idx: int
    t: float
    endpoint: str
    source: str
    session: str
    status: int  # HTTP status; 0 = no response (connect error, reset, timeout)
    latency_s: float  # scheduled send -> last byte
    ttft_s: float  # scheduled send -> first body byte (first token for a stream)
    lag_s: float  # actual send - scheduled send (the generator's own delay)
    chunks: int  # SSE events received (streaming)
    server: str  # x-dlb-server of the response ("" if none)
    error: str = ""
    tail: str = ""  # the end of the body, only with ``keep_tail`` (``dlb bench load`` reads server stamps from it)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300 and not self.error


def body_for(r: WorkloadRequest, model: str, stream: bool) -> bytes:
    text = _TEXT[: 4 * max(1, min(r.prompt_tokens, len(_TEXT) // 4))]
    if r.endpoint == "chat":
        doc: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": r.max_tokens}
    else:
        doc = {"model": model, "prompt": text, "max_tokens": r.max_tokens}
    if stream:
        doc["stream"] = True
    return json.dumps(doc).encode()


class LoadRunner:
    """Send ``requests`` open-loop to ``targets`` (source cell -> base URL ``http://host:port``)."""

    def __init__(self, requests: list[WorkloadRequest], targets: dict[str, str], *, stream: bool = True,
                 model: str = "dlb-emulated", session_header: str = "x-session-id", timeout_s: float = 120.0,
                 on_result: Callable[[Result], None] | None = None, clock: Callable[[], float] = time.monotonic,
                 keep_tail: bool = False) -> None:
        missing = sorted({r.source for r in requests} - set(targets) - {""})
        if missing and "" not in targets:
            raise ValueError(f"targets: no URL for source cell(s) {', '.join(missing)} (have {', '.join(targets)})")
        self.requests = requests
        self.targets = targets
        self.stream = stream
        self.model = model
        self.session_header = session_header
        self.timeout_s = timeout_s
        self.on_result = on_result
        self.clock = clock
        self.keep_tail = keep_tail
        self.results: list[Result] = []
        self.sent = 0
        self.in_flight = 0
        self.t0 = 0.0

    def _url(self, r: WorkloadRequest) -> str:
        base = self.targets.get(r.source) or self.targets[""]
        return base.rstrip("/") + r.path

    async def run(self, stop: asyncio.Event | None = None) -> list[Result]:
        import aiohttp

        conn = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None, force_close=False)
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(connector=conn, timeout=timeout, auto_decompress=False) as session:
            tasks: set[asyncio.Task[None]] = set()
            self.t0 = self.clock()
            for idx, r in enumerate(self.requests):
                if stop is not None and stop.is_set():
                    break
                delay = self.t0 + r.t - self.clock()
                if delay > 0:
                    if stop is None:
                        await asyncio.sleep(delay)
                    else:
                        try:
                            async with asyncio.timeout(delay):
                                await stop.wait()
                            break
                        except TimeoutError:
                            pass
                task = asyncio.create_task(self._one(session, idx, r))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                self.sent += 1
            if stop is not None and tasks and not stop.is_set():
                # Every request is sent: drain them, but a stop during the drain still cuts what is left.
                drain: asyncio.Future[Any] = asyncio.gather(*tasks, return_exceptions=True)
                stopped: asyncio.Future[Any] = asyncio.create_task(stop.wait())
                await asyncio.wait({drain, stopped}, return_when=asyncio.FIRST_COMPLETED)
                stopped.cancel()
            if stop is not None and stop.is_set():
                for t in list(tasks):
                    t.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
        self.results.sort(key=lambda x: x.idx)
        return self.results

    async def _one(self, session: Any, idx: int, r: WorkloadRequest) -> None:
        import aiohttp

        sched = self.t0 + r.t
        headers = {"content-type": "application/json"}
        if r.session:
            headers[self.session_header] = r.session
        body = body_for(r, self.model, self.stream)
        self.in_flight += 1
        start = self.clock()
        status, ttft, chunks, server, error, last = 0, math.nan, 0, "", "", b""
        try:
            async with session.post(self._url(r), data=body, headers=headers) as resp:
                status = resp.status
                server = resp.headers.get(SERVER_HEADER, "")
                async for data in resp.content.iter_any():
                    if chunks == 0 and math.isnan(ttft):
                        ttft = self.clock() - sched
                    chunks += data.count(b"data: ")
                    last = data
                if self.stream and status == 200 and chunks == 0:
                    error = "empty stream"
        except asyncio.CancelledError:
            error = CUT
        except (TimeoutError, aiohttp.ClientError, OSError) as e:
            error = type(e).__name__
        finally:
            self.in_flight -= 1
        end = self.clock()
        if math.isnan(ttft):
            ttft = end - sched
        res = Result(idx, r.t, r.endpoint, r.source, r.session, status, end - sched, ttft, start - sched, chunks, server, error,
                     last[-160:].decode(errors="replace") if self.keep_tail else "")
        self.results.append(res)
        if self.on_result is not None:
            self.on_result(res)


# -- summaries ------------------------------------------------------------------------------------

def quantile(xs: list[float], q: float) -> float:
    if not xs:
        return math.nan
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(math.ceil(q * len(s))) - 1))]


#: The error of a request still in flight when the caller stopped the run (Ctrl-C): not a failure of
#: what was measured, so summaries leave it out and count it apart.
CUT = "cancelled"


def summarize(results: list[Result], duration_s: float | None = None) -> dict[str, Any]:
    """Counts, latency and TTFT quantiles of the served requests; requests cut by a stop are left out
    (``cut``), so an interrupted run's success rate is that of the requests it let finish."""
    cut = sum(1 for r in results if r.error == CUT)
    if cut:
        results = [r for r in results if r.error != CUT]
    ok = [r for r in results if r.ok]
    lat = [r.latency_s for r in ok]
    ttft = [r.ttft_s for r in ok]
    lag = [r.lag_s for r in results]
    span = duration_s or (max((r.t for r in results), default=0.0) or 1.0)
    return {
        "requests": len(results), "ok": len(ok), "errors": len(results) - len(ok), "cut": cut,
        "success_rate": len(ok) / len(results) if results else math.nan,
        "offered_rps": len(results) / span if span else math.nan,
        "mean_s": sum(lat) / len(lat) if lat else math.nan,
        "p50_s": quantile(lat, 0.5), "p90_s": quantile(lat, 0.9), "p99_s": quantile(lat, 0.99),
        "ttft_p50_s": quantile(ttft, 0.5), "ttft_p90_s": quantile(ttft, 0.9),
        "lag_p50_s": quantile(lag, 0.5), "lag_p99_s": quantile(lag, 0.99), "lag_max_s": max(lag, default=math.nan),
        "statuses": _counts(str(r.status) for r in results),
        "error_kinds": _counts(r.error for r in results if r.error),
    }


def _counts(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for k in items:
        out[k] = out.get(k, 0) + 1
    return dict(sorted(out.items()))


def write_results(results: list[Result], path: str | Path) -> None:
    """``.csv`` → CSV with a header; anything else → JSON lines."""
    p = Path(path)
    rows = [asdict(r) for r in results]
    if p.suffix == ".csv":
        with open(p, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(Result.__dataclass_fields__))
            w.writeheader()
            w.writerows(rows)
    else:
        with open(p, "w") as fh:
            fh.writelines(json_dumps(row) + "\n" for row in rows)
