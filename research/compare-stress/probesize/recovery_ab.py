"""Recovery timing of the slowed cell in `dlb demo --compare --scenarios slow-cell` runs (rule: recovery-ab/rule.md).

Per run folder (the compare's OUT/slow-cell-POLICY-tN, logs included): R = us-central1's recovery (its
server 0's ``emulator_faults`` event back to slowdown 1.0); (a) seconds from R to the us-central1 leaf's
first probe-declared "faster" change; (b) seconds from the end of the degradation window to the first
1-s sample in which root us-east1 sent >= 20 % of its requests to us-central1.

Usage: python recovery_ab.py OUT_DIR [OUT_DIR ...] > timings.json
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
import sys
from pathlib import Path


def _ts(stamp: str) -> float:
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def run_timing(run: Path) -> dict[str, float | None]:
    faults = [json.loads(line) for line in (run / "logs/server-us-central1-0.log").open() if '"emulator_faults"' in line]
    slowed = next(_ts(e["timestamp"]) for e in faults if e["slowdown"] != 1.0)
    recovered = next(_ts(e["timestamp"]) for e in faults if e["slowdown"] == 1.0 and _ts(e["timestamp"]) > slowed)
    probe_faster = None
    for line in (run / "logs/leaf-us-central1.log").open():
        if '"cell_change_detected"' in line and '"faster"' in line and '"traffic"' not in line:
            t = _ts(json.loads(line)["timestamp"])
            if t > recovered:
                probe_faster = t - recovered
                break
    doc = json.loads((run / "results.json").read_text())
    end = doc["degradation"]["window_s"][1]
    root_back = None
    for sample in doc["samples"]:
        sent = sample["decisions"].get("us-east1", {})
        total = sum(sent.values())
        if sample["t"] > end and total > 0 and sent.get("us-central1", 0) / total >= 0.2:
            root_back = sample["t"] - end
            break
    return {"probe_faster_after_s": probe_faster, "root_back_after_s": root_back, "mean_s": doc["summary"]["mean_s"]}


def main(dirs: list[str]) -> None:
    out: dict[str, dict] = {}
    for d in dirs:
        runs = {run.name: run_timing(run) for run in sorted(Path(d).glob("slow-cell-*-t*"))}
        back = [r["root_back_after_s"] for r in runs.values() if r["root_back_after_s"] is not None]
        commit = json.loads(Path(d, "records.jsonl").read_text().splitlines()[0])["commit"]
        out[d] = {"commit": commit, "runs": runs, "median_root_back_after_s": statistics.median(back) if back else None}
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main(sys.argv[1:])
