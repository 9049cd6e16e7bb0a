"""What DLB says picks a cell's server must be what does: the policy's rule only where the cell has a leaf
ext_proc; elsewhere the leaf Envoy's LEAST_REQUEST (config summary and ``dlb_leaf_pick_rule``). A stranger
read "leaf pick prequal" and ``rule="prequal"`` on a fleet whose leaves had no ext_proc at all."""

from __future__ import annotations

import copy

from test_config import minimal

from dlb.config import config_from_dict
from dlb.config.cli import summary
from dlb.ext_proc.leaf import ENVOY_PICKS, LeafAgent
from dlb.ext_proc.leaf_setup import state_from_config


def test_the_summary_names_the_cells_whose_leaf_runs_the_rule() -> None:
    raw = minimal()
    assert "leaf pick prequal (choices 2) in no cell (none sets leaf.ext_proc" in summary(config_from_dict(copy.deepcopy(raw)))
    raw["cells"][0]["leaf"]["ext_proc"] = "127.0.0.1:9011"
    assert "leaf pick prequal (choices 2) in a (leaf.ext_proc), elsewhere the leaf Envoy's LEAST_REQUEST" in summary(config_from_dict(copy.deepcopy(raw)))
    raw["cells"][1]["leaf"]["ext_proc"] = "127.0.0.1:9021"
    assert "leaf pick prequal (choices 2)" in summary(config_from_dict(raw))


def _rules(agent: LeafAgent) -> dict[str, float]:
    fam = next(f for f in agent.collect() if f.name == "dlb_leaf_pick_rule")
    return {s.labels["rule"]: s.value for s in fam.samples}


def test_the_pick_rule_metric_says_envoy_picks_without_a_leaf_ext_proc() -> None:
    cfg = config_from_dict(minimal())
    agent = LeafAgent(state_from_config(cfg, "b", 2, 0, 5.0, 60.0, pick_rule="prequal"))
    assert _rules(agent) == {"prequal": 1.0, "rif": 0.0, ENVOY_PICKS: 0.0}
    agent.envoy_picks = True
    assert _rules(agent) == {"prequal": 0.0, "rif": 0.0, ENVOY_PICKS: 1.0}
