"""The fluid-model check: equilibrium solvers against brute force, and the routers against the solvers."""

from __future__ import annotations

import numpy as np
import pytest

from dlb.core.costs import Cost
from dlb.core.flow import FlowConfig, saturation_workload
from dlb.core.latency_model import LatencyParams, latency, service_rate, workload_for_rate
from dlb.core.router import Mechanism, PolicyConfig, RootRouter
from dlb.core.topology import Topology
from dlb.theory import equilibria as eq
from dlb.theory import fluid as th
from dlb.theory import parallel


def two_cells(lam0: float = 75.0, lam1: float = 10.0, rtt_ms: float = 80.0, complete: bool = False) -> eq.FluidNetwork:
    """Source 0 may use both cells; a slow local cell and a fast remote one (a real trade-off)."""
    tau = np.array([[0.0005, rtt_ms / 2000], [rtt_ms / 2000, 0.0005]])
    allowed = np.array([[True, True], [complete, True]])
    return eq.FluidNetwork(
        name="two", lam=np.array([lam0, lam1]), a=np.array([0.8, 0.3]), b=np.array([0.02, 0.012]),
        c=np.array([20.0, 15.0]), s=np.array([4.0, 3.0]), replicas=np.array([4.0, 3.0]), tau=tau, allowed=allowed,
    )


def test_workload_inverts_service_rate() -> None:
    net = two_cells()
    z = np.array([20.0, 70.0])
    n = eq.workload(z, net)
    for j in range(2):
        assert n[j] == pytest.approx(workload_for_rate(z[j], net.a[j], net.b[j], net.c[j], net.s[j]), rel=1e-9)
    assert np.isinf(eq.workload(np.array([1 / 0.02, 0.0]), net)[0])


def _brute_force(net: eq.FluidNetwork, objective: eq.Objective) -> float:
    """argmin of the objective over a fine grid of source 0's split (source 1 is pinned to cell 1).

    The Wardrop potential ∫₀^z ℓ(μ⁻¹(s)) ds is integrated here by the trapezoid rule on a fine grid of
    inflows s, not by the solver's Gauss–Legendre rule in workload space.
    """
    lam0, lam1 = net.lam
    x = np.linspace(0.0, 1.0, 20001)
    z = np.stack([lam0 * x, lam0 * (1 - x) + lam1], axis=1)
    ok = np.all(z < net.capacity, axis=1)
    x, z = x[ok], z[ok]
    rtt = 2 * net.tau[0]
    network = lam0 * (x * rtt[0] + (1 - x) * rtt[1]) + lam1 * 2 * net.tau[1, 1]
    if objective is eq.Objective.OPTIMUM:
        val = eq.workload(z, net).sum(axis=1) + network
    else:
        val = network.copy()
        for j in range(2):
            s = np.linspace(0.0, z[:, j].max(), 200001)
            n = eq.workload(np.stack([s, s], axis=1), net)[:, j]
            ell = latency(n, net.a[j], net.b[j], net.c[j], net.s[j])
            prim = np.concatenate([[0.0], np.cumsum(0.5 * (ell[1:] + ell[:-1]) * np.diff(s))])
            val += np.interp(z[:, j], s, prim)
    return float(x[np.argmin(val)])


def test_optimum_matches_grid_search_on_two_cells() -> None:
    net = two_cells()
    sol = eq.solve(eq.Objective.OPTIMUM, net)
    assert 0.01 < sol.x[0, 0] < 0.99  # interior split: the test exercises the trade-off
    assert sol.x[0, 0] == pytest.approx(_brute_force(net, eq.Objective.OPTIMUM), abs=2e-4)


def test_wardrop_matches_grid_search_on_two_cells() -> None:
    net = two_cells()
    sol = eq.solve(eq.Objective.WARDROP, net)
    assert 0.01 < sol.x[0, 0] < 0.99
    assert sol.x[0, 0] == pytest.approx(_brute_force(net, eq.Objective.WARDROP), abs=2e-4)
    # ... and Wardrop costs more than the optimum (price of anarchy) but not less.
    opt = eq.solve(eq.Objective.OPTIMUM, net)
    assert sol.total_latency > opt.total_latency * (1 + 1e-6)


