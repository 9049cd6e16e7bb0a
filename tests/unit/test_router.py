"""The root router: discrete argmin with local correction, flow sampling, aversion and affinity."""

from __future__ import annotations

import numpy as np
import pytest

from dlb.core.affinity import AffinityCache, AffinityConfig
from dlb.core.aversion import AversionConfig, update_aversion
from dlb.core.costs import Cost, ModelTable, cost_vector
from dlb.core.flow import FlowConfig, saturation_workload, workload_at_rate
from dlb.core.latency_model import LatencyParams, inv_marginal_rate, latency
from dlb.core.router import NO_CELL, Mechanism, PolicyConfig, RootRouter
from dlb.core.topology import Topology

P = LatencyParams(a=1.0, b=0.05, c=8.0, s=1.0)


def topo3(allowed=None) -> Topology:
    tau = [[0, 0.02, 0.05], [0.02, 0, 0.03], [0.05, 0.03, 0]]
    return Topology.build(["a", "b", "c"], [4, 8, 2], tau, allowed)


def probed(router: RootRouter, rif, now: float = 0.0, params=None, errors=None) -> RootRouter:
    """Probe every cell with a state that has seen all of the router's sends so far."""
    for j, n in enumerate(rif):
        router.on_probe(j, now, n, params[j] if params else P, errors[j] if errors else 0.0, seen_until=now)
    return router


def test_costs_formulas() -> None:
    t = topo3()
    n = np.array([4.0, 4.0, 4.0])
    m = ModelTable.from_params([P, P, P])
    rtt = 2 * t.tau[0]
    np.testing.assert_allclose(cost_vector(Cost.RIF, n, t.replicas, m, rtt), [1.0, 0.5, 2.0])
    np.testing.assert_allclose(cost_vector(Cost.LATENCY, n, t.replicas, m, rtt), latency(n, *P.as_array()) + rtt)
    np.testing.assert_allclose(cost_vector(Cost.GRADIENT, n, t.replicas, m, rtt), inv_marginal_rate(n, *P.as_array()) + rtt)
    with pytest.raises(ValueError):
        cost_vector(Cost.LATENCY, n, t.replicas, None, rtt)


def test_discrete_picks_argmin() -> None:
    r = probed(RootRouter(topo3(), 0, PolicyConfig(Mechanism.DISCRETE, Cost.RIF), P, np.random.default_rng(0)), [8, 4, 0])
    assert r.pick(0.1) == 2  # 0/2 < 4/8 < 8/4


def test_discrete_local_correction_prevents_herding() -> None:
    """Between probes, requests spread as the root's own sends raise a cell's cost."""
    r = probed(RootRouter(topo3(), 0, PolicyConfig(Mechanism.DISCRETE, Cost.RIF), P, np.random.default_rng(0)), [0, 0, 0])
    picks = [r.pick(0.1) for _ in range(140)]
    counts = np.bincount(picks, minlength=3)
    # Equalising N/k with k = (4, 8, 2) → shares 4:8:2 of 140.
    np.testing.assert_allclose(counts, [40, 80, 20], atol=1)
    r.on_probe(0, 0.2, 0.0, P)
    assert r.view.sent[0] == 0


def test_sends_stay_counted_until_a_probe_could_have_seen_them() -> None:
    """A probe answered before the root's requests reached the leaf must not erase them (issue 11)."""
    r = probed(RootRouter(topo3(), 0, PolicyConfig(Mechanism.DISCRETE, Cost.RIF), P, np.random.default_rng(0)), [0, 0, 0])
    for _ in range(30):
        r.pick(0.1)
    sent = r.view.sent.copy()
    assert sent[2] > 0  # cell 2 is 50 ms away: round trip 100 ms
    r.on_probe(2, 0.15, 0.0, P)  # the leaf answered at 0.125, before the 0.1 sends arrived (0.15)
    assert r.view.sent[2] == sent[2]
    r.on_probe(2, 0.2, 0.0, P)  # answered at 0.175, after they arrived: the probe's RIF has them
    assert r.view.sent[2] == 0
    r.pick(0.3)
    for j in range(3):  # an explicit horizon (the probe's own send time): the 0.1 sends are seen, 0.3's not
        r.on_probe(j, 0.35, 0.0, P, seen_until=0.25)
    assert r.view.sent.sum() == 1


