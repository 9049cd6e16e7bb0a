"""Prequal's pick (probe pool + hot-cold rule on tokens waiting), alone and inside the leaf's state."""

from __future__ import annotations

import random

import numpy as np
import pytest

from dlb.core.estimator import EstimatorConfig
from dlb.core.latency_model import LatencyParams
from dlb.core.server_pick import PrequalConfig, ProbePool, quantile
from dlb.ext_proc.leaf_state import Completion, LeafState, ServerState


def pool(**kw: float) -> ProbePool:
    return ProbePool(PrequalConfig(**kw), random.Random(0))


def test_quantile_is_one_of_the_values() -> None:
    assert quantile([5.0, 1.0, 3.0, 2.0], 0.5) == 2.0
    assert quantile([5.0, 1.0, 3.0, 2.0], 0.84) == 5.0
    assert quantile(list(map(float, range(16))), 0.84) == 13.0


def test_cold_server_with_fewest_tokens_wins_over_fewest_requests() -> None:
    state = {0: (1.0, 4000.0), 1: (3.0, 300.0), 2: (2.0, 900.0)}  # (RIF, tokens waiting)
    p = pool(probes_per_pick=3)
    assert p.pick(0.0, [0, 1, 2], state.__getitem__, 100.0) == 1


def test_hot_server_is_skipped_even_with_fewest_tokens() -> None:
    # 16 probes: the two above the 0.84 quantile (RIF 13) are hot; server 15 has the most requests, fewest tokens.
    state = {i: (float(i), 1000.0 - i) for i in range(15)}
    state[15] = (40.0, 1.0)
    p = pool(probes_per_pick=16, pool_size=16)
    assert p.pick(0.0, list(range(16)), state.__getitem__, 1.0) == 13  # fewest tokens among the cold


def test_probe_is_charged_and_reused_then_dropped() -> None:
    calls: list[int] = []

    def probe(s: int) -> tuple[float, float]:
        calls.append(s)
        return (0.0, 0.0) if s == 0 else (5.0, 5000.0)

    p = pool(probes_per_pick=1, pool_size=4, max_uses=2, max_age_s=10.0)
    picks = [p.pick(float(t), [0, 1], probe, 1000.0) for t in range(6)]
    # Server 0's answer is charged with each request it takes, so a burst does not pile onto one stale "idle" probe.
    assert picks.count(0) >= 1 and all(pr.uses < 2 for pr in p.probes)
    assert all(pr.at >= 0.0 for pr in p.probes) and len(p.probes) <= 4


def test_expired_probes_leave_the_pool() -> None:
    p = pool(probes_per_pick=1, max_age_s=1.0, max_uses=100)
    p.pick(0.0, [0, 1, 2, 3], lambda s: (0.0, 0.0), 1.0)
    p.pick(5.0, [0, 1, 2, 3], lambda s: (0.0, 0.0), 1.0)
    assert [pr.at for pr in p.probes] == [5.0]


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="hot_quantile"):
        PrequalConfig(hot_quantile=0.0)
    with pytest.raises(ValueError, match="pool_size"):
        PrequalConfig(probes_per_pick=4, pool_size=2)


# -- in the leaf -----------------------------------------------------------------------------------------


def leaf(n: int = 2, **kw: object) -> LeafState:
    servers = [ServerState(f"10.0.0.{i}:80") for i in range(n)]
    return LeafState(cell="c", servers=servers, replicas=n, prior=LatencyParams(0.1, 0.01, 4.0, 1.0), choices=n,
                     rng=np.random.default_rng(0), estimator_config=EstimatorConfig(window_s=60, refit_period_s=1),
                     pick_rule="prequal", prequal=PrequalConfig(probes_per_pick=n), **kw)  # type: ignore[arg-type]


def test_leaf_balances_tokens_not_request_counts() -> None:
    """One 16 kB prompt (≈ 4 k tokens) on server 0 outweighs two short chats on server 1: the next request
    goes to server 1, where the RIF rule would send it to server 0."""
    st = leaf(2, expected_output_tokens=0.0)
    st.start(0.0, "long", 0, st.request_tokens(16_000))
    st.start(0.0, "a", 1, st.request_tokens(400))
    st.start(0.0, "b", 1, st.request_tokens(400))
    assert st.pick(0.0, "next", 400) == 1
    rif = leaf(2, expected_output_tokens=0.0)
    rif.pick_rule = "rif"
    rif.start(0.0, "long", 0, 4000.0)
    rif.start(0.0, "a", 1, 100.0)
    rif.start(0.0, "b", 1, 100.0)
    assert rif.pick(0.0, "next", 400) == 0


def test_leaf_tokens_are_released_on_completion_and_expiry() -> None:
    st = leaf(2)
    st.pick(0.0, "r1", 4000)
    st.pick(0.0, "r2", 40)
    assert sum(s.tokens for s in st.servers) == pytest.approx(1000 + 10 + 2 * st.expected_output_tokens)
    st.complete(1.0, Completion("r1", "", 200, 0.5))
    st.expire(10_000.0)
    assert all(s.tokens == pytest.approx(0.0) and s.rif == 0 for s in st.servers)


def test_full_kv_cache_reads_hot() -> None:
    st = leaf(2)
    st.on_scrape(0, 0.0, 0.0, 0.99)  # idle but its KV cache is full: cannot admit
    st.on_scrape(1, 3.0, 0.0, 0.40)
    assert {st.pick(float(t), f"r{t}", 100) for t in range(3)} == {1}


def test_scraped_load_counts_as_tokens_of_the_mean_request_size() -> None:
    st = leaf(2, expected_output_tokens=0.0)
    st.start(0.0, "seen", 1, 500.0)  # mean request size the leaf has seen: 500 tokens
    st.on_scrape(0, 4.0, 2.0, 0.1)  # 6 requests from elsewhere ≈ 3000 tokens > server 1's 500
    assert st.pick(0.0, "next", 400) == 1