def test_rif_solver_matches_waterfill_on_complete_graph() -> None:
    rng = np.random.default_rng(7)
    net = th.random_network(rng, "w", n_cells=(4, 4))
    net = eq.FluidNetwork(**{**net.__dict__, "allowed": np.ones((net.n, net.n), bool)})
    n_fill = eq.rif_waterfill(net)
    np.testing.assert_allclose(n_fill / net.replicas, (n_fill / net.replicas)[0], rtol=1e-10)
    np.testing.assert_allclose(service_rate(n_fill, net.a, net.b, net.c, net.s).sum(), net.lam.sum(), rtol=1e-10)
    sol = eq.solve(eq.Objective.RIF, net)
    np.testing.assert_allclose(sol.N, n_fill, rtol=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_wardrop_complementary_slackness(seed: int) -> None:
    """Every used arc of a source has the least latency cost; unused arcs cost at least as much."""
    net = th.random_network(np.random.default_rng(seed), f"cs{seed}")
    sol = eq.solve(eq.Objective.WARDROP, net)
    n = eq.workload(sol.z, net)
    cost = latency(n, net.a, net.b, net.c, net.s)[None, :] + 2 * net.tau  # costs recomputed here
    np.testing.assert_allclose(service_rate(sol.N, net.a, net.b, net.c, net.s), sol.z, rtol=1e-9)
    np.testing.assert_allclose(sol.x.sum(axis=1), 1.0)
    assert not (sol.x[~net.allowed] > 0).any()
    for i in range(net.n):
        best = cost[i, net.allowed[i]].min()
        used = net.allowed[i] & (sol.x[i] > 1e-6)
        assert used.any()
        assert np.all(cost[i, used] <= best + 1e-4 * best), (i, cost[i], sol.x[i])


def test_overloaded_cell_does_not_freeze_the_flow_step() -> None:
    """Past capacity the steady-state sensitivity explodes; the step must still move flow away."""
    p = [LatencyParams(0.3, 0.0135, 18.0, 2.8), LatencyParams(0.86, 0.0074, 60.0, 17.0)]
    topo = Topology.build(["hot", "cool"], [3, 6], [[0.0005, 0.03], [0.03, 0.0005]])
    r = RootRouter(topo, 0, PolicyConfig(Mechanism.FLOW, Cost.GRADIENT, flow=FlowConfig()), p[0])
    r.x = np.array([0.5, 0.5])
    hot_n = 20 * saturation_workload(p[0].a, p[0].b, p[0].c, p[0].s, 0.99)  # far beyond saturation
    for now in (0.0, 0.2, 0.4, 0.6, 0.8, 1.0):
        r.on_probe(0, now, float(hot_n), p[0])
        r.on_probe(1, now, 20.0, p[1])
        r.note_arrivals(150 * 0.2)
        r.rate = 150.0
        r.tick(now)
    assert r.x[0] < 0.1  # left within a second (without the clip: 0.5 -> 0.4997)


def test_an_overloaded_cell_does_not_shrink_the_step_that_empties_it() -> None:
    """Just past saturation the gradient cost's g(N_sat) ∝ (1 − ρ)⁻³ is huge; averaged into ĝ it made
    the step that moves flow off the overloaded cell tiny (a sparse 6-cell topology stayed 8× above
    the optimum for 200 s). Overloaded cells stay out of ĝ's mean, so the flow leaves within seconds."""
    p = [LatencyParams(0.3, 0.0135, 18.0, 2.8), LatencyParams(0.86, 0.0074, 60.0, 17.0)]
    topo = Topology.build(["hot", "cool"], [3, 6], [[0.0005, 0.03], [0.03, 0.0005]])
    r = RootRouter(topo, 0, PolicyConfig(Mechanism.FLOW, Cost.GRADIENT, flow=FlowConfig()), p[0])
    r.x = np.array([0.5, 0.5])
    hot_n = 1.5 * saturation_workload(p[0].a, p[0].b, p[0].c, p[0].s, 0.99)  # just past saturation
    cool_n = saturation_workload(p[1].a, p[1].b, p[1].c, p[1].s, 0.5)  # a calm cell at half load
    for k in range(26):
        now = 0.2 * k
        r.on_probe(0, now, float(hot_n), p[0])
        r.on_probe(1, now, float(cool_n), p[1])
        r.tick(now)
    assert r.x[0] < 0.1, r.x  # within 5 s (with the overloaded cell in ĝ's mean: 0.5 -> 0.39)


def small_networks() -> list[eq.FluidNetwork]:
    rng = np.random.default_rng(1)
    return [th.random_network(rng, f"S{i}", n_cells=(3, 3)) for i in range(3)]


@pytest.fixture(scope="module")
def small_run() -> list[th.Record]:
    return th.run(small_networks(), th.SimConfig(horizon_s=150.0), ["Flow-Grad", "Flow-Lat", "Disc-RIF"])


def test_flow_grad_reaches_the_optimum(small_run: list[th.Record]) -> None:
    for r in small_run:
        if r.policy == "Flow-Grad":
            assert -1e-3 <= r.latency_gap <= th.FLOW_GRAD_TARGET, r
            assert r.workload_gap < 0.02, r
            assert r.equilibrium_latency_gap == 0.0


def test_flow_lat_reaches_wardrop_and_pays_the_price_of_anarchy(small_run: list[th.Record]) -> None:
    recs = [r for r in small_run if r.policy == "Flow-Lat"]
    for r in recs:
        assert r.workload_gap < 0.01, r
        assert r.latency_gap == pytest.approx(r.equilibrium_latency_gap, abs=0.005)
    assert max(r.equilibrium_latency_gap for r in recs) > 0.01  # a real gap exists on these topologies


def test_disc_rif_settles_near_equal_rif_per_replica(small_run: list[th.Record]) -> None:
    for r in small_run:
        if r.policy == "Disc-RIF":
            assert r.workload_gap < 0.2, r
            assert r.latency_gap >= -1e-3, r  # never better than the optimum


def test_simulation_from_equilibrium_stays_there() -> None:
    """Sanity of the integrator: with routing frozen at the optimum, N stays at μ⁻¹(z) exactly."""
    net = small_networks()[0]
    opt = eq.solve(eq.Objective.OPTIMUM, net)
    n = np.array(opt.N)
    dt = th.DT
    for _ in range(2000):
        n = (n + dt * opt.z) / (1 + dt / latency(n, net.a, net.b, net.c, net.s))
    np.testing.assert_allclose(n, opt.N, rtol=1e-9)


def test_targets_judge_exact_runs_only() -> None:
    def rec(policy: str, replicas: int, gap: float, amp: float = 0.0, wgap: float = 0.0, noise: float = 0.0) -> th.Record:
        return th.Record("T", policy, gap, wgap, amp, 0.0, replicas, noise)

    good = [rec("Flow-Grad", 1, 0.004), rec("Flow-Grad", 4, 0.005), rec("Flow-Lat", 1, 0.1, wgap=0.002),
            rec("Flow-Lat", 16, 0.1005, wgap=0.003), rec("Flow-Grad", 1, 0.5, noise=0.25)]
    assert all(h for _, h, _ in th.targets(good))
    cycle = good + [rec("Flow-Grad", 16, 0.009, amp=0.02)]
    verdicts = {name.split(":")[0]: h for name, h, _ in th.targets(cycle)}
    assert not all(verdicts.values())
    drift = [rec("Flow-Grad", 1, 0.001), rec("Flow-Grad", 4, 0.008)]  # both under 1 %, but R changes the result
    assert [h for _, h, _ in th.targets(drift)] == [True, True, True, False]  # settled, gap, cycle, R


def test_each_network_is_solved_once_for_every_replica_count_and_noise(monkeypatch) -> None:
    """The equilibria depend on the network only; solving them again for every (R, ε) job cost ~115 s of
    CPU per job on the complete 12-cell graph (six jobs in the default set), more than its simulations."""
    calls: list[str] = []
    real = th.solve

    def counting(objective: eq.Objective, net: eq.FluidNetwork, *a, **k):
        calls.append(net.name)
        return real(objective, net, *a, **k)

    monkeypatch.setattr(th, "solve", counting)
    net = small_networks()[0]
    recs = parallel.run_parallel([net], th.SimConfig(horizon_s=2.0), parallel.Sweep(["Flow-RIF"], 1.0, (1, 2), (0.0, 0.25)), 1)
    assert len(recs) == 4 and len({r.equilibrium_latency_gap for r in recs}) == 1
    assert len(calls) == 2  # RIF (Flow-RIF's) and the optimum, once


def one_cell(lam: float) -> eq.FluidNetwork:
    """One cell fed ``lam`` requests/s (capacity 1/b = 50), with the generator's buffer."""
    net = eq.FluidNetwork(name="one", lam=np.array([lam]), a=np.array([0.8]), b=np.array([0.02]), c=np.array([20.0]),
                          s=np.array([4.0]), replicas=np.array([4.0]), tau=np.array([[0.0005]]),
                          allowed=np.array([[True]]))
    return eq.FluidNetwork(**{**net.__dict__, "buffer": th.buffers(net)})


def test_a_full_buffer_holds_its_workload_and_loses_the_rest() -> None:
    """Past the buffer the cell serves μ(B) = 0.99/b and the rest of the inflow is lost (the record's
    overflow); without the buffer N would grow without bound and nothing would be counted."""
    net = one_cell(100.0)
    b_full = float(net.buffer[0])
    assert service_rate(b_full, 0.8, 0.02, 20.0, 4.0) == pytest.approx(th.BUFFER_RHO * 50.0, rel=1e-9)
    traj = th.simulate(net, "Flow-RIF", th.SimConfig(horizon_s=120.0))
    assert traj.N[-1, 0] == pytest.approx(b_full, rel=1e-12)
    opt = eq.solve(eq.Objective.OPTIMUM, one_cell(40.0))  # any equilibrium: compare() needs one
    rec = th.compare(net, "Flow-RIF", traj, opt, opt, 20.0)
    assert rec.overflow == pytest.approx((100.0 - th.BUFFER_RHO * 50.0) / 100.0, rel=1e-3)
    assert th.compare(one_cell(40.0), "Flow-RIF", th.simulate(one_cell(40.0), "Flow-RIF", th.SimConfig(horizon_s=60.0)),
                      opt, opt, 20.0).overflow == 0.0


def test_load_sets_the_demand_and_keeps_every_topology() -> None:
    """--load scales the demand only; adding size 10 or a load leaves the older sizes' draws alone."""
    by_load = th.scale_networks(0, (2, 6), ("complete",), (0.85, 0.95))
    assert [n.name for n in by_load] == ["C02@85", "C06@85", "C02@95", "C06@95"]
    for lo, hi in zip(by_load[:2], by_load[2:], strict=True):
        assert lo.utilisation == pytest.approx(0.85) and hi.utilisation == pytest.approx(0.95)
        np.testing.assert_array_equal(lo.a, hi.a)
        np.testing.assert_array_equal(lo.tau, hi.tau)
    old = {n.name: n for n in th.scale_networks(0, (2, 6, 12))}
    new = {n.name: n for n in th.scale_networks(0, (2, 6, 10, 12))}
    assert set(new) == set(old) | {"C10", "S10"}
    for name, net in old.items():
        np.testing.assert_array_equal(net.lam, new[name].lam)
        np.testing.assert_array_equal(net.allowed, new[name].allowed)


def test_targets_judge_the_routers_default_delay_rule_only() -> None:
    ok = th.Record("T", "Flow-Grad", 0.004, 0.0, 0.0, 0.0, rule=th.rule_name(FlowConfig()))
    other = th.rule_name(FlowConfig(relaxation_delay=not FlowConfig().relaxation_delay))
    old = th.Record("T", "Flow-Grad", 0.5, 0.0, 0.3, 0.0, rule=other)
    assert th.targets([ok, old]) == th.targets([ok])


def test_a_run_still_filling_up_is_not_settled_and_not_called_a_limit_cycle() -> None:
    """A stranger's C02 at 98 % load: 600 s from an empty start still filled, and `dlb theory` reported a gap
    of −30 % and 'no limit cycle: FAIL (amplitude 1.7 %)'; at 3 600 s it sat at the optimum. The drift of the
    total workload over the averaging window tells a fill from a cycle."""
    from types import SimpleNamespace

    t = np.linspace(0.0, 600.0, 601)
    filling = 100.0 * (1.0 - np.exp(-t / 400.0))  # still rising over the last 60 s
    cycling = 63.0 + 2.0 * np.sin(2 * np.pi * t / 20.0)  # 20-s period: three cycles in the window
    net = SimpleNamespace(name="T", utilisation=0.98, lam=np.array([1.0]))
    ref = SimpleNamespace(N=np.array([63.0]), total_latency=63.0)

    def record(total: np.ndarray) -> th.Record:
        traj = th.Trajectory(t, total[:, None], np.zeros((t.size, 1, 1)), total, np.zeros(t.size))
        return th.compare(net, "Flow-Grad", traj, ref, ref, 60.0)  # type: ignore[arg-type]

    fill, cycle = record(filling), record(cycling)
    assert not fill.settled and fill.drift > th.DRIFT_LIMIT
    assert cycle.settled and cycle.amplitude > th.AMPLITUDE_LIMIT
    verdicts = {name.split(" (")[0]: ok for name, ok, _ in th.targets([fill])}
    assert verdicts["flow runs settled within the horizon"] is False
    assert list(verdicts) == ["flow runs settled within the horizon"]  # no end-state check reads a fill
    assert {n.split(" (")[0]: ok for n, ok, _ in th.targets([cycle])}["flow policies: no limit cycle"] is False