def test_discrete_latency_prefers_near_cell_when_idle() -> None:
    r = probed(RootRouter(topo3(), 2, PolicyConfig(Mechanism.DISCRETE, Cost.LATENCY), P, np.random.default_rng(0)), [0, 0, 0])
    assert r.pick(0.0) == 2


def test_residency_never_violated() -> None:
    allowed = [[True, False, True], [True, True, True], [False, False, True]]
    for mech in Mechanism:
        r = probed(RootRouter(topo3(allowed), 0, PolicyConfig(mech, Cost.LATENCY), P, np.random.default_rng(1)), [100, 0, 50])
        for k in range(50):
            r.tick(0.2 * k)
            probed(r, [100, 0, 50], now=0.2 * k)
            assert r.pick(0.2 * k + 0.01) in (0, 2)
        assert r.x[1] == 0.0


def test_stale_and_unavailable_cells_are_skipped() -> None:
    r = probed(RootRouter(topo3(), 0, PolicyConfig(Mechanism.DISCRETE, Cost.RIF, stale_after_s=1.0), P, np.random.default_rng(0)), [0, 0, 0])
    r.set_available(2, False)
    r.set_available(1, False)
    assert r.pick(0.5) == 0
    assert r.pick(5.0) == NO_CELL  # everything stale
    fresh = RootRouter(topo3(), 0, PolicyConfig(), P)
    for j in range(3):
        fresh.set_available(j, False)  # never answered, probes failed: known dead
    assert fresh.pick(0.0) == NO_CELL


@pytest.mark.parametrize("mechanism", list(Mechanism))
def test_a_router_with_no_probe_yet_routes_by_its_static_weights(mechanism: Mechanism) -> None:
    """Warm start: a restarted root samples the replica split (or the weights it was given) until its
    first probe answer, instead of refusing every request; a cell whose probes failed is left out."""
    t = topo3()
    r = RootRouter(t, 0, PolicyConfig(mechanism, Cost.LATENCY), P, np.random.default_rng(1))
    counts = np.bincount([r.pick(0.0) for _ in range(1400)], minlength=3)
    np.testing.assert_allclose(counts / 1400, [4 / 14, 8 / 14, 2 / 14], atol=0.04)  # replicas 4:8:2
    r.x = np.array([0.0, 0.0, 1.0])  # e.g. the control plane's last FlowWeights
    assert {r.pick(0.1) for _ in range(50)} == {2}
    r.set_available(2, False)  # its probes failed: known dead, even with all the weight
    assert {r.pick(0.2) for _ in range(200)} <= {0, 1}
    r.set_available(0, False)
    r.set_available(1, False)
    assert r.pick(0.3) == NO_CELL


def test_warm_start_ends_at_the_first_probe_and_a_stale_cell_stays_unused() -> None:
    r = RootRouter(topo3(), 0, PolicyConfig(Mechanism.DISCRETE, Cost.RIF, stale_after_s=1.0), P, np.random.default_rng(0))
    assert r.pick(0.0) != NO_CELL and not r.probed
    r.on_probe(1, 0.5, 0.0, P)
    assert r.probed
    assert {r.pick(0.6) for _ in range(30)} == {1}  # fresh state wins over cells it has no news of
    assert r.pick(5.0) == NO_CELL  # cell 1 went stale (its leaf may be gone); 0 and 2 never answered


def test_flow_moves_toward_lower_cost_and_stays_on_simplex() -> None:
    r = RootRouter(topo3(), 0, PolicyConfig(Mechanism.FLOW, Cost.LATENCY, flow=FlowConfig(period_s=0.1)), P, np.random.default_rng(0))
    x0 = r.x.copy()
    for k in range(30):
        probed(r, [30, 2, 2], now=0.1 * k)
        for _ in range(20):
            r.pick(0.1 * k)
        r.tick(0.1 * k)
    assert r.x.sum() == pytest.approx(1.0)
    assert np.all(r.x >= 0)
    assert r.x[0] < x0[0]
    counts = np.bincount([r.pick(3.0) for _ in range(4000)], minlength=3) / 4000
    np.testing.assert_allclose(counts, r.x, atol=0.03)


