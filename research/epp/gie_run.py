"""1,000 OpenAI requests through a real GIE-style Envoy and ``dlb serve epp``, then the EPP SIGKILLed mid-run.

Why: issue 28's target, made repeatable on demand (too long for CI; ``tests/e2e/test_epp_gateway_e2e.py``
is the CI form). The gateway, EPP and servers are that test's ``Pool`` (one GIE-style Envoy config, not
two). For each failure mode, FailClose (``failure_mode_allow: false``, ORIGINAL_DST on the EPP's header)
and FailOpen (``true``, override-host on the EPP's ``envoy.lb`` metadata, least-request fallback):

1. ``--requests`` requests, every other one a streamed chat completion, the rest non-streamed
   ``/v1/completions``, ``--concurrency`` at a time. Checked per request from what the servers and Envoy
   say, not the EPP: the Envoy access-log line (joined by the client's ``x-dlb-run-id``) has the EPP's
   header = its metadata = the upstream Envoy used = the address of the server naming itself in
   ``x-dlb-server``; and per server, its own ``vllm:request_success_total`` = the EPP's picks of it.
2. ``--kill-rate`` requests a second for ``--kill-at + --down-s + --after-s`` seconds; the EPP SIGKILLed at ``--kill-at``, started
   again on the same port after ``--down-s``. Per request: started before the kill, while the EPP was dead
   (kill to the restarted EPP's ready file), or after; answered whole or not; where it went.

Run from the repository root: ``.venv/bin/python research/epp/gie_run.py --json research/epp/gie-run.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "e2e")]
from test_epp_gateway_e2e import Pool  # noqa: E402  (the e2e test's gateway: one GIE-style config, not two)

RID = "x-dlb-run-id"
MODEL = "dlb-emulated"


def body_of(i: int) -> tuple[str, dict[str, Any]]:
    """Request ``i``: even ones a streamed chat completion, odd ones a non-streamed completion."""
    if i % 2 == 0:
        return "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": f"hello {i} " * (1 + i % 7)}],
                                        "max_tokens": 4 + i % 5, "stream": True}
    return "/v1/completions", {"model": MODEL, "prompt": f"hello {i} " * (1 + i % 7), "max_tokens": 4 + i % 5}


def whole(stream: bool, status: int, data: bytes) -> bool:
    """A 200 whose body is a complete OpenAI answer: a stream ending in ``[DONE]``, or JSON with a choice."""
    if status != 200:
        return False
    if stream:
        return data.rstrip().endswith(b"data: [DONE]")
    try:
        return bool(json.loads(data).get("choices"))
    except ValueError:
        return False


async def one(http: aiohttp.ClientSession, port: int, i: int, rid: str, t_zero: float) -> dict[str, Any]:
    path, body = body_of(i)
    t0 = time.monotonic()
    try:
        async with http.post(f"http://127.0.0.1:{port}{path}", json=body, headers={RID: rid}) as r:
            status, server, data = r.status, r.headers.get("x-dlb-server", ""), await r.read()
    except (TimeoutError, aiohttp.ClientError) as e:
        status, server, data = 0, "", repr(e).encode()
    t1 = time.monotonic()
    ok = whole(body.get("stream", False), status, data)
    return {"rid": rid, "stream": i % 2 == 0, "status": status, "server": server, "ok": ok,
            "t0": t0 - t_zero, "t1": t1 - t_zero, **({} if ok else {"error": data[:160].decode(errors="replace")})}


def pct(xs: list[float]) -> dict[str, float]:
    return {"p50_ms": round(float(np.percentile(xs, 50)) * 1e3, 1), "p90_ms": round(float(np.percentile(xs, 90)) * 1e3, 1)} if xs else {}


def joined(pool: Pool, results: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, str] | None]]:
    """Each request with its Envoy access-log line (None when Envoy wrote none)."""
    by_rid = {line["rid"]: line for line in pool.log_lines()}
    return [(r, by_rid.get(r["rid"])) for r in results]


def went_where_picked(pool: Pool, r: dict[str, Any], line: dict[str, str] | None, key: str) -> bool:
    """The EPP named an endpoint (``key``: its header or metadata), Envoy used it, and the server there says it served it."""
    return (line is not None and r["ok"] and line[key] not in ("", "-") and line["dest"] == line["meta"]
            and line[key] == line["upstream"] == pool.by_name.get(line["server"]) and line["server"] == r["server"])


def settle(pool: Pool, results: list[dict[str, Any]]) -> None:
    """Envoy flushes its access log about once a second: wait (bounded) for every request's line."""
    want = {r["rid"] for r in results}
    deadline = time.monotonic() + 10
    while not want <= {line["rid"] for line in pool.log_lines()} and time.monotonic() < deadline:
        time.sleep(0.1)


