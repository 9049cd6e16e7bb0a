"""Cancelling client timeouts: the figures research/routing-stress/timeout-cancel-rule.md judges.

Reads each arm's records (``results.json[.gz]``, else the ``partial-*.jsonl`` of a run still going or
stopped). Per policy it prints the means over runs of: the failure-counting mean ÷ Rand's and ÷ the best
operator's (lr-global or hub-score, whichever has the lower mean ratio to Rand) in the same scenario and
trial; the error, shed and timed-out rates; and the client-visible failure rate (errors + shed + timed out).
It also prints the rule's holds/fails for each DLB policy. Only the runs of whole scenarios where every
policy finished count, so a stopped run is still compared like with like. A second directory (the serve
arm) is compared on the runs both arms have.

Usage: python research/routing-stress/timeout_verdict.py CANCEL_DIR [SERVE_DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from statistics import mean
from typing import Any

from deadline_verdict import records  # this folder's reader of an arm's records (the script's dir is on sys.path)

DLB = ("Disc-RIF", "Disc-Lat", "Disc-Grad", "Flow-RIF", "Flow-Lat", "Flow-Grad")
OPERATORS = ("lr-global", "hub-score")
POLICIES = ("Rand", *OPERATORS, *DLB)


def whole_runs(by: dict[tuple[str, int, int], dict[str, Any]], policies: tuple[str, ...] = POLICIES) -> list[tuple[int, int]]:
    """(scenario, trial) pairs of scenarios in which every policy finished every trial."""
    runs = {(s, t) for (_p, s, t) in by}
    done = [(s, t) for s, t in runs if all((p, s, t) in by for p in policies)]
    whole = {s for s, _ in done if all(x in done for x in runs if x[0] == s)}
    return sorted(x for x in done if x[0] in whole)


def table(by: dict[tuple[str, int, int], dict[str, Any]], runs: list[tuple[int, int]], dlb: tuple[str, ...] = DLB) -> dict[str, Any]:
    def ratio(p: str, q: str) -> float:
        return mean(by[(p, s, t)]["mean_latency_with_failures"] / by[(q, s, t)]["mean_latency_with_failures"] for s, t in runs)

    best = min(OPERATORS, key=lambda o: ratio(o, "Rand"))
    rows: dict[str, dict[str, float]] = {}
    for p in ("Rand", *OPERATORS, *dlb):
        rs = [by[(p, s, t)] for s, t in runs]
        rows[p] = {"vs_rand": ratio(p, "Rand"), "vs_best_operator": ratio(p, best),
                   **{f: mean(r[f] for r in rs) for f in ("error_rate", "shed_rate", "timed_out_rate", "client_failure_rate")},
                   "mean_s": mean(r["mean_latency_with_failures"] for r in rs)}
    bound = min(rows["Rand"]["client_failure_rate"], rows[best]["client_failure_rate"]) + 0.001
    verdict = {}
    for p in dlb:
        r = rows[p]
        parts = {"rand": r["vs_rand"] <= 1.0, "operator": r["vs_best_operator"] <= 1.0, "failures": r["client_failure_rate"] <= bound}
        verdict[p] = {"holds": all(parts.values()), **parts}
    first = by[("Rand", *runs[0])]
    return {"runs": len(runs), "scenarios": sorted({s for s, _ in runs}), "best_operator": best,
            "failure_bound": bound, "commit": first["commit"], "code": first["code"],
            "timeouts": first.get("timeouts", "serve"), "rows": rows, "verdict": verdict}


COLUMNS = ("policy", "÷ Rand", "÷ best operator", "errors", "shed", "timed out", "client-visible failures", "mean (s)", "rule")


def markdown(t: dict[str, Any]) -> str:
    head = (f"{t['runs']} runs per policy (scenarios {t['scenarios'][0]}–{t['scenarios'][-1]}), --timeouts {t['timeouts']}, "
            f"best operator {t['best_operator']}, client-visible failure bound {100 * t['failure_bound']:.2f} %")
    out = [head, "", "| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    for p, r in t["rows"].items():
        v = t["verdict"].get(p)
        rule = "–" if v is None else ("holds" if v["holds"] else "fails (" + ", ".join(k for k in ("rand", "operator", "failures") if not v[k]) + ")")
        out.append(f"| {p} | {r['vs_rand']:.3f} | {r['vs_best_operator']:.3f} | {100 * r['error_rate']:.2f} % | "
                   f"{100 * r['shed_rate']:.2f} % | {100 * r['timed_out_rate']:.2f} % | {100 * r['client_failure_rate']:.2f} % | "
                   f"{r['mean_s']:.2f} | {rule} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("cancel", type=Path)
    ap.add_argument("serve", type=Path, nargs="?")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    cancel = {(r["policy"], r["scenario"], r["trial"]): r for r in records(a.cancel)}
    out = {"cancel": table(cancel, whole_runs(cancel))}
    print(markdown(out["cancel"]))
    if a.serve is not None:
        serve = {(r["policy"], r["scenario"], r["trial"]): r for r in records(a.serve)}
        both = [x for x in whole_runs(serve) if x in set(whole_runs(cancel))]
        out["cancel_on_serve_runs"], out["serve"] = table(cancel, both), table(serve, both)
        for k in ("cancel_on_serve_runs", "serve"):
            print("\n" + markdown(out[k]))
    if a.json is not None:
        a.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
