"""``dlb sim --resume`` over a directory that holds an experiment finished with other settings refuses, naming
the options that differ: it used to run the new settings and replace the stored records without a word."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from dlb.cli import build_parser
from dlb.sim import cli as sim_cli
from dlb.sim import outdir


def _args(out: Path, *flags: str) -> argparse.Namespace:
    argv = ["sim", "--experiment", "baseline", "--scenarios", "2", "--trials", "1", "--minutes", "2", "--out", str(out),
            "--no-progress", *flags]
    return build_parser(argv).parse_args(argv)


def test_resume_with_other_settings_refuses_and_keeps_the_stored_records(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sim_cli, "git_commit", lambda: "c0ffee")
    monkeypatch.setattr(sim_cli, "code_tree", lambda: "tree")
    out = tmp_path / "rA"
    out.mkdir()
    first = _args(out, "--seed", "7", "--policies", "Rand,Disc-Lat,Flow-Grad,hub-score,MNLB")
    stored = sim_cli._settings(first, "baseline", first.policies.split(","), None)
    records = [{"experiment": "baseline", "code": "tree", "policy": p, "scenario": s} for p in stored["policies"] for s in (0, 1)]
    (out / outdir.RESULTS).write_text(json.dumps(records))
    (out / outdir.BENCHMARK).write_text(json.dumps({"per_experiment": {"baseline": {"code": "tree", "settings": stored}}}))
    before = (out / outdir.RESULTS).read_text()

    again = _args(out, "--seed", "8", "--policies", "Rand,Disc-Lat", "--resume")
    assert sim_cli.run(again) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "baseline runs made with other settings" in err
    assert "--seed 7 there, 8 now" in err and "--policies" in err
    assert (out / outdir.RESULTS).read_text() == before
