"""``dlb demo --compare``: one seeded workload against each policy on the real data path.

Each (scenario, policy) is a clean deployment (fresh processes, fresh ports) running the *same*
requests — same arrival times, lengths, sessions, sources (:func:`dlb.load.workload.generate` with
one seed) — in two scenarios: ``steady`` (no degradation) and ``degraded`` (the demo's mid-run
slowdown). Records (``--json``): ``{scenario, policy, requests, ok, errors, mean_s, p50_s, p90_s,
ttft_p50_s, norm_mean, norm_p90, affinity_hit_rate, cells: {cell: requests}}``, ``norm`` = ÷ Rand's
value in the same scenario.

Rand runs on the real data path as DLB's fail-open path: both endpoints flow, no root services, the
control plane's weights frozen at the replica split (no error aversion: the scenarios inject no
errors, so it would not act). MNLB runs the same way, its weights from the central LP the control
plane solves every 10 s (the config's ``mnlb`` policy plugin: demand from the leaves' per-source
completion counters, capacity from their published models; :mod:`dlb.control_plane.mnlb`).

``affinity_hit_rate``: among chat turns after a session's first, the fraction served by the same
cell as the session's previous turn (the cell-level affinity the root provides).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from dlb.launch.up import StopFlag
from dlb.load.generator import Result, summarize

SCENARIOS = ("steady", "degraded")


def affinity_hit_rate(results: list[Result]) -> float:
    last: dict[str, str] = {}
    hits = total = 0
    for r in sorted(results, key=lambda x: x.t):
        if not r.session or not r.server:
            continue
        cell = r.server.rpartition("/")[0]
        if r.session in last:
            total += 1
            hits += last[r.session] == cell
        last[r.session] = cell
    return hits / total if total else math.nan


def record(scenario: str, policy: str, results: list[Result], cells: list[str]) -> dict[str, Any]:
    s = summarize(results)
    counts = dict.fromkeys(cells, 0)
    for r in results:
        c = r.server.rpartition("/")[0]
        if c in counts:
            counts[c] += 1
    return {"scenario": scenario, "policy": policy, "requests": s["requests"], "ok": s["ok"], "errors": s["errors"],
            "mean_s": s["mean_s"], "p50_s": s["p50_s"], "p90_s": s["p90_s"], "ttft_p50_s": s["ttft_p50_s"],
            "norm_mean": math.nan, "norm_p90": math.nan, "affinity_hit_rate": affinity_hit_rate(results), "cells": counts}


def normalise(records: list[dict[str, Any]]) -> None:
    for rec in records:
        base = next((r for r in records if r["scenario"] == rec["scenario"] and r["policy"] == "Rand"), None)
        if base and base["mean_s"] and base["p90_s"]:
            rec["norm_mean"] = rec["mean_s"] / base["mean_s"]
            rec["norm_p90"] = rec["p90_s"] / base["p90_s"]


def table(records: list[dict[str, Any]]) -> str:
    lines = ["| scenario | policy | requests | ok | mean s | p50 s | p90 s | TTFT p50 s | ÷Rand mean | ÷Rand p90 | affinity |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in records:
        lines.append(f"| {r['scenario']} | {r['policy']} | {r['requests']} | {r['ok']} | {r['mean_s']:.2f} | {r['p50_s']:.2f} | "
                     f"{r['p90_s']:.2f} | {r['ttft_p50_s']:.2f} | {r['norm_mean']:.2f} | {r['norm_p90']:.2f} | "
                     f"{r['affinity_hit_rate']:.2f} |")
    return "\n".join(lines)


def _clean(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x


def run_compare(args: argparse.Namespace, out: Path, stop: StopFlag) -> int:
    from dlb.testbed.demo import run_once
    from dlb.testbed.demo_run import DLB_POLICIES
    from dlb.testbed.report import git_commit

    policies = args.policies.split(",") if args.policies else ["Rand", "MNLB", *DLB_POLICIES]
    bad = [p for p in policies if p not in ("Rand", "MNLB") and p not in DLB_POLICIES]
    if bad:
        print(f"dlb demo --compare: --policies: unknown {', '.join(bad)} (choose from Rand, MNLB, {', '.join(DLB_POLICIES)})")
        return 2
    records: list[dict[str, Any]] = []
    for scenario in SCENARIOS:
        for policy in policies:
            if stop():
                break
            run, code = run_once(args, out / f"{scenario}-{policy}", stop, live=False, policy=policy,
                                 degrade=scenario == "degraded", quiet=True)
            if run is None or not run.results:
                print(f"dlb demo --compare: {scenario}/{policy} produced no results (exit {code})")
                continue
            rec = record(scenario, policy, run.results, list(run.servers))
            records.append(rec)
            print(f"{scenario:8s} {policy:9s} ok {rec['ok']}/{rec['requests']} mean {rec['mean_s']:.2f}s "
                  f"p90 {rec['p90_s']:.2f}s", flush=True)
    normalise(records)
    text = table(records)
    print(text)
    (out / "compare.md").write_text(text + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(_clean({**git_commit(), "duration_s": args.duration, "load": args.load,
                                                      "seed": args.seed, "records": records}), indent=1))
    return 130 if stop() else 0
