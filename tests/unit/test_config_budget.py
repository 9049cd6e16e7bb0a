"""Hostile and broken config files (issue 14 rows 7-8): a problem report naming file and line, never a
traceback, a hang or gigabytes; a control plane whose SIGHUP reload fails keeps serving the old config."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from dlb.config import ConfigError, load_config, parse_config
from dlb.config.loader import MAX_CELLS, MAX_CONFIG_BYTES, MAX_DEPTH

GOOD = """\
version: 1
cells:
  - name: a
    leaf: {address: 127.0.0.1:10010, probe: 127.0.0.1:9010}
    servers: [127.0.0.1:8010]
endpoints:
  - name: m
    match: {prefix: /v1/}
"""


def alias_bomb(levels: int) -> str:
    """The billion-laughs document: each level lists the previous one 9 times (9**levels values)."""
    lines = ["version: 1", 'l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def only_problem(text: str) -> tuple[str, str, int | None]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "bad.yaml")
    problems = info.value.problems
    assert all(p.file == "bad.yaml" for p in problems)
    return problems[0].path, problems[0].reason, problems[0].line


def test_alias_bomb_is_refused_within_the_memory_budget() -> None:
    tracemalloc.start()
    try:
        path, reason, line = only_problem(alias_bomb(7))  # 4.8 million values once expanded
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "alias" in reason and line is not None and line >= 2, (path, reason, line)
    assert peak < 200 * 2**20, f"peak {peak / 2**20:.0f} MB"


def test_nesting_5000_deep_is_a_problem_not_a_traceback() -> None:
    for text in ("x: " + "[" * 5000 + "]" * 5000, "x: " + "{a: " * 5000 + "1" + "}" * 5000):
        _, reason, line = only_problem(text)
        assert "nest" in reason and line == 1, reason


def test_an_alias_inside_its_own_anchor_is_a_problem_not_a_recursion() -> None:
    # A list, a mapping and a merge key that name the node they sit in: before, Python's stack ran out
    # (RecursionError), and a SIGHUP of such a file under dlb up stopped every process.
    for cycle in ("x: &a [*a]", "x: &a {y: *a}", "x: &a {<<: *a, y: 1}", "x: &a [1, [2, *a]]"):
        path, reason, line = only_problem(GOOD + cycle + "\n")
        assert "cycle" in reason and path.startswith("x") and line is not None, (cycle, path, reason)


def test_aliases_nesting_deeper_than_the_text_are_a_problem_not_a_recursion() -> None:
    # Each anchor wraps the last: two levels of text, 1,500 once expanded (and few values on the way down).
    lines = ["a0: &a0 1"] + [f"a{i}: &a{i} [*a{i - 1}]" for i in range(1, 1500)]
    _, reason, _ = only_problem(GOOD + "\n".join(lines) + "\n")
    assert f"deeper than {MAX_DEPTH}" in reason and "aliases" in reason, reason


def test_nesting_within_the_limit_is_checked_as_usual() -> None:
    _, reason, _ = only_problem(GOOD + "probe: " + "[" * (MAX_DEPTH - 2) + "]" * (MAX_DEPTH - 2) + "\n")
    assert "must be a mapping" in reason


def test_merge_keys_are_supported_and_explicit_keys_win() -> None:
    text = """\
version: 1
cells:
  - &base
    name: a
    leaf: {address: 127.0.0.1:10010, probe: 127.0.0.1:9010}
    servers: [127.0.0.1:8010]
  - <<: *base
    name: b
    leaf: {address: 127.0.0.1:10020, probe: 127.0.0.1:9020}
    servers: [127.0.0.1:8020, 127.0.0.1:8021]
network: {default_one_way_ms: 5}
endpoints:
  - {name: m, match: {prefix: /v1/}, policy: &pol {mechanism: discrete, cost: rif}}
  - {name: n, match: {prefix: /v2/}, policy: {<<: *pol, cost: latency}}
"""
    cfg = parse_config(text, "merge.yaml")
    assert [c.name for c in cfg.cells] == ["a", "b"] and len(cfg.cells[1].servers) == 2
    assert cfg.endpoints[1].policy.mechanism.value == "discrete" and cfg.endpoints[1].policy.cost.value == "latency"


def test_a_bad_merge_key_names_file_and_line() -> None:
    path, reason, line = only_problem(GOOD.replace("    servers: [127.0.0.1:8010]", "    servers: [127.0.0.1:8010]\n    <<: 7"))
    assert "merge key" in reason and path == "cells[0].<<" and line == 6, (path, reason, line)


def test_merge_bomb_is_refused() -> None:
    text = "a: &a {x: 1, y: 2}\n"
    for i in range(1, 16):
        text += f"b{i}: &b{i}\n" + "".join(f"  k{j}: *{'a' if i == 1 else f'b{i - 1}'}\n" for j in range(10))
    _, reason, _ = only_problem(text)
    assert "alias" in reason


def test_an_integer_of_5000_digits_is_a_bad_value() -> None:
    path, reason, line = only_problem(GOOD.replace("version: 1", "version: " + "9" * 5000))
    assert path == "version" and "bad value" in reason and line == 1


def test_too_many_cells_is_one_problem_not_a_quadratic_check() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("version: 1\ncells: [" + ",".join(["1"] * 5_000) + "]\n", "many.yaml")
    assert any(p.path == "cells" and f"at most {MAX_CELLS}" in p.reason for p in info.value.problems)
    assert len(info.value.problems) < MAX_CELLS + 10


def test_many_unknown_keys_are_summarised() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(GOOD + "probe: {" + ",".join(f"k{i}: 1" for i in range(5000)) + "}\n", "keys.yaml")
    assert [p.path for p in info.value.problems] == ["probe"] and "5,000 keys" in info.value.problems[0].reason


def test_a_huge_file_is_refused_unread(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text(GOOD + "#" + "x" * MAX_CONFIG_BYTES + "\n")
    with pytest.raises(ConfigError) as info:
        load_config(big)
    assert "larger than" in str(info.value) and str(big) in str(info.value)
