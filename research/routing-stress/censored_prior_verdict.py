"""The measured prior with the running requests: the verdicts of research/routing-stress/censored-prior-rule.md
(NAME OFF ON triples) and censored-prior-131-rule.md (NAME OFF ON AA quadruples, ``--aa``).

Each experiment is a set of ``dlb sim`` output folders: off ran main before the change with Rand, the operator
baselines and the four policies that fit latency models; on ran the change with the four; AA (the 131 rule)
ran off's code with the estimators' dither from another stream (``aa_dither.py``). Per (variant, policy),
every figure the mean over its scenarios, every cell is a no-harm cell. Without AA: on's mean ≤ 1.01 × off's
and on's failures ≤ off's + 0.05 point. With AA, each bound is widened to what the A/A pair moved that cell
by: mean ≤ off's × max(1.01, 1 + |AA/off − 1|), failures ≤ off's + max(0.05 point, |AA − off|).
The issue's R, O and F are printed for both arms.

Usage: python research/routing-stress/censored_prior_verdict.py [--aa] NAME OFF ON [AA] [...] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import admission_floor_verdict  # the same table and verdict, with every cell a no-harm cell
from admission_floor_verdict import MEAN_RATIO, NO_HARM_FAILURES, cells
from deadline_verdict import records
from retry_verdict import _avg, _by

MODEL_POLICIES = ("Disc-Lat", "Disc-Grad", "Flow-Lat", "Flow-Grad")


def with_aa(res: dict[str, Any], aa_dir: Path) -> list[str]:
    """Re-judge ``cells``' rows with the A/A-widened bounds; returns the failing cells."""
    aa = _by(records(aa_dir))
    failed = []
    for key, row in res["rows"].items():
        variant, p = key.rsplit(" ", 1)
        if (variant, p) not in aa:
            raise SystemExit(f"{aa_dir}: no A/A runs of {key}")
        o, n = row["off"], row["on"]
        m, f = _avg(aa[(variant, p)], "mean_latency_with_failures"), _avg(aa[(variant, p)], "client_failure_rate")
        row["aa"] = {"mean": m, "failures": f}
        row["mean_bound"] = max(MEAN_RATIO, 1.0 + abs(m / o["mean"] - 1.0))
        row["failure_margin"] = max(NO_HARM_FAILURES, abs(f - o["failures"]))
        row["holds"] = row["mean_on_over_off"] <= row["mean_bound"] and n["failures"] <= o["failures"] + row["failure_margin"]
        if not row["holds"]:
            failed.append(key)
        print(f"{key:22s} {'holds' if row['holds'] else 'FAILS'} | off {o['mean']:6.2f} s {100 * o['failures']:6.2f} % "
              f"| A/A {m:6.2f} s {100 * f:6.2f} % | on {n['mean']:6.2f} s {100 * n['failures']:6.2f} % "
              f"| on/off {row['mean_on_over_off']:.4f} (bound {row['mean_bound']:.4f}), failures {100 * (n['failures'] - o['failures']):+.2f} "
              f"(bound +{100 * row['failure_margin']:.2f}) point | on {admission_floor_verdict._rof(n)} off {admission_floor_verdict._rof(o)}")
    return failed


def main_aa() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--aa", action="store_true")
    ap.add_argument("quads", nargs="+", help="NAME OFF ON AA, repeated")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    if len(a.quads) % 4:
        ap.error("give NAME OFF ON AA quadruples")
    out: dict[str, Any] = {"experiments": {}}
    failed: list[str] = []
    for i in range(0, len(a.quads), 4):
        name, off, on, aa = a.quads[i:i + 4]
        res = out["experiments"][name] = cells(Path(off), Path(on), MODEL_POLICIES, ())
        print(f"## {name}")
        failed += [f"{name}: {k}" for k in with_aa(res, Path(aa))]
    out["failed"], out["verdict"] = failed, not failed
    print(f"cells failing: {len(failed)} {failed}; verdict: {'adopted' if not failed else 'not adopted'}")
    if a.json is not None:
        a.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    if "--aa" in sys.argv:
        main_aa()
    else:
        admission_floor_verdict.main(__doc__, MODEL_POLICIES, (), ("adopted", "not adopted"))
