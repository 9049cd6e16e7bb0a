"""The fluid-model check: equilibrium solvers against brute force, and the routers against the solvers.

Here: the tests that start dlb services, open sockets or run subprocesses;
the others: ``tests/unit/test_theory.py``.
The rules and what the tests stand for: that file's docstring.
"""

from __future__ import annotations

import json

import pytest
from test_theory import small_networks

from dlb import cli
from dlb.core.flow import FlowConfig
from dlb.theory import equilibria as eq
from dlb.theory import fluid as th
from dlb.theory import parallel


def test_optimum_is_no_worse_than_other_equilibria() -> None:
    for net in th.networks(3, 5):
        opt = eq.solve(eq.Objective.OPTIMUM, net)
        for other in (eq.Objective.WARDROP, eq.Objective.RIF):
            assert opt.total_latency <= eq.solve(other, net).total_latency * (1 + 1e-7)


def test_cli_writes_json_records(tmp_path, capsys) -> None:
    out = tmp_path / "theory.json"
    rc = cli.main(["theory", "--set", "paper", "--topologies", "1", "--seed", "3", "--horizon", "40",
                   "--policies", "Flow-RIF,Disc-RIF", "--replicas", "1,2", "--noise", "0", "--jobs", "1", "--json", str(out)])
    recs = json.loads(out.read_text())
    assert [(r["policy"], r["replicas"]) for r in recs] == [("Flow-RIF", 1), ("Disc-RIF", 1), ("Flow-RIF", 2), ("Disc-RIF", 2)]
    for r in recs:
        assert {"topology", "policy", "replicas", "noise", "latency_gap", "workload_gap", "amplitude", "commit"} <= set(r)
        assert isinstance(r["latency_gap"], float) and isinstance(r["workload_gap"], float)
        # The run's settings and command line, as the bench files carry them (they were missing).
        assert r["settings"]["seed"] == 3 and r["settings"]["horizon"] == 40 and r["settings"]["set"] == "paper"
        assert {"window", "kappa", "sizes", "load"} <= set(r["settings"])
        assert r["command_line"].startswith("dlb theory --set paper --topologies 1 --seed 3")
    text = capsys.readouterr().out
    # 40 s from an empty start has not settled: that check comes first, and the end-state ones (R identity
    # among them) judge settled runs only (tests/unit/test_theory.py covers them on records).
    assert "Flow-RIF" in text and "flow runs settled within the horizon" in text
    assert rc == (0 if "FAIL" not in text else 1)


def test_cli_rejects_unknown_policy(capsys) -> None:
    assert cli.main(["theory", "--policies", "Flow-Foo"]) == 1
    assert "--policies: unknown policy ['Flow-Foo']" in capsys.readouterr().err


def test_parallel_jobs_per_policy_keep_the_serial_order_and_records() -> None:
    """Jobs run one policy each, dearest first, in worker processes; the records come back in
    (topology, R, ε, policy) order and equal the serial run's, and each job's records are handed on as
    it finishes (the CLI streams them to disk)."""
    nets = small_networks()[:2]
    cfg = th.SimConfig(horizon_s=2.0)
    pols = ["Flow-Grad", "Disc-RIF"]
    streamed: list[th.Record] = []
    par = parallel.run_parallel(nets, cfg, parallel.Sweep(pols, 1.0, (1, 2)), 2, on_records=streamed.extend)
    ser = parallel.run_parallel(nets, cfg, parallel.Sweep(pols, 1.0, (1, 2)), 1)
    assert par == ser
    assert [(r.topology, r.replicas, r.policy) for r in par] == [
        (n.name, R, p) for n in nets for R in (1, 2) for p in pols]  # fmt: skip
    assert sorted(streamed, key=repr) == sorted(par, key=repr)