def test_update_aversion_controller() -> None:
    cfg = AversionConfig(margin=0.02, gain=2.0, decay=0.5, max_rate=0.9)
    active = np.ones(3, bool)
    a = np.zeros(3)
    for _ in range(10):
        a = update_aversion(a, np.array([0.0, 0.5, 0.01]), active, cfg)
    assert a[1] == pytest.approx(0.9)  # saturates at max < 1
    assert a[0] == 0.0 and a[2] == 0.0  # within margin of the best
    for _ in range(20):
        a = update_aversion(a, np.zeros(3), active, cfg)
    assert a[1] < 1e-5  # recovery
    off = update_aversion(np.full(3, 0.5), np.array([0.0, 0.5, 0.0]), active, AversionConfig(enabled=False))
    assert not off.any()


def test_aversion_moves_traffic_but_keeps_a_trickle() -> None:
    pol = PolicyConfig(Mechanism.DISCRETE, Cost.RIF, aversion=AversionConfig(period_s=0.1, max_rate=0.9))
    r = RootRouter(topo3(), 0, pol, P, np.random.default_rng(0))
    for k in range(20):
        probed(r, [0, 0, 0], now=0.1 * k, errors=[0.0, 0.6, 0.0])
        r.tick(0.1 * k)
    picks = []
    for _ in range(3000):
        probed(r, [0, 0, 0], now=2.0, errors=[0.0, 0.6, 0.0])
        picks.append(r.pick(2.0))
    share_bad = np.mean(np.array(picks) == 1)
    # Without aversion cell 1 (lowest N/k tie-broken randomly) would get ~1/3; with a = 0.9, ~1/30.
    assert 0.005 < share_bad < 0.08


def test_affinity_cache_lru_and_ttl() -> None:
    c = AffinityCache(max_sessions=2, ttl_s=10.0)
    c.put("s1", 1, 0.0)
    c.put("s2", 2, 0.0)
    assert c.get("s1", 1.0) == 1  # s1 now most recent
    c.put("s3", 0, 1.0)  # evicts s2
    assert c.get("s2", 1.0) is None and c.evictions == 1
    assert c.get("s1", 10.5) is None  # expired
    c.forget_cell(0)
    assert len(c) == 0


def test_conditional_affinity_stays_then_leaves() -> None:
    aff = AffinityConfig(enabled=True, prefix_savings=0.5)
    r = RootRouter(topo3(), 0, PolicyConfig(Mechanism.DISCRETE, Cost.RIF, affinity=aff), P, np.random.default_rng(0))
    probed(r, [0, 0, 0])
    first = r.pick(0.0, session="sess")
    # Make the pinned cell slightly worse than the best: within the savings, the session stays.
    loads = [0.0, 0.0, 0.0]
    loads[first] = 0.4 * r.replicas[first]
    probed(r, loads, now=0.1)
    assert r.pick(0.1, session="sess") == first
    # Much worse: re-route and re-affinitise.
    loads[first] = 10 * r.replicas[first]
    probed(r, loads, now=0.2)
    moved = r.pick(0.2, session="sess")
    assert moved != first
    probed(r, [0.0, 0.0, 0.0], now=0.3)
    assert r.affinity is not None and r.affinity.get("sess", 0.3) == moved


def test_affinity_under_flow_moves_to_the_best_alternative_not_a_sample() -> None:
    """Paper 3.5: leaving the session's cell goes to the best alternative, even when x says otherwise."""
    aff = AffinityConfig(enabled=True, prefix_savings=0.5)
    topo = Topology.build(["a", "b", "c"], [4, 4, 4], [[0.0005, 0.002, 0.002], [0.002, 0.0005, 0.002], [0.002, 0.002, 0.0005]])
    r = RootRouter(topo, 0, PolicyConfig(Mechanism.FLOW, Cost.LATENCY, affinity=aff), P, np.random.default_rng(0))
    probed(r, [0, 0, 0])
    r.affinity.put("s", 0, 0.0)
    # x sends almost everything to cell 1, but cell 2 has the lower expected latency.
    r.x = np.array([0.0, 0.98, 0.02])
    probed(r, [200.0, 60.0, 9.0], now=0.1)  # ℓ(200) ≫ ℓ(60) > ℓ(9): cell 0 loses even with the saving
    moves = set()
    for _ in range(50):
        r.affinity.put("s", 0, 0.1)  # pinned to cell 0 again each time
        moves.add(r.pick(0.1, session="s"))
    assert moves == {2}
    # Within the saving the session stays, although x gives its cell no mass.
    probed(r, [9.0 + 0.4 / P.b * 0.5, 60.0, 9.0], now=0.2)
    r.affinity.put("s", 0, 0.2)
    assert r.pick(0.2, session="s") == 0


