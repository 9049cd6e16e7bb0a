"""``dlb load``: the flags of the open-loop load generator, its progress lines and its summary.

Why here: commands (argparse, printing, exit codes) live only in each package's ``cli.py``; the
generator (:mod:`dlb.load.generator`) sends requests and records results for any caller.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import urllib.parse
from dataclasses import asdict, replace
from pathlib import Path

from dlb.finite_json import dumps as json_dumps
from dlb.load.argtypes import output_file, positive_float
from dlb.load.generator import LoadRunner, Result, summarize, write_results
from dlb.load.workload import WorkloadRequest, WorkloadSpec, generate, read_trace


def _seconds_text(x: float) -> str:
    """``1.234s``, or ``-`` when there is nothing to measure (no request succeeded): not ``nans``."""
    return "-" if math.isnan(x) else f"{x:.3f}s"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("load", help="open-loop OpenAI load generator (Poisson/constant, streaming, sessions, traces)",
                              description="Send OpenAI requests open-loop: a generated workload (rate, arrivals, lengths, "
                              "sessions) or a trace file. Latency and TTFT are from the scheduled send time.")
    p.add_argument("--url", action="append", required=True,
                   help="base URL (http://host:port, or the base_url dlb up prints); repeat as CELL=URL to send each source cell's requests to its root")
    p.add_argument("--rate", type=positive_float, default=10.0, help="requests per second (default 10)")
    p.add_argument("--duration", type=positive_float, default=30.0, help="seconds of arrivals (default 30)")
    p.add_argument("--arrival", choices=("poisson", "constant"), default="poisson", help="arrival process: Poisson (default) or evenly spaced")
    p.add_argument("--endpoint", choices=("chat", "completions", "mixed"), default="mixed", help="OpenAI API: chat, completions or both (default)")
    p.add_argument("--no-stream", action="store_true", help="non-streaming requests")
    p.add_argument("--sessions", type=float, default=3.0, help="mean chat turns per session (default 3; 1 = no multi-turn)")
    p.add_argument("--output-median", type=float, default=80.0, help="median output tokens (log-normal; default 80)")
    p.add_argument("--prompt-median", type=float, default=300.0, help="median prompt tokens (log-normal; default 300)")
    p.add_argument("--trace", default=None, help="replay this JSON-lines trace instead of generating (see --write-trace)")
    p.add_argument("--write-trace", default=None, help="write the generated workload as a trace and exit")
    p.add_argument("--model", default="dlb-emulated", help="the request's 'model' field (default dlb-emulated)")
    p.add_argument("--timeout", type=positive_float, default=120.0, help="per-request timeout in seconds (default 120)")
    p.add_argument("--seed", type=int, default=1, help="workload seed: the same seed sends the same requests (default 1)")
    p.add_argument("--out", type=output_file, default=None, help="per-request results: FILE.csv or FILE.jsonl")
    p.add_argument("--json", type=output_file, default=None, help="write the summary as JSON")
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
        if parts.path.rstrip("/") == "/v1":  # the base_url dlb up prints (an OpenAI client's): the paths add /v1 again
            url = urllib.parse.urlunsplit(parts._replace(path=""))
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
    if args.arrival == "constant":
        # rate x duration requests, evenly spaced: the Poisson draw's count (28 for --rate 10 --duration 3)
        # is not the rate asked for, so draw over a longer span until there are enough and keep the first n.
        n = max(1, round(args.rate * args.duration))
        while len(reqs) < n:
            spec = replace(spec, duration_s=2 * spec.duration_s)
            reqs = generate(spec)
        reqs = [WorkloadRequest(**{**asdict(r), "t": k * args.duration / n}) for k, r in enumerate(reqs[:n])]
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

    stopped_by: list[int] = []  # the signal that stopped the run early, if one did

    async def main() -> list[Result]:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        import signal

        def on_signal(sig: int) -> None:
            stopped_by.append(sig)
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig)
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
    # Offered over the span the arrivals had: the asked duration (a trace's: its last send), or until the stop.
    span = runner.clock() - runner.t0 if stopped_by else (duration if args.trace else args.duration)
    s = summarize(results, span or None)
    if stopped_by:
        print(f"dlb load: interrupted after {span:.0f}s: {s['cut']} requests then in flight left out, "
              f"{len(reqs) - runner.sent} not sent")
    sec = _seconds_text
    print(f"requests {s['requests']}  ok {s['ok']} ({100 * s['success_rate']:.1f} %)  offered {s['offered_rps']:.1f}/s\n"
          f"latency mean {sec(s['mean_s'])} p50 {sec(s['p50_s'])} p90 {sec(s['p90_s'])} p99 {sec(s['p99_s'])}  "
          f"TTFT p50 {sec(s['ttft_p50_s'])} p90 {sec(s['ttft_p90_s'])}\n"
          f"generator lag p50 {1000 * s['lag_p50_s']:.1f} ms p99 {1000 * s['lag_p99_s']:.1f} ms  statuses {s['statuses']}"
          + (f"  errors {s['error_kinds']}" if s["error_kinds"] else ""))
    if args.out:
        write_results(results, args.out)
    if args.json:
        Path(args.json).write_text(json_dumps(s, indent=1))
    if stopped_by:  # as a shell reports a command its signal ended, so `dlb load ... && next` does not go on
        return 128 + stopped_by[0]
    return 0 if s["requests"] and s["ok"] == s["requests"] else 1
