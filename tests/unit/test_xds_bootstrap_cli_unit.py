"""``dlb config xds-bootstrap --config FILE``: the cell it is asked for must be one of the file's.

An Envoy bootstrapped for a cell the control plane does not know (a typo in ``--cell``) gets no
snapshot: it waits without listeners and without a word. With the config at hand the command says so.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dlb.cli import main

EXAMPLE = Path(__file__).resolve().parents[2] / "envoy_configs" / "dlb.example.yaml"


@pytest.mark.parametrize("role", ["root", "leaf"])
def test_a_cell_the_config_does_not_have_is_refused_by_name(role: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "boot.yaml"
    argv = ["config", "xds-bootstrap", "--role", role, "--xds", "127.0.0.1:18000", "--admin-port", "9901",
            "--config", str(EXAMPLE), "-o", str(out), "--cell"]
    assert main([*argv, "us-eats1"]) == 1
    assert "--cell: no cell named 'us-eats1' (cells: us-east1, us-west1, eu-west1)" in capsys.readouterr().err
    assert not out.exists()
    assert main([*argv, "us-east1"]) == 0 and out.exists()
