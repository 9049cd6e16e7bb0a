"""Flow policies re-run with two-choice picks on the protocol-head seed, against the recorded runs.

Usage: python compare.py OLD_RESULTS.json.gz NEW_RESULTS(.json.gz | partial .jsonl) [--json OUT]

The other policies' runs are not repeated: Rand is re-run beside the flow policies and must match the
recorded Rand run for run (same scenarios, same arrivals), which is what makes the recorded
lr-global and Disc-* runs comparable. Figures as ``dlb sim report`` computes them: per run the
failure-counting mean ÷ Rand's (and ÷ lr-global's) in the same scenario and trial, then the mean
over runs.
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict
from statistics import mean

KEY = "mean_latency_with_failures"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    with gzip.open(args.old, "rt") as f:
        old = json.load(f)
    if args.new.endswith(".gz"):
        with gzip.open(args.new, "rt") as f:
            new = json.load(f)
    else:
        with open(args.new) as f:
            new = [json.loads(line) for line in f if line.strip()]
    by_old = {(r["policy"], r["scenario"], r["trial"]): r for r in old}
    mismatched = [k for r in new if r["policy"] == "Rand"
                  for k in [(r["policy"], r["scenario"], r["trial"])] if by_old[k][KEY] != r[KEY]]
    runs = {(r["scenario"], r["trial"]) for r in new if r["policy"] != "Rand"}
    rows = {}
    for label, src in (("recorded", old), ("two-choice", new)):
        per: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
        for r in src:
            k = (r["scenario"], r["trial"])
            if k not in runs or r["policy"] == "Rand":
                continue
            rand = by_old[("Rand", *k)][KEY]
            lrg = by_old[("lr-global", *k)][KEY]
            per[r["policy"]].append((r[KEY] / rand, r[KEY] / lrg, r["error_rate"]))
        for pol, v in sorted(per.items()):
            if label == "two-choice" or pol not in {r["policy"] for r in new}:
                rows[f"{pol} ({label})" if pol.startswith("Flow") else pol] = {
                    "runs": len(v), "norm_mean": round(mean(x[0] for x in v), 4),
                    "vs_lr_global": round(mean(x[1] for x in v), 4), "error_rate": round(mean(x[2] for x in v), 5)}
            elif pol.startswith("Flow"):
                rows[f"{pol} (recorded, sampling)"] = {
                    "runs": len(v), "norm_mean": round(mean(x[0] for x in v), 4),
                    "vs_lr_global": round(mean(x[1] for x in v), 4), "error_rate": round(mean(x[2] for x in v), 5)}
    out = {"rand_runs_compared": sum(r["policy"] == "Rand" for r in new), "rand_mismatches": mismatched,
           "new_commit": sorted({r["commit"] for r in new}), "rows": rows}
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
