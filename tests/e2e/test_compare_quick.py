"""``dlb demo --compare --quick``: the three operator baselines and Flow-Grad on the embedded fleet, end to end.

Real processes throughout (emulators, leaves, Envoys, control plane). Checks what each baseline must
do on the real fleet, from the per-request CSV: locality-failover keeps every request in its source
cell, lr-global spreads us-east1's requests over every cell, no policy takes europe-west4's traffic
out of Europe (residency); every request is answered; and a second run with the same ``--out``
resumes from the records instead of running anything again.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.envoy

EUROPE = {"europe-west4", "europe-west1"}


def _compare(out: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dlb.cli", "demo", "--compare", "--quick", "--duration", "5", "--out", str(out)],
                          capture_output=True, text=True, timeout=timeout_s)


def _cells(run_dir: Path) -> Counter[tuple[str, str]]:
    with (run_dir / "requests.csv").open() as f:
        return Counter((r["source"], r["cell"]) for r in csv.DictReader(f))


@pytest.mark.timeout(1200)  # four clean deployments: ~4.5 min at load average 12, over 10 min at 45
def test_quick_compare_runs_each_baseline_as_defined_and_resumes(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    proc = _compare(out, 840)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert [r["policy"] for r in records] == ["lr-global", "locality-failover", "hub-score", "Flow-Grad"]
    for r in records:
        assert r["scenario"] == "steady" and r["trial"] == 0 and r["requests"] > 30, r
        assert r["ok"] == r["requests"], r
    home = _cells(out / "steady-locality-failover-t0")
    assert all(src == cell for src, cell in home), home
    spread = _cells(out / "steady-lr-global-t0")
    assert {cell for src, cell in spread if src == "us-east1"} == {"us-east1", "us-central1", "europe-west4", "europe-west1"}, spread
    for r in records:
        cells = _cells(out / f"steady-{r['policy']}-t0")
        assert all(cell in EUROPE for src, cell in cells if src == "europe-west4"), (r["policy"], cells)
    assert (out / "compare.md").read_text().count("| steady |") == 4

    again = _compare(out, 300)
    assert again.returncode == 0, again.stdout[-2000:]
    assert "resuming: 4 runs" in again.stdout
    assert "emulated servers" not in again.stdout  # no deployment was started again
    assert len((out / "records.jsonl").read_text().splitlines()) == 4
