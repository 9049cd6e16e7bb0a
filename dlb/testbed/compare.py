"""``dlb demo --compare``: the stress scenarios against every policy on the real data path, with trials.

Each (scenario, policy, trial) is a clean deployment (fresh processes, fresh ports) running the
*same* requests as every other policy of that (scenario, trial): same arrival times, lengths,
sessions and sources (:mod:`dlb.testbed.scenarios` fixes each scenario's seed; trial t adds 1000·t).
The order is trial-major (every scenario and policy of trial 0, then of trial 1...) so a machine that
drifts spreads its drift over the policies instead of onto one.

Records: one JSON line per run in ``OUT/records.jsonl``, written as each run ends; a run whose
(scenario, policy, trial) is already there is skipped, so the same command with the same ``--out``
resumes an interrupted comparison. Each record: ``{scenario, policy, trial, seed, requests, ok,
errors, shed, timeout_s, mean_s, p50_s, p90_s, ttft_p50_s, served_mean_s, affinity_hit_rate, cells,
loadavg}`` where every latency counts a failed or shed request (anything but a 2xx) as the request
timeout (``timeout_s``, :data:`~dlb.testbed.scenarios.REQUEST_TIMEOUT_S`); ``served_mean_s`` is the
mean of the served requests only; ``shed`` counts 429s, ``errors`` every other failure.
Each run's requests (time, source, cell, status, latency) are in ``OUT/<scenario>-<policy>-t<trial>/requests.csv``;
per scenario, ``OUT/<scenario>-latency-cdf.png`` and ``OUT/<scenario>-cell-share.png`` (:mod:`dlb.testbed.compare_plots`).

The summary (``compare.md``, ``--json``) per (scenario, policy): trials, mean ± the half-width of the
95 % confidence interval of the mean over trials (Student t), p90 and TTFT p50 averaged over trials,
error and shed rates over all requests, and the mean ÷ the best operator baseline's mean.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
from pathlib import Path
from typing import Any

from dlb.core.native_discrete import DEFAULT_PICK
from dlb.launch.up import StopFlag
from dlb.load.generator import Result, quantile
from dlb.resumable import json_lines
from dlb.testbed.demo_run import native_label
from dlb.testbed.scenarios import REQUEST_TIMEOUT_S, SCENARIOS, trial_seed

OPERATOR = ("lr-global", "locality-failover", "hub-score")
QUICK_POLICIES = ("lr-global", "locality-failover", "hub-score", "Flow-Grad")


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


def charged(r: Result, timeout_s: float) -> tuple[float, float]:
    """(latency, TTFT) of one request as the comparison counts them: a failure costs the timeout."""
    return (r.latency_s, r.ttft_s) if r.ok else (timeout_s, timeout_s)


def record(scenario: str, policy: str, trial: int, results: list[Result], cells: list[str],
           timeout_s: float = REQUEST_TIMEOUT_S) -> dict[str, Any]:
    lat = [charged(r, timeout_s)[0] for r in results]
    ttft = [charged(r, timeout_s)[1] for r in results]
    served = [r.latency_s for r in results if r.ok]
    shed = sum(1 for r in results if r.status == 429)
    counts = dict.fromkeys(cells, 0)
    for r in results:
        c = r.server.rpartition("/")[0]
        if c in counts:
            counts[c] += 1
    ok = len(served)
    return {"scenario": scenario, "policy": policy, "trial": trial, "requests": len(results), "ok": ok,
            "errors": len(results) - ok - shed, "shed": shed, "timeout_s": timeout_s,
            "mean_s": sum(lat) / len(lat) if lat else math.nan, "p50_s": quantile(lat, 0.5), "p90_s": quantile(lat, 0.9),
            "ttft_p50_s": quantile(ttft, 0.5), "served_mean_s": sum(served) / ok if ok else math.nan,
            "affinity_hit_rate": affinity_hit_rate(results), "cells": counts}


def mean_ci(xs: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % confidence interval (Student t; NaN with one value)."""
    from scipy import stats

    n = len(xs)
    if n == 0:
        return math.nan, math.nan
    m = sum(xs) / n
    if n == 1:
        return m, math.nan
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    return m, float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (scenario, policy), in first-seen order; ``vs_best_operator`` = mean ÷ the best
    operator baseline's mean in the same scenario."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["scenario"], r["policy"]), []).append(r)
    rows = []
    for (scenario, policy), rs in groups.items():
        m, ci = mean_ci([r["mean_s"] for r in rs])
        req = sum(r["requests"] for r in rs) or 1
        rows.append({"scenario": scenario, "policy": policy, "trials": len(rs), "mean_s": m, "ci95_s": ci,
                     "p90_s": sum(r["p90_s"] for r in rs) / len(rs), "ttft_p50_s": sum(r["ttft_p50_s"] for r in rs) / len(rs),
                     "error_rate": sum(r["errors"] for r in rs) / req, "shed_rate": sum(r["shed"] for r in rs) / req,
                     "vs_best_operator": math.nan, **({"native_pick": rs[0]["native_pick"]} if "native_pick" in rs[0] else {})})
    for row in rows:
        ops = [o["mean_s"] for o in rows if o["scenario"] == row["scenario"] and o["policy"] in OPERATOR]
        if ops and min(ops) > 0:
            row["vs_best_operator"] = row["mean_s"] / min(ops)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| scenario | policy | trials | mean s ± 95 % CI | p90 s | TTFT p50 s | errors | shed | ÷ best operator |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        ci = "" if math.isnan(r["ci95_s"]) else f" ± {r['ci95_s']:.2f}"
        policy = native_label(r["policy"], r["native_pick"]) if "native_pick" in r else r["policy"]
        vs = "–" if math.isnan(r["vs_best_operator"]) else f"{r['vs_best_operator']:.2f}"  # no operator baseline ran
        lines.append(f"| {r['scenario']} | {policy} | {r['trials']} | {r['mean_s']:.2f}{ci} | {r['p90_s']:.2f} | "
                     f"{r['ttft_p50_s']:.2f} | {r['error_rate']:.1%} | {r['shed_rate']:.1%} | {vs} |")
    return "\n".join(lines)


