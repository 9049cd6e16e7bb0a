"""``dlb bench overhead`` with the bench's root probing its leaf every PROBE_MS (diagnostic, not a verdict).

Why: the root service's CPU per request exceeds the constant-reply floor's by ~50 µs, and idle it spends ~45 ms
of CPU per second probing its one leaf at the default 20-ms period (~0.5 ms of gRPC per probe). This runs the
same bench with the probe period patched into its config, to see how much of the root hop's CPU and added
p50 the probes are.

    PROBE_MS=1000 PYTHONPATH=. .venv/bin/python research/tools/bench_probe_period.py bench overhead \
        --configs plain root-bare-h2 root --duration 12 --slices 24
"""

from __future__ import annotations

import os
import sys
from typing import Any

import dlb.bench.overhead as ov

_original = ov.bench_config


def _patched(upstream: int) -> dict[str, Any]:
    raw = _original(upstream)
    period = os.environ.get("PROBE_MS")
    if period:
        ms = float(period)
        raw["probe"] = {"period_ms": ms, "stale_after_ms": 10 * ms, "backoff_max_ms": ms}
    return raw


if __name__ == "__main__":
    ov.bench_config = _patched
    from dlb.cli import main

    sys.argv = ["dlb", *sys.argv[1:]]
    main()
