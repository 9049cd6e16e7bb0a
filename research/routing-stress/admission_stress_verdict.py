"""Leaf admission beyond the outage: the checks of research/routing-stress/admission-stress-rule.md.

For each experiment given as an (off, on) pair of ``dlb sim`` output folders and each DLB policy (each
utilisation level apart): the mean over runs of the on-arm's failure-counting mean ÷ the off-arm's, and the
change of client-visible failures; holds if ≤ 1.005 and ≤ +0.05 points. Rand's and lr-global's records
must be identical in both arms.

Usage: python research/routing-stress/admission_stress_verdict.py NAME OFF ON [NAME OFF ON ...] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from statistics import mean
from typing import Any

from admission_verdict import BASELINE_FAILURES, BASELINE_MEAN, DLB
from deadline_verdict import records  # this folder's reader of an arm's records (the script's dir is on sys.path)


def check(off_dir: Path, on_dir: Path) -> dict[str, Any]:
    key = ("policy", "variant", "scenario", "trial")
    off = {tuple(r[k] for k in key): r for r in records(off_dir)}
    on = {tuple(r[k] for k in key): r for r in records(on_dir)}
    same = all(off[k]["mean_latency_with_failures"] == on[k]["mean_latency_with_failures"]
               for k in on if k[0] in ("Rand", "lr-global") and k in off)
    rows: dict[str, Any] = {}
    for p in DLB:
        for variant in sorted({k[1] for k in on if k[0] == p}):
            ks = [k for k in on if k[0] == p and k[1] == variant and k in off]
            if not ks:
                continue
            ratio = mean(on[k]["mean_latency_with_failures"] / off[k]["mean_latency_with_failures"] for k in ks)
            dfail = mean(on[k]["client_failure_rate"] - off[k]["client_failure_rate"] for k in ks)
            refused = mean(on[k].get("admission_refused_rate", 0.0) for k in ks)
            rows[f"{p} {variant}"] = {"runs": len(ks), "mean_on_over_off": ratio, "failures_change": dfail,
                                      "admission_refused_rate": refused,
                                      "holds": ratio <= BASELINE_MEAN and dfail <= BASELINE_FAILURES}
    return {"rand_and_lr_global_identical": same, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("triples", nargs="+", help="NAME OFF ON, repeated")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    if len(a.triples) % 3:
        ap.error("give NAME OFF ON triples")
    out: dict[str, Any] = {}
    for i in range(0, len(a.triples), 3):
        name, off, on = a.triples[i:i + 3]
        out[name] = res = check(Path(off), Path(on))
        print(f"## {name} (Rand and lr-global identical: {res['rand_and_lr_global_identical']})")
        for row, v in res["rows"].items():
            print(f"{row:28s} runs {v['runs']}  on/off {v['mean_on_over_off']:.4f}  failures {100 * v['failures_change']:+.3f} pt"
                  f"  refused {100 * v['admission_refused_rate']:.3f} %  {'holds' if v['holds'] else 'FAILS'}")
    out["holds"] = all(v["holds"] for res in out.values() if isinstance(res, dict) for v in res["rows"].values())
    print(f"all hold: {out['holds']}")
    if a.json is not None:
        a.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