def _clean(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x


def _unclean(rec: dict[str, Any]) -> dict[str, Any]:
    return {k: (math.nan if v is None else v) for k, v in rec.items()}


def write_requests(results: list[Result], path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t", "source", "endpoint", "cell", "status", "latency_s", "ttft_s"])
        for r in sorted(results, key=lambda x: x.t):
            w.writerow([f"{r.t:.3f}", r.source, r.endpoint, r.server.rpartition("/")[0], r.status,
                        f"{r.latency_s:.4f}", f"{r.ttft_s:.4f}"])


def plan(args: argparse.Namespace) -> tuple[list[str], list[str], int]:
    """(scenarios, policies, trials) the options ask for; raises ValueError naming the option."""
    from dlb.testbed.demo_run import ALL_POLICIES, DEFAULT_POLICIES

    if args.quick:
        return ["steady"], list(QUICK_POLICIES), 1
    scenarios = args.scenarios.split(",") if args.scenarios else list(SCENARIOS)
    bad = [repr(s) for s in scenarios if s not in SCENARIOS]
    if bad:
        raise ValueError(f"--scenarios: unknown {', '.join(bad)} (choose from {', '.join(SCENARIOS)})")
    policies = args.policies.split(",") if args.policies else list(DEFAULT_POLICIES)
    bad = [repr(p) for p in policies if p not in ALL_POLICIES]
    if bad:
        raise ValueError(f"--policies: unknown {', '.join(bad)} (choose from {', '.join(ALL_POLICIES)})")
    if args.trials < 1:
        raise ValueError(f"--trials: at least 1, got {args.trials}")
    return scenarios, policies, args.trials


def run_compare(args: argparse.Namespace, out: Path, stop: StopFlag) -> int:
    from dlb.testbed.demo import run_once
    from dlb.testbed.demo_run import NATIVE_POLICIES
    from dlb.testbed.report import git_commit

    try:
        scenarios, policies, trials = plan(args)
        duration = args.duration
        for s in scenarios:
            SCENARIOS[s].check(duration)
    except ValueError as e:
        print(f"dlb demo --compare: {e}")
        return 2
    out.mkdir(parents=True, exist_ok=True)
    path = out / "records.jsonl"
    records = [_unclean(v) for _, v in json_lines(path) if isinstance(v, dict) and "policy" in v]
    pick = getattr(args, "native_pick", DEFAULT_PICK)
    if pick != DEFAULT_PICK and not set(policies) & set(NATIVE_POLICIES):
        print(f"dlb demo --compare: --native-pick {pick}: no *-native policy in --policies to apply it to")
        return 2
    other = sorted({native_label(r["policy"], r["native_pick"]) for r in records
                    if r["policy"] in policies and r.get("native_pick", pick) != pick})
    if other:  # resuming would mix two picks under one policy name
        print(f"dlb demo --compare: {path} holds {', '.join(other)}, not --native-pick {pick}: use another --out or that pick")
        return 2
    done = {(r["scenario"], r["policy"], r["trial"]) for r in records}
    if done:
        print(f"dlb demo --compare: resuming: {len(done)} runs already in {path}", flush=True)
    commit = git_commit()
    for trial in range(trials):
        for scenario in scenarios:
            sc = SCENARIOS[scenario]
            for policy in policies:
                if stop():
                    break
                if (scenario, policy, trial) in done:
                    continue
                one = argparse.Namespace(**{**vars(args), "duration": duration, "scenario": sc, "seed": trial_seed(sc, trial)})
                run_dir = out / f"{scenario}-{policy}-t{trial}"
                load = os.getloadavg()[0]
                run, code = run_once(one, run_dir, stop, live=False, policy=policy, degrade=sc.fault is not None, quiet=True)
                if run is None or not run.results or run.interrupted:
                    print(f"dlb demo --compare: {scenario}/{policy}/trial {trial} produced no complete result (exit {code})")
                    continue
                write_requests(run.results, run_dir / "requests.csv")
                rec = {**record(scenario, policy, trial, run.results, list(run.servers), run.timeout_s),
                       "seed": one.seed, "duration_s": duration, "loadavg": [round(load, 2), round(os.getloadavg()[0], 2)], **commit,
                       **({"native_pick": pick} if policy in NATIVE_POLICIES else {})}
                records.append(rec)
                with path.open("a") as f:
                    f.write(json.dumps(_clean(rec)) + "\n")
                print(f"{scenario:12s} {policy:17s} t{trial} ok {rec['ok']}/{rec['requests']} shed {rec['shed']} "
                      f"mean {rec['mean_s']:.2f}s p90 {rec['p90_s']:.2f}s (load {load:.1f})", flush=True)
    from dlb.testbed.compare_plots import plot_scenario

    for scenario in scenarios:
        plot_scenario(out, scenario, policies, REQUEST_TIMEOUT_S)
    rows = summarize(records)
    text = table(rows)
    print(text)
    (out / "compare.md").write_text(text + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(_clean({**commit, "duration_s": duration, "timeout_s": REQUEST_TIMEOUT_S,
                                                      "summary": rows, "records": records}), indent=1))
    return 130 if stop() else 0
