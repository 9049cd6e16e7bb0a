"""The discrete-event simulator: queueing theory, conservation, determinism, every policy."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from dlb.sim.engine import SimConfig, generate_arrivals, simulate
from dlb.sim.policies import ALL_POLICIES
from dlb.sim.scenario import Disruption, Scenario, Workload, generate


def erlang_c_wait(c: int, lam: float, mu: float) -> float:
    """Mean sojourn time of M/M/c (Erlang C): P(wait)/(cμ − λ) + 1/μ."""
    a = lam / mu
    rho = a / c
    top = a**c / math.factorial(c) / (1 - rho)
    p_wait = top / (sum(a**k / math.factorial(k) for k in range(c)) + top)
    return p_wait / (c * mu - lam) + 1 / mu


def mmc_scenario(lam: float, duration: float, servers: int = 1) -> Scenario:
    """One cell, 8 slots per server, exponential decode (mean 1 s), negligible prefill, no overflow."""
    w = Workload(prefill_shift=0.0, prefill_shape=1.0, prefill_scale=1e-6, decode_shift=0.0, decode_shape=1.0,
                 decode_scale=100.0, prefill_token_s=1e-9, decode_token_s=0.01, queue_limit=10**9)
    return Scenario(seed=7, names=("only",), tau=np.array([[0.0002]]), servers=(servers,),
                    prefill_token_s=np.array([1e-9]), decode_token_s=np.array([0.01]), demand=np.array([lam]),
                    workload=w, utilization=0.75, duration_s=duration, mod_amp=0.0,
                    mod_period_s=np.array([100.0]), mod_phase=np.array([0.0]))


@pytest.mark.parametrize("lam", [4.0, 6.0])
def test_single_cell_matches_erlang_c_and_littles_law(lam: float) -> None:
    sc = mmc_scenario(lam, duration=2000.0)
    res = simulate(sc, "Rand", 0)
    assert res.errors == 0 and res.in_flight == 0 and res.completed == res.arrivals
    serving = res.latency - 2 * 0.0002
    want = erlang_c_wait(8, lam, 1.0)
    # 8k–12k requests at ρ ≤ 0.75: the standard error of the mean sojourn is ~1–2 % (ρ = 0.9 needs far longer runs).
    assert serving.mean() == pytest.approx(want, rel=0.05)
    # Little's law: time-average RIF = throughput × mean time in system.
    lam_obs = res.arrivals / sc.duration_s
    assert res.mean_rif[0] == pytest.approx(lam_obs * serving.mean(), rel=0.05)


def test_conservation_with_overflow_and_cut_drain() -> None:
    sc = generate(11, utilization=1.1, duration_s=15.0)
    sc = replace(sc, workload=replace(sc.workload, queue_limit=2))
    for policy in ("Rand", "Disc-RIF", "Flow-Lat"):
        res = simulate(sc, policy, 0)
        assert res.errors > 0
        assert res.completed + res.errors + res.shed + res.in_flight == res.arrivals
        assert res.in_flight == 0 and res.latency.size == res.completed
        cut = simulate(sc, policy, 0, SimConfig(drain_s=0.0))
        assert cut.in_flight > 0
        assert cut.completed + cut.errors + cut.shed + cut.in_flight == cut.arrivals


def test_deterministic_for_a_seed() -> None:
    sc = generate(5, duration_s=12.0)
    a = simulate(sc, "Disc-Grad", 0)
    b = simulate(sc, "Disc-Grad", 0)
    np.testing.assert_array_equal(a.latency, b.latency)
    assert a.events == b.events and a.errors == b.errors
    c = simulate(sc, "Disc-Grad", 1)
    assert c.arrivals != a.arrivals or not np.array_equal(c.latency, a.latency)


def test_common_random_numbers_across_policies() -> None:
    sc = generate(5, duration_s=10.0)
    t1, _s1, _p1, d1 = generate_arrivals(sc, 0)
    t2, _s2, _p2, d2 = generate_arrivals(sc, 0)
    np.testing.assert_array_equal(t1, t2)
    np.testing.assert_array_equal(d1, d2)
    assert simulate(sc, "Rand").arrivals == simulate(sc, "Flow-Grad").arrivals == t1.size


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_each_policy_on_a_tiny_scenario(policy: str) -> None:
    sc = generate(3, duration_s=20.0)
    res = simulate(sc, policy, 0)
    s = res.summary()
    assert res.arrivals > 100
    assert res.completed + res.errors == res.arrivals
    assert s["error_rate"] < 0.05
    # Serving latency is ≥ the unloaded latency of the fastest cell's short requests and finite.
    assert 0.1 < s["mean"] < 20.0 and s["p50"] <= s["p90"] <= s["p99"]
    assert res.per_cell_served.sum() == res.completed


def test_unknown_policy_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown policy 'Nope'"):
        simulate(generate(1, duration_s=5.0), "Nope")


def test_noise_moves_latency_policies_only() -> None:
    clean = generate(4, duration_s=15.0)
    noisy = generate(4, duration_s=15.0, noise_eps=0.5)
    for policy in ("Disc-RIF", "Rand"):
        np.testing.assert_array_equal(simulate(clean, policy).latency, simulate(noisy, policy).latency)
    assert not np.array_equal(simulate(clean, "Disc-Lat").latency, simulate(noisy, "Disc-Lat").latency)


def test_outage_reduces_traffic_to_the_hit_cells() -> None:
    base = generate(2, duration_s=60.0)
    out = generate(2, duration_s=60.0, disruption="outage")
    d = out.disruption
    assert d is not None and d.kind == "outage"
    hit = [j for j in range(out.n) if d.outage_servers[j] < out.servers[j]]
    assert hit, "the outage cuts at least one cell"
    assert out.demand.sum() / out.capacity(d.outage_servers).sum() > 0.95
    a = simulate(base, "Disc-RIF")
    b = simulate(out, "Disc-RIF")
    assert b.per_cell_served[hit].sum() < a.per_cell_served[hit].sum()


@pytest.mark.parametrize("policy", ["Rand", "Disc-RIF", "locality-failover"])
def test_a_cell_with_every_server_down_fails_what_reaches_it_and_recovers(policy: str) -> None:
    """An outage down to 0 servers (``dlb demo --compare``'s cell-outage): requests that reach the cell fail
    (its leaf Envoy has no host), a probing policy stops sending there, and the cell serves again after."""
    base = generate(2, duration_s=60.0)
    k = list(base.servers)
    k[0] = 0
    sc = replace(base, disruption=Disruption("outage", 20.0, 35.0, outage_servers=tuple(k)))
    r = simulate(sc, policy)
    assert ((r.routed == 0) & (r.arrival_t > 40.0)).sum() > 0  # back in use once its servers are
    if policy == "Rand":
        assert r.summary()["error_rate"] > 0.01
    elif policy == "Disc-RIF":
        assert r.summary()["error_rate"] < 0.01


def test_burst_adds_demand_in_its_window() -> None:
    sc = generate(2, duration_s=100.0, disruption="burst")
    d = sc.disruption
    assert d is not None and d.burst_extra > 0
    t, s, _p, _d = generate_arrivals(sc, 0)
    inside = ((t >= d.start_s) & (t < d.end_s) & (s == d.burst_cell)).sum() / (d.end_s - d.start_s)
    outside = ((t < d.start_s) & (s == d.burst_cell)).sum() / d.start_s
    assert inside - outside == pytest.approx(d.burst_extra, rel=0.2)


# -- the batched server model: the emulator's engine inside the simulator ------------------------------


def batched_scenario(lam: float, duration: float) -> Scenario:
    """One cell of one batched server, 2 ms network, the workload's default sizes."""
    w = Workload(server_model="batched", decode_token_s=0.006, prefill_token_s=2e-5)
    return Scenario(seed=9, names=("only",), tau=np.array([[0.002]]), servers=(1,),
                    prefill_token_s=np.array([2e-5]), decode_token_s=np.array([0.006]), demand=np.array([lam]),
                    workload=w, utilization=0.8, duration_s=duration, mod_amp=0.0,
                    mod_period_s=np.array([100.0]), mod_phase=np.array([0.0]))


@pytest.mark.parametrize(("lam", "kv"), [(2.0, 400_000), (12.0, 400_000), (8.0, 8_000)])
def test_batched_server_is_the_emulator_engine_step_for_step(lam: float, kv: int) -> None:
    """The simulator's multi-step runs (each step's context one token per sequence longer, runs cut
    where the KV growth preempts) give every request exactly the latency the emulator's own
    step-by-step virtual-clock run gives (same profile, same arrivals at the server); with a small
    KV cache, with the same preemptions, and none is lost."""
    from dlb.emulator.engine import Arrival, Engine
    from dlb.emulator.engine import simulate as engine_simulate

    sc = batched_scenario(lam, duration=60.0)
    sc = replace(sc, workload=replace(sc.workload, kv_cache_tokens=kv))
    t, _src, ptok, dtok = generate_arrivals(sc, 0)
    res = simulate(sc, "Rand", 0, arrivals=(t, _src, ptok, dtok))
    assert res.errors == 0 and res.completed == t.size > 50
    w = sc.workload
    assert w.cell_profile(2e-5, 0.006).ref_context_tokens == 1024  # the context term is on
    eng = Engine(w.cell_profile(2e-5, 0.006), max_batch=w.max_batch, max_waiting_tokens=kv)
    ref = engine_simulate(eng, [Arrival(float(a) + 0.002, max(1, round(p)), max(1, round(d)))
                                for a, p, d in zip(t, ptok, dtok, strict=True)])
    want = np.sort(np.array([r.e2e + 0.004 for r in ref]))
    np.testing.assert_allclose(np.sort(res.latency), want, rtol=0, atol=1e-9)
    assert res.preemptions == eng.preemptions
    assert (res.preemptions > 20) == (kv < 10_000)
    assert res.summary()["preemptions"] == res.preemptions


def test_batched_latency_grows_with_load_past_the_knee() -> None:
    """Flat-then-linear: light load is served near the unloaded latency, heavy load much slower."""
    light = simulate(batched_scenario(1.0, 120.0), "Rand", 0)
    heavy = simulate(batched_scenario(25.0, 120.0), "Rand", 0)
    unloaded = batched_scenario(1.0, 1.0).nominal_server_latency()
    assert light.latency.mean() < 1.3 * unloaded
    assert heavy.latency.mean() > 2.0 * light.latency.mean()


def test_mnlb_estimates_demand_and_capacity_the_oracle_is_handed_them() -> None:
    """Before its first 10-s period MNLB knows no demand and routes like Rand; MNLB-oracle solves on the
    true demand from t = 0 (mostly local: half Rand's network time). After a minute of measurements
    MNLB has learned the demand and keeps most traffic local too."""
    short = generate(5, duration_s=9.0)
    rand, est, oracle = (simulate(short, p) for p in ("Rand", "MNLB", "MNLB-oracle"))
    assert est.net_mean == pytest.approx(rand.net_mean, rel=0.1)
    assert oracle.net_mean < 0.6 * rand.net_mean
    longer = generate(5, duration_s=60.0)
    assert simulate(longer, "MNLB").net_mean < 0.6 * simulate(longer, "Rand").net_mean


def test_prequal_leaf_pick_runs_the_leaf_agents_pool() -> None:
    """leaf_pick = prequal: every request accounted for, deterministic, and picks differ from the RIF rule."""
    sc = generate(5, duration_s=20.0, leaf_pick="prequal", server_model="batched")
    a, b = simulate(sc, "Disc-RIF"), simulate(sc, "Disc-RIF")
    assert a.completed + a.errors + a.in_flight == a.arrivals and a.in_flight == 0
    np.testing.assert_array_equal(a.latency, b.latency)
    rif = simulate(replace(sc, workload=replace(sc.workload, leaf_pick="rif")), "Disc-RIF")
    assert rif.arrivals == a.arrivals and not np.array_equal(rif.latency, a.latency)
    with pytest.raises(ValueError, match="leaf_pick"):
        Workload(leaf_pick="fastest")


@pytest.mark.parametrize("policy", ["MNLB", "Disc-RIF", "Flow-Grad"])
def test_root_replicas_serve_every_request(policy: str) -> None:
    """``root_replicas``: requests round-robin over a cell's replicas, each with its own probes and state;
    nothing is lost, and R = 1 is the one-root simulator bit for bit."""
    sc = generate(3, duration_s=20.0)
    one = simulate(sc, policy, 0)
    np.testing.assert_array_equal(one.latency, simulate(sc, policy, 0, SimConfig(root_replicas=1)).latency)
    many = simulate(sc, policy, 0, SimConfig(root_replicas=3))
    assert many.arrivals == one.arrivals
    assert many.completed + many.errors + many.in_flight == many.arrivals
    assert many.errors <= max(3, 2 * one.errors)
    with pytest.raises(ValueError, match="root_replicas"):
        SimConfig(root_replicas=0)


def test_a_slow_cell_is_slow_in_the_batched_model_too() -> None:
    """A ``slow`` disruption (priors: a cell silently 3× slower) slowed only the pipeline model's
    servers; the batched model's engines kept their speed, so the fault did nothing there. Requests
    that start inside the window take ~3× longer, and the speed comes back when it ends."""
    from dataclasses import replace

    from dlb.sim.scenario import Disruption

    base = batched_scenario(2.0, 90.0)
    slow = replace(base, disruption=Disruption("slow", 30.0, 60.0, cell=0, factor=3.0))
    arr = generate_arrivals(base, 0)
    a, b = simulate(base, "Rand", 0, arrivals=arr), simulate(slow, "Rand", 0, arrivals=arr)
    t = arr[0]
    inside, after = (t > 31.0) & (t < 59.0), t > 62.0
    assert b.latency.size == a.latency.size == t.size  # one latency per arrival, in arrival order
    assert b.latency[inside].mean() > 2.5 * a.latency[inside].mean()
    assert b.latency[after].mean() == pytest.approx(a.latency[after].mean(), rel=0.05)
    assert b.latency[t < 29.0].mean() == pytest.approx(a.latency[t < 29.0].mean(), rel=1e-9)


def test_overload_sheds_only_with_leaves_that_report_capacity() -> None:
    """At 110 % load Disc-RIF's roots shed; with leaves that report no capacity (older ones) they never do.
    Shed requests are arrivals that count at the request timeout in the failure-counting mean."""
    sc = generate(11, utilization=1.1, duration_s=30.0, server_model="pipeline")
    on = simulate(sc, "Disc-RIF", 0)
    off = simulate(sc, "Disc-RIF", 0, SimConfig(shed=False))
    assert on.shed > 0 and off.shed == 0
    s = on.summary()
    assert s["shed_rate"] == pytest.approx(on.shed / on.arrivals)
    unserved = on.arrivals - on.latency.size
    assert s["mean_latency_with_failures"] >= unserved * on.request_timeout_s / on.arrivals


def test_batched_queue_holds_what_the_server_serves_within_the_request_timeout() -> None:
    """The batched server's waiting queue is bounded by the prompts it admits, at its rate, within
    the request timeout (less the unloaded latency), at most a KV cache's worth: under overload a
    request is refused at once instead of queueing past the time its client waits."""
    w = Workload(server_model="batched")
    tp, td = 2e-4, 8e-3
    wait = 60.0 - w.unloaded_latency(tp, td)
    assert w.max_waiting_tokens(tp, td, 60.0) == int(w.server_rate(tp, td) * wait * w.mean_prefill_tokens)
    assert w.max_waiting_tokens(tp, td, 20.0) < w.max_waiting_tokens(tp, td, 60.0) < w.kv_cache_tokens
    assert w.max_waiting_tokens(tp, td, 1e5) == w.kv_cache_tokens
    over = batched_scenario(45.0, 60.0)  # ~1.4x the server's rate (32 requests/s)
    # The bound alone: cancelling at the timeout empties the queue before it fills (test_sim_timeouts).
    short, long = (simulate(over, "Rand", 0, SimConfig(request_timeout_s=t, timeouts="serve")) for t in (10.0, 40.0))
    assert short.errors > long.errors > 0
    assert np.median(short.latency) < np.median(long.latency) - 3.0  # a shorter wait for those it serves
    assert short.completed + short.errors == short.arrivals