def test_affinity_compares_expected_latency_with_rif_cost() -> None:
    """The saving is a time: with the RIF cost the rule still compares ℓ_j(N_j) + 2τ_ij."""
    aff = AffinityConfig(enabled=True, prefix_savings=0.3)
    models = [P, LatencyParams(a=0.2, b=0.01, c=8.0, s=1.0), P]
    r = RootRouter(topo3(), 0, PolicyConfig(Mechanism.DISCRETE, Cost.RIF, affinity=aff), P, np.random.default_rng(0))
    probed(r, [0, 0, 0], params=models)
    r.affinity.put("s", 0, 0.0)
    # Cell 0 (4 replicas, ℓ = 1.0 s) vs cell 1 (8 replicas, ℓ = 0.2 s): 1.0 − 0.3 > 0.2 + RTT → move to 1.
    assert r.pick(0.0, session="s") == 1


def test_flow_step_does_not_depend_on_the_roots_own_rate() -> None:
    """Issue 11: the step is normalised by the fleet's rate from probes, not the root's own arrivals,
    so R replicas carrying λ/R each move the cell's inflow exactly as one root carrying λ does (with
    the old rule η ∝ 1/λ_i, each replica stepped R times further and the loop gain grew with R)."""
    topo = topo3()
    xs = []
    for arrivals in (120.0, 30.0):  # one root's share vs a quarter of it
        r = RootRouter(topo, 0, PolicyConfig(Mechanism.FLOW, Cost.LATENCY), P, np.random.default_rng(0))
        for k in range(4):
            now = 0.2 * k
            probed(r, [20.0, 2.0, 9.0], now=now)
            r.note_arrivals(arrivals * 0.2)
            r.tick(now)
        xs.append(r.x.copy())
    np.testing.assert_allclose(xs[0], xs[1], atol=1e-12)
    assert not np.allclose(xs[0], np.array([4, 8, 2]) / 14)  # it did move


def test_flow_step_scale_does_not_collapse_below_the_knee() -> None:
    """Flow-Lat below the knee: ℓ' ≈ 0 there, but the step's scale is taken at N ≥ N_ref, so the same
    cost difference moves x by the same amount at any load below the reference (here the fleet's
    rate is above half of every cell's capacity, so N_ref is the 50 %-utilisation workload)."""
    topo = topo3()
    moves = []
    for load in (2.0, 5.0):  # both below the knee c = 8, where ℓ'(N) differs by a factor ~20
        r = RootRouter(topo, 0, PolicyConfig(Mechanism.FLOW, Cost.LATENCY, flow=FlowConfig(max_step=1.0)), P, np.random.default_rng(0))
        probed(r, [load, 11.0, 11.0], now=0.0)
        r.tick(0.0)
        fleet_rate = (load / float(latency(load, *P.as_array())) + 2 * 11.0 / float(latency(11.0, *P.as_array())))
        assert fleet_rate > 0.5 / P.b  # Λ̂ could push any cell past 50 %: the reference stays there
        moves.append(np.abs(r.x - np.array([4, 8, 2]) / 14).sum() * fleet_rate)
    assert moves[0] > 0 and moves[1] == pytest.approx(moves[0], rel=0.05)


def test_a_confidence_0_model_does_not_replace_a_learned_one() -> None:
    """A restarted leaf reports its configured prior with confidence 0: the root keeps the curve it learned
    (its RIF and health still count) until the leaf has measured something. In the core, so the simulator's
    roots and the control plane's flow loop follow the rule the root service does."""
    r = RootRouter(topo3(), 0, PolicyConfig.from_name("Disc-Lat"), P)
    r.on_probe(1, 0.0, 0.0, P, confidence=0.0)  # nothing learned yet: the prior is taken
    assert r.models.a[1] == P.a
    learned = LatencyParams(a=0.2, b=0.01, c=8.0, s=1.0)
    r.on_probe(1, 1.0, 2.0, learned, confidence=0.6)
    r.on_probe(1, 2.0, 5.0, LatencyParams(a=9.0, b=0.5, c=8.0, s=1.0), confidence=0.0)
    assert r.models.a[1] == 0.2 and r.view.confidence[1] == 0.6 and r.view.rif[1] == 5.0
    r.on_probe(1, 3.0, 5.0, LatencyParams(a=0.3, b=0.01, c=8.0, s=1.0), confidence=0.03)  # measured again
    assert r.models.a[1] == 0.3 and r.view.confidence[1] == 0.03


