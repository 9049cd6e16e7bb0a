"""BF-IO's pure algorithm (dlb/core/bfio.py) against brute force and its own definitions."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlb.core.bfio import (
    PICK_POINTS,
    DpBalancer,
    GreedyPicker,
    assign_batch_milp,
    horizon_quadrature,
    imbalance,
    predicted_workload,
    survival,
)


def _objective(kv: np.ndarray, n: np.ndarray, adds: list[tuple[int, float]], horizon: int, mean: float) -> float:
    """Σ_h (max − mean) of the predicted workload after placing ``adds`` — the definition, computed naively."""
    kv2, n2 = kv.astype(float).copy(), n.astype(float).copy()
    for k, p in adds:
        kv2[k] += p
        n2[k] += 1
    return imbalance(predicted_workload(kv2, n2, horizon, mean))


@settings(max_examples=200, deadline=None)
@given(
    kv=st.lists(st.integers(0, 5000), min_size=1, max_size=6),
    n_seed=st.integers(0, 10_000),
    prompt=st.integers(1, 3000),
    horizon=st.sampled_from([0, 1, 3, 10, 50]),
    mean=st.sampled_from([2.0, 20.0, 256.0]),
)
def test_greedy_pick_minimises_predicted_imbalance(kv: list[int], n_seed: int, prompt: int, horizon: int,
                                                   mean: float) -> None:  # fmt: skip
    rng = np.random.default_rng(n_seed)
    kv_a = np.array(kv, dtype=float)
    n_a = rng.integers(0, 20, len(kv)).astype(float)
    k = GreedyPicker(horizon, mean, points=None).pick(kv_a, n_a, float(prompt))  # the exact horizon sum
    costs = [_objective(kv_a, n_a, [(g, prompt)], horizon, mean) for g in range(len(kv))]
    assert costs[k] <= min(costs) + 1e-6 * max(1.0, min(costs))


@settings(max_examples=100, deadline=None)
@given(horizon=st.integers(0, 400), mean=st.sampled_from([1.0, 2.0, 20.0, 256.0, 5000.0]), points=st.integers(1, 16),
       alpha=st.floats(-1e4, 1e4), beta=st.floats(-100, 100))
def test_horizon_quadrature_is_exact_for_lines(horizon: int, mean: float, points: int, alpha: float, beta: float) -> None:
    """Each bin's point and weight reproduce Σ q^h (α + βh) exactly: the request-path picker's cost is
    exact wherever the BF-IO cost is linear in h, with at most ``points`` points whatever H."""
    hs = np.arange(horizon + 1, dtype=float)
    qh = survival(mean) ** hs
    pts, w = horizon_quadrature(horizon, mean, points)
    assert len(pts) <= min(points, horizon + 1) and np.all(np.diff(pts) > 0) and pts[0] >= 0 and pts[-1] <= horizon
    want = float((qh * (alpha + beta * hs)).sum())
    assert float((w * (alpha + beta * pts)).sum()) == pytest.approx(want, rel=1e-9, abs=1e-6 * (abs(alpha) + abs(beta) * horizon + 1))


def test_request_path_picker_works_on_a_fixed_number_of_points() -> None:
    """H = 200 costs the picker 12 horizon points, not 201 (why ``dlb bfio bench`` is flat in H), and
    on a loaded 32-rank state it still picks the exact sum's rank."""
    rng = np.random.default_rng(3)
    kv, n = rng.uniform(10_000, 60_000, 32), rng.integers(32, 64, 32).astype(float)
    quad, exact = GreedyPicker(200, 256.0), GreedyPicker(200, 256.0, points=None)
    assert len(quad.hs) == PICK_POINTS and len(exact.hs) == 201
    assert all(quad.pick(kv, n, p) == exact.pick(kv, n, p) for p in (16.0, 600.0, 4000.0))


def test_ties_go_to_the_least_predicted_rank() -> None:
    # Rank 0 is far heaviest: a small request raises no maximum anywhere, so the tie-break decides.
    kv = np.array([10_000.0, 300.0, 100.0, 200.0])
    n = np.array([4.0, 4.0, 4.0, 4.0])
    assert GreedyPicker(10, 100.0).pick(kv, n, 50.0) == 2


def test_horizon_sees_growth_that_the_current_step_does_not() -> None:
    # Rank 0 holds less KV now but many more requests, so it overtakes rank 1 within a few steps.
    kv = np.array([1000.0, 1200.0])
    n = np.array([60.0, 2.0])
    assert GreedyPicker(0, 1000.0).pick(kv, n, 100.0) == 0
    assert GreedyPicker(50, 1000.0).pick(kv, n, 100.0) == 1


