"""The figures research/routing-stress/flow-two-choice-rule.md judges, from the three ``dlb sim`` runs.

Per experiment and policy, over the scenarios present for every policy (whole scenarios only): the
mean of per-run failure-counting mean ÷ Rand's (``norm_mean``), ÷ the best operator baseline's in the
same run, and the mean error + shed rate; then the rule's three criteria for each flow pair.

Usage: python research/routing-stress/flowpick_verdict.py DIR [--json FILE]   (DIR holds baseline/, burst/, util95/)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from statistics import mean
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from deadline_verdict import records  # the same reader of dlb sim's records (whole file or partial pieces)

OPERATORS = ("lr-global", "hub-score")
PAIRS = ("Flow-Grad", "Flow-Lat", "Flow-RIF")
TWO = "[pick=two-choice]"


def table(d: Path) -> dict[str, Any]:
    recs = records(d)
    pols = list(dict.fromkeys(r["policy"] for r in recs))
    by = {(r["policy"], r["scenario"], r["trial"]): r for r in recs}
    runs = sorted({(s, t) for (_, s, t) in by if all((p, s, t) in by for p in pols)})
    rows: dict[str, Any] = {}
    for p in pols:
        rs = [by[(p, s, t)] for s, t in runs]
        rand = [by[("Rand", s, t)]["mean_latency_with_failures"] for s, t in runs]
        best_op = [min(by[(o, s, t)]["mean_latency_with_failures"] for o in OPERATORS if (o, s, t) in by) for s, t in runs]
        rows[p] = {
            "vs_rand": mean(r["mean_latency_with_failures"] / q for r, q in zip(rs, rand, strict=True)),
            "vs_best_operator": mean(r["mean_latency_with_failures"] / q for r, q in zip(rs, best_op, strict=True)),
            "error_rate": mean(r["error_rate"] + r.get("shed_rate", 0.0) for r in rs),
            "per_run": [round(r["mean_latency_with_failures"] / q, 4) for r, q in zip(rs, rand, strict=True)],
        }
    return {"runs": len(runs), "commit": recs[0]["commit"] if recs else None, "policies": rows}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    out: dict[str, Any] = {}
    for exp in ("baseline", "burst", "util95"):
        d = Path(a.dir) / exp
        if d.exists() and records(d):
            out[exp] = table(d)
    for exp, t in out.items():
        print(f"## {exp}: {t['runs']} runs, commit {t['commit']}")
        for p, r in t["policies"].items():
            print(f"  {p:28s} ÷Rand {r['vs_rand']:.3f}  ÷best-op {r['vs_best_operator']:.3f}  err {100 * r['error_rate']:.2f}%  {r['per_run']}")
    verdict: dict[str, Any] = {}
    for base in PAIRS:
        v: dict[str, Any] = {}
        for exp, t in out.items():
            rows = t["policies"]
            if base not in rows or base + TWO not in rows:
                continue
            s, c = rows[base], rows[base + TWO]
            v[exp] = {"delta": round(c["vs_rand"] - s["vs_rand"], 4), "lower": c["vs_rand"] < s["vs_rand"],
                      "within_0.01": c["vs_rand"] <= s["vs_rand"] + 0.01,
                      "errors_ok": c["error_rate"] <= s["error_rate"] + 0.001}
        verdict[base] = v
        print(base, json.dumps(v))
    if a.json:
        Path(a.json).write_text(json.dumps({"experiments": out, "criteria": verdict}, indent=1))


if __name__ == "__main__":
    main()