async def main_run(pool: Pool, n: int, concurrency: int, key: str) -> dict[str, Any]:
    sem = asyncio.Semaphore(concurrency)
    t_zero = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:

        async def bounded(i: int) -> dict[str, Any]:
            async with sem:
                return await one(http, pool.port, i, f"main-{i}", t_zero)

        results = await asyncio.gather(*(bounded(i) for i in range(n)))
    wall = time.monotonic() - t_zero
    settle(pool, results)
    pairs = joined(pool, results)
    served, picks = pool.served(), pool.picks()
    return {
        "requests": n, "streamed": sum(r["stream"] for r in results), "wall_s": round(wall, 2), "req_per_s": round(n / wall, 1),
        "errors": sum(not r["ok"] for r in results), "statuses": dict(Counter(str(r["status"]) for r in results)),
        "log_lines": sum(line is not None for _, line in pairs),
        "went_where_picked": sum(went_where_picked(pool, r, line, key) for r, line in pairs),
        "served_by_server": served, "epp_picks_by_server": picks, "served_equals_picks": served == picks,
        "latency_all": pct([r["t1"] - r["t0"] for r in results]),
        "latency_streamed_chat": pct([r["t1"] - r["t0"] for r in results if r["stream"]]),
        "latency_completions": pct([r["t1"] - r["t0"] for r in results if not r["stream"]]),
        "error_samples": [r for r in results if not r["ok"]][:5],
    }


async def kill_run(pool: Pool, rate: float, concurrency: int, kill_at: float, down_s: float, after_s: float,
                   key: str) -> dict[str, Any]:
    """Paced traffic; the EPP SIGKILLed at ``kill_at`` and started again ``down_s`` later."""
    assert pool.epp is not None and pool.epp.proc is not None
    t_zero = time.monotonic()
    end = kill_at + down_s + after_s
    marks: dict[str, float] = {}
    results: list[dict[str, Any]] = []
    sem = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:

        async def bounded(i: int) -> None:
            async with sem:
                results.append(await one(http, pool.port, i, f"kill-{i}", t_zero))

        async def paced() -> None:
            """Open loop at ``rate`` a second (a fast 500 does not make more requests), at most ``concurrency`` in flight."""
            tasks = []
            for i in range(int(end * rate)):
                await asyncio.sleep(max(0.0, i / rate - (time.monotonic() - t_zero)))
                tasks.append(asyncio.create_task(bounded(i)))
            await asyncio.gather(*tasks)

        async def killer() -> None:
            assert pool.epp is not None and pool.epp.proc is not None
            await asyncio.sleep(kill_at)
            os.kill(pool.epp.pid, signal.SIGKILL)
            marks["kill"] = time.monotonic() - t_zero
            await asyncio.to_thread(pool.epp.proc.wait, 10)
            await asyncio.sleep(max(0.0, kill_at + down_s - (time.monotonic() - t_zero)))
            marks["restart"] = time.monotonic() - t_zero
            pool.epp.spawn()
            await asyncio.to_thread(pool.epp.wait_ready)
            marks["ready"] = time.monotonic() - t_zero

        await asyncio.gather(killer(), paced())
    settle(pool, results)
    pairs = joined(pool, results)

    def phase(r: dict[str, Any]) -> str:
        if r["t1"] < marks["kill"]:
            return "before_kill"
        if r["t0"] < marks["kill"]:
            return "in_flight_at_kill"
        if r["t0"] < marks["restart"]:
            return "epp_dead"
        return "epp_starting" if r["t0"] < marks["ready"] else "after_restart"

    out: dict[str, Any] = {"marks_s": {k: round(v, 3) for k, v in marks.items()}, "rate": rate, "concurrency": concurrency}
    for name in ("before_kill", "in_flight_at_kill", "epp_dead", "epp_starting", "after_restart"):
        sel = [(r, line) for r, line in pairs if phase(r) == name]
        out[name] = {
            "requests": len(sel), "ok": sum(r["ok"] for r, _ in sel),
            "statuses": dict(Counter(str(r["status"]) for r, _ in sel)),
            "reached_a_server": sum(bool(r["server"]) for r, _ in sel),
            "went_where_picked": sum(went_where_picked(pool, r, line, key) for r, line in sel),
            "envoy_picked_without_epp": sum(bool(line and r["ok"] and line[key] in ("", "-") and line["upstream"] == pool.by_name.get(line["server"]))
                                            for r, line in sel),
            "servers": dict(Counter(r["server"] or "-" for r, _ in sel)),
            "latency": pct([r["t1"] - r["t0"] for r, _ in sel]),
            "failed_samples": [{**r, "log": line} for r, line in sel if not r["ok"] and r["status"] != 500][:3],
        }
    since_restart = [(r, line) for r, line in pairs if r["t0"] >= marks["restart"]]
    first_pick = min((r["t1"] for r, line in since_restart if went_where_picked(pool, r, line, key)), default=None)
    out["recovery_s"] = {
        "kill_to_first_failure": min((round(r["t1"] - marks["kill"], 3) for r in results if r["t1"] >= marks["kill"] and not r["ok"]),
                                     default=None),
        "restart_to_ready_file": round(marks["ready"] - marks["restart"], 3),
        "restart_to_first_epp_pick_answered": round(first_pick - marks["restart"], 3) if first_pick is not None else None,
        "failures_started_after_first_epp_pick": sum(not r["ok"] for r, _ in since_restart if first_pick is not None and r["t0"] >= first_pick),
        "not_epp_picked_started_after_first_epp_pick": sum(not went_where_picked(pool, r, line, key) for r, line in since_restart
                                                           if first_pick is not None and r["t0"] >= first_pick),
    }
    return out


