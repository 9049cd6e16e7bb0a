"""Where every DLB policy stands: the table of research/routing-stress/status-103-rule.md.

Per (experiment variant, DLB policy) over the runs of one ``dlb sim`` output folder per experiment:
**R** failure-counting mean ≤ Rand's, **O** ≤ the best operator's (lowest mean of the operator baselines
present), **F** client-visible failures ≤ min(Rand's, that operator's) + 0.1 point.

Usage: python research/routing-stress/status_table.py DIR [DIR ...] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from statistics import mean
from typing import Any

from deadline_verdict import records  # this folder's reader of an arm's records (the script's dir is on sys.path)

DLB = ("Disc-RIF", "Disc-Lat", "Flow-Grad")
OPERATORS = ("lr-global", "locality-failover", "hub-score")
F_MARGIN = 0.001


def table(d: Path) -> dict[str, Any]:
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records(d):
        by.setdefault((r["variant"], r["policy"]), []).append(r)

    def avg(variant: str, policy: str, field: str) -> float:
        return mean(r[field] for r in by[(variant, policy)])

    rows: dict[str, Any] = {}
    for variant in sorted({v for v, _ in by}, key=lambda v: min(r["x"] for k, rs in by.items() if k[0] == v for r in rs)):
        ops = [p for p in OPERATORS if (variant, p) in by]
        best = min(ops, key=lambda p: avg(variant, p, "mean_latency_with_failures"))
        m_rand, m_op = avg(variant, "Rand", "mean_latency_with_failures"), avg(variant, best, "mean_latency_with_failures")
        bound = min(avg(variant, "Rand", "client_failure_rate"), avg(variant, best, "client_failure_rate")) + F_MARGIN
        for p in DLB:
            if (variant, p) not in by:
                continue
            m, f = avg(variant, p, "mean_latency_with_failures"), avg(variant, p, "client_failure_rate")
            rows[f"{variant} {p}"] = {"over_rand": m / m_rand, "best_operator": best, "over_operator": m / m_op,
                                      "failures": f, "failure_bound": bound,
                                      "R": m <= m_rand, "O": m <= m_op, "F": f <= bound}
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    out: dict[str, Any] = {}
    met = total = 0
    print("| variant | policy | ÷ Rand | ÷ best operator | failures (bound) | meets |")
    print("| --- | --- | --- | --- | --- | --- |")
    for d in a.dirs:
        out[d.name] = rows = table(d)
        for key, v in rows.items():
            variant, policy = key.rsplit(" ", 1)
            ok = v["R"] and v["O"] and v["F"]
            met += ok
            total += 1
            miss = ",".join(c for c in "ROF" if not v[c])
            print(f"| {d.name} {variant} | {policy} | {v['over_rand']:.3f} | {v['over_operator']:.3f} ({v['best_operator']}) "
                  f"| {100 * v['failures']:.3f} % ({100 * v['failure_bound']:.3f} %) | {'yes' if ok else 'no: ' + miss} |")
    print(f"cells meeting the target: {met} of {total}")
    if a.json is not None:
        a.json.write_text(json.dumps({"experiments": out, "met": met, "cells": total}, indent=1) + "\n")


if __name__ == "__main__":
    main()
