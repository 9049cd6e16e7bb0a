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
    assert "None" not in line and "rss —→45.4→— MB" in line and "loop lag — ms (ping — ms)" in line and line.endswith("PASS")
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


def _lag_reading(lags_s: list[float], longest_s: float | None = None):
    """What the service's /metrics would carry after heartbeats with these lags (a real LoopLag's families)."""
    from prometheus_client import CollectorRegistry, generate_latest

    from dlb.bench.hostile_measure import loop_lag
    from dlb.service.loop_lag import LoopLag
    from dlb.service.metrics import CallbackCollector

    lag = LoopLag("dlb_root")
    for s in lags_s:
        lag.record(s, 0.0)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CallbackCollector(lag.families))
    reading = loop_lag(generate_latest(registry).decode(), "dlb_root")
    assert reading is not None
    if longest_s is not None:
        reading = type(reading)(reading.buckets, longest_s)
    return reading


def test_the_window_lag_counts_beats_over_the_bound_exactly_and_bounds_the_worst_from_above() -> None:
    """Bucket deltas between two reads: beats over 40 ms exact; the worst lag's upper bound is its bucket's
    bound, narrowed by the 60-s longest gauge when the window fits in it."""
    from dlb.bench.hostile_measure import window_lag

    before = _lag_reading([0.001] * 5 + [0.3])  # a 300-ms lag before the window: not the window's
    after = _lag_reading([0.001] * 5 + [0.3] + [0.002] * 10 + [0.042, 0.033], longest_s=0.3)
    w = window_lag(before, after, window_s=20.0, over_s=0.04)
    assert w["beats"] == 12 and w["over"] == 1
    assert w["max_ms"] == 45.0 and not w["exact"]  # 42 ms lies in (40, 45]; the gauge still shows the older 300 ms
    rose = window_lag(_lag_reading([0.001] * 5, longest_s=0.001), _lag_reading([0.001] * 5 + [0.042], longest_s=0.042),
                      window_s=20.0, over_s=0.04)
    assert rose["max_ms"] == 42.0 and rose["exact"]  # the 60-s gauge rose between the reads: its value is the window's
    narrowed = window_lag(before, _lag_reading([0.001] * 5 + [0.3] + [0.033], longest_s=0.031), window_s=20.0, over_s=0.04)
    assert narrowed["max_ms"] == 31.0 and narrowed["over"] == 0
    wide = window_lag(before, _lag_reading([0.001] * 5 + [0.3] + [0.033], longest_s=0.031), window_s=90.0, over_s=0.04)
    assert wide["max_ms"] == 35.0  # a window longer than the gauge's 60 s: the bucket bound only
    huge = window_lag(before, _lag_reading([0.001] * 5 + [0.3] + [7.5], longest_s=7.5), window_s=20.0, over_s=0.04)
    assert huge["max_ms"] == 7500.0  # past the last bound: the gauge's figure, never null
    with pytest.raises(ValueError):
        window_lag(before, after, window_s=20.0, over_s=0.042)


def test_the_loop_block_target_judges_the_services_own_loop_not_the_ping() -> None:
    """The target is about the service's loop being blocked: a 75-ms ping beside a 25-ms loop lag passes
    (the time was spent outside the loop), a 20-ms ping beside a 45-ms lag fails (a block of up to
    65 ms). Before, the ping alone judged both the other way round."""
    def rec(ping: float | None, lag: float | None) -> dict:
        return {"rss_before_mb": 80.0, "rss_peak_mb": 81.0, "rss_after_mb": 80.0, "loop_block_max_ms": ping, "loop_lag_max_ms": lag,
                "real_traffic_p50_ms": 10.0, "real_traffic_errors": 0}

    assert hostile._verdicts(rec(75.0, 25.0), 10.0)["loop_block_le_50ms"] is True
    assert hostile._verdicts(rec(20.0, 45.0), 10.0)["loop_block_le_50ms"] is False
    assert hostile._verdicts(rec(20.0, 30.0), 10.0)["loop_block_le_50ms"] is True  # lag 30 + period 20 = 50
    assert hostile._verdicts(rec(20.0, 35.0), 10.0)["loop_block_le_50ms"] is False
    assert hostile._verdicts(rec(60.0, None), 10.0)["loop_block_le_50ms"] is False  # no lag exported: the ping judges
    assert hostile.LAG_OVER_S == 0.03
