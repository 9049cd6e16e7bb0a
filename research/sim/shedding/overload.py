"""Shedding on vs off under overload: Disc-RIF and Flow-Grad at 95 % and 110 % load (research record).

Usage (repository root): ``python research/sim/shedding/overload.py [--minutes 5] [--scenarios 4]``;
writes ``overload.json`` next to this file. Scenario k has seed 1000·101 + k (seed 101, as
``dlb sim --seed 101``); every figure is the mean over scenarios of one trial each. "with failures":
failed and shed requests count at the 60-s request timeout (dlb.sim.outcome).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

import numpy as np

from dlb.sim.engine import SimConfig, simulate
from dlb.sim.scenario import generate

FIELDS = ("error_rate", "shed_rate", "timed_out_rate", "mean_latency_with_failures", "mean", "p90_latency_with_failures")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--scenarios", type=int, default=4)
    ap.add_argument("--loads", default="0.95,1.1")
    args = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], check=False, capture_output=True, text=True).stdout.strip()
    rows = []
    for load in (float(x) for x in args.loads.split(",")):
        for k in range(1, args.scenarios + 1):
            sc = generate(101_000 + k, utilization=load, duration_s=60.0 * args.minutes)
            for policy, shed in (("Rand", False), ("Disc-RIF", False), ("Disc-RIF", True), ("Flow-Grad", False), ("Flow-Grad", True)):
                t0 = time.perf_counter()
                s = simulate(sc, policy, 0, SimConfig(shed=shed)).summary()
                rows.append({"load": load, "scenario": 101_000 + k, "cells": sc.n, "policy": policy, "shed": shed,
                             **{f: s[f] for f in FIELDS}, "wall_s": time.perf_counter() - t0})
                print(json.dumps(rows[-1]), flush=True)
    table = []
    for load in sorted({r["load"] for r in rows}):
        for policy, shed in dict.fromkeys((r["policy"], r["shed"]) for r in rows):
            sel = [r for r in rows if r["load"] == load and r["policy"] == policy and r["shed"] == shed]
            table.append({"load": load, "policy": policy, "shed": shed, **{f: float(np.mean([r[f] for r in sel])) for f in FIELDS}})
    out = Path(__file__).with_name("overload.json")
    out.write_text(json.dumps({"commit": commit, "minutes": args.minutes, "scenarios": args.scenarios, "seed": 101,
                               "mean_over_scenarios": table, "runs": rows}, indent=1) + "\n")
    for r in table:
        print(f"{r['load']:.2f} {r['policy']:9} shed={'on ' if r['shed'] else 'off'} err {100 * r['error_rate']:5.2f} % "
              f"shed {100 * r['shed_rate']:5.2f} % timeout {100 * r['timed_out_rate']:5.2f} % "
              f"mean w/ failures {r['mean_latency_with_failures']:6.2f} s  served mean {r['mean']:5.2f} s")


if __name__ == "__main__":
    main()
