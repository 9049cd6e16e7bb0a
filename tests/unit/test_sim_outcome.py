"""Evaluation that cannot be flattered: failed and shed requests count at the request timeout, old
records still load, and every table shows the error rate beside the latency."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from dlb.cli import main
from dlb.core.router import SHED
from dlb.sim import engine
from dlb.sim.engine import SimConfig, simulate
from dlb.sim.experiments import EXPERIMENTS, Job, normalise, run_job
from dlb.sim.outcome import DEFAULT_REQUEST_TIMEOUT_S, complete, with_failures
from dlb.sim.policies import POLICIES
from dlb.sim.report import check_one_build, markdown_table, reproduction_report
from dlb.sim.scenario import Workload, generate


def test_failing_a_request_never_beats_serving_it_at_the_timeout() -> None:
    rng = np.random.default_rng(3)
    lat = rng.gamma(2.0, 1.5, 500)
    lat[:5] = 90.0  # served, but slower than the timeout: a client stopped waiting
    t = 60.0
    for k in (0, 1, 50, 499):
        slowest = np.argsort(lat)[::-1][:k]  # a policy that drops its slowest requests
        kept = np.delete(lat, slowest)
        mean_f, p90_f = with_failures(kept, k, t)
        at_timeout = np.where(np.isin(np.arange(lat.size), slowest), t, lat)
        mean_t, p90_t = with_failures(at_timeout, 0, t)
        assert mean_f == pytest.approx(mean_t) and p90_f == pytest.approx(p90_t)
        # ... and serving them at their own latency is never worse (it is capped at the timeout).
        assert with_failures(lat, 0, t)[0] <= mean_f + 1e-12
        assert mean_f >= float(np.minimum(kept, t).mean()) - 1e-12  # the success-only mean flatters
    assert with_failures(np.zeros(0), 0, t) == (pytest.approx(math.nan, nan_ok=True),) * 2
    with pytest.raises(ValueError):
        with_failures(lat, 0, 0.0)


def test_overflow_errors_count_at_the_timeout_in_a_run() -> None:
    """A run that fails requests (a queue of one, 120 % load): its failure-counting mean is exactly the
    mean with those requests served at the timeout, and above the success-only mean."""
    sc = generate(11, utilization=1.2, duration_s=15.0, workload=Workload(queue_limit=1))
    res = simulate(sc, "Rand", 0, SimConfig(request_timeout_s=30.0))
    s = res.summary()
    assert res.errors > 0 and res.overflow == res.errors and res.shed == 0
    failed = res.arrivals - res.latency.size
    everyone = np.concatenate([np.minimum(res.latency, 30.0), np.full(failed, 30.0)])
    assert s["mean_latency_with_failures"] == pytest.approx(float(everyone.mean()))
    assert s["mean_latency_with_failures"] > s["mean"]
    assert s["overflow_rate"] == pytest.approx(res.overflow / res.arrivals) and s["shed_rate"] == 0.0
    assert s["request_timeout_s"] == 30.0 and s["server_model"] == "pipeline"


def test_a_root_that_sheds_is_counted_apart_from_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wiring a shedding root will use: :data:`SHED` from ``pick`` is a shed, not an error."""
    real = engine.build_roots

    def shedding(*args, **kwargs):  # every third request refused on purpose
        roots = real(*args, **kwargs)
        for root in roots:
            pick, calls = root.pick, [0]

            def pick_or_shed(now: float, _pick=pick, _calls=calls) -> int:
                _calls[0] += 1
                return SHED if _calls[0] % 3 == 0 else _pick(now)

            root.pick = pick_or_shed
        return roots

    monkeypatch.setattr(engine, "build_roots", shedding)
    sc = generate(3, duration_s=10.0)
    res = simulate(sc, "Disc-RIF", 0)
    s = res.summary()
    assert res.shed > 0 and s["shed_rate"] == pytest.approx(res.shed / res.arrivals)
    assert s["error_rate"] == pytest.approx(res.errors / res.arrivals) and res.errors < res.shed
    assert s["mean_latency_with_failures"] >= (res.shed / res.arrivals) * DEFAULT_REQUEST_TIMEOUT_S


def test_records_carry_the_new_fields_and_the_server_model() -> None:
    var = next(v for v in EXPERIMENTS["baseline"])
    rec = run_job(Job("baseline", var, 3, 0, "Rand", 10.0, server_model="batched", request_timeout_s=45.0))
    for f in ("mean", "p90", "error_rate", "mean_latency_with_failures", "p90_latency_with_failures", "shed_rate",
              "overflow_rate", "refused_rate", "timed_out_rate", "cancelled_rate", "client_failure_rate"):
        assert f in rec and math.isfinite(rec[f]), f
    assert rec["server_model"] == "batched" and rec["request_timeout_s"] == 45.0
    assert rec["timeouts"] == "cancel" and rec["cancelled"] == 0
    # A variant that chooses its own server model keeps it.
    pipe = next(v for v in EXPERIMENTS["server-model"] if v.label == "pipeline")
    assert Job("server-model", pipe, 3, 0, "Rand", 10.0, server_model="batched").effective_server_model() == "pipeline"


def _old(policy: str, mean: float, err: float) -> dict:
    """A record as results files held it before the failure-counting fields."""
    return {"experiment": "baseline", "variant": "util=0.8", "x": 0.8, "policy": policy, "scenario": 1, "trial": 0,
            "duration_s": 600.0, "mean": mean, "p50": mean, "p90": 2 * mean, "p99": 3 * mean, "error_rate": err,
            "arrivals": 1000, "errors": int(err * 1000), "in_flight": 0}