def test_at_low_fleet_load_the_step_is_sized_where_the_whole_fleet_could_take_a_cell() -> None:
    """The fleet at 10 % of one cell's capacity: no cell can get past Λ̂ = 2 req/s, so the gain at the
    50 %-utilisation workload (10 req/s) is one no reachable state has; sized at μ⁻¹(Λ̂) instead, the
    step is ~17× larger for Flow-Grad (the priors experiment: 122–178 s to find the right cell before,
    2 s after). At high fleet load (Λ̂ ≥ half of every cell's capacity) nothing changes."""
    topo = topo3()
    moved = {}
    for load in (0.67, 11.0):
        r = RootRouter(topo, 0, PolicyConfig(Mechanism.FLOW, Cost.GRADIENT, flow=FlowConfig(max_step=1.0)), P, np.random.default_rng(0))
        x0 = r.x.copy()
        probed(r, [load, load, load], now=0.0)
        r.tick(0.0)
        moved[load] = float(np.abs(r.x - x0).sum())
        lam = 3 * load / float(latency(load, *P.as_array()))
        n_ref = float(np.minimum(saturation_workload(*P.as_array(), 0.5), workload_at_rate(lam, *P.as_array())))
        assert (n_ref < 4.0) if load < 1 else (n_ref == float(saturation_workload(*P.as_array(), 0.5)))
    assert moved[0.67] > 0.1, moved  # the 50 %-reference rule moved 0.05 here (0.89 now)


def test_policy_names() -> None:
    assert PolicyConfig(Mechanism.FLOW, Cost.GRADIENT).name == "Flow-Grad"
    assert PolicyConfig(Mechanism.DISCRETE, Cost.RIF).name == "Disc-RIF"


def test_topology_validation() -> None:
    with pytest.raises(ValueError):
        Topology.build(["a", "a"], [1, 1], np.zeros((2, 2)))
    with pytest.raises(ValueError):
        Topology.build(["a", "b"], [1, 0], np.zeros((2, 2)))
    with pytest.raises(ValueError):
        Topology.build(["a", "b"], [1, 1], np.zeros((2, 2)), [[False, False], [True, True]])
    t = topo3([[True, False, True], [True, True, True], [False, False, True]])
    assert list(t.out_neighbors(0)) == [0, 2] and list(t.in_neighbors(0)) == [0, 1]
    with pytest.raises(ValueError):
        t.tau[0, 0] = 1.0  # read-only


@pytest.mark.parametrize("cost", list(Cost))
def test_cached_discrete_pick_equals_numpy_argmin(cost: Cost) -> None:
    """The per-request fast path (incremental Python-list costs) decides exactly as the vectorised costs."""
    rng = np.random.default_rng(7)
    t = Topology.build(["a", "b", "c", "d"], [2, 4, 1, 3], rng.uniform(0, 0.05, (4, 4)) * (1 - np.eye(4)))
    r = RootRouter(t, 1, PolicyConfig(Mechanism.DISCRETE, cost, stale_after_s=0.5), P, np.random.default_rng(1))
    now = 0.0
    for step in range(400):
        now += 0.01
        if step % 7 == 0:  # probes arrive for a random cell, sometimes with a new model
            j = int(rng.integers(4))
            model = LatencyParams(rng.uniform(0.5, 2), rng.uniform(0.01, 0.1), rng.uniform(1, 10), 1.0) if rng.random() < 0.5 else None
            if model is not None and not model.is_stable_shape():
                model = None
            r.on_probe(j, now, float(rng.integers(0, 30)), model)
        if step % 53 == 0:
            r.set_available(int(rng.integers(4)), bool(rng.random() < 0.7))
        usable = r.usable(now)
        want = np.where(usable, r.costs(now), np.inf)
        cell = r.pick(now)
        if not usable.any():
            assert cell == NO_CELL
            continue
        assert usable[cell] and want[cell] <= want.min() * (1 + 1e-9) + 1e-12, (step, cell, want)


