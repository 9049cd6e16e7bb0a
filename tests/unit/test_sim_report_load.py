"""``dlb sim report`` reads results files plain or gzip'd: research/ keeps large runs as ``.json.gz``."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from dlb.sim.report import load

RECORDS = [{"experiment": "baseline", "policy": "Rand", "mean": 1.5}]


def test_gzipped_and_plain_results_load_the_same(tmp_path: Path) -> None:
    (tmp_path / "r.json").write_text(json.dumps(RECORDS))
    (tmp_path / "r.json.gz").write_bytes(gzip.compress(json.dumps(RECORDS).encode()))
    assert load(tmp_path / "r.json") == load(tmp_path / "r.json.gz") == RECORDS


def test_a_truncated_gzip_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "r.json.gz").write_bytes(gzip.compress(json.dumps(RECORDS).encode())[:-12])
    with pytest.raises(ValueError, match="cannot read results file"):
        load(tmp_path / "r.json.gz")


def test_the_default_report_goes_beside_the_results_not_into_research(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default ``--output`` was research/paper-reproduction.md relative to the working directory: run from
    the repository root it overwrote the committed report and wrote research/sim-plots/."""
    from dlb.cli import main
    from dlb.sim import report

    monkeypatch.setattr(report, "plot", lambda records, out: None)
    monkeypatch.setattr(report, "reproduction_report", lambda records, shown, plots, analysis: "# report\n")
    (tmp_path / "run").mkdir()
    rec = {"experiment": "x", "variant": "v", "scenario": 0, "trial": 0, "policy": "Rand"}
    (tmp_path / "run" / "results.json").write_text(json.dumps([rec]))
    monkeypatch.chdir(tmp_path)
    assert main(["sim", "report", "--results", "run/results.json"]) == 0
    assert (tmp_path / "run" / "paper-reproduction.md").read_text() == "# report\n"
    assert (tmp_path / "run" / "sim-plots").is_dir()
    assert not (tmp_path / "research").exists()


@pytest.mark.parametrize("records, message", [
    ([{"experiment": "baseline", "policy": "Rand", "mean": "abc"}], r"record 0 \(baseline, Rand\): mean must be a number or null, got 'abc'"),
    ([{"experiment": "baseline", "policy": "Rand", "trial": True}], "trial must be a number"),
    ([], "no records"),
    (["x"], "expected a list of records"),
])
def test_a_record_the_report_cannot_compute_with_is_named(tmp_path: Path, records: list, message: str) -> None:
    """A string in ``mean`` was a TypeError deep in the aggregation; an empty list a report of 0 runs."""
    (tmp_path / "r.json").write_text(json.dumps(records))
    with pytest.raises(ValueError, match=message):
        load(tmp_path / "r.json")
