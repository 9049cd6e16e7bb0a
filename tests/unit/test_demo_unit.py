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