def test_old_records_load_with_what_can_be_derived() -> None:
    recs = normalise([_old(p, 2.0 if p == "Rand" else 1.5, 0.01 if p == "Flow-Grad" else 0.0) for p in POLICIES])
    fg = next(r for r in recs if r["policy"] == "Flow-Grad")
    assert fg["mean_latency_with_failures"] == pytest.approx(0.99 * 1.5 + 0.01 * DEFAULT_REQUEST_TIMEOUT_S)
    assert math.isnan(fg["p90_latency_with_failures"]) and math.isnan(fg["shed_rate"])  # not settled: n/a
    dr = next(r for r in recs if r["policy"] == "Disc-RIF")
    assert dr["p90_latency_with_failures"] == 3.0 and dr["norm_mean"] == pytest.approx(0.75)
    # The failure-counting mean is what is normalised: 1 % errors at 60 s undo Flow-Grad's lead.
    assert fg["norm_mean_served"] == pytest.approx(0.75) and fg["norm_mean"] > 1.0
    assert complete(dict(fg)) == fg  # completing twice changes nothing
    md = markdown_table(recs)
    assert "n/a" in md and "predate these fields" in md
    check_one_build(recs)


def test_report_shows_error_beside_latency() -> None:
    recs = normalise([dict(_old(p, 2.0 if p == "Rand" else 1.7, 0.02 if p == "Flow-Lat" else 0.0),
                           mean_latency_with_failures=2.0, p90_latency_with_failures=4.0, shed_rate=0.0,
                           timed_out_rate=0.01 if p == "Disc-RIF" else 0.0)
                      for p in POLICIES])
    md = markdown_table(recs)
    header = next(line for line in md.splitlines() if line.startswith("| policy"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    assert cols[1:7] == ["norm mean", "÷ best operator", "error rate", "shed rate", "timed out", "client-visible failures"]
    assert "| Flow-Lat | 1.000 ± 0.000 | 1.000 | 2.00% | 0.00% |" in md
    rep = reproduction_report(recs, "results.json", None)
    assert "request timeout (60 s)" in rep
    baseline = next(line for line in rep.splitlines() if line.startswith("| DLB policies ~20 %"))
    assert "Flow-Lat 1.000 (err 2.00%)" in baseline
    # Records from before the field get the client-visible failures derived (errors + shed + timed out).
    assert "Disc-RIF 1.000 (err 0.00%, timed out 1.00%, client-visible 1.00%)" in baseline
    assert all(r["timeouts"] == "serve" and r["cancelled_rate"] == 0.0 for r in recs)


def test_report_refuses_mixed_timeouts() -> None:
    recs = normalise([_old(p, 1.0, 0.0) for p in POLICIES])
    with pytest.raises(ValueError, match="request timeouts"):
        check_one_build(recs + [dict(recs[0], request_timeout_s=30.0)])
    with pytest.raises(ValueError, match="mix --timeouts cancel, serve"):
        check_one_build(recs + [dict(recs[0], timeouts="cancel")])


def _run(policy: str, model: str, scenario: int, lat: float, err: float = 0.0) -> dict:
    return dict(_old(policy, lat, err), scenario=scenario, server_model=model, mean_latency_with_failures=lat,
                p90_latency_with_failures=2 * lat, shed_rate=0.0, timed_out_rate=0.0)


def test_report_divides_by_the_best_operator_baseline_and_splits_server_models() -> None:
    """"÷ best operator" divides by the operator baseline with the lowest norm mean, run by run; runs of
    both server models are reported side by side, each against its own Rand and operators."""
    lat = {"Rand": 2.0, "lr-global": 1.6, "locality-failover": 1.8, "hub-score": 1.9, "Flow-Grad": 1.2}
    recs = []
    for model, k in (("batched", 1.0), ("pipeline", 0.5)):
        for sc in (1, 2):
            recs += [_run(p, model, sc, v * k * sc, 0.03 if p == "Flow-Grad" and model == "pipeline" else 0.0)
                     for p, v in lat.items()]
            recs.append(_run("Disc-RIF", model, sc, 1.5 * k * sc))
    check_one_build(recs)  # two server models are two reports' worth, not a mix to refuse
    recs = normalise(recs)
    md = markdown_table(recs)
    assert "## baseline — util=0.8 — batched server (2 runs per policy; best operator baseline: lr-global)" in md
    assert "## baseline — util=0.8 — pipeline server (2 runs per policy; best operator baseline: lr-global)" in md
    assert md.index("batched server") < md.index("pipeline server")
    assert "| Flow-Grad | 0.600 ± 0.000 | 0.750 | 0.00% |" in md  # 1.2 / 1.6, and ÷ Rand 1.2 / 2.0
    assert "| Flow-Grad | 0.600 ± 0.000 | 0.750 | 3.00% |" in md  # the pipeline runs: their own errors
    assert "| lr-global | 0.800 ± 0.000 | 1.000 |" in md
    rep = reproduction_report(recs, "results.json", None)
    assert "## Claims (docs/design.md §4) — batched server" in rep and "## Claims (docs/design.md §4) — pipeline server" in rep
    row = next(line for line in rep.splitlines() if line.startswith("| baseline — util=0.8 |"))
    assert "lr-global 0.800 (err 0.00%)" in row and "Flow-Grad 0.600 (err 0.00%) | 0.750 |" in row


def test_cli_checks_server_model_and_timeout(tmp_path) -> None:
    with pytest.raises(SystemExit):
        main(["sim", "--server-model", "neither", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="--request-timeout"):
        main(["sim", "--request-timeout", "0", "--out", str(tmp_path)])


def test_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError):
        replace(SimConfig(), request_timeout_s=0.0)
