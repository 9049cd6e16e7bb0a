"""The overhead bench's per-slice ratios, A/A band and CPU-budget verdicts (pure)."""

import json

import pytest

from dlb.bench import overhead_stats as s


def _slices(*cpu_ms: float, p50: float = 1.0) -> list[s.SliceSample]:
    return [s.SliceSample(cpu_s=c / 1000 * 100, requests=100, p50_ms=p50) for c in cpu_ms]


def test_ratio_is_per_slice_then_median():
    # The box slows down 3x in slice 2; the config still costs 1.2x the floor in every slice.
    r = s.ratio(_slices(0.12, 0.36, 0.12), _slices(0.10, 0.30, 0.10), "cpu_ms_per_req")
    assert r.median == pytest.approx(1.2)
    assert r.per_slice == pytest.approx((1.2, 1.2, 1.2))


def test_ratio_refuses_unpaired_slices():
    with pytest.raises(ValueError, match="2 slices of the configuration but 1 of the floor"):
        s.ratio(_slices(1, 2), _slices(1), "cpu_ms_per_req")


def test_noise_band_is_how_far_the_aa_median_can_reach_and_narrows_with_slices():
    aa = s.ratio(_slices(0.98, 1.04, 1.0), _slices(1.0, 1.0, 1.0), "cpu_ms_per_req")
    assert s.noise_band(aa) == pytest.approx(0.04)  # three slices: the median can land on any of them
    many = s.ratio(_slices(*([0.98, 1.04, 1.0, 0.99, 1.01] * 8)), _slices(*([1.0] * 40)), "cpu_ms_per_req")
    assert s.noise_band(many) <= 0.011
    assert s.noise_band(s.Ratio(float("nan"), ())) != s.noise_band(s.Ratio(float("nan"), ()))  # NaN: no slices, no band


def test_budget_verdicts_fail_over_budget_and_skip_configs_not_run():
    ratios = {"root": s.Ratio(1.3, (1.3,)), s.FLOOR: s.Ratio(1.0, (1.0,))}
    vs = {v.config: v for v in s.budget_verdicts({"root": 1.2, s.FLOOR: 0.9, "root+leaf": 3.0}, ratios, 0.02)}
    assert vs["root"].holds is False and vs[s.FLOOR].holds is False  # the floor's own ratio is 1 > 0.9
    assert "root+leaf" not in vs
    assert "root: CPU per request <= 1.2 x root-bare-h2's" in vs["root"].rule(s.FLOOR, "x86_64-2cpu")
    assert s.budget_verdicts({"root": 1.4}, ratios, 0.02)[0].holds is True


def test_load_budgets_by_kind_and_bad_files_name_the_field(tmp_path):
    p = tmp_path / "b.json"
    p.write_text(json.dumps({"x86_64-2cpu": {"floor": s.FLOOR, "budgets": {"root": 1.5}}}))
    assert s.load_budgets(p, "x86_64-2cpu") == {"root": 1.5}
    assert s.load_budgets(p, "aarch64-8cpu") is None
    p.write_text(json.dumps({"x86_64-2cpu": {"floor": s.FLOOR, "budgets": {"root": "fast"}}}))
    with pytest.raises(ValueError, match=r"x86_64-2cpu.budgets.root: expected a positive number"):
        s.load_budgets(p, "x86_64-2cpu")
    p.write_text("{")
    with pytest.raises(ValueError, match="not JSON"):
        s.load_budgets(p, "x86_64-2cpu")


def test_committed_budgets_file_loads():
    assert s.load_budgets(s.BUDGETS_FILE, "x86_64-2cpu")


def test_root_hop_figures_are_per_slice_against_the_floor_with_an_interval_of_the_median():
    """added p50 = (p50 − plain's) ÷ (floor's − plain's) in the same open-loop slice; closed rps = requests ÷
    the floor's in the same closed-loop slice; a slice whose floor adds nothing is left out."""
    from dlb.bench.overhead import root_hop_figures

    def rec(config: str, mode: str, p50: list[float], requests: list[int]) -> dict:
        return {"config": config, "mode": mode,
                "slices": [{"cpu_s": 1.0, "requests": n, "p50_ms": p} for p, n in zip(p50, requests, strict=True)]}

    records = [rec("plain", "closed", [1] * 5, [300] * 5), rec(s.FLOOR, "closed", [2] * 5, [200, 200, 100, 200, 100]),
               rec("root", "closed", [2] * 5, [190, 180, 100, 210, 100]),
               rec("plain", "open", [1.0] * 5, [50] * 5), rec(s.FLOOR, "open", [2.0, 3.0, 1.0, 1.5, 2.0], [50] * 5),
               rec("root", "open", [2.2, 3.4, 9.0, 1.6, 2.2], [50] * 5)]
    fig = root_hop_figures(records)["root"]
    assert fig["closed_rps"]["per_slice"] == [0.95, 0.9, 1.0, 1.05, 1.0]
    assert fig["closed_rps"]["median"] == pytest.approx(1.0)
    assert fig["added_p50"]["per_slice"] == pytest.approx([1.2] * 4)  # the third slice: the floor added nothing
    lo, hi = fig["added_p50"]["ci95"]
    assert lo <= fig["added_p50"]["median"] <= hi
    assert records[-1]["added_p50_vs_floor"] == fig["added_p50"] and records[2]["rps_vs_floor"] == fig["closed_rps"]
    assert "root" not in root_hop_figures([r for r in records if r["config"] != s.FLOOR])
    # Three slices are too few for an interval (a bootstrap of them would look resolved).
    three = [dict(r, slices=r["slices"][:3]) for r in records]
    assert root_hop_figures(three)["root"]["closed_rps"]["ci95"] is None
