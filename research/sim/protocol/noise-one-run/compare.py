"""Compare a re-run of the noise experiment with the committed protocol records (see README.md).

Run from the repository root after ``dlb sim --experiment noise --seed 5 --out research/sim/protocol/noise-one-run``.
"""
import json
from pathlib import Path

from dlb.sim.report import load


def key(r: dict) -> tuple:
    return (r["variant"], r["policy"], r["scenario"], r["trial"])


a = [r for r in load("research/sim/protocol/results.json.gz") if r["experiment"] == "noise"]
b = [r for r in load("research/sim/protocol/noise-one-run/results.json") if r["experiment"] == "noise"]
A = {key(r): r for r in a}
B = {key(r): r for r in b}
fields = ["mean", "p90", "error_rate", "arrivals", "errors", "events"]
same = sum(all(A[x][f] == B[x][f] for f in fields) for x in A if x in B)
print(len(A), len(B), "identical on", fields, ":", same)
bm = json.loads(Path("research/sim/protocol/noise-one-run/benchmark.json").read_text())
pe = bm["per_experiment"]["noise"]
print("wall_s", round(pe["wall_s"], 1), "cpu_s", round(pe["cpu_s"], 1), "pieces", pe.get("pieces"),
      "commit", pe.get("commit"), "code", pe.get("code"))