def test_pick_respects_allowed_mask() -> None:
    kv, n = np.array([0.0, 500.0, 900.0]), np.array([0.0, 1.0, 1.0])
    assert GreedyPicker(5, 50.0).pick(kv, n, 10.0, np.array([False, False, True])) == 2
    with pytest.raises(ValueError):
        GreedyPicker(5, 50.0).pick(kv, n, 10.0, np.array([False, False, False]))


@pytest.mark.parametrize("seed", range(4))
def test_milp_batch_is_optimal_on_small_instances(seed: int) -> None:
    rng = np.random.default_rng(seed)
    g, m, horizon, mean = 3, 4, 3, 10.0
    kv = rng.integers(0, 2000, g).astype(float)
    n = rng.integers(0, 5, g).astype(float)
    prompts = rng.integers(1, 1500, m).astype(float).tolist()
    got = assign_batch_milp(kv, n, prompts, horizon, mean)
    best = min(_objective(kv, n, list(zip(a, prompts, strict=True)), horizon, mean) for a in itertools.product(range(g), repeat=m))
    assert _objective(kv, n, list(zip(got, prompts, strict=True)), horizon, mean) == pytest.approx(best, rel=1e-6)


def test_milp_respects_capacity() -> None:
    kv, n = np.array([0.0, 10_000.0]), np.array([0.0, 0.0])
    got = assign_batch_milp(kv, n, [100.0, 100.0, 100.0], 2, 10.0, capacity=np.array([1, 5]))
    assert got.count(0) == 1


def test_balancer_tracks_residents_and_decoded_tokens() -> None:
    b = DpBalancer(ranks=2, policy="bf-io", horizon=5, mean_decode_tokens=100.0, step_s=0.01)
    r1 = b.assign(0.0, "a", 1000)
    r2 = b.assign(0.0, "b", 1000)
    assert {r1, r2} == {0, 1}
    assert b.assign(0.0, "a", 1000) == r1  # a duplicate start keeps its rank
    # 1 s at 10 ms per token: each request has decoded 100 tokens.
    assert b.kv(1.0).tolist() == pytest.approx([1100.0, 1100.0])
    assert b.finish("a", 2.0, duration_s=2.0) == r1
    assert b.kv(1.0)[r1] == 0.0 and b.n[r1] == 0
    assert b.step_s == pytest.approx(0.01 + 0.1 * (2.0 / 100.0 - 0.01))
    assert b.finish("nope", 1.0) is None


def test_workload_policies_fill_free_slots_then_keep_counts_level() -> None:
    b = DpBalancer(ranks=3, policy="bf-io", horizon=5, mean_decode_tokens=50.0, slots=2)
    for i, p in enumerate([100, 100, 100, 100, 100]):
        b.assign(0.0, f"r{i}", p)
    # Two ranks hold two requests (full), one holds one: the next request must go to the free slot
    # even though a huge prompt would rather avoid it.
    assert b.n.tolist().count(2) == 2
    free = int(np.argmin(b.n))
    assert b.assign(0.0, "big", 50_000) == free
    # Every rank full: placement among the ranks within count_slack (here 1) of the fewest residents,
    # so counts never drift more than slack + 1 apart however the prompts come.
    assert b.open_ranks().all()
    rng = np.random.default_rng(5)
    for i in range(60):
        b.assign(float(i), f"q{i}", float(rng.choice([10, 20_000])))
        assert b.n.max() - b.n.min() <= 2
    # Without slack a full group leaves no choice (JSQ); a huge prompt goes to the least-count rank.
    c = DpBalancer(ranks=2, policy="least-kv", count_slack=0)
    c.assign(0.0, "a", 10)
    assert c.assign(0.0, "b", 10_000) == 1


def test_requests_past_the_slots_wait_without_kv_and_run_when_a_slot_frees() -> None:
    b = DpBalancer(ranks=1, policy="bf-io", mean_decode_tokens=10.0, step_s=0.1, slots=2)
    for rid in ("a", "b", "c"):
        b.assign(0.0, rid, 1000)
    assert b.n[0] == 3 and b.nrun[0] == 2 and list(b.queues[0]) == ["c"]
    assert b.kv(1.0)[0] == pytest.approx(2 * (1000 + 10))  # only the two running ones hold KV and decode
    b.finish("a", 1.0, duration_s=1.0)
    assert b.nrun[0] == 2 and not b.queues[0]  # "c" promoted, decoding from t = 1
    assert b.kv(2.0)[0] == pytest.approx((1000 + 20) + (1000 + 10))
    b.assign(2.0, "d", 5)
    b.finish("d", 2.5)  # left while waiting: gone from the queue, no KV change
    assert b.n[0] == 2 and not b.queues[0]


