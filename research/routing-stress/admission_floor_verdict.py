"""Leaf admission relative to the server's own pace: the verdict of research/routing-stress/admission-floor-rule.md.

Each experiment is an (off, on) pair of ``dlb sim`` output folders: off ran ``--admission-slowdown 0`` (the
deadline alone) with Rand and the operator baselines, on ran ``--admission-slowdown 2`` with the DLB policies
only (the others have no leaf admission). Per (variant, DLB policy), every figure the mean over its scenarios:
**fix** cells (length y=1/10, y=1/4) need on's failures ≤ min(Rand's, the best operator's) + 0.1 point and
on's mean ≤ 1.01 × off's; every other cell needs on's mean ≤ 1.01 × off's and failures ≤ off's + 0.05 point.
Also printed: the issue's R (mean ≤ Rand's), O (≤ the best operator's) and F for both arms, where the off arm
ran Rand and the operators (a no-harm variant may run the DLB policies only: its R, O, F print as ``?``).

Usage: python research/routing-stress/admission_floor_verdict.py NAME OFF ON [...] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from deadline_verdict import records  # this folder's reader of an arm's records (the script's dir is on sys.path)
from retry_verdict import _avg, _by  # the same grouping by (variant, policy) and mean over scenarios

DLB = ("Disc-RIF", "Disc-Lat", "Flow-Grad")
OPERATORS = ("lr-global", "locality-failover", "hub-score")
FIX = ("y=1/10", "y=1/4")
F_MARGIN = 0.001
MEAN_RATIO = 1.01
NO_HARM_FAILURES = 0.0005


def cells(off_dir: Path, on_dir: Path, dlb: tuple[str, ...] = DLB, fix: tuple[str, ...] = FIX) -> dict[str, Any]:
    off, on = _by(records(off_dir)), _by(records(on_dir))
    slowdowns = {"off": sorted({r.get("admission_slowdown", 0.0) for rs in off.values() for r in rs}),
                 "on": sorted({r.get("admission_slowdown", 0.0) for rs in on.values() for r in rs})}
    rows: dict[str, Any] = {}
    for variant in sorted({v for v, _ in off}):
        ops = {p: off[(variant, p)] for p in OPERATORS if (variant, p) in off}
        best = min(ops, key=lambda p: _avg(ops[p], "mean_latency_with_failures")) if ops else None
        m_best = _avg(ops[best], "mean_latency_with_failures") if best else None
        rand = off.get((variant, "Rand"))
        m_rand = _avg(rand, "mean_latency_with_failures") if rand else None
        f_bound = (min(_avg(rand, "client_failure_rate"), _avg(ops[best], "client_failure_rate")) + F_MARGIN
                   if rand and best else None)
        if variant in fix and f_bound is None:
            raise SystemExit(f"{off_dir}: fix variant {variant} needs Rand and the operators in the off arm")
        for p in dlb:
            if (variant, p) not in off or (variant, p) not in on:
                continue
            row: dict[str, Any] = {"best_operator": best, "operator_mean": m_best, "rand_mean": m_rand, "failure_bound": f_bound}
            for arm, recs in (("off", off), ("on", on)):
                rs = recs[(variant, p)]
                m, f = _avg(rs, "mean_latency_with_failures"), _avg(rs, "client_failure_rate")
                row[arm] = {"runs": len(rs), "mean": m, "failures": f, "admission_refused_rate": _avg(rs, "admission_refused_rate"),
                            "R": None if m_rand is None else m <= m_rand, "O": None if m_best is None else m <= m_best,
                            "F": None if f_bound is None else f <= f_bound}
            o, n = row["off"], row["on"]
            row["mean_on_over_off"] = n["mean"] / o["mean"]
            if variant in fix:
                row["kind"], row["holds"] = "fix", n["F"] and row["mean_on_over_off"] <= MEAN_RATIO
            else:
                row["kind"] = "no harm"
                row["holds"] = row["mean_on_over_off"] <= MEAN_RATIO and n["failures"] <= o["failures"] + NO_HARM_FAILURES
            rows[f"{variant} {p}"] = row
    return {"slowdowns": slowdowns, "rows": rows}


def _rof(a: dict[str, Any]) -> str:
    return "".join("?" if a[k] is None else k if a[k] else "-" for k in "ROF")


def _num(x: float | None, fmt: str, scale: float = 1.0) -> str:
    return "?" if x is None else format(scale * x, fmt)


def main(doc: str | None = __doc__, dlb: tuple[str, ...] = DLB, fix: tuple[str, ...] = FIX,
         outcome: tuple[str, str] = ("the on arm slowdown becomes the default", "the default stays 0")) -> None:
    """Parse ``NAME OFF ON`` triples, print each cell and the verdict (``outcome``: adopted, not), write ``--json``."""
    ap = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    ap.add_argument("triples", nargs="+", help="NAME OFF ON, repeated")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    if len(a.triples) % 3:
        ap.error("give NAME OFF ON triples")
    out: dict[str, Any] = {"experiments": {}}
    failed: list[str] = []
    for i in range(0, len(a.triples), 3):
        name, off, on = a.triples[i:i + 3]
        res = out["experiments"][name] = cells(Path(off), Path(on), dlb, fix)
        print(f"## {name} (slowdowns: off {res['slowdowns']['off']}, on {res['slowdowns']['on']})")
        for key, row in res["rows"].items():
            o, n = row["off"], row["on"]
            if not row["holds"]:
                failed.append(key)
            print(f"{key:22s} {row['kind']:7s} {'holds' if row['holds'] else 'FAILS'} | Rand {_num(row['rand_mean'], '6.2f')} s, best op "
                  f"{row['best_operator'] or '?':9s} {_num(row['operator_mean'], '6.2f')} s, bound {_num(row['failure_bound'], '.2f', 100)} %"
                  f" | off {o['mean']:6.2f} s {100 * o['failures']:6.2f} % ({100 * o['admission_refused_rate']:.2f} % refused) {_rof(o)}"
                  f" | on {n['mean']:6.2f} s {100 * n['failures']:6.2f} % ({100 * n['admission_refused_rate']:.2f} % refused) {_rof(n)}"
                  f" | on/off {row['mean_on_over_off']:.4f}")
    out["failed"] = failed
    out["verdict"] = not failed
    print(f"cells failing: {len(failed)} {failed}; verdict: {outcome[0] if out['verdict'] else outcome[1]}")
    if a.json is not None:
        a.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
