"""Package-wide logging setup and the CLI registry."""

from __future__ import annotations

import json
import subprocess
import sys

from dlb import cli


def test_log_lines_are_json() -> None:
    code = "from dlb import log; log.configure(); log.configure(); log.get_logger('t').info('hello', cell='a')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1  # configured once, no duplicate handlers
    rec = json.loads(lines[0])
    assert rec["event"] == "hello" and rec["cell"] == "a" and rec["level"] == "info"


def test_cli_without_command_prints_help(capsys) -> None:
    assert cli.main([]) == 2
    assert "usage: dlb" in capsys.readouterr().out