def test_jsq_and_round_robin_balance_counts() -> None:
    for policy in ("jsq", "round-robin"):
        b = DpBalancer(ranks=4, policy=policy)
        ranks = [b.assign(0.0, f"r{i}", 10 if i % 2 else 5000) for i in range(8)]
        assert sorted(ranks) == [0, 0, 1, 1, 2, 2, 3, 3], policy


def test_bad_settings_are_named() -> None:
    with pytest.raises(ValueError, match="policy"):
        DpBalancer(ranks=2, policy="random")
    with pytest.raises(ValueError, match="dp_ranks"):
        DpBalancer(ranks=0)
    with pytest.raises(ValueError, match="mean_decode_tokens"):
        GreedyPicker(3, 0.5)


def _dp_config(**dp: object) -> dict[str, object]:
    return {
        "version": 1,
        "cells": [{"name": "a", "leaf": {"address": "127.0.0.1:10010", "probe": "127.0.0.1:9010"},
                   "servers": [{"address": "127.0.0.1:8100", **dp}, "127.0.0.1:8200"]}],
        "endpoints": [{"name": "m", "match": {"prefix": "/v1/"}}],
    }


def test_config_dp_group_fields_and_rank_ports() -> None:
    from dlb.config import config_from_dict

    cfg = config_from_dict(_dp_config(dp_ranks=4, policy="jsq", horizon=50))
    s = cfg.cells[0].servers[0]
    assert s.dp is not None and (s.dp.ranks, s.dp.policy, s.dp.horizon) == (4, "jsq", 50)
    assert [a.port for a in s.rank_addresses()] == [8100, 8101, 8102, 8103]
    assert cfg.cells[0].servers[1].dp is None


@pytest.mark.parametrize(
    ("dp", "path", "reason"),
    [
        ({"dp_ranks": 2, "policy": "random"}, "servers[0].policy", "not one of"),
        ({"policy": "bf-io"}, "servers[0].policy", "dp_ranks > 1"),
        ({"dp_ranks": 0}, "servers[0].dp_ranks", ">= 1"),
        ({"dp_ranks": 2, "horizon": -1}, "servers[0].horizon", ">= 0"),
        ({"dp_ranks": 200}, "servers[1].address", "servers[0].dp_ranks"),  # rank 100 is the other server
        ({"dp_ranks": 2, "hold_queue": 8, "hold_early": 1.5}, "servers[0].hold_early", "<= 0.99"),
        ({"dp_ranks": 2, "policy": "jsq", "hold_queue": 8, "hold_early": 0.1}, "servers[0].hold_early", "bf-io"),
        ({"dp_ranks": 2, "hold_early": 0.1}, "servers[0].hold_early", "hold_queue > 0"),
        ({"hold_early": 0.1}, "servers[0].hold_early", "dp_ranks > 1"),
    ],
)
def test_config_dp_group_errors_name_the_field(dp: dict[str, object], path: str, reason: str) -> None:
    from dlb.config import ConfigError, config_from_dict

    with pytest.raises(ConfigError) as info:
        config_from_dict(_dp_config(**dp))
    assert any(path in p.path and reason in p.reason for p in info.value.problems), info.value.problems


def test_hold_early_reaches_the_leafs_rank_picker() -> None:
    """``hold_early`` from the file sets when the leaf's BF-IO starts holding; unset, the default."""
    from dlb.config import config_from_dict
    from dlb.ext_proc.leaf_setup import state_from_config

    for dp, expect in (({}, 0.25), ({"hold_early": 0.0}, 0.0), ({"hold_early": 0.5}, 0.5)):
        cfg = config_from_dict(_dp_config(dp_ranks=4, policy="bf-io", max_num_seqs=8, hold_queue=16, **dp))
        assert cfg.cells[0].servers[0].dp.hold_early == expect
        bal, _ = state_from_config(cfg, "a", choices=1, seed=0).dp_groups[0]
        assert bal.hold_early == expect


