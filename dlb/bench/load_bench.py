"""``dlb bench load``: does ``dlb load`` keep up with its target rate without skewing what it measures?

The upstream is a tiny streaming server in its own process that answers every POST with a fixed
stream (``--chunks`` SSE events ``--gap-ms`` apart, the first after ``--first-ms``) and stamps, in the
last event, the CLOCK_MONOTONIC times at which it received the request and sent the last byte.
CLOCK_MONOTONIC is one clock for every process on a Linux machine, so per request:

- ``send_delay`` = server receipt − scheduled send: the generator's lateness plus loopback;
- ``skew`` = client-measured latency − (server last byte − scheduled send): what the generator adds
  on the way back (reading, parsing, event-loop delay);

Verdict rule, fixed before any run: at ``--rate`` (default 300 streaming req/s) for ``--duration``
seconds the generator *keeps up* if it sent ≥ 99 % of the scheduled requests, ≥ 99 % succeeded, and
``send_delay`` p99 ≤ 20 ms; it *does not skew* if ``skew`` p50 ≤ 2 ms and p99 ≤ 20 ms. A low-rate
run (``--low-rate``, default 20/s) is measured the same way for reference.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

from dlb.bench import harness
from dlb.load.generator import LoadRunner, quantile
from dlb.load.workload import WorkloadRequest
from dlb.procutil import free_port, stop_process


def _serve(port: int, chunks: int, first_ms: float, gap_ms: float) -> None:  # pragma: no cover - child process
    from aiohttp import web

    async def handle(request: web.Request) -> web.StreamResponse:
        recv = time.monotonic()
        await request.read()
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep(first_ms / 1000)
        for _ in range(chunks - 1):
            await resp.write(b'data: {"choices":[{"text":"abcd"}]}\n\n')
            await asyncio.sleep(gap_ms / 1000)
        last = time.monotonic()
        await resp.write(f'data: {{"recv": {recv}, "last": {last}}}\n\ndata: [DONE]\n\n'.encode())
        await resp.write_eof()
        return resp

    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    app = web.Application()
    app.router.add_post("/{tail:.*}", handle)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def _stamps(tail: str) -> tuple[float, float] | None:
    """(server receipt, server last byte) from the stream's stamp event."""
    k = tail.find('{"recv"')
    if k < 0:
        return None
    try:
        d = json.loads(tail[k:tail.index("}", k) + 1])
        return float(d["recv"]), float(d["last"])
    except (ValueError, KeyError):
        return None


async def measure(port: int, rate: float, duration: float) -> dict[str, Any]:
    """One constant-rate run against the stamping upstream; every figure in ms."""
    n = int(rate * duration)
    reqs = [WorkloadRequest(t=k / rate, endpoint="completions", source="", prompt_tokens=16, max_tokens=8) for k in range(n)]
    runner = LoadRunner(reqs, {"": f"http://127.0.0.1:{port}"}, timeout_s=30, keep_tail=True)
    cpu0 = time.process_time()
    results = await runner.run()
    cpu = time.process_time() - cpu0
    ok = [r for r in results if r.ok]
    send_delay, skew = [], []
    for r in ok:
        st = _stamps(r.tail)
        if st is None:
            continue
        sched = runner.t0 + r.t
        send_delay.append(1000 * (st[0] - sched))
        skew.append(1000 * (r.latency_s - (st[1] - sched)))
    return {"rate": rate, "duration_s": duration, "scheduled": n, "sent": runner.sent, "ok": len(ok), "stamped": len(skew),
            "lag_p50_ms": 1000 * quantile([r.lag_s for r in results], 0.5),
            "lag_p99_ms": 1000 * quantile([r.lag_s for r in results], 0.99),
            "send_delay_p50_ms": quantile(send_delay, 0.5), "send_delay_p99_ms": quantile(send_delay, 0.99),
            "skew_p50_ms": quantile(skew, 0.5), "skew_p99_ms": quantile(skew, 0.99),
            "latency_p50_ms": 1000 * quantile([r.latency_s for r in ok], 0.5),
            "ttft_p50_ms": 1000 * quantile([r.ttft_s for r in ok], 0.5),
            "generator_cpu_ms_per_req": 1000 * cpu / max(1, len(results))}


#: The verdict rule of the module docstring, as the results file states it.
RULES = {"keeps_up": "sent >= 99 % and ok >= 99 % of the scheduled requests, send delay p99 <= 20 ms",
         "no_skew": "skew p50 <= 2 ms and p99 <= 20 ms"}


def verdict(m: dict[str, Any]) -> dict[str, bool]:
    """The rule in the module docstring."""
    keeps_up = m["sent"] >= 0.99 * m["scheduled"] and m["ok"] >= 0.99 * m["scheduled"] and m["send_delay_p99_ms"] <= 20
    no_skew = m["skew_p50_ms"] <= 2 and m["skew_p99_ms"] <= 20
    return {"keeps_up": bool(keeps_up), "no_skew": bool(no_skew)}


def run(args: argparse.Namespace) -> int:
    if args.serve is not None:
        _serve(args.serve, args.chunks, args.first_ms, args.gap_ms)
        return 0
    from dlb.config.model import HostPort
    from dlb.launch.up import tcp_open
    from dlb.testbed.report import git_commit

    record = harness.start()  # the tree and the box's load as they are when the run starts
    commit = git_commit()
    port = free_port()
    up = subprocess.Popen([sys.executable, "-m", "dlb.cli", "bench", "load", "--serve", str(port), "--chunks", str(args.chunks),
                           "--first-ms", str(args.first_ms), "--gap-ms", str(args.gap_ms)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not tcp_open(HostPort("127.0.0.1", port)):
            if up.poll() is not None or time.monotonic() > deadline:
                print("dlb bench load: the upstream did not start", file=sys.stderr)
                return 1
            time.sleep(0.05)
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
        out: dict[str, Any] = {**commit, "upstream": {"chunks": args.chunks, "first_ms": args.first_ms, "gap_ms": args.gap_ms},
                               "loadavg_start": record.loadavg_start, "runs": []}
        for rate in (args.low_rate, args.rate):
            m = asyncio.run(measure(port, rate, args.duration))
            m["verdict"] = verdict(m)
            out["runs"].append(m)
            print(f"rate {rate:.0f}/s: sent {m['sent']}/{m['scheduled']} ok {m['ok']}  lag p50/p99 {m['lag_p50_ms']:.2f}/"
                  f"{m['lag_p99_ms']:.2f} ms  send delay p50/p99 {m['send_delay_p50_ms']:.2f}/{m['send_delay_p99_ms']:.2f} ms  "
                  f"skew p50/p99 {m['skew_p50_ms']:.2f}/{m['skew_p99_ms']:.2f} ms  latency p50 {m['latency_p50_ms']:.1f} ms  "
                  f"generator CPU {m['generator_cpu_ms_per_req']:.2f} ms/req  {m['verdict']}", flush=True)
        out["loadavg_end"] = os.getloadavg()
        last = out["runs"][-1]
        targets = [harness.Target(f"{name} at {args.rate:g}/s: {RULES[name]}", bool(ok)) for name, ok in last["verdict"].items()]
        return harness.finish(record, out, targets, json_path=args.json)
    finally:
        stop_process(up, 5)
