"""``dlb load``: an open-loop OpenAI load generator (streaming, sessions, trace replay).

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

import argparse
import asyncio
import csv
import json
import math
import sys
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dlb.load.argtypes import positive_float
from dlb.load.workload import WorkloadRequest, WorkloadSpec, generate, read_trace

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
                            await asyncio.wait_for(stop.wait(), delay)
                            break
                        except TimeoutError:
                            pass
                task = asyncio.create_task(self._one(session, idx, r))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                self.sent += 1
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
            error = "cancelled"
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


def _seconds_text(x: float) -> str:
    """``1.234s``, or ``-`` when there is nothing to measure (no request succeeded): not ``nans``."""
    return "-" if math.isnan(x) else f"{x:.3f}s"


def summarize(results: list[Result], duration_s: float | None = None) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    lat = [r.latency_s for r in ok]
    ttft = [r.ttft_s for r in ok]
    lag = [r.lag_s for r in results]
    span = duration_s or (max((r.t for r in results), default=0.0) or 1.0)
    return {
        "requests": len(results), "ok": len(ok), "errors": len(results) - len(ok),
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


def json_safe(obj: Any) -> Any:
    """``obj`` with every NaN float replaced by None: strict JSON (``NaN`` is not JSON, and jq, JS and
    most JSON readers refuse it), where "nothing to measure" reads as null."""
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    return obj


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
            fh.writelines(json.dumps(json_safe(row), allow_nan=False) + "\n" for row in rows)


# -- command ----------------------------------------------------------------------------------------

def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("load", help="open-loop OpenAI load generator (Poisson/constant, streaming, sessions, traces)",
                              description="Send OpenAI requests open-loop: a generated workload (rate, arrivals, lengths, "
                              "sessions) or a trace file. Latency and TTFT are from the scheduled send time.")
    p.add_argument("--url", action="append", required=True,
                   help="base URL (http://host:port); repeat as CELL=URL to send each source cell's requests to its root")
    p.add_argument("--rate", type=positive_float, default=10.0, help="requests per second (default 10)")
    p.add_argument("--duration", type=positive_float, default=30.0, help="seconds of arrivals (default 30)")
    p.add_argument("--arrival", choices=("poisson", "constant"), default="poisson")
    p.add_argument("--endpoint", choices=("chat", "completions", "mixed"), default="mixed")
    p.add_argument("--no-stream", action="store_true", help="non-streaming requests")
    p.add_argument("--sessions", type=float, default=3.0, help="mean chat turns per session (1 = no multi-turn)")
    p.add_argument("--output-median", type=float, default=80.0, help="median output tokens (log-normal)")
    p.add_argument("--prompt-median", type=float, default=300.0, help="median prompt tokens (log-normal)")
    p.add_argument("--trace", default=None, help="replay this JSON-lines trace instead of generating (see --write-trace)")
    p.add_argument("--write-trace", default=None, help="write the generated workload as a trace and exit")
    p.add_argument("--model", default="dlb-emulated")
    p.add_argument("--timeout", type=positive_float, default=120.0, help="per-request timeout in seconds")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default=None, help="per-request results: FILE.csv or FILE.jsonl")
    p.add_argument("--json", default=None, help="write the summary as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=run_load)


def _targets(urls: list[str]) -> dict[str, str]:
    """``--url`` values by source cell ("" for all); a value that is no http(s) URL is refused by name
    (before, every request failed with ``InvalidUrlClientError`` and the run went on)."""
    out: dict[str, str] = {}
    for u in urls:
        cell, sep, url = u.partition("=")
        if not (sep and not cell.startswith("http")):
            cell, url = "", u
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--url {u}: not an http(s) URL with a host (http://HOST:PORT, or CELL=http://HOST:PORT)")
        out[cell] = url
    return out


def build_requests(args: argparse.Namespace, sources: list[str]) -> list[WorkloadRequest]:
    if args.trace:
        return read_trace(args.trace)
    chat = {"chat": 1.0, "completions": 0.0, "mixed": 0.6}[args.endpoint]
    spec = WorkloadSpec(rate_rps=args.rate, duration_s=args.duration, sources=dict.fromkeys(sources, 1.0) or {"": 1.0},
                        chat_fraction=chat, chat_turns=max(1.0, args.sessions), output_median=args.output_median,
                        prompt_median=args.prompt_median, seed=args.seed)
    reqs = generate(spec)
    if args.arrival == "constant":  # same requests, evenly spaced
        n = len(reqs)
        reqs = [WorkloadRequest(**{**asdict(r), "t": k * args.duration / max(n, 1)}) for k, r in enumerate(reqs)]
    return reqs


def run_load(args: argparse.Namespace) -> int:
    try:
        targets = _targets(args.url)
        reqs = build_requests(args, [k for k in targets if k])
    except (ValueError, OSError) as e:
        print(f"dlb load: {e}", file=sys.stderr)
        return 2
    if args.write_trace:
        from dlb.load.workload import write_trace

        write_trace(reqs, args.write_trace)
        print(f"wrote {len(reqs)} requests to {args.write_trace}")
        return 0
    try:
        runner = LoadRunner(reqs, targets, stream=not args.no_stream, model=args.model, timeout_s=args.timeout)
    except ValueError as e:
        print(f"dlb load: {e}", file=sys.stderr)
        return 2
    duration = max((r.t for r in reqs), default=0.0)
    where = ", ".join(f"{k or '*'}={v}" for k, v in targets.items())
    print(f"dlb load: {len(reqs)} requests over {duration:.0f}s to {where}", flush=True)

    async def main() -> list[Result]:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        import signal

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        work = asyncio.create_task(runner.run(stop))
        while not work.done():
            await asyncio.sleep(1.0)
            if not args.quiet and not work.done():
                done = len(runner.results)
                okn = sum(1 for r in runner.results if r.ok)
                el = runner.clock() - runner.t0
                bar = "#" * int(30 * min(1.0, el / max(duration, 1e-9)))
                print(f"[{bar:<30}] {el:5.0f}s sent {runner.sent}/{len(reqs)} done {done} ok {okn} "
                      f"in flight {runner.in_flight}", flush=True)
        return await work

    results = asyncio.run(main())
    s = summarize(results, duration or None)
    sec = _seconds_text
    print(f"requests {s['requests']}  ok {s['ok']} ({100 * s['success_rate']:.1f} %)  offered {s['offered_rps']:.1f}/s\n"
          f"latency mean {sec(s['mean_s'])} p50 {sec(s['p50_s'])} p90 {sec(s['p90_s'])} p99 {sec(s['p99_s'])}  "
          f"TTFT p50 {sec(s['ttft_p50_s'])} p90 {sec(s['ttft_p90_s'])}\n"
          f"generator lag p50 {1000 * s['lag_p50_s']:.1f} ms p99 {1000 * s['lag_p99_s']:.1f} ms  statuses {s['statuses']}"
          + (f"  errors {s['error_kinds']}" if s["error_kinds"] else ""))
    if args.out:
        write_results(results, args.out)
    if args.json:
        Path(args.json).write_text(json.dumps(json_safe(s), indent=1, allow_nan=False))
    return 0 if s["requests"] and s["ok"] == s["requests"] else 1