def test_cli_resumes_an_interrupted_run_and_refuses_bad_settings(tmp_path, monkeypatch, capsys) -> None:
    """`dlb theory --json F --resume` keeps the records an interrupted run of the same code and settings
    left in F.partial.jsonl (a line cut by the interruption is skipped) and runs only the rest; without
    --resume an existing partial file is not overwritten; settings that would average the start of a
    run (window ≥ horizon), a --json path that cannot be written and --jobs 0 are refused before any
    work; Ctrl-C says where the records are."""
    import json

    import dlb.provenance

    monkeypatch.setattr(dlb.provenance, "code_tree", lambda: "tree-a")
    f = tmp_path / "t.json"
    base = ["theory", "--sizes", "2", "--horizon", "20", "--replicas", "1", "--noise", "0",
            "--policies", "Flow-Grad,Disc-RIF", "--jobs", "1", "--json", str(f)]  # fmt: skip
    cli.main(base)
    full = json.loads(f.read_text())
    assert len(full) == 4 and {r["code"] for r in full} == {"tree-a"}
    assert not (tmp_path / "t.json.partial.jsonl").exists()
    settings = {"code": "tree-a", "set": "scale", "sizes": "2", "topologies": 12, "seed": 0, "horizon": 20.0,
                "window": 10.0, "kappa": 1.0, "graphs": "complete,sparse", "load": None, "rule": None}
    partial = tmp_path / "t.json.partial.jsonl"
    partial.write_text("".join(json.dumps({**r, "settings": settings}) + "\n" for r in full[:2]) + '{"topol')
    f.unlink()
    assert cli.main(base) == 1
    assert "continue it with --resume" in capsys.readouterr().err
    cli.main([*base, "--resume"])
    assert "2 record(s) kept" in capsys.readouterr().err
    strip = ("commit", "command_line")  # the records the resumed run made name its command, --resume included
    assert [{k: v for k, v in r.items() if k not in strip} for r in json.loads(f.read_text())] == [
        {k: v for k, v in r.items() if k not in strip} for r in full]
    for bad, msg in ((["--horizon", "5"], "must be shorter than --horizon"), (["--window", "0"], "--window must be > 0"),
                     (["--jobs", "0"], "--jobs must be >= 1"), (["--json", str(tmp_path / "no" / "x.json")], "does not exist"),
                     (["--json", str(tmp_path)], "is a directory")):  # fmt: skip
        assert cli.main(["theory", "--sizes", "2", "--horizon", "20", *bad]) == 1
        assert msg in capsys.readouterr().err

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(parallel, "run_parallel", interrupted)
    assert cli.main(base) == 130
    assert "continue with --resume" in capsys.readouterr().err


def _dynamics_record(relaxation: bool) -> th.Record:
    net = th.dynamics_network(0.95)
    cfg = th.SimConfig(horizon_s=480.0, flow=FlowConfig(relaxation_delay=relaxation))
    return th.run([net], cfg, ["Flow-Grad"])[0]


def test_dynamics_case_settles_under_the_delay_only_rule() -> None:
    """``dlb theory --set dynamics``: a queue relaxing in ~57 s behind a 0.2-s loop. Linearised, the
    delay-only loop K·e^{−sτ}/(s(1 + sT)) keeps a phase margin ≈ (1 − Kτ)/√(KT) > 0 for Kτ < 1 whatever
    T (research/theory.md, "Queue dynamics"): x settles in ~2 min and N relaxes with T, no cycle."""
    rec = _dynamics_record(False)
    assert abs(rec.latency_gap) <= th.FLOW_GRAD_TARGET and rec.amplitude <= th.AMPLITUDE_LIMIT, rec
    assert rec.overflow == 0.0 and rec.settled, rec


@pytest.mark.xfail(strict=True, reason="the relaxation rule (off by default) evaluates T at the current state: 164 % "
                   "above the optimum at 600 s (research/theory.md, 'Queue dynamics'); remove this mark when it settles")
def test_dynamics_case_settles_under_the_relaxation_rule() -> None:
    rec = _dynamics_record(True)
    assert abs(rec.latency_gap) <= th.FLOW_GRAD_TARGET and rec.amplitude <= th.AMPLITUDE_LIMIT, rec
