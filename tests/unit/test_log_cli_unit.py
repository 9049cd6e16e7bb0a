"""Package-wide logging setup and the CLI registry.

Here: the tests that run in-process (no sockets, no processes);
the others: ``tests/integration/test_log_cli.py``.
The rules and what the tests stand for: that file's docstring.
"""

from __future__ import annotations

import json

from dlb import cli


def test_cli_without_command_prints_help(capsys) -> None:
    assert cli.main([]) == 2
    assert "usage: dlb" in capsys.readouterr().out


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
