"""Files and directories a command writes are refused when the command starts, not after its run.

A bench's ``--json`` into a missing directory, or ``dlb sim report --output`` under ``/sys``, was a
traceback after the whole run; ``dlb theory --json`` and ``dlb sim --out`` already checked first.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from dlb.load.argtypes import output_dir, output_file


def test_a_file_in_directories_still_to_make_is_accepted(tmp_path: Path) -> None:
    assert output_file(str(tmp_path / "a" / "b" / "r.json")) == str(tmp_path / "a" / "b" / "r.json")
    assert output_file("-") == "-"
    assert output_dir(str(tmp_path / "plots" / "new")) == str(tmp_path / "plots" / "new")


def test_a_file_under_a_read_only_directory_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    real_access = os.access  # as root (CI) every directory is writable to access(): answer as for a user
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == ro and mode & os.W_OK else real_access(p, mode))
    with pytest.raises(argparse.ArgumentTypeError, match="not writable"):
        output_file(str(ro / "x" / "r.json"))
    with pytest.raises(argparse.ArgumentTypeError, match="not writable"):
        output_dir(str(ro))


def test_a_directory_for_a_file_or_a_file_for_a_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(argparse.ArgumentTypeError, match="is a directory"):
        output_file(str(tmp_path))
    with pytest.raises(argparse.ArgumentTypeError, match="not a directory"):
        output_file(str(tmp_path / "f" / "r.json"))  # under a file
    with pytest.raises(argparse.ArgumentTypeError, match="not a directory"):
        output_dir(str(tmp_path / "f"))
    with pytest.raises(argparse.ArgumentTypeError, match="empty"):
        output_file("")


def test_a_record_the_file_system_refuses_at_the_end_is_printed_not_lost(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dlb.bench.harness import BenchRecord, finish

    (tmp_path / "f").write_text("x")
    record = BenchRecord(command_line="dlb bench x", commit="c0ffee", loadavg_start=(0.0, 0.0, 0.0))
    assert finish(record, {"rps": 123.0}, json_path=str(tmp_path / "f" / "r.json")) == 2
    out, err = capsys.readouterr()
    assert "cannot write --json" in err and '"rps": 123.0' in out
