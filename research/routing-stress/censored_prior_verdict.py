"""The measured prior with the running requests: the verdict of research/routing-stress/censored-prior-rule.md.

Each experiment is an (off, on) pair of ``dlb sim`` output folders: off ran main before the change with Rand,
the operator baselines and the four policies that fit latency models; on ran the change with the four. Per
(variant, policy), every figure the mean over its scenarios, every cell is a no-harm cell: on's mean ≤ 1.01 ×
off's and on's failures ≤ off's + 0.05 point. The issue's R, O and F are printed for both arms.

Usage: python research/routing-stress/censored_prior_verdict.py NAME OFF ON [...] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from admission_floor_verdict import _num, _rof, cells  # the same table, with every cell a no-harm cell

MODEL_POLICIES = ("Disc-Lat", "Disc-Grad", "Flow-Lat", "Flow-Grad")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("triples", nargs="+", help="NAME OFF ON, repeated")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    if len(a.triples) % 3:
        ap.error("give NAME OFF ON triples")
    out: dict[str, Any] = {"experiments": {}}
    failed: list[str] = []
    for i in range(0, len(a.triples), 3):
        name, off, on = a.triples[i:i + 3]
        res = out["experiments"][name] = cells(Path(off), Path(on), dlb=MODEL_POLICIES, fix=())
        print(f"## {name}")
        for key, row in res["rows"].items():
            o, n = row["off"], row["on"]
            if not row["holds"]:
                failed.append(key)
            print(f"{key:22s} {'holds' if row['holds'] else 'FAILS'} | Rand {_num(row['rand_mean'], '6.2f')} s, best op "
                  f"{row['best_operator'] or '?':9s} {_num(row['operator_mean'], '6.2f')} s, bound {_num(row['failure_bound'], '.2f', 100)} %"
                  f" | off {o['mean']:6.2f} s {100 * o['failures']:6.2f} % {_rof(o)} | on {n['mean']:6.2f} s {100 * n['failures']:6.2f} % {_rof(n)}"
                  f" | on/off {row['mean_on_over_off']:.4f}")
    out["failed"] = failed
    out["verdict"] = not failed
    print(f"cells failing: {len(failed)} {failed}; verdict: {'adopted' if out['verdict'] else 'not adopted'}")
    if a.json is not None:
        a.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
