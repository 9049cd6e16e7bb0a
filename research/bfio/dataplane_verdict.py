"""The data-path BF-IO verdict (research/bfio.md, rules C7–C10) from a folder of ``dlb bfio dataplane`` records.

Reads ``g{G}-{above|below}-s{seed}.json`` (each one seed, JSQ and BF-IO on fresh processes) and grades:
- above capacity, per G: **holds** when BF-IO's backlog-phase idle ≤ 0.85 × JSQ's in ≥ 5 of 6 seeds, its
  mean tokens/s of stepping ≥ JSQ's and its mean p90 ≤ JSQ's; **partly** when backlog idle is lower in
  ≥ 5 of 6 but a further condition fails; else **fails**. A seed without a backlog interval misses the
  factor; a run that lost a request fails the setting.
- below capacity, per G: **holds** when whole-run idle ≤ JSQ's in ≥ 5 of 6.
Fewer than 6 seeds of a setting: graded "k of n" and not a verdict.

Usage: python research/bfio/dataplane_verdict.py DIR [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from statistics import mean
from typing import Any

FACTOR = 0.85
NEED = 5
SEEDS = 6
NAME = re.compile(r"g(\d+)-(above|below)-s(\d+)\.json$")


def load(d: Path) -> dict[tuple[int, str], dict[int, dict[str, dict[str, Any]]]]:
    """``{(G, phase): {seed: {policy: record}}}``."""
    out: dict[tuple[int, str], dict[int, dict[str, dict[str, Any]]]] = {}
    for f in sorted(d.glob("g*-*-s*.json")):
        m = NAME.search(f.name)
        if m is None:
            continue
        doc = json.loads(f.read_text())
        recs = {r["policy"]: r for r in doc["records"]}
        out.setdefault((int(m[1]), m[2]), {})[int(m[3])] = recs
    return out


def grade_above(seeds: dict[int, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    rows, met, lower = [], 0, 0
    lost = False
    for seed, recs in sorted(seeds.items()):
        j, b = recs["jsq"], recs["bf-io"]
        lost |= any(r["ok"] != r["requests"] for r in (j, b))
        ji, bi = j.get("idle_frac_backlog"), b.get("idle_frac_backlog")
        ratio = bi / ji if ji and bi is not None else None
        met += ratio is not None and ratio <= FACTOR
        lower += ratio is not None and ratio < 1.0
        rows.append({"seed": seed, "backlog_idle": [ji, bi], "ratio": ratio, "idle": [j["idle_frac"], b["idle_frac"]],
                     "tok_s_stepping": [j["throughput_tok_per_step_s"], b["throughput_tok_per_step_s"]],
                     "p90_s": [j["p90_s"], b["p90_s"]], "mean_s": [j["mean_s"], b["mean_s"]],
                     "energy_gpu_s": [j["energy_proxy_gpu_s"], b["energy_proxy_gpu_s"]], "max_held": [j["max_held"], b["max_held"]]})
    thr = [mean(r["tok_s_stepping"][k] for r in rows) for k in (0, 1)]
    p90 = [mean(r["p90_s"][k] for r in rows) for k in (0, 1)]
    if len(rows) < SEEDS:
        verdict = f"{met} of {len(rows)} seeds (fewer than {SEEDS}: no verdict)"
    elif lost:
        verdict = "fails (a request was lost)"
    elif met >= NEED and thr[1] >= thr[0] and p90[1] <= p90[0]:
        verdict = "holds"
    elif lower >= NEED:
        verdict = "partly"
    else:
        verdict = "fails"
    return {"rows": rows, "met_factor": met, "lower": lower, "seeds": len(rows), "mean_tok_s_stepping": thr,
            "mean_p90_s": p90, "verdict": verdict}


def grade_below(seeds: dict[int, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    rows = [{"seed": s, "idle": [r["jsq"]["idle_frac"], r["bf-io"]["idle_frac"]],
             "lost": sum(x["requests"] - x["ok"] for x in r.values())} for s, r in sorted(seeds.items())]
    ok = sum(r["idle"][1] <= r["idle"][0] for r in rows)
    if len(rows) < SEEDS:
        verdict = f"{ok} of {len(rows)} seeds (fewer than {SEEDS}: no verdict)"
    else:
        verdict = "holds" if ok >= NEED and not any(r["lost"] for r in rows) else "fails"
    return {"rows": rows, "not_worse": ok, "seeds": len(rows), "verdict": verdict}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    out: dict[str, Any] = {}
    for (g, phase), seeds in sorted(load(args.dir).items()):
        res = grade_above(seeds) if phase == "above" else grade_below(seeds)
        out[f"G{g} {phase}"] = res
        print(f"## G {g} {phase} capacity: {res['verdict']}")
        if phase == "above":
            print("| seed | backlog idle JSQ / BF-IO | ratio | whole-run idle | tok/s stepping | p90 s | mean s |")
            print("| ---: | --- | ---: | --- | --- | --- | --- |")
            for r in res["rows"]:
                ji, bi = r["backlog_idle"]
                ratio = "–" if r["ratio"] is None else f"{r['ratio']:.2f}"
                print(f"| {r['seed']} | {ji:.3f} / {bi:.3f} | {ratio} | {r['idle'][0]:.3f} / {r['idle'][1]:.3f} | "
                      f"{r['tok_s_stepping'][0]:.0f} / {r['tok_s_stepping'][1]:.0f} | {r['p90_s'][0]:.1f} / {r['p90_s'][1]:.1f} | "
                      f"{r['mean_s'][0]:.1f} / {r['mean_s'][1]:.1f} |")
            print(f"≤ {FACTOR} × in {res['met_factor']} of {res['seeds']}, lower in {res['lower']}; mean tok/s stepping "
                  f"{res['mean_tok_s_stepping'][0]:.0f} / {res['mean_tok_s_stepping'][1]:.0f}; mean p90 "
                  f"{res['mean_p90_s'][0]:.1f} / {res['mean_p90_s'][1]:.1f} s\n")
        else:
            idle = " ".join(f"{r['seed']}: {r['idle'][0]:.3f}/{r['idle'][1]:.3f}" for r in res["rows"])
            print(f"whole-run idle JSQ/BF-IO {idle}; BF-IO ≤ JSQ in {res['not_worse']} of {res['seeds']}\n")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
