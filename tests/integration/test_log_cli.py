"""Package-wide logging setup and the CLI registry.
"""

from __future__ import annotations

import json
import subprocess
import sys


def test_log_lines_are_json() -> None:
    code = "from dlb import log; log.configure(); log.configure(); log.get_logger('t').info('hello', cell='a')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1  # configured once, no duplicate handlers
    rec = json.loads(lines[0])
    assert rec["event"] == "hello" and rec["cell"] == "a" and rec["level"] == "info"


def test_logging_follows_a_replaced_stderr() -> None:
    """After configure(), a swapped-and-closed sys.stderr (pytest's capture between tests) must not make
    every later log call raise: the logger writes to sys.stderr as it is now."""
    import subprocess
    import sys

    code = (
        "import io, sys\n"
        "from dlb import log\n"
        "old = sys.stderr\n"
        "sys.stderr = io.StringIO()\n"
        "log.configure()\n"
        "log.get_logger('t').info('first')\n"
        "sys.stderr.close()\n"
        "sys.stderr = old\n"
        "log.get_logger('t').info('second_event')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert "second_event" in out.stderr
