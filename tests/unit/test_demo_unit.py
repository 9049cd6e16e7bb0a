"""``dlb demo --no-live`` end to end: the whole stack from one command, and nothing left behind.

Here: the tests that run in-process (no sockets, no processes);
the others: ``tests/e2e/test_demo.py``.
The rules and what the tests stand for: that file's docstring.
"""

from __future__ import annotations

from pathlib import Path

import pytest


def test_demo_dp_option_makes_europe_west1_a_bfio_dp_cell(tmp_path: Path) -> None:
    """``dlb demo --dp 4`` (planned, not run): europe-west1's servers are emulators with 4 lock-step ranks
    on consecutive ports, the config names them DP groups picked by BF-IO, the leaf agent expands them
    into ranks, and the cell's capacity counts every rank. The default run has no DP cell."""
    from dlb.cli import build_parser
    from dlb.config import config_from_dict
    from dlb.ext_proc.leaf_setup import state_from_config
    from dlb.testbed.demo import prepare

    args = build_parser().parse_args(["demo", "--dp", "4", "--out", str(tmp_path)])
    run, sup, _ = prepare(args, tmp_path)
    cfg = config_from_dict(run.cfg_dict, "demo")
    dp = [s.dp for s in cfg.cell("europe-west1").servers]
    assert len(dp) == 2 and all(g is not None and (g.ranks, g.policy) == (4, "bf-io") for g in dp)
    assert all(s.dp is None for c in cfg.cells if c.name != "europe-west1" for s in c.servers)
    state = state_from_config(cfg, "europe-west1")
    assert len(state.servers) == 8 and [len(m) for _, m in state.dp_groups] == [4, 4]
    argv = {c.name: c.argv for c in sup.children if c.name.startswith("server europe-west1/")}
    assert argv and all("--dp-size" in a and a[a.index("--dp-size") + 1] == "4" for a in argv.values())
    plain, _, _ = prepare(build_parser().parse_args(["demo", "--out", str(tmp_path / "plain")]), tmp_path / "plain")
    assert run.capacity["europe-west1"] == pytest.approx(4 * plain.capacity["europe-west1"])
    assert all("dp_ranks" not in str(s) for c in plain.cfg_dict["cells"] for s in c["servers"])


def _run_with_results(tmp_path: Path, stop_s: float | None, after_in_20: int = 6):
    """A planned demo run (nothing started) whose requests went 30 % to us-central1, 5 % while it was
    degraded and ``after_in_20`` / 20 after it, up to ``stop_s`` (an interruption) or the end."""
    from dlb.cli import build_parser
    from dlb.load.generator import Result
    from dlb.testbed.demo import prepare

    run, _, _ = prepare(build_parser().parse_args(["demo", "--out", str(tmp_path)]), tmp_path)
    assert run.degrade_window is not None and run.degrade_cell == "us-central1"
    a, b = run.degrade_window
    end = run.spec.duration_s if stop_s is None else stop_s
    results = []
    for i in range(int(end * 20)):
        t = i / 20
        share = 1 if a <= t < b else after_in_20 if t >= b else 6
        cell = "us-central1" if i % 20 < share else "us-east1"
        results.append(Result(i, t, "chat", "us-east1", "", 200, 1.0, 0.1, 0.0, 5, f"{cell}/0"))
    run.results, run.interrupted, run.stopped_s = results, stop_s is not None, stop_s
    return run


