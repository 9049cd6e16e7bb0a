"""BF-IO's pure algorithm (dlb/core/bfio.py) against brute force and its own definitions."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlb.core.bfio import DpBalancer, GreedyPicker, assign_batch_milp, imbalance, predicted_workload


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
    k = GreedyPicker(horizon, mean).pick(kv_a, n_a, float(prompt))
    costs = [_objective(kv_a, n_a, [(g, prompt)], horizon, mean) for g in range(len(kv))]
    assert costs[k] <= min(costs) + 1e-6 * max(1.0, min(costs))


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
    best = min(_objective(kv, n, list(zip(a, prompts)), horizon, mean) for a in itertools.product(range(g), repeat=m))
    assert _objective(kv, n, list(zip(got, prompts)), horizon, mean) == pytest.approx(best, rel=1e-6)


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
    assert b.finish("a", 1.0, duration_s=2.0) == r1
    assert b.kv(1.0)[r1] == 0.0 and b.n[r1] == 0
    assert b.step_s == pytest.approx(0.01 + 0.1 * (2.0 / 100.0 - 0.01))
    assert b.finish("nope", 1.0) is None


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
