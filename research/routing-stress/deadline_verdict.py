"""Deadline shedding, off vs on: the figures research/routing-stress/deadline-shed-rule.md judges.

Reads each arm's records (``results.json[.gz]``, else the ``partial-*.jsonl`` of a run still going or
stopped) and prints, per policy, the means over runs of: the failure-counting mean ÷ lr-global's and
÷ Rand's in the same scenario and trial, error + shed rate, served-after-timeout share and served-only
mean ÷ Rand's. lr-global and Rand come from the ``off`` arm (the switch does not touch them).
Only runs present in both arms count, so a partial run compares like with like.

Usage: python research/routing-stress/deadline_verdict.py OFF_DIR ON_DIR [--json FILE]
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
from pathlib import Path
from statistics import mean
from typing import Any

DLB = ("Disc-RIF", "Disc-Lat", "Flow-Grad")


def records(d: Path) -> list[dict[str, Any]]:
    for name in ("results.json.gz", "results.json"):
        p = d / name
        if p.exists():
            raw = gzip.decompress(p.read_bytes()).decode() if name.endswith(".gz") else p.read_text()
            data = json.loads(raw)  # dlb sim writes null for a NaN figure (older files: bare NaN)
            return [{k: math.nan if v is None else v for k, v in r.items()} for r in (data["records"] if isinstance(data, dict) else data)]
    return [json.loads(line) for p in sorted(d.glob("partial-*.jsonl")) for line in p.read_text().splitlines() if line]


def table(off_dir: Path, on_dir: Path) -> dict[str, Any]:
    off = {(r["policy"], r["scenario"], r["trial"]): r for r in records(off_dir)}
    on = {(r["policy"], r["scenario"], r["trial"]): r for r in records(on_dir)}
    runs = sorted({(s, t) for (p, s, t) in on if p in DLB and all((q, s, t) in on for q in DLB)
                   and all((q, s, t) in off for q in (*DLB, "Rand"))})
    rand_same = all(off[("Rand", s, t)]["mean_latency_with_failures"] == on[("Rand", s, t)]["mean_latency_with_failures"]
                    for s, t in runs if ("Rand", s, t) in on)
    has_lr = all(("lr-global", s, t) in off for s, t in runs)
    rows: dict[str, Any] = {}
    for arm, recs in (("off", off), ("on", on)):
        for p in (*DLB, "Rand", "lr-global", "hub-score"):
            src = off if p not in DLB else recs
            if not all((p, s, t) in src for s, t in runs) or (p not in DLB and arm == "on"):
                continue
            rs = [src[(p, s, t)] for s, t in runs]
            rand = [off[("Rand", s, t)] for s, t in runs]
            row = {
                "vs_rand": mean(r["mean_latency_with_failures"] / q["mean_latency_with_failures"] for r, q in zip(rs, rand, strict=True)),
                "error_rate": mean(r["error_rate"] for r in rs),
                "shed_rate": mean(r["shed_rate"] for r in rs),
                "timed_out_rate": mean(r["timed_out_rate"] for r in rs),
                "served_vs_rand": mean(r["mean"] / q["mean"] for r, q in zip(rs, rand, strict=True)),
            }
            if has_lr:
                lr = [off[("lr-global", s, t)] for s, t in runs]
                row["vs_lr_global"] = mean(r["mean_latency_with_failures"] / q["mean_latency_with_failures"] for r, q in zip(rs, lr, strict=True))
            rows[f"{p} {arm}" if p in DLB else p] = row
    return {"runs": len(runs), "scenarios": sorted({s for s, _ in runs}), "rand_identical_in_both_arms": rand_same,
            "off_commit": next(iter(off.values()))["commit"] if off else None,
            "on_commit": next(iter(on.values()))["commit"] if on else None, "rows": rows}


def markdown(t: dict[str, Any]) -> str:
    out = [f"{t['runs']} runs per policy (scenarios {t['scenarios'][0]}–{t['scenarios'][-1]}); Rand identical in both arms: "
           f"{t['rand_identical_in_both_arms']}", "",
           "| policy | ÷ lr-global | ÷ Rand | errors | shed | errors + shed | served after timeout | served-only ÷ Rand |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in t["rows"].items():
        lr = f"{r['vs_lr_global']:.3f}" if "vs_lr_global" in r else "n/a"
        out.append(f"| {name} | {lr} | {r['vs_rand']:.3f} | {100 * r['error_rate']:.2f} % | {100 * r['shed_rate']:.2f} % | "
                   f"{100 * (r['error_rate'] + r['shed_rate']):.2f} % | {100 * r['timed_out_rate']:.1f} % | {r['served_vs_rand']:.3f} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("off", type=Path)
    ap.add_argument("on", type=Path)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    t = table(a.off, a.on)
    if not t["runs"]:
        raise SystemExit("no run is in both arms yet")
    print(markdown(t))
    if a.json:
        a.json.write_text(json.dumps(t, indent=1) + "\n")


if __name__ == "__main__":
    main()
