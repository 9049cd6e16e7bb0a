"""The command line under a reader that goes away: ``dlb ... | head -1`` must not print a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_closed_pipe_ends_the_command_quietly_as_sigpipe_would() -> None:
    r, w = os.pipe()
    os.close(r)  # the reader is gone before the first write: that write fails with EPIPE
    try:
        proc = subprocess.run([sys.executable, "-m", "dlb", "config", "render", str(ROOT / "envoy_configs/dlb.example.yaml"),
                               "root", "us-east1", "--admin-port", "19999"],
                              stdout=w, stderr=subprocess.PIPE, cwd=ROOT, timeout=60, check=False)
    finally:
        os.close(w)
    assert "Traceback" not in proc.stderr.decode(), proc.stderr.decode()
    assert proc.returncode == 128 + 13  # as a tool killed by SIGPIPE reports it