def test_leaf_state_hands_dp_picks_to_the_group_policy() -> None:
    from dlb.config import config_from_dict
    from dlb.ext_proc.leaf_setup import state_from_config
    from dlb.ext_proc.leaf_state import Completion

    cfg = config_from_dict(_dp_config(dp_ranks=4, policy="bf-io", horizon=10, mean_decode_tokens=100, max_num_seqs=100))
    st = state_from_config(cfg, "a", choices=1, seed=0)
    assert len(st.servers) == 5 and len(st.dp_groups) == 1
    bal, members = st.dp_groups[0]
    picked = []
    for k in range(40):
        i = st.pick(0.0, f"r{k}", content_length=8000 if k % 4 == 0 else 400)  # 2000 or 100 prompt tokens at 4 B each
        picked.append(st.servers[i].address)
    on_dp = [a for a in picked if a in members]
    assert on_dp and int(bal.n.sum()) == len(on_dp)
    kv = bal.kv(0.0)
    assert kv.max() - kv.min() <= 2000.0  # BF-IO spread the big prompts instead of stacking them
    # Completions from the access log close the residents and refine the step time.
    for k, a in enumerate(picked):
        st.complete(5.0, Completion(request_id=f"r{k}", upstream=a, status=200, duration_s=5.0))
    assert bal.n.sum() == 0 and not bal.residents
    assert bal.step_s > 0.02  # 5 s over 100 tokens says 50 ms per step


def test_leaf_with_only_a_dp_group_skips_the_server_pick_but_not_health() -> None:
    """A cell whose servers are all ranks of one group goes straight to the group's policy; an ejected
    rank is still never picked, and a server added later (not a rank) turns the shortcut off."""
    from dlb.config import config_from_dict
    from dlb.ext_proc.leaf_setup import state_from_config

    raw = _dp_config(dp_ranks=4, policy="jsq", max_num_seqs=100)
    raw["cells"][0]["servers"] = raw["cells"][0]["servers"][:1]  # type: ignore[index]
    st = state_from_config(config_from_dict(raw), "a", choices=1, seed=0)
    bal, members = st.dp_groups[0]
    sole = st._sole_group()
    assert sole is not None and sole[0] is bal
    st.servers[st.by_address[members[2]]].ejected_until = 1e9
    picked = [st.servers[st.pick(0.0, f"r{k}", 400)].address for k in range(9)]
    assert members[2] not in picked and sorted(set(picked)) == sorted(set(members) - {members[2]})
    assert bal.n.tolist() == [3.0, 3.0, 0.0, 3.0]  # JSQ among the healthy ranks, as with the server pick
    st.set_servers([(a, 1.0) for a in members] + [("127.0.0.1:8200", 1.0)])
    assert st._sole_group() is None


def test_placement_simulation_finishes_every_request_under_both_placements() -> None:
    """``dlb bfio placement``: each placement and policy serves every request of a small overloaded run."""
    from dlb.bench.bfio_placement import PlacementRun, simulate
    from dlb.emulator.profile import BUILTIN_PROFILES

    for placement in ("central", "arrival"):
        for policy in ("jsq", "bf-io"):
            r = simulate(placement, policy, PlacementRun(4, 4, 1.5, 64, 1, BUILTIN_PROFILES["llama-8b-h100"], mean_decode=16.0))
            assert r.requests == 64 and 0.0 <= r.idle_frac < 1.0 and r.mean_steps >= 1.0
    with pytest.raises(ValueError, match="placement"):
        simulate("later", "jsq", PlacementRun(4, 4, 1.5, 8, 1, BUILTIN_PROFILES["llama-8b-h100"]))


def test_held_run_model_serves_every_request_and_bfio_uses_the_backlog() -> None:
    """``dlb bfio heldrun``: every request of a small held run finishes under each policy, and with a long
    backlog and prefill elsewhere BF-IO's release (the leaf's own code) idles well below JSQ's FIFO."""
    from dlb.bench.bfio_heldrun import HeldRun, simulate

    runs = {pol: simulate(pol, HeldRun(4, 8, requests=240, rate=17.5, time_scale=4, seed=1, prefill=False))
            for pol in ("jsq", "bf-io", "round-robin", "least-kv")}  # fmt: skip
    for r in runs.values():
        assert r.requests == 240 and r.backlog_steps > 50 and 0.0 < r.idle_frac < 1.0
    assert runs["bf-io"].idle_frac_backlog < 0.6 * runs["jsq"].idle_frac_backlog
    fifo = simulate("bf-io", HeldRun(4, 8, requests=240, rate=17.5, time_scale=4, seed=1, prefill=False, window=1))
    assert fifo.idle_frac_backlog > runs["bf-io"].idle_frac_backlog  # the choice among held requests is the gain
