"""Grade a ``dlb bench overhead`` run for issue 29's native-discrete target (research/native-discrete-bench-rule.md).

Throughput: closed-loop rps of ``root-native-discrete`` ÷ ``plain`` ≥ 0.95. Latency: per interleaved slice,
the open-loop p50 difference native − plain; median with a bootstrap 95 % interval against +0.1 ms.

Usage: python research/tools/native_discrete_bench_verdict.py FILE.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

NATIVE, PLAIN = "root-native-discrete", "plain"
RPS_FLOOR, P50_MS = 0.95, 0.1


def grade(records: list[dict]) -> dict:
    by = {(r["config"], r["mode"]): r for r in records}
    rps = by[NATIVE, "closed"]["rps"] / by[PLAIN, "closed"]["rps"]
    diffs = np.array([n["p50_ms"] - p["p50_ms"] for n, p in zip(by[NATIVE, "open"]["slices"], by[PLAIN, "open"]["slices"], strict=True)])
    rng = np.random.default_rng(0)
    boot = np.median(rng.choice(diffs, size=(10_000, diffs.size), replace=True), axis=1)
    lo, hi = (float(x) for x in np.percentile(boot, [2.5, 97.5]))
    med = float(np.median(diffs))
    p50 = "met" if med <= P50_MS and hi <= P50_MS else "not met" if lo > P50_MS else "unresolved"
    return {"rps_ratio": rps, "throughput": "met" if rps >= RPS_FLOOR else "not met", "p50_diff_ms": med,
            "p50_diff_ci95_ms": [lo, hi], "per_slice_ms": diffs.tolist(), "p50": p50,
            "open_p50_ms": {c: by[c, "open"]["p50_ms"] for c in (PLAIN, NATIVE)}, "loadavg_1m": by[PLAIN, "closed"].get("loadavg_1m")}


if __name__ == "__main__":
    out = grade(json.loads(Path(sys.argv[1]).read_text()))
    print(json.dumps(out, indent=1))
