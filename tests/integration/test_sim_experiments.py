"""Experiments, records, normalisation, the report and the ``dlb sim`` command (CI-sized)."""

from __future__ import annotations

import json
import math

import pytest

from dlb.cli import main
from dlb.sim.experiments import EXPERIMENTS, make_jobs, normalise, run_jobs
from dlb.sim.policies import POLICIES
from dlb.sim.report import markdown_table, plot, reproduction_report

SMOKE_POLICIES = ("Rand", "MNLB", "Disc-RIF", "Flow-Grad")
#: Sweeps with many variants (and y = 10, ten times the request rate) smoke two policies.
SMALL = {"length": ("Rand", "Flow-Grad"), "noise": ("Rand", "Disc-Lat"), "utilization": ("Rand", "Disc-Grad")}
FIELDS = {"experiment", "variant", "policy", "scenario", "trial", "mean", "p50", "p90", "p99", "error_rate", "norm_mean", "norm_p90",
          "mean_latency_with_failures", "p90_latency_with_failures", "shed_rate", "server_model", "request_timeout_s"}


@pytest.mark.parametrize("experiment", list(EXPERIMENTS))
def test_each_experiment_smoke(experiment: str) -> None:
    policies = SMALL.get(experiment, SMOKE_POLICIES)
    # y = 10 has ten times the request rate: the length sweep gets a shorter run.
    minutes = 0.02 if experiment == "length" else 0.05
    jobs = make_jobs([experiment], scenarios=1, trials=1, minutes=minutes, seed=3, policies=policies)
    assert len(jobs) == len(EXPERIMENTS[experiment]) * len(policies)
    recs = run_jobs(jobs, workers=1, progress=False)
    assert len(recs) == len(jobs)
    for r in recs:
        assert r.keys() >= FIELDS
        assert r["arrivals"] > 0 and math.isfinite(r["mean"]) and r["mean"] > 0
        if r["policy"] == "Rand":
            assert r["norm_mean"] == 1.0 and r["norm_p90"] == 1.0
        else:  # normalised: the failure-counting mean; the success-only one beside it
            rand = next(q for q in recs if q["policy"] == "Rand" and q["variant"] == r["variant"])
            assert r["norm_mean"] == pytest.approx(r["mean_latency_with_failures"] / rand["mean_latency_with_failures"])
            assert r["norm_mean_served"] == pytest.approx(r["mean"] / rand["mean"])


def test_in_order_runs_scenario_by_scenario() -> None:
    """A run stopped at a deadline keeps whole scenarios (each with its Rand) only when jobs go in order."""
    jobs = make_jobs(["baseline"], scenarios=2, trials=1, minutes=0.01, seed=3, policies=("Rand", "Disc-RIF"))
    seen: list[int] = []
    run_jobs(jobs, workers=1, progress=False, on_record=lambda r: seen.append(r["scenario"]), in_order=True)
    assert seen == sorted(seen) and len(set(seen)) == 2


def _rec(exp: str, var: str, x: float, policy: str, norm: float, err: float = 0.0, scenario: int = 1) -> dict:
    return {"experiment": exp, "variant": var, "x": x, "policy": policy, "scenario": scenario, "trial": 0,
            "duration_s": 600.0, "mean": norm, "p50": norm, "p90": 2 * norm, "p99": 3 * norm, "error_rate": err}


def test_report_table_and_plots(tmp_path) -> None:
    recs = []
    for var, x in (("util=0.5", 0.5), ("util=0.8", 0.8)):
        recs += [_rec("utilization", var, x, p, 1.0 if p == "Rand" else 0.9) for p in POLICIES]
    recs += [_rec("baseline", "util=0.8", 0.8, p, 1.0 if p == "Rand" else 0.85) for p in POLICIES]
    recs = normalise(recs)
    md = markdown_table(recs)
    assert "## utilization — util=0.5" in md and "| Flow-Grad | 0.900" in md and "network" in md
    paths = plot(recs, tmp_path)
    assert {p.name for p in paths} == {"baseline.png", "utilization.png"}
    assert all(0 < p.stat().st_size < 200_000 for p in paths)
    rep = reproduction_report(recs, "results.json", "sim-plots")
    assert "| DLB policies ~20 % below Rand at 80 % utilisation | **yes**" in rep
    assert "![utilization](sim-plots/utilization.png)" in rep