def test_flow_pick_follows_x_after_external_update() -> None:
    r = probed(RootRouter(topo3(), 0, PolicyConfig(Mechanism.FLOW, Cost.LATENCY), P, np.random.default_rng(0)), [0, 0, 0])
    r.x = np.array([0.0, 0.0, 1.0])  # e.g. weights from the control plane
    assert {r.pick(0.1) for _ in range(200)} == {2}


def test_smooth_split_keeps_every_prefix_of_the_stream_within_one_request_of_x() -> None:
    """FlowConfig.smooth_split: counts follow x exactly over every prefix (random sampling drifts by
    √n), cells with no weight are never picked, and a new x is followed from the next request."""
    pol = PolicyConfig(Mechanism.FLOW, Cost.LATENCY, flow=FlowConfig(smooth_split=True, pick="sample"))
    r = probed(RootRouter(topo3(), 0, pol, P, np.random.default_rng(0)), [0, 0, 0])
    r.x = np.array([0.5, 0.3, 0.2])
    counts = np.zeros(3)
    for k in range(1, 101):
        counts[r.pick(0.1)] += 1
        assert np.all(np.abs(counts - k * r.x) <= 1.0 + 1e-9), (k, counts)
    r.x = np.array([0.0, 1.0, 0.0])
    assert {r.pick(0.1) for _ in range(20)} == {1}
    sampled = probed(RootRouter(topo3(), 0, PolicyConfig(Mechanism.FLOW, Cost.LATENCY, flow=FlowConfig(pick="sample")), P, np.random.default_rng(0)), [0, 0, 0])
    sampled.x = np.array([0.5, 0.3, 0.2])
    drift = np.zeros(3)
    worst = 0.0
    for k in range(1, 401):
        drift[sampled.pick(0.1)] += 1
        worst = max(worst, float(np.abs(drift - k * sampled.x).max()))
    assert worst > 2.0  # the default (sampling) does drift: the test above can tell them apart


def _two_cells() -> Topology:
    return Topology.build(["a", "b"], [4, 4], [[0, 0.01], [0.01, 0]])


def test_two_choice_sends_the_next_requests_away_from_a_cell_far_above_its_share() -> None:
    """FlowConfig.pick two-choice: two cells drawn from x, the cheaper now wins, so with x = ½/½ a cell
    whose RIF is far above the other's gets only the draws where both land on it (¼), where sampling
    gives it its ½ whatever its state."""
    counts = {}
    for pick in ("sample", "two-choice"):
        pol = PolicyConfig(Mechanism.FLOW, Cost.RIF, flow=FlowConfig(pick=pick))
        r = probed(RootRouter(_two_cells(), 0, pol, P, np.random.default_rng(3)), [400, 0])
        r.x = np.array([0.5, 0.5])
        counts[pick] = sum(r.pick(0.1) == 0 for _ in range(400))
    assert counts["sample"] > 160  # ~200
    assert counts["two-choice"] < 130  # ~100: only when both draws are cell 0


def test_two_choice_follows_x_when_x_gives_every_cell_the_same_load_per_server() -> None:
    """At the flow's fixed point the costs of the cells in use are equal; the comparison then only
    corrects fluctuations and the long-run split is x (RIF cost, x ∝ servers, a probe every 14 picks
    that has seen every send)."""
    pol = PolicyConfig(Mechanism.FLOW, Cost.RIF, flow=FlowConfig(pick="two-choice"))
    r = probed(RootRouter(topo3(), 0, pol, P, np.random.default_rng(5)), [0, 0, 0])
    r.x = np.array([4.0, 8.0, 2.0]) / 14.0
    counts = np.zeros(3)
    for k in range(1400):
        now = 0.001 * k
        if k % 14 == 0:
            probed(r, [0, 0, 0], now=now)
        counts[r.pick(now)] += 1
    np.testing.assert_allclose(counts / counts.sum(), r.x, atol=0.02)


def test_flow_pick_is_validated() -> None:
    with pytest.raises(ValueError):
        FlowConfig(pick="least")
    with pytest.raises(ValueError):
        FlowConfig(pick="two-choice", smooth_split=True)


def test_bench_pick_smoke() -> None:
    from dlb.bench.pick import measure

    recs = measure(decisions=200, cells=(3,))
    assert len(recs) == 9 and all(r["pick_us"] > 0 and r["baseline_us"] > 0 for r in recs)


