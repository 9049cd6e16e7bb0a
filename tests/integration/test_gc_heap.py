"""The control plane freezes its start-up heap, so a full garbage collection walks only what came after.

Issue 14 row 6: after bloated ADS streams were refused, a full collection (triggered by the attack's
allocations) walked every object the control plane built at start and blocked its event loop 38-101 ms.
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from test_config_budget_integration import GOOD, _wait_for

from dlb.procutil import free_port


def _metrics(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("dlb_xds_gc_")}


@pytest.mark.timeout(120)
def test_control_plane_freezes_its_start_up_heap_and_reports_collections(tmp_path: Path) -> None:
    cfg = tmp_path / "dlb.yaml"
    cfg.write_text(GOOD)
    log = tmp_path / "cp.log"
    xds, status = free_port(), free_port()
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "dlb.cli", "serve", "control-plane", "--config", str(cfg), "--no-probe",
                                 "--xds", f"127.0.0.1:{xds}", "--status", f"127.0.0.1:{status}"],
                                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "DLB_LOG_FORMAT": "json"})
    try:
        _wait_for(log, "heap_frozen", proc)
        m = _metrics(status)
        # Modules, descriptors, config and servers: tens of thousands of objects no collection walks again.
        assert m["dlb_xds_gc_frozen_objects"] > 10_000, m
        assert {f'dlb_xds_gc_pause_seconds_total{{generation="{g}"}}' for g in "012"} <= set(m), m
        assert 'dlb_xds_gc_pause_longest_seconds{generation="2"}' in m
    finally:
        proc.terminate()
        proc.wait(timeout=30)