def test_cli_run_and_report(tmp_path, capsys) -> None:
    out = tmp_path / "res"
    rc = main(["sim", "--experiment", "baseline", "--scenarios", "1", "--trials", "1", "--minutes", "0.05",
               "--policies", "Rand,Disc-RIF", "--workers", "2", "--out", str(out), "--no-progress", "--seed", "4"])
    assert rc == 0
    data = json.loads((out / "results.json").read_text())
    assert {r["policy"] for r in data} == {"Rand", "Disc-RIF"} and all(r.keys() >= FIELDS for r in data)
    assert (out / "results.md").exists() and (out / "baseline.png").exists()
    bench = json.loads((out / "benchmark.json").read_text())
    assert bench["events"] > 0 and bench["jobs"] == 2
    report = tmp_path / "docs" / "repro.md"
    assert main(["sim", "report", "--results", str(out / "results.json"), "--output", str(report)]) == 0
    assert "Paper reproduction" in report.read_text() and (tmp_path / "docs" / "sim-plots" / "baseline.png").exists()


def test_one_command_times_each_experiment_and_never_mixes_commits(tmp_path) -> None:
    """Several experiments in one `dlb sim`: each is timed on its own (wall, CPU, runs, commit) in
    benchmark.json, priors included; records from another commit already in results.json are dropped,
    not merged, so the report never meets a mix this command made (and refuses one made by hand)."""
    from dlb.provenance import code_tree, git_commit

    out = tmp_path / "res"
    out.mkdir()
    stale = {"experiment": "burst", "variant": "burst", "policy": "Rand", "scenario": 1, "trial": 0, "commit": "0" * 40,
             "mean": 1.0, "p90": 1.0}
    (out / "results.json").write_text(json.dumps([stale]))
    rc = main(["sim", "--experiment", "priors", "--experiment", "homogeneous", "--scenarios", "1", "--trials", "1",
               "--minutes", "0.05", "--policies", "Rand,Disc-Lat", "--variants", "homogeneous,recover",
               "--out", str(out), "--no-progress", "--workers", "1"])
    assert rc == 0
    bench = json.loads((out / "benchmark.json").read_text())
    commit = git_commit()
    assert list(bench["per_experiment"]) == ["priors", "homogeneous"] and bench["commit"] == commit
    for t in bench["per_experiment"].values():
        assert t["wall_s"] > 0 and t["cpu_s"] > 0 and t["runs"] > 0 and t["commit"] == commit and t["protocol"] is False
    recs = json.loads((out / "results.json").read_text())
    assert {r["commit"] for r in recs} == {commit} and {r["experiment"] for r in recs} == {"priors", "homogeneous"}
    assert {r["code"] for r in recs} == {code_tree()}
    merged = tmp_path / "mixed.json"
    merged.write_text(json.dumps(recs + [stale]))
    assert main(["sim", "report", "--results", str(merged), "--output", str(tmp_path / "r.md")]) == 2
    # `all` with --variants runs only the experiments that have one of them.
    assert main(["sim", "--experiment", "all", "--scenarios", "1", "--trials", "1", "--minutes", "0.05",
                 "--policies", "Rand,Disc-Lat", "--variants", "homogeneous", "--out", str(tmp_path / "all"),
                 "--no-progress", "--workers", "1"]) == 0
    assert list(json.loads((tmp_path / "all" / "benchmark.json").read_text())["per_experiment"]) == ["homogeneous"]