def test_a_busy_small_cell_does_not_stall_the_step_between_big_ones() -> None:
    """Per-cell scale (the default): each arc moves at its own cell's sensitivity g_j. Under one mean
    ĝ, a small cell near its capacity (g ∝ (1 − ρ)⁻³, huge) shrank every arc's step, so flow between
    two big cells with different costs barely moved (the fluid model's C12 stayed 5.7 % above the
    optimum at 600 s; docs/theory.md, "Per-cell scale")."""
    big, small = LatencyParams(0.5, 0.002, 200.0, 30.0), LatencyParams(0.5, 0.1, 3.0, 0.5)
    topo = Topology.build(["a", "b", "small"], [8, 8, 1], np.full((3, 3), 0.01))
    xs = {}
    for per_cell in (True, False):
        r = RootRouter(topo, 0, PolicyConfig(Mechanism.FLOW, Cost.GRADIENT, flow=FlowConfig(per_cell_scale=per_cell)), big)
        r.x = np.array([0.45, 0.45, 0.10])
        for k in range(10):
            for j, (n, p) in enumerate(((320.0, big), (150.0, big), (60.0, small))):  # a busier than b; small at ~96 %
                r.on_probe(j, 0.2 * k, n, p)
            r.tick(0.2 * k)
        xs[per_cell] = r.x.copy()
    assert xs[True][0] < 0.36  # 2 s: a third of a's flow has moved to b
    assert xs[False][0] > 0.44  # the mean-ĝ step: stalled
    assert FlowConfig().per_cell_scale


def test_a_cell_reported_with_no_server_is_no_fallback_but_a_stale_one_is() -> None:
    """The retry's last resort (:func:`dlb.core.fallback.next_best`'s ``allowed``): a cell whose probes are
    only late may serve a retried request; one whose leaf said every server is down, or whose probes fail,
    would answer it 503 in place of the refusal it was retried for."""
    r = probed(RootRouter(topo3(), 0, PolicyConfig(Mechanism.DISCRETE, Cost.RIF), P, np.random.default_rng(0)), [0, 0, 0])
    assert r.fallback_candidates() == [0, 1, 2]
    r.on_probe(1, 1.0, 0, P, replicas=0)  # every server of cell 1 down
    r.set_available(2, False)  # cell 2's probes fail
    assert r.fallback_candidates() == [0]
    r.on_probe(1, 2.0, 0, P, replicas=4)
    late = 2.0 + r.policy.stale_after_s + 1.0  # no probe for longer than stale_after_s: unusable, still a candidate
    assert not r.usable(late)[1] and r.fallback_candidates() == [0, 1]


def test_a_recovered_cells_aversion_reaches_zero() -> None:
    """It decayed geometrically and never reached 0: 7e-42 two minutes after the errors stopped, so an
    operator's alert on ``dlb_root_aversion_rate == 0`` never cleared."""
    cfg = AversionConfig()
    rates = np.array([0.9, 0.0])
    for _ in range(12):  # 0.9 × 0.5^10 < 1e-3
        rates = update_aversion(rates, np.zeros(2), np.ones(2, bool), cfg)
    assert rates.tolist() == [0.0, 0.0]
    assert update_aversion(np.array([0.9, 0.0]), np.zeros(2), np.ones(2, bool), cfg)[0] == 0.45  # the decay itself unchanged


def test_a_long_session_id_is_kept_as_a_fixed_size_digest() -> None:
    """The cache kept each client's raw ``x-session-id``: 58-KB ids grew a root ~54 KB per request."""
    import sys

    from dlb.core.affinity import KEY_CHARS, AffinityCache

    cache = AffinityCache(1000, 600.0)
    long_ids = [f"{i}-".ljust(58_000, "s") for i in range(50)]
    for i, sid in enumerate(long_ids):
        cache.put(sid, i % 3, 0.0)
    cache.put("a-short-uuid", 2, 0.0)
    assert [cache.get(sid, 1.0) for sid in long_ids] == [i % 3 for i in range(50)]  # still one entry per session
    assert cache.get("a-short-uuid", 1.0) == 2 and len(cache) == 51
    assert max(sys.getsizeof(k) for k in cache._map) < 2 * KEY_CHARS + 100
