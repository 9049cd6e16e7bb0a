"""Results files are strict JSON: null where a figure is NaN (``dlb sim`` wrote ``"norm_mean": NaN`` when Rand
did not run, ``dlb bench sim-twin --json`` ``"real_mean_s": NaN`` without --real), and the readers take null back."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dlb.bench import harness
from dlb.bench.sim_twin import read_real
from dlb.finite_json import dumps, finite
from dlb.sim import cli as sim_cli
from dlb.sim import outdir
from dlb.sim.report import load


def _strict(text: str) -> object:
    def refuse(name: str) -> None:
        raise ValueError(f"bare {name} in the file")

    return json.loads(text, parse_constant=refuse)


def test_non_finite_floats_become_null_everywhere() -> None:
    assert finite({"a": [math.nan, (math.inf, 1.0)], "b": -math.inf, "c": "NaN"}) == {"a": [None, [None, 1.0]], "b": None, "c": "NaN"}
    assert _strict(dumps({"x": float("nan")})) == {"x": None}


def test_a_bench_results_file_is_strict_json(tmp_path: Path) -> None:
    record = harness.BenchRecord(command_line="dlb bench sim-twin", commit="c", loadavg_start=(0.0, 0.0, 0.0),
                                 loadavg_end=(0.0, 0.0, 0.0), figures=[{"real_mean_s": math.nan, "sim_mean_s": 1.5}])
    harness.write_json(tmp_path / "twin.json", record)
    (row,) = _strict((tmp_path / "twin.json").read_text())  # type: ignore[misc]
    assert row["real_mean_s"] is None and row["sim_mean_s"] == 1.5


def _record(policy: str, scenario: int) -> dict:
    return {"experiment": "baseline", "variant": "default", "policy": policy, "scenario": scenario, "trial": 0,
            "code": "tree", "commit": "c", "mean": 2.0, "mean_latency_with_failures": 2.0, "p90_latency_with_failures": 3.0,
            "client_failure_rate": 0.0, "events": 10, "cpu_s": 0.1}


def test_sim_results_without_rand_are_strict_json_and_read_back_as_nan(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The paper experiment's writer (Rand absent: every norm_* is NaN), then the report's and the merge's readers."""
    from dlb.sim import report

    monkeypatch.setattr(report, "plot", lambda records, out: None)
    monkeypatch.setattr(sim_cli, "run_jobs", lambda todo, **kw: [_record("Disc-Lat", j.scenario) for j in todo])
    argv = ["sim", "--experiment", "baseline", "--scenarios", "1", "--trials", "1", "--minutes", "1", "--policies", "Disc-Lat",
            "--out", str(tmp_path), "--no-progress"]
    from dlb.cli import build_parser

    args = build_parser(argv).parse_args(argv)
    sim_cli._run_paper_experiment(args, "baseline", ["Disc-Lat"], tmp_path, "c", "tree", None)
    stored = _strict((tmp_path / outdir.RESULTS).read_text())
    assert isinstance(stored, list) and stored and all(r["norm_mean"] is None for r in stored)
    for r in load(tmp_path / outdir.RESULTS) + outdir.results_of(tmp_path, "tree"):
        assert math.isnan(r["norm_mean"])


def test_the_twin_reads_a_real_run_whose_mean_is_null(tmp_path: Path) -> None:
    """``dlb demo --compare`` writes null for a run with no served request; ``--real`` raised a TypeError on it."""
    (tmp_path / "records.jsonl").write_text(json.dumps({"scenario": "steady", "policy": "Rand", "mean_s": None}) + "\n")
    (run,) = read_real(tmp_path / "records.jsonl")
    assert math.isnan(run.mean_s)
