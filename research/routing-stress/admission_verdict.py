"""Leaf admission: the figures research/routing-stress/admission-rule.md judges.

Per arm (old: ``--admission off``, new: ``--admission on``) and policy, the outage runs' means over runs of
the failure-counting mean ÷ Rand and ÷ the best operator, error, shed, timed-out and client-visible failure
rates (:func:`timeout_verdict.table`); then the rule's checks for each DLB policy. With the baseline arms,
each DLB policy's per-run ratio new ÷ old of the failure-counting mean, and the change of its client-visible
failures, at 80 % load.

Usage: python research/routing-stress/admission_verdict.py OUTAGE_OLD OUTAGE_NEW [BASELINE_OLD BASELINE_NEW] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from statistics import mean
from typing import Any

from deadline_verdict import records  # this folder's reader of an arm's records (the script's dir is on sys.path)
from timeout_verdict import OPERATORS, markdown, table, whole_runs

DLB = ("Disc-RIF", "Disc-Lat", "Flow-Grad")
POLICIES = ("Rand", *OPERATORS, *DLB)
#: Baseline: a DLB policy's mean may rise at most this factor, its client-visible failures this share.
BASELINE_MEAN = 1.005
BASELINE_FAILURES = 0.0005


def by_run(d: Path) -> dict[tuple[str, int, int], dict[str, Any]]:
    return {(r["policy"], r["scenario"], r["trial"]): r for r in records(d)}


def outage(old_dir: Path, new_dir: Path) -> dict[str, Any]:
    old, new = by_run(old_dir), by_run(new_dir)
    runs = [x for x in whole_runs(new, POLICIES) if x in set(whole_runs(old, POLICIES))]
    t_old, t_new = table(old, runs, DLB), table(new, runs, DLB)
    checks = {}
    for p in DLB:
        o, n = t_old["rows"][p], t_new["rows"][p]
        target = t_new["verdict"][p]
        better = n["vs_best_operator"] < o["vs_best_operator"] and n["client_failure_rate"] < o["client_failure_rate"]
        checks[p] = {"target": target["operator"] and target["failures"], "mean_vs_operator": target["operator"],
                     "failures_in_bound": target["failures"], "better_than_old": better}
    same = all(old[(p, s, t)]["mean_latency_with_failures"] == new[(p, s, t)]["mean_latency_with_failures"]
               for p in ("Rand", *OPERATORS) for s, t in runs)
    return {"old": t_old, "new": t_new, "checks": checks, "baselines_identical": same}


def baseline(old_dir: Path, new_dir: Path) -> dict[str, Any]:
    old, new = by_run(old_dir), by_run(new_dir)
    out: dict[str, Any] = {}
    for p in DLB:
        runs = sorted((s, t) for (q, s, t) in new if q == p and (p, s, t) in old)
        ratio = mean(new[(p, s, t)]["mean_latency_with_failures"] / old[(p, s, t)]["mean_latency_with_failures"] for s, t in runs)
        dfail = mean(new[(p, s, t)]["client_failure_rate"] - old[(p, s, t)]["client_failure_rate"] for s, t in runs)
        refused = mean(new[(p, s, t)].get("admission_refused_rate", 0.0) for s, t in runs)
        out[p] = {"runs": len(runs), "mean_new_over_old": ratio, "failures_change": dfail, "admission_refused_rate": refused,
                  "holds": ratio <= BASELINE_MEAN and dfail <= BASELINE_FAILURES}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("dirs", type=Path, nargs="+", help="OUTAGE_OLD OUTAGE_NEW [BASELINE_OLD BASELINE_NEW]")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    if len(a.dirs) not in (2, 4):
        ap.error("give two directories (the outage arms) or four (and the baseline arms)")
    out = {"outage": outage(a.dirs[0], a.dirs[1])}
    for arm in ("old", "new"):
        print(f"## outage, {arm}\n\n{markdown(out['outage'][arm])}\n")
    print(f"Rand and operators identical in both arms: {out['outage']['baselines_identical']}")
    for p, c in out["outage"]["checks"].items():
        print(p, c)
    if len(a.dirs) == 4:
        out["baseline"] = baseline(a.dirs[2], a.dirs[3])
        for p, b in out["baseline"].items():
            print("baseline", p, b)
    ok_base = all(b["holds"] for b in out.get("baseline", {}).values())
    checks = out["outage"]["checks"].values()
    out["target"] = all(c["target"] for c in checks) and ok_base
    out["adopt"] = all(c["better_than_old"] for c in checks) and ok_base and "baseline" in out
    print(f"target: {out['target']}; adopt as default: {out['adopt']}")
    if a.json is not None:
        a.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