def test_resume_runs_only_what_an_interrupted_run_left_out(tmp_path, monkeypatch, capsys) -> None:
    """The full protocol is ~7 h of 2-core time: `--resume` keeps an interrupted run's streamed records
    of the same code (a line cut by the kill is skipped), runs only the missing jobs, gives the same
    records as one uninterrupted run, and skips an experiment already finished with the same settings;
    records of other code are never kept."""
    import dlb.sim.cli as simcli

    monkeypatch.setattr(simcli, "code_tree", lambda: "tree-a")  # the test checkout may be dirty
    args = ["sim", "--experiment", "baseline", "--scenarios", "1", "--trials", "1", "--minutes", "0.05",
            "--policies", "Rand,Disc-RIF,Flow-Grad", "--workers", "1", "--no-progress", "--seed", "5"]
    whole, part = tmp_path / "whole", tmp_path / "part"
    assert main([*args, "--out", str(whole)]) == 0
    full = json.loads((whole / "results.json").read_text())
    assert {r["code"] for r in full} == {"tree-a"} and len(full) == 3
    # An interrupted run: two records streamed (one of other code), then a line cut by the kill.
    part.mkdir()
    kept, other = dict(full[0]), dict(full[1], code="tree-b")
    (part / "partial-baseline.jsonl").write_text(json.dumps(kept) + "\n" + json.dumps(other) + "\n" + '{"experim')
    capsys.readouterr()
    assert main([*args, "--out", str(part), "--resume"]) == 0
    assert "1 of 3 runs kept" in capsys.readouterr().err
    got = json.loads((part / "results.json").read_text())
    strip = ("wall_s", "cpu_s", "finished_at", "piece_started_at", "commit")
    assert sorted(({k: v for k, v in r.items() if k not in strip} for r in got), key=repr) == sorted(
        ({k: v for k, v in r.items() if k not in strip} for r in full), key=repr)
    bench = json.loads((part / "benchmark.json").read_text())["per_experiment"]["baseline"]
    assert bench["pieces"] == 2 and bench["runs"] == 3  # the kept record ran in the first piece and bench["code"] == "tree-a"
    # Finished with these settings: kept, nothing run; other settings are refused, naming them (running them
    # replaced the finished records without a word: a stranger's report), and the records stay.
    assert main([*args, "--out", str(part), "--resume"]) == 0
    assert "finished earlier" in capsys.readouterr().err
    before = (part / "results.json").read_bytes()
    assert main([*args[:-1], "6", "--out", str(part), "--resume"]) == 2
    assert "--seed 5 there, 6 now" in capsys.readouterr().err
    assert (part / "results.json").read_bytes() == before
    # Other code: nothing is resumed onto it, and a dirty tree refuses to resume at all.
    monkeypatch.setattr(simcli, "code_tree", lambda: "tree-c")
    assert main([*args, "--out", str(part), "--resume"]) == 0
    assert "finished earlier" not in capsys.readouterr().err
    assert {r["code"] for r in json.loads((part / "results.json").read_text())} == {"tree-c"}
    monkeypatch.setattr(simcli, "code_tree", lambda: "tree-c+dirty")
    with pytest.raises(SystemExit, match="dirty"):
        main([*args, "--out", str(part), "--resume"])


def test_out_dir_damage_gives_messages_and_loses_nothing(tmp_path, monkeypatch, capsys) -> None:
    """What an --out directory holds is the protocol's only memory: a results.json that is not a list
    of records is reported and rewritten after the runs (its partial file removed only then); a
    benchmark.json entry of this build stays without --resume; an unreadable benchmark.json is named
    when resuming; the order of --policies does not count as a new setting; --out that is a file is a
    message; Ctrl-C says how to resume; the report reads a file given twice once."""
    import dlb.sim.cli as simcli

    monkeypatch.setattr(simcli, "code_tree", lambda: "tree-a")
    out = tmp_path / "d"
    out.mkdir()
    (out / "results.json").write_text("[1, 2]")
    args = ["sim", "--scenarios", "1", "--trials", "1", "--minutes", "0.05", "--workers", "1", "--no-progress",
            "--out", str(out)]  # fmt: skip
    assert main([*args, "--experiment", "homogeneous", "--policies", "Rand,Disc-RIF"]) == 0
    assert "2 of its 2 entries are not records" in capsys.readouterr().err
    assert {r["experiment"] for r in json.loads((out / "results.json").read_text())} == {"homogeneous"}
    assert not (out / "partial-homogeneous.jsonl").exists()
    assert main([*args, "--experiment", "burst", "--policies", "Rand,Disc-RIF"]) == 0
    assert list(json.loads((out / "benchmark.json").read_text())["per_experiment"]) == ["homogeneous", "burst"]
    capsys.readouterr()
    assert main([*args, "--experiment", "burst", "--policies", "Disc-RIF, Rand", "--resume"]) == 0
    assert "finished earlier" in capsys.readouterr().err
    bench = json.loads((out / "benchmark.json").read_text())
    assert bench["wall_s"] == pytest.approx(sum(t["wall_s"] for t in bench["per_experiment"].values()))
    (out / "benchmark.json").write_text('{"per_experiment": [1,')
    assert main([*args, "--experiment", "burst", "--policies", "Rand,Disc-RIF", "--resume"]) == 0
    assert "not valid JSON" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="not a directory"):
        main([*args[:-1], str(out / "results.json"), "--experiment", "burst"])

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(simcli, "run_jobs", interrupted)
    assert main([*args, "--experiment", "outage", "--policies", "Rand"]) == 130
    assert "--resume" in capsys.readouterr().err
    rep = tmp_path / "r.md"
    assert main(["sim", "report", "--results", str(out / "results.json"), "--results", str(out / "results.json"),
                 "--output", str(rep)]) == 0  # fmt: skip
    assert "were dropped" in capsys.readouterr().err and "(4 runs)" in rep.read_text()


