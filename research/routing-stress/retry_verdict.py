"""Cross-cell retry of refusals: the verdict of research/routing-stress/retry-rule.md.

Each experiment is an (off, on) pair of ``dlb sim`` output folders; the operator baselines ran in the
off arm only (no DLB root: retry cannot change them). Per (variant, DLB policy), over its scenarios:
**M** the failure-counting mean ≤ the best operator's (lowest mean in that variant); **F** client-visible
failures ≤ min(Rand's, the best operator's) + 0.1 point; a cell passes if both hold. Verdict: no cell
passes off and fails on, at least as many pass on as off, and the baseline's mean on ÷ off ≤ 1.005 with
failures up ≤ 0.02 point for every DLB policy.

Usage: python research/routing-stress/retry_verdict.py NAME OFF ON [...] --baseline OFF ON [--json FILE]
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
BASELINE_MEAN = 1.005
BASELINE_FAILURES = 0.0002


def _by(recs: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in recs:
        out.setdefault((r["variant"], r["policy"]), []).append(r)
    return out


def _avg(rs: list[dict[str, Any]], field: str) -> float:
    return mean(r[field] for r in rs)


def cells(off_dir: Path, on_dir: Path) -> dict[str, Any]:
    off, on = _by(records(off_dir)), _by(records(on_dir))
    rand_same = all(sorted(r["mean_latency_with_failures"] for r in on[k]) == sorted(r["mean_latency_with_failures"] for r in off[k])
                    for k in on if k[1] == "Rand")
    rows: dict[str, Any] = {}
    for variant in sorted({v for v, _ in off}):
        ops = {p: off[(variant, p)] for p in OPERATORS if (variant, p) in off}
        best = min(ops, key=lambda p: _avg(ops[p], "mean_latency_with_failures"))
        m_best = _avg(ops[best], "mean_latency_with_failures")
        f_bound = min(_avg(off[(variant, "Rand")], "client_failure_rate"), _avg(ops[best], "client_failure_rate")) + F_MARGIN
        for p in DLB:
            row: dict[str, Any] = {"best_operator": best, "operator_mean": m_best, "failure_bound": f_bound}
            for arm, recs in (("off", off), ("on", on)):
                rs = recs.get((variant, p), [])
                if not rs:
                    continue
                m, f = _avg(rs, "mean_latency_with_failures"), _avg(rs, "client_failure_rate")
                row[arm] = {"runs": len(rs), "mean": m, "failures": f, "retried_rate": _avg(rs, "retried_rate"),
                            "admission_refused_rate": _avg(rs, "admission_refused_rate"),
                            "M": m <= m_best, "F": f <= f_bound, "passes": m <= m_best and f <= f_bound}
            if "off" in row and "on" in row:
                row["mean_on_over_off"] = row["on"]["mean"] / row["off"]["mean"]
            rows[f"{variant} {p}"] = row
    return {"rand_identical": rand_same, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("triples", nargs="+", help="NAME OFF ON, repeated")
    ap.add_argument("--baseline", nargs=2, type=Path, required=True, metavar=("OFF", "ON"))
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    if len(a.triples) % 3:
        ap.error("give NAME OFF ON triples")
    out: dict[str, Any] = {"experiments": {}}
    lost = won = n_off = n_on = 0
    for i in range(0, len(a.triples), 3):
        name, off, on = a.triples[i:i + 3]
        res = out["experiments"][name] = cells(Path(off), Path(on))
        print(f"## {name} (Rand identical in both arms: {res['rand_identical']})")
        for key, row in res["rows"].items():
            o, n = row.get("off"), row.get("on")
            if o is None or n is None:
                continue
            n_off += o["passes"]
            n_on += n["passes"]
            lost += o["passes"] and not n["passes"]
            won += n["passes"] and not o["passes"]
            print(f"{key:24s} best op {row['best_operator']:9s} {row['operator_mean']:6.3f} s, bound {100 * row['failure_bound']:.3f} %"
                  f" | off {o['mean']:6.3f} s {100 * o['failures']:.3f} % {'pass' if o['passes'] else 'FAIL'}"
                  f" | on {n['mean']:6.3f} s {100 * n['failures']:.3f} % {'pass' if n['passes'] else 'FAIL'}"
                  f" | on/off {row['mean_on_over_off']:.4f}, retried {100 * n['retried_rate']:.2f} %")
    boff, bon = (_by(records(p)) for p in a.baseline)
    base: dict[str, Any] = {}
    for p in DLB:
        ks = [k for k in bon if k[1] == p and k in boff]
        ratio = mean(_avg(bon[k], "mean_latency_with_failures") / _avg(boff[k], "mean_latency_with_failures") for k in ks)
        dfail = mean(_avg(bon[k], "client_failure_rate") - _avg(boff[k], "client_failure_rate") for k in ks)
        base[p] = {"mean_on_over_off": ratio, "failures_change": dfail, "holds": ratio <= BASELINE_MEAN and dfail <= BASELINE_FAILURES}
        print(f"baseline {p:9s} on/off {ratio:.4f}, failures {100 * dfail:+.3f} pt {'holds' if base[p]['holds'] else 'FAILS'}")
    out["baseline"] = base
    out["passes_off"], out["passes_on"], out["lost"], out["won"] = n_off, n_on, lost, won
    out["verdict"] = lost == 0 and n_on >= n_off and all(v["holds"] for v in base.values())
    print(f"cells passing: off {n_off}, on {n_on}; lost {lost}, won {won}; verdict: {'retry on' if out['verdict'] else 'retry stays off'}")
    if a.json is not None:
        a.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
