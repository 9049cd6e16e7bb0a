"""What the loop-lag heartbeat (dlb/service/loop_lag.py) costs: CPU per beat on a uvloop, idle and busy.

Idle: the loop has nothing else to do, so each beat is a wake from epoll (the worst case per beat):
the process's CPU over ``--seconds`` with and without the heartbeat. Inline: a loop that is awake
anyway (a busy root) pays only the beat itself — ``LoopLag._beat`` (the lag, the histogram, the slot,
the next ``call_later``) called 200,000 times in a row, each new timer cancelled. (Fewer callbacks per
CPU-second on a busy loop was tried first: its run-to-run noise, ~10 %, is 100x the effect.) Each run
is a fresh interpreter; periods alternate, in rounds.

    python research/tools/loop_lag_cost.py --seconds 5 --rounds 3 --json research/bench/loop-lag-cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from dlb.service.loop_lag import PERIOD_S

PERIODS = (0.0, PERIOD_S, 0.01, 0.005)  # 0: no heartbeat


def one(mode: str, period: float, seconds: float) -> dict:
    import asyncio

    import uvloop

    from dlb.service.loop_lag import LoopLag

    async def main() -> dict:
        if mode == "inline":
            lag = LoopLag("dlb_cost").start()
            n = 200_000
            c0 = time.process_time()
            for _ in range(n):
                handle = lag._handle
                lag._beat()
                assert handle is not None
                handle.cancel()
            cpu = time.process_time() - c0
            lag.stop()
            return {"mode": mode, "period_s": period, "cpu_s": round(cpu, 5), "beats": n, "us_per_beat": round(cpu / n * 1e6, 2)}
        lag = LoopLag("dlb_cost", period_s=period).start() if period else None
        c0 = time.process_time()
        await asyncio.sleep(seconds)
        cpu = time.process_time() - c0
        beats = sum(lag.hist.counts) if lag else 0
        if lag:
            lag.stop()
        return {"mode": mode, "period_s": period, "seconds": seconds, "cpu_s": round(cpu, 5), "beats": beats}

    return uvloop.run(main())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--one", nargs=2, metavar=("MODE", "PERIOD"))
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one[0], float(a.one[1]), a.seconds)))
        return 0
    from dlb.provenance import git_commit

    load = [round(os.getloadavg()[0], 2)]
    runs = []
    for _ in range(a.rounds):
        for mode in ("idle", "inline"):
            for period in PERIODS if mode == "idle" else (PERIOD_S,):
                out = subprocess.run([sys.executable, __file__, "--seconds", str(a.seconds), "--one", mode, str(period)],
                                     capture_output=True, text=True, check=True).stdout
                runs.append(json.loads(out))
                print(out.strip(), flush=True)
    load.append(round(os.getloadavg()[0], 2))
    result = {"bench": "loop-lag-cost", "commit": git_commit(), "load_avg_1m": {"start": load[0], "end": load[1]}, "runs": runs}
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
