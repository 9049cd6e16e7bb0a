"""Client timeouts in the simulator: a request unanswered at arrival + timeout is cancelled wherever it
is (``timeouts="cancel"``, the real path: the root's route timeout, a reset stream, the server's
abort), and ``timeouts="serve"`` keeps the simulator's older behaviour bit for bit."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

import dlb.sim.engine as sim_engine
from dlb.sim.engine import RunResult, SimConfig, simulate
from dlb.sim.scenario import Scenario, generate
from tests.unit.test_sim_engine import batched_scenario, mmc_scenario


def _overloaded(model: str) -> tuple[Scenario, float]:
    """One server at ~1.4-1.5x its rate for a minute, and a timeout a fraction of the backlog."""
    return (mmc_scenario(12.0, 60.0), 5.0) if model == "pipeline" else (batched_scenario(45.0, 60.0), 10.0)


@pytest.mark.parametrize("model", ["pipeline", "batched"])
def test_an_overloaded_server_cancels_at_the_deadline_and_serves_more_in_time(model: str) -> None:
    """Cancelled requests leave the server at their deadline, so it spends its time on requests whose
    clients still wait: far more answers arrive within the timeout than when dead requests keep their place."""
    sc, t = _overloaded(model)
    cancel = simulate(sc, "Rand", 0, SimConfig(request_timeout_s=t))
    serve = simulate(sc, "Rand", 0, SimConfig(request_timeout_s=t, timeouts="serve"))
    assert cancel.cancelled > 0 and serve.cancelled == 0
    assert cancel.latency.max() <= t  # nothing is answered after its client left
    assert serve.latency.max() > 2 * t  # ...which the old behaviour did
    in_time = [int(np.count_nonzero(r.latency <= t)) for r in (cancel, serve)]
    assert in_time[0] > 1.5 * in_time[1]
    assert cancel.completed + cancel.errors + cancel.shed + cancel.cancelled + cancel.in_flight == cancel.arrivals
    assert cancel.in_flight == 0 and cancel.rif_end.tolist() == [0]
    s = cancel.summary()
    assert s["timed_out_rate"] == s["cancelled_rate"] == pytest.approx(cancel.cancelled / cancel.arrivals)
    assert s["client_failure_rate"] == pytest.approx(s["error_rate"] + s["shed_rate"] + s["timed_out_rate"])
    # Every cancelled request counts at the timeout in the failure-counting mean.
    assert s["mean_latency_with_failures"] == pytest.approx(
        (cancel.latency.sum() + (cancel.arrivals - cancel.latency.size) * t) / cancel.arrivals)


def _fleet(model: str) -> Scenario:
    return generate(11, utilization=1.3, duration_s=30.0, server_model=model)


#: Digests of runs made by the simulator before it could cancel (a71bdb9), with ``timeouts`` absent:
#: ``serve`` must reproduce them. No policy here fits a latency model (no BLAS-dependent bits).
BEFORE = {
    "pipeline-overload/Rand": ("75ff4d08a41f048c", "73c9d7f1a829f4e8", 749, 749, 0, 0, 12031, 631),
    "batched-overload/Rand": ("c9ae06a08798102c", "a6f858804f580e80", 2709, 2386, 323, 0, 14520, 1765),
    "fleet-pipeline/lr-global": ("453b2651a2fc5a1d", "11a53b0f7f809b91", 5399, 3885, 1514, 0, 27858, 547),
    "fleet-batched/Disc-RIF": ("9fbb553e55032037", "bad5594a0e0653fd", 5599, 5598, 1, 0, 22054, 5475),
    "fleet-batched/Disc-RIF-native": ("92802405d0bb8805", "785b402d86ede96a", 5599, 5592, 7, 0, 28124, 5412),
}


def _case(name: str) -> tuple[Scenario, str, float]:
    where, policy = name.split("/")
    if where.endswith("overload"):
        sc, _t = _overloaded(where.split("-")[0])
        return sc, policy, 5.0 if where.startswith("pipeline") else 10.0
    return _fleet(where.split("-")[1]), policy, 5.0


def _digest(r: RunResult) -> tuple:
    s = r.summary()
    return (hashlib.sha256(np.ascontiguousarray(r.latency, np.float64).tobytes()).hexdigest()[:16],
            hashlib.sha256(np.ascontiguousarray(r.routed, np.int64).tobytes()).hexdigest()[:16],
            s["arrivals"], s["completed"], s["errors"], s["shed"], s["events"], round(s["timed_out_rate"] * s["arrivals"]))


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_serve_reproduces_the_runs_from_before_cancellation(name: str) -> None:
    sc, policy, t = _case(name)
    res = simulate(sc, policy, 0, SimConfig(request_timeout_s=t, timeouts="serve", admission=False,
                                                  cross_cell_retry=False))  # as before it
    assert _digest(res) == BEFORE[name]
    assert res.cancelled == 0 and res.summary()["timeouts"] == "serve"


@pytest.mark.parametrize("policy", ["lr-global", "Disc-RIF-native", "Disc-RIF"])
def test_rif_at_leaves_and_roots_returns_to_zero_after_an_overload_that_timed_out(
        policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An overloaded fleet's backlog ends at the last deadline: the leaves released every cancelled
    request, and the roots that count their own requests (Envoy's active requests) saw each end with
    the 504, while the same run serving its dead requests is still busy long after."""
    roots: list = []
    real = sim_engine.build_roots

    def keep(*args, **kwargs):  # the simulator's own root objects, kept to read their counts after the run
        built = real(*args, **kwargs)
        roots.extend(built)
        return built

    monkeypatch.setattr(sim_engine, "build_roots", keep)
    sc = _fleet("batched")
    cfg = SimConfig(request_timeout_s=5.0, drain_s=8.0, admission=False)  # admission would refuse the backlog
    res = simulate(sc, policy, 0, cfg)
    assert res.cancelled > 0 and res.in_flight == 0
    assert res.rif_end.tolist() == [0] * sc.n
    for root in roots:
        if policy == "lr-global":
            assert sum(root.active) == 0
        elif policy == "Disc-RIF-native":
            assert float(np.sum(root.active)) == 0.0
    busy = simulate(sc, policy, 0, SimConfig(request_timeout_s=5.0, drain_s=8.0, timeouts="serve", admission=False))
    assert busy.in_flight > 0 and busy.rif_end.sum() > 0


def test_timeouts_mode_is_checked() -> None:
    with pytest.raises(ValueError, match="timeouts must be one of cancel, serve"):
        SimConfig(timeouts="drop")
