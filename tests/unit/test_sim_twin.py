"""``dlb bench sim-twin``: the simulator's twin of each ``dlb demo --compare`` scenario sends the real run's
requests, applies its fault in the same window and keeps the demo's residency; the comparison puts each
world's mean over its own best operator baseline."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dlb.bench.sim_twin import RealRun, read_real, scenario_twin, twin_rows
from dlb.load.workload import generate, with_phases
from dlb.testbed.fleet import DEFAULT_FLEET
from dlb.testbed.scenarios import SCENARIOS, plan_workload


def test_the_twin_sends_the_real_runs_requests() -> None:
    sc, (t, src, ptok, dtok) = scenario_twin("burst", 15, 45.0)
    spec, phases, _ = plan_workload(DEFAULT_FLEET, SCENARIOS["burst"], 45.0, 15, 0.75)
    reqs = with_phases(generate(spec), phases)
    assert len(t) == len(reqs) and np.all(np.diff(t) >= 0)
    assert [int(p) for p in ptok[:20]] == [r.prompt_tokens for r in reqs[:20]]
    assert [int(d) for d in dtok[:20]] == [r.max_tokens for r in reqs[:20]]
    assert [sc.names[i] for i in src[:20]] == [r.source for r in reqs[:20]]
    start, length, _ = SCENARIOS["burst"].phase_window(45.0)
    inside = ((t >= start) & (t < start + length)).sum() / length
    before = (t < start).sum() / start
    assert inside > 1.6 * before  # twice the rate during the burst (Poisson noise aside)
    assert sc.workload.server_model == "batched" and sc.workload.max_batch == DEFAULT_FLEET.max_batch


def test_the_twin_takes_every_server_of_the_degraded_cell_down_in_the_real_window() -> None:
    sc, _ = scenario_twin("cell-outage", 14, 45.0)
    d = sc.disruption
    j = sc.names.index(DEFAULT_FLEET.degrade_cell)
    assert d is not None and d.kind == "outage" and (d.start_s, d.end_s) == SCENARIOS["cell-outage"].fault_window(45.0)
    assert d.outage_servers[j] == 0 and all(k == s for i, (k, s) in enumerate(zip(d.outage_servers, sc.servers, strict=True)) if i != j)
    slow, _ = scenario_twin("slow-cell", 13, 45.0)
    assert slow.disruption is not None and (slow.disruption.kind, slow.disruption.factor) == ("slow", DEFAULT_FLEET.degrade_slowdown)
    eu = sc.names.index("europe-west4")
    assert [sc.names[k] for k in np.flatnonzero(sc.allowed[eu])] == ["europe-west4", "europe-west1"]
    assert sc.allowed[sc.names.index("us-east1")].all()


def test_each_world_is_divided_by_its_own_best_operator() -> None:
    runs = [RealRun("steady", p, 0, 11, 20.0, mean_s=m) for p, m in (("hub-score", 4.0), ("lr-global", 8.0), ("Disc-Lat", 5.0))]
    rows = {r["policy"]: r for r in twin_rows(runs)}
    assert rows["hub-score"]["real_vs_best_operator"] == 1.0 and rows["Disc-Lat"]["real_vs_best_operator"] == 1.25
    sim_best = min(rows[p]["sim_mean_s"] for p in ("hub-score", "lr-global"))
    assert rows["Disc-Lat"]["sim_vs_best_operator"] == pytest.approx(rows["Disc-Lat"]["sim_mean_s"] / sim_best)
    assert all(r["sim_failed"] < 0.05 for r in rows.values())


def test_a_real_file_with_a_scenario_without_twin_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "records.jsonl"
    f.write_text(json.dumps({"scenario": "tsunami", "policy": "Rand", "trial": 0, "seed": 1, "duration_s": 30, "mean_s": 1.0}) + "\n")
    with pytest.raises(ValueError, match="tsunami"):
        read_real(f)


@pytest.mark.parametrize("line, needle", [
    ('{"policy": "Rand", "mean_s": 1.0}', "record 1: missing scenario"),
    ('[1, 2]', "record 1: not an object"),
    ('{"scenario": "steady", "policy": "Rand", "mean_s": 1.0, "trial": "x"}', "record 1: invalid literal"),
    ('{"scenario": ', "not JSON"),
])
def test_a_real_file_with_a_broken_record_names_the_record(tmp_path: Path, line: str, needle: str) -> None:
    """A record without ``scenario`` read as the bare key ``'scenario'``."""
    f = tmp_path / "records.jsonl"
    f.write_text(line + "\n")
    with pytest.raises(ValueError, match=needle):
        read_real(f)


def test_the_twins_leaves_fit_on_the_demo_leaves_window(tmp_path: Path) -> None:
    """The twin's estimator window and refit period are the ones the demo writes into its leaves' config
    (the simulator's default 30 s / 10 s moved the twin's models on another time scale)."""
    from dlb.bench.sim_twin import twin_config
    from dlb.cli import build_parser
    from dlb.config import load_config
    from dlb.testbed.demo import prepare

    _, _, path = prepare(build_parser().parse_args(["demo", "--out", str(tmp_path)]), tmp_path)
    fit = load_config(path).policy.leaf.fit
    est = twin_config().estimator
    assert (est.window_s, est.refit_period_s) == (fit.window_s, fit.refit_period_s) == (10.0, 1.0)


def test_the_twins_leaves_and_roots_judge_by_the_demo_endpoints_timeout(tmp_path: Path) -> None:
    """Admission and deadline shedding compare with the endpoints' timeout_s the demo's leaves and roots get
    (600 s), not the clients' 60 s: the twin refused 5 % of the burst's requests that the real leaves served."""
    from dlb.bench.sim_twin import twin_config
    from dlb.cli import build_parser
    from dlb.config import load_config
    from dlb.config.model import leaf_deadline_s
    from dlb.testbed.demo import prepare
    from dlb.testbed.scenarios import REQUEST_TIMEOUT_S

    _, _, path = prepare(build_parser().parse_args(["demo", "--out", str(tmp_path)]), tmp_path)
    cfg = twin_config()
    assert cfg.service_deadline_s == leaf_deadline_s(load_config(path).endpoints) == 600.0
    assert cfg.request_timeout_s == REQUEST_TIMEOUT_S == 60.0