def test_protocol_defaults_and_short_runs_are_marked() -> None:
    """``dlb sim`` defaults to the protocol (10 scenarios × 10 min, 3 baseline trials, 2 for the others),
    and the report marks verdicts from runs below it as short."""
    from dlb.cli import build_parser
    from dlb.sim.experiments import PROTOCOL

    args = build_parser().parse_args(["sim", "--experiment", "all"])
    assert (args.scenarios, args.minutes, args.trials) == (10, 10.0, None)
    jobs = make_jobs(["baseline", "burst"], args.scenarios, args.trials, args.minutes, 1, ("Rand",))
    trials = {e: len({j.trial for j in jobs if j.experiment == e}) for e in ("baseline", "burst")}
    assert trials == {"baseline": 3, "burst": 2} and {j.duration_s for j in jobs} == {600.0}
    assert len({j.scenario for j in jobs}) == 10
    assert PROTOCOL.met_by("burst", 10, 2, 10.0) and not PROTOCOL.met_by("baseline", 10, 2, 10.0)

    def recs(trials: int, minutes: float) -> list[dict]:
        return normalise([dict(_rec("baseline", "util=0.8", 0.8, p, 1.0 if p == "Rand" else 0.8, scenario=k),
                               trial=t, duration_s=60.0 * minutes)
                          for p in POLICIES for k in range(10) for t in range(trials)])

    assert "| baseline | 30 | 10.0 | full |" in reproduction_report(recs(3, 10.0), "r.json", None)
    short = reproduction_report(recs(3, 2.0), "r.json", None)
    assert "| baseline | 30 | 2.0 | short |" in short and "| **yes** (short) |" in short
    assert "| short |" in reproduction_report(recs(2, 10.0), "r.json", None)


def test_estimate_projects_cost_at_the_protocol(tmp_path) -> None:
    """``--estimate`` runs each variant × policy once, short, and scales the CPU time to the protocol:
    ×(10 min ÷ probe minutes) × trials × the 10 scenarios' demand ÷ the probe scenario's."""
    from dlb.sim.cost import demand

    out = tmp_path / "est"
    assert main(["sim", "--experiment", "burst", "--estimate", "0.05", "--policies", "Rand", "--out", str(out)]) == 0
    est = json.loads((out / "cost-estimate.json").read_text())
    (e,) = est["estimates"]
    assert e["experiment"] == "burst" and e["runs"] == 1 * 1 * 10 * 2 and not (out / "results.json").exists()
    kw = {**EXPERIMENTS["burst"][0].kwargs(), "server_model": "batched"}  # dlb sim's default server
    ratio = sum(demand(kw, 1000 + k, 10.0) for k in range(10)) / demand(kw, 1000, 0.05)
    assert e["projected_cpu_s"] == pytest.approx(e["measured_cpu_s"] * (10.0 / 0.05) * 2 * ratio)
    assert "| burst | 20 |" in (out / "cost-estimate.md").read_text()


def test_cli_runs_the_operator_baselines_by_name(tmp_path) -> None:
    """The operator baselines run when named, in records, tables and plots (a
    plot palette of ten colours once crashed on the eleventh policy)."""
    out = tmp_path / "ops"
    pols = "Rand,Disc-RIF,lr-global,locality-failover,hub-score"
    rc = main(["sim", "--experiment", "server-model", "--scenarios", "1", "--trials", "1", "--minutes", "0.05",
               "--policies", pols, "--workers", "1", "--out", str(out), "--no-progress", "--seed", "4"])
    assert rc == 0
    data = json.loads((out / "results.json").read_text())
    assert {r["policy"] for r in data} == set(pols.split(",")) and all(r.keys() >= FIELDS for r in data)
    assert {r["variant"] for r in data} == {"pipeline", "batched"}
    assert "| hub-score |" in (out / "results.md").read_text() and (out / "server-model.png").exists()
