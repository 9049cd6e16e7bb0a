"""``dlb demo --no-live`` end to end: the whole stack from one command, and nothing left behind.

Here: the tests that run in-process (no sockets, no processes); the others: ``tests/e2e/test_demo.py``.

Runs the real CLI in a subprocess (emulators, control plane, leaf/root Envoys over xDS, leaf agents,
root services, the load generator), then reads the report it wrote. Rules (issue 10):
- >= 99 % of requests succeed through every tier, and every cell serves traffic;
- the degraded cell's share falls during the degradation and comes back after it (the verdict rule is
  written in dlb/testbed/report.py and stored in results.json);
- no process of the run is left once the command ends — normally, after SIGINT mid-run, and after
  the supervisor is SIGKILLed (processes are found by the DLB_SUPERVISED_RUN marker in /proc).
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
