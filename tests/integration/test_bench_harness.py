"""The one bench harness: every results file carries the commit, command, box load and verdict; a missed
target exits 1 and is named; every benchmark command has the same ``--json FILE``."""

from __future__ import annotations

import argparse
import json
import re

import pytest

from dlb import cli
from dlb.bench import cli as bench_cli
from dlb.bench import harness


def _record() -> harness.BenchRecord:
    return harness.BenchRecord(command_line="dlb bench x", commit="abc", loadavg_start=(0.5, 0.4, 0.3))


def test_an_object_gains_the_stamp_and_keeps_every_field_it_had() -> None:
    """Fields the benchmark writes win over the stamp (no rename, no overwrite), the stamp fills the rest."""
    rec = _record()
    code = harness.finish(rec, {"commit": {"sha": "own"}, "rows": [1]}, [harness.Target("a <= 1", True, "0.5")])
    out = rec.as_json()
    assert code == 0 and out["commit"] == {"sha": "own"} and out["rows"] == [1]
    assert out["command_line"] == "dlb bench x" and out["loadavg_start"] == [0.5, 0.4, 0.3] and len(out["loadavg_end"]) == 3
    assert out["target_verdicts"] == [{"rule": "a <= 1", "pass": True, "measured": "0.5"}] and out["pass"] is True


def test_a_list_keeps_its_shape_and_every_row_is_stamped() -> None:
    rec = _record()
    harness.finish(rec, [{"p50_ms": 1.0}, {"p50_ms": 2.0, "commit": "mine"}])
    rows = rec.as_json()
    assert isinstance(rows, list) and [r["p50_ms"] for r in rows] == [1.0, 2.0]
    assert rows[0]["commit"] == "abc" and rows[1]["commit"] == "mine" and all(r["pass"] for r in rows)


def test_a_missed_target_exits_1_and_is_named_and_an_unmeasured_one_is_not_missed(tmp_path, capsys) -> None:
    rec = _record()
    path = tmp_path / "r.json"
    targets = [harness.Target("p99 <= 20 ms", False, "31 ms"), harness.Target("no errors", True),
               harness.Target("pick <= 20 µs", None, "25 µs")]
    assert harness.finish(rec, {"x": 1}, targets, json_path=str(path)) == 1
    err = capsys.readouterr().err
    assert "missed target: p99 <= 20 ms (measured 31 ms)" in err and "no errors" not in err and "pick" not in err
    written = json.loads(path.read_text())
    assert written["pass"] is False and written["x"] == 1 and written["commit"] == "abc"


def test_start_reads_the_commit_and_load_before_the_work(monkeypatch) -> None:
    monkeypatch.setattr(harness, "git_commit", lambda: "c0ffee")
    rec = harness.start(harness.command_line(["bench", "pick", "--json", "a b.json"]))
    assert rec.commit == "c0ffee" and rec.command_line == "dlb bench pick --json 'a b.json'" and len(rec.loadavg_start) == 3
    assert rec.loadavg_end is None


@pytest.mark.parametrize("key", sorted(bench_cli.BENCHES))
def test_every_bench_has_the_common_json_option_and_no_history_in_its_help(key: tuple[str, str]) -> None:
    """One ``--json FILE`` everywhere; help says what a bench does, not which issue or commit made it."""
    top = argparse.ArgumentParser()
    bench_cli.add(top.add_subparsers(), *key)
    sub = top._subparsers._group_actions[0].choices[key[1]]  # type: ignore[union-attr]
    text = sub.format_help()
    assert "--json FILE" in text and "naming each missed target" in " ".join(text.split())
    assert not re.search(r"\bissue \d+|\bissue's\b|\b[0-9a-f]{7,40}\b", text), text


def test_pick_writes_its_rows_with_commit_and_load(tmp_path) -> None:
    """A bench that wrote no commit before: every row now names it, the figures unchanged."""
    out = tmp_path / "pick.json"
    assert cli.main(["bench", "pick", "--decisions", "20", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert rows and {"cells", "policy", "baseline_us", "pick_us", "speedup"} <= set(rows[0])
    assert all(r["commit"] and len(r["loadavg_start"]) == 3 and r["command_line"].startswith("dlb bench pick") for r in rows)


def test_a_bad_option_value_is_a_message_and_exit_1_not_a_traceback(capsys) -> None:
    assert cli.main(["bench", "faults", "--faults", "nope"]) == 1
    assert "--faults: unknown fault 'nope'" in capsys.readouterr().err