def test_demo_report_of_an_interrupted_run_says_what_it_did_not_measure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C before the recovery window: the report says how long the run lasted and that the return
    was not measured (it said 'over 60s', 'after nan%', 'came back: False'); a whole run keeps its verdict."""
    import json

    from dlb.testbed import report
    from dlb.testbed.report import write_report

    monkeypatch.setattr(report, "git_commit", lambda: {"commit": "0" * 40, "dirty": False})  # git is a process

    run = _run_with_results(tmp_path, 37.0)
    write_report(run, tmp_path)
    md = (tmp_path / "report.md").read_text()
    deg = json.loads((tmp_path / "results.json").read_text())["degradation"]
    assert deg["fell"] is True and deg["came_back"] is None and deg["share_after"] is None, deg
    assert "over 37s" in md and "after not reached" in md and "came back: not measured" in md, md

    full = tmp_path / "full"
    full.mkdir()
    write_report(_run_with_results(full, None), full)
    deg = json.loads((full / "results.json").read_text())["degradation"]
    assert deg["fell"] is True and deg["came_back"] is True, deg
    assert "over 60s" in (full / "report.md").read_text()


def test_the_degraded_cell_came_back_when_it_regained_a_third_of_its_drop(tmp_path: Path) -> None:
    """30 % → 5 % → 15 % regained 40 % of the drop (came back; half was the rule, and two healthy windows of
    one real run differ by up to 0.10); 30 % → 5 % → 10 % regained 20 % (did not)."""
    from dlb.testbed.report import degradation

    assert degradation(_run_with_results(tmp_path, None, after_in_20=3))["came_back"] is True  # type: ignore[index]
    assert degradation(_run_with_results(tmp_path, None, after_in_20=2))["came_back"] is False  # type: ignore[index]


def test_the_demo_names_the_policies_of_the_config_it_runs(tmp_path: Path) -> None:
    """``dlb demo --config FILE`` reported the embedded fleet's policies whatever the file said; the label
    is now read from the config the run uses (planned, not run)."""
    import yaml

    from dlb.cli import build_parser
    from dlb.testbed.demo import prepare

    plain, _, _ = prepare(build_parser().parse_args(["demo", "--out", str(tmp_path / "plain")]), tmp_path / "plain")
    assert plain.policy == "chat Disc-Lat + affinity, completions Flow-Grad"
    doc = {"version": 1,
           "cells": [{"name": n, "root": {"address": f"127.0.0.1:{4000 + i}"}, "leaf": {"address": f"127.0.0.1:{1000 + i}",
                      "probe": f"127.0.0.1:{2000 + i}"}, "servers": [f"127.0.0.1:{3000 + i}"]} for i, n in enumerate(["east", "west"])],
           "network": {"one_way_ms": {"east": {"west": 30}}},
           "endpoints": [{"name": "comp", "match": {"prefix": "/v1/"}, "policy": {"mechanism": "flow", "cost": "latency"}}]}
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(doc))
    mine, _, _ = prepare(build_parser().parse_args(["demo", "--config", str(path), "--out", str(tmp_path / "m")]), tmp_path / "m")
    assert mine.policy == "comp Flow-Lat"
    forced, _, _ = prepare(build_parser().parse_args(["demo", "--config", str(path), "--policy", "Disc-RIF",
                                                      "--out", str(tmp_path / "f")]), tmp_path / "f")
    assert forced.policy == "Disc-RIF"


def test_a_native_policy_runs_every_endpoint_in_the_root_envoy_with_the_pick_asked(tmp_path: Path) -> None:
    """``--policy Disc-Lat-native --native-pick round-robin``: the config the run uses has every endpoint
    ``native-discrete`` with that pick and no affinity (which would keep the ext_proc); ``--compare``
    runs the native policies only when asked, as ``dlb sim`` does."""
    from dlb.cli import build_parser
    from dlb.config import load_config
    from dlb.core.router import Cost
    from dlb.testbed.compare import plan
    from dlb.testbed.demo import prepare
    from dlb.testbed.demo_run import NATIVE_POLICIES

    args = build_parser().parse_args(["demo", "--policy", "Disc-Lat-native", "--native-pick", "round-robin",
                                      "--out", str(tmp_path / "n")])
    run, _, config_path = prepare(args, tmp_path / "n")
    cfg = load_config(config_path)
    assert run.policy == "Disc-Lat-native (round-robin)"
    assert [(ep.policy.native, ep.policy.native_pick, ep.policy.cost, ep.policy.affinity.enabled) for ep in cfg.endpoints] == [
        (True, "round-robin", Cost.LATENCY, False)] * 2
    default = plan(build_parser().parse_args(["demo", "--compare"]))[1]
    assert not set(NATIVE_POLICIES) & set(default)
    asked = plan(build_parser().parse_args(["demo", "--compare", "--policies", "Disc-Lat,Disc-Lat-native"]))[1]
    assert asked == ["Disc-Lat", "Disc-Lat-native"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--native-pick", "fastest"])


def test_sends_since_the_last_sample_restart_from_zero_when_a_root_envoy_restarted() -> None:
    from dlb.testbed.demo import sent_since

    assert sent_since({"a": 12.0, "b": 5.0}, {"a": 10.0, "b": 5.0}) == {"a": 2.0, "b": 0.0}
    assert sent_since({"a": 3.0, "c": 1.0}, {"a": 40.0}) == {"a": 3.0, "c": 1.0}  # a's Envoy restarted; c is new


def test_compare_refuses_options_it_would_ignore_and_a_resume_with_another_native_pick(tmp_path: Path,
                                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """``--compare --quick --policies …`` ran --quick's own set, ``--compare --policy`` dropped the policy,
    and a resume with another ``--native-pick`` mixed two picks under one name: each is refused now."""
    import json

    from dlb.cli import build_parser
    from dlb.errors import UsageError
    from dlb.launch.up import StopFlag
    from dlb.testbed.cli import _run_demo
    from dlb.testbed.compare import run_compare, summarize, table

    parse = build_parser().parse_args
    for argv, named in ((["--quick", "--policies", "Disc-Lat"], "--policies"), (["--quick", "--trials", "2"], "--trials"),
                        (["--policy", "Rand"], "--policy")):
        with pytest.raises(UsageError, match=named):
            _run_demo(parse(["demo", "--compare", *argv, "--out", str(tmp_path / "x")]))
    with pytest.raises(UsageError, match="--native-pick"):  # a pick with no native policy to apply it to
        _run_demo(parse(["demo", "--policy", "Disc-Lat", "--native-pick", "round-robin", "--out", str(tmp_path / "y")]))
    with pytest.raises(ValueError, match="''"):
        from dlb.testbed.compare import plan
        plan(parse(["demo", "--compare", "--policies", "Disc-Lat,"]))
    out = tmp_path / "cmp"
    out.mkdir()
    rec = {"scenario": "steady", "policy": "Disc-Lat-native", "trial": 0, "native_pick": "least-request", "requests": 10,
           "ok": 10, "errors": 0, "shed": 0, "mean_s": 2.0, "p90_s": 3.0, "ttft_p50_s": 0.1}
    (out / "records.jsonl").write_text(json.dumps(rec) + "\n")
    args = parse(["demo", "--compare", "--scenarios", "steady", "--policies", "Disc-Lat-native", "--trials", "1",
                  "--native-pick", "round-robin", "--duration", "20", "--out", str(out)])
    args.duration = 20.0

    def no_run(*a: object, **k: object) -> None:
        raise AssertionError("a run started")

    monkeypatch.setattr("dlb.testbed.demo.run_once", no_run)
    assert run_compare(args, out, StopFlag()) == 2  # refused before any run starts
    assert "Disc-Lat-native (least-request)" in table(summarize([rec]))
    assert table(summarize([rec])).endswith("| – |")  # no operator baseline ran: no ratio, not "nan"
    args.policies = "Disc-Lat"
    assert run_compare(args, out, StopFlag()) == 2  # --native-pick with no native policy
