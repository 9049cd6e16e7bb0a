"""DLB config: the example loads, defaults apply, every problem is reported with file, line and path.

Here: the tests that start dlb services, open sockets or run subprocesses;
the others: ``tests/unit/test_config.py``.
The rules and what the tests stand for: that file's docstring.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_config import EXAMPLE

from dlb.cli import main

# --------------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------------


def test_cli_validate_envoy(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["config", "validate", "--envoy", str(EXAMPLE)]) == 0  # the real Envoy accepts every bootstrap
    assert "every root and leaf bootstrap OK" in capsys.readouterr().out
    fake = tmp_path / "envoy"
    fake.write_text("#!/bin/sh\necho 'Proto constraint validation failed (something)' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("DLB_ENVOY", str(fake))
    assert main(["config", "validate", "--envoy", str(EXAMPLE)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 6  # 3 leaves + 3 roots, each named
    assert err[0] == f"{EXAMPLE}: cells[0] (us-east1): Envoy rejects the leaf bootstrap: Proto constraint validation failed (something)"
