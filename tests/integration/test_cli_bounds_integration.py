"""A bench's bad argument is one line, not a traceback (the bench records its commit first: git runs)."""

from __future__ import annotations

import pytest

from dlb.cli import main


def test_an_unknown_twin_policy_is_one_line_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "sim-twin", "--policies", "nope"]) == 1
    err = capsys.readouterr().err
    assert "--policies: unknown nope (known: Rand," in err and "Traceback" not in err
