"""``dlb bench hostile`` at smoke size: every attack runs against live services and leaves a full record.

Here: the tests that run in-process (no sockets, no processes);
the others: ``tests/e2e/test_bench_hostile.py``.
The rules and what the tests stand for: that file's docstring.
"""

from __future__ import annotations

import pytest

from dlb.bench import hostile
from dlb.bench.hostile_attacks import yaml_bomb

pytestmark = pytest.mark.timeout(240)


def test_the_bomb_expands_exponentially_but_is_small() -> None:
    import yaml

    text = yaml_bomb(4)
    assert len(text) < 400
    data = yaml.safe_load(text)
    assert len(data["cells"]) == 9 and len(data["cells"][0][0][0]) == 9


def test_the_console_line_shows_missing_measures_as_a_dash_not_none() -> None:
    """`--scale ci` printed 'rss None→45.4→None MB  loop None ms' for the validator and 'p50 None ms'
    when no real request finished during a short attack."""
    from dlb.bench.hostile import summary_line

    r = {"row": 7, "attack": "yaml-bomb-validate", "rss_before_mb": None, "rss_peak_mb": 45.4, "rss_after_mb": None,
         "loop_block_max_ms": None, "real_traffic_p50_ms": None, "real_traffic_errors": 0,
         "verdicts": {"config_reported_in_2s_200mb": True, "no_errors": True}}
    line = summary_line(r, 13.2)
    assert "None" not in line and "rss —→45.4→— MB" in line and "loop — ms" in line and line.endswith("PASS")
    r["verdicts"]["no_errors"] = False
    assert summary_line(r, None).endswith("FAIL: no_errors") and "(baseline —)" in summary_line(r, None)


def test_a_missed_target_makes_the_bench_exit_non_zero_and_names_it(monkeypatch, capsys) -> None:
    """`dlb bench hostile` exited 0 even when a target failed, so CI could not gate on it. The run itself
    is a recorded result of the real bench's shape (a live run's verdicts depend on the machine)."""
    import argparse


    ok = {"attack": "hpack-cache", "row": 1, "rss_before_mb": 78.1, "rss_peak_mb": 78.2, "rss_after_mb": 78.2,
          "loop_block_max_ms": 4.8, "real_traffic_p50_ms": 10.7, "real_traffic_errors": 0,
          "verdicts": {"rss_growth_le_50mb": True, "loop_block_le_50ms": True, "no_errors": True}}
    bad = dict(ok, attack="idle-connections", row=3, loop_block_max_ms=314.5, real_traffic_errors=2,
               verdicts={"rss_growth_le_50mb": True, "loop_block_le_50ms": False, "no_errors": False})
    result = {"baseline_p50_ms": 10.6, "baseline_loop_block_max_ms": 5.0, "load_avg_1m": {"start": 0.3, "end": 0.5},
              "attacks": [ok, bad]}
    missed = [t.rule for t in hostile.targets(result) if t.holds is False]
    assert missed == ["row 3 idle-connections: loop_block_le_50ms", "row 3 idle-connections: no_errors"]
    assert all(t.holds for t in hostile.targets({"attacks": [ok]}))

    args = argparse.Namespace(attacks="hpack-cache,idle-connections", scale="ci", rate=10.0, settle_s=1.0, baseline_s=1.0,
                              mem_cap_mb=1000, validate_timeout_s=5.0, tls=False, json=None)
    monkeypatch.setattr(hostile, "run_bench", lambda *a, **k: result)
    monkeypatch.setattr("dlb.bench.harness.git_commit", lambda: "0" * 40)  # a unit test runs no git
    assert hostile.run(args) == 1
    err = capsys.readouterr().err
    assert "row 3 idle-connections: loop_block_le_50ms" in err and "row 3 idle-connections: no_errors" in err
    result["attacks"] = [ok]
    assert hostile.run(args) == 0
