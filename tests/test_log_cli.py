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


def test_a_service_on_an_unknown_cell_names_the_option_and_the_cells(tmp_path, capsys) -> None:
    """Was ``dlb.yaml: cells: dlb.yaml: no cell named 'nope'``: the file twice, and a field the user did not write."""
    from dlb.testbed.fleet import CellPlan, Fleet, demo_config

    fleet = Fleet(cells=(CellPlan("us-east1", 1, "fast-test", root=True), CellPlan("us-west1", 1, "fast-test")))
    path = tmp_path / "dlb.yaml"
    path.write_text(json.dumps(demo_config(fleet, {"us-east1": ["127.0.0.1:1"], "us-west1": ["127.0.0.1:2"]})))
    for command in ("leaf", "root"):
        assert cli.main(["serve", command, "--config", str(path), "--cell", "nope"]) == 1
        err = capsys.readouterr().err
        assert f"{path}: --cell: no cell named 'nope' (cells: us-east1, us-west1)" in err, err
        assert err.count(str(path)) == 1, err