def uptime() -> str:
    return subprocess.run(["uptime"], check=False, capture_output=True, text=True).stdout.strip()


def run_mode(fail_open: bool, args: argparse.Namespace) -> dict[str, Any]:
    key = "meta" if fail_open else "dest"
    with tempfile.TemporaryDirectory(prefix="dlb-gie-run-") as tmp, Pool(Path(tmp), fail_open=fail_open) as pool:
        main = asyncio.run(main_run(pool, args.requests, args.concurrency, key))
        kill = asyncio.run(kill_run(pool, args.kill_rate, args.kill_concurrency, args.kill_at, args.down_s, args.after_s, key))
    return {"failure_mode_allow": fail_open, "main": main, "kill": kill}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=1000, help="requests in the main run, per mode (default 1000)")
    ap.add_argument("--concurrency", type=int, default=16, help="main run's requests in flight (default 16)")
    ap.add_argument("--kill-rate", type=float, default=100.0, help="kill run's requests a second (default 100)")
    ap.add_argument("--kill-concurrency", type=int, default=16, help="kill run's most requests in flight (default 16)")
    ap.add_argument("--kill-at", type=float, default=3.0, help="seconds of kill-run traffic before the SIGKILL (default 3)")
    ap.add_argument("--down-s", type=float, default=3.0, help="seconds the EPP stays dead (default 3)")
    ap.add_argument("--after-s", type=float, default=5.0, help="seconds of traffic after the restart (default 5)")
    ap.add_argument("--modes", default="fail_close,fail_open", help="comma-separated: fail_close, fail_open")
    ap.add_argument("--json", default=None, help="write the record here")
    args = ap.parse_args()
    if bad_modes := set(args.modes.split(",")) - {"fail_close", "fail_open"}:
        ap.error(f"--modes: unknown {sorted(bad_modes)} (fail_close, fail_open)")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], check=True, capture_output=True, text=True, cwd=REPO).stdout.strip()
    record: dict[str, Any] = {"commit": commit, "command": " ".join(sys.argv), "args": vars(args), "uptime_before": uptime(),
                              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "modes": {}}
    for mode in args.modes.split(","):
        record["modes"][mode] = run_mode(mode == "fail_open", args)
        record["modes"][mode]["verdict"] = verdict(record["modes"][mode], args.requests)
        print(json.dumps({mode: {k: v for k, v in record["modes"][mode]["main"].items() if k != "error_samples"}}))
    record["uptime_after"] = uptime()
    text = json.dumps(record, indent=1)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0 if all(verdict(r, args.requests).values() for r in record["modes"].values()) else 1


def verdict(r: dict[str, Any], n: int) -> dict[str, bool]:
    """The target's checks on one mode's record: GIE's FailClose drops while the EPP is dead, FailOpen forwards."""
    main, dead, rec = r["main"], r["kill"]["epp_dead"], r["kill"]["recovery_s"]
    return {"no_errors": main["errors"] == 0, "all_where_picked": main["went_where_picked"] == n and main["served_equals_picks"],
            "while_dead": dead["ok"] == dead["requests"] if r["failure_mode_allow"] else dead["reached_a_server"] == 0,
            "recovered": rec["restart_to_first_epp_pick_answered"] is not None and rec["failures_started_after_first_epp_pick"] == 0
            and rec["not_epp_picked_started_after_first_epp_pick"] == 0}


if __name__ == "__main__":
    sys.exit(main())
