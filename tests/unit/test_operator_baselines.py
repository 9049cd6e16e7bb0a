"""Operator baselines (DESIGN §3): Envoy's priority load, outlier ejection, least request, hub score."""

from __future__ import annotations

import numpy as np
import pytest

from dlb.core.operator_baselines import (
    HubScoreRoot,
    LocalityFailoverRoot,
    LrGlobalRoot,
    OutlierConfig,
    OutlierDetector,
    host_offsets,
    hub_scores,
    least_request_p2c,
    priority_loads,
)
from dlb.core.router import NO_CELL
from dlb.core.topology import Topology


@pytest.mark.parametrize(("p0", "p1", "want"), [
    # Envoy's "Priority levels" table (overprovisioning factor 1.4), healthy % of P0 and P1.
    (100, 100, [100, 0]),
    (72, 72, [100, 0]),
    (71, 71, [99, 1]),
    (50, 50, [70, 30]),
    (25, 100, [35, 65]),
    (25, 25, [50, 50]),
])
def test_priority_load_matches_envoys_documented_table(p0: int, p1: int, want: list[int]) -> None:
    assert priority_loads([p0, p1], [100, 100]) == want


def test_priority_load_spills_in_order_and_sums_to_100() -> None:
    # P0 at 20 % healthy → 28; P1 at 40 % → 56; P2 takes the rest (16) though fully healthy.
    assert priority_loads([2, 4, 10], [10, 10, 10]) == [28, 56, 16]
    loads = priority_loads([1, 1, 1], [5, 5, 5])  # each 28, sum 84 → scaled to 100
    assert sum(loads) == 100 and loads[0] >= loads[1] == loads[2]
    assert priority_loads([0, 0], [4, 4]) == [50, 50]  # total panic: by host count


def test_total_panic_splits_by_host_count_not_health() -> None:
    # 20 % healthy everywhere: health 28 + 28 < 100 and both under the 50 % panic threshold.
    assert priority_loads([2, 6], [10, 30]) == [25, 75]
    assert priority_loads([2, 6], [10, 30], panic_percent=0.0) == [50, 50]  # panic off: by health
    # One priority above the threshold: no total panic, health decides (35 + 84 ≥ 100 → spill-over).
    assert priority_loads([25, 60], [100, 100]) == [35, 65]


def test_outlier_ejects_after_five_consecutive_5xx_and_un_ejects_after_base_time() -> None:
    od = OutlierDetector(20)
    for k in range(4):
        assert not od.record(3, False, float(k))
    od.record(3, True, 4.0)  # a success resets the run
    for k in range(4):
        assert not od.record(3, False, 5.0 + k)
    assert od.record(3, False, 9.0)
    assert od.ejected(3, 9.0) and od.ejected(3, 38.9)
    assert not od.ejected(3, 39.0)  # base ejection time 30 s


def test_outlier_ejection_time_grows_with_repeat_ejections_and_respects_max_percent() -> None:
    od = OutlierDetector(20, OutlierConfig())
    for _ in range(5):
        od.record(0, False, 0.0)
    for _ in range(5):  # straight after un-ejection: multiplier 2 → 60 s
        od.record(0, False, 30.0)
    assert od.ejected(0, 89.0) and not od.ejected(0, 90.0)
    for _ in range(5):
        od.record(1, False, 31.0)
    assert od.ejected(1, 31.0)
    for _ in range(5):  # 2 of 20 ejected = 10 %: Envoy's default cap, no third
        od.record(2, False, 32.0)
    assert not od.ejected(2, 32.0)


def test_p2c_prefers_the_less_loaded_host() -> None:
    rng = np.random.default_rng(0)
    active = [0, 10]
    picks = [least_request_p2c([0, 1], active, rng) for _ in range(2000)]
    # Host 1 wins only when both draws are host 1: probability 1/4.
    assert 0.70 < picks.count(0) / 2000 < 0.80


def test_lr_global_counts_its_own_active_requests_and_skips_ejected_hosts() -> None:
    t = Topology.build(["a", "b"], [2, 2], [[0, 0.05], [0.05, 0]])
    assert host_offsets([2, 2]) == [0, 2, 4]
    root = LrGlobalRoot(t, 0, np.random.default_rng(1), OutlierConfig(max_ejection_percent=100.0))
    hosts = [root.pick_server(0.0) for _ in range(400)]
    assert set(hosts) == {0, 1, 2, 3}
    assert max(root.active) - min(root.active) <= 8  # P2C keeps them level (random: spread ~±17)
    for h in hosts:
        root.on_reply(1.0, h, True)
    assert root.active == [0, 0, 0, 0]
    for _ in range(5):
        root.active[2] += 1
        root.on_reply(2.0, 2, False)
    assert 2 not in {root.pick_server(3.0) for _ in range(200)}
    assert 2 in {root.pick_server(40.0) for _ in range(200)}  # un-ejected after 30 s


def test_lr_global_sees_servers_down_through_health_checks() -> None:
    t = Topology.build(["a", "b"], [4, 4], [[0, 0.05], [0.05, 0]])
    root = LrGlobalRoot(t, 0, np.random.default_rng(2))
    root.on_probe(1, 0.0, 0.0, replicas=2)  # cell b: servers 4, 5 up, 6, 7 down
    assert {root.pick_server(0.0) for _ in range(300)} == {0, 1, 2, 3, 4, 5}


def test_locality_failover_stays_local_until_health_drops_then_spills_by_rtt() -> None:
    tau = [[0, 0.08, 0.02], [0.08, 0, 0.05], [0.02, 0.05, 0]]
    t = Topology.build(["a", "b", "c"], [10, 10, 10], tau)
    root = LocalityFailoverRoot(t, 0, np.random.default_rng(3), OutlierConfig(max_ejection_percent=100.0))
    assert root.order == [0, 2, 1]
    assert {root.pick(0.0) for _ in range(200)} == {0}
    root.on_probe(0, 0.0, 0.0, replicas=5)  # half the local servers down: 70 % local, 30 % to c
    picks = [root.pick(0.0) for _ in range(4000)]
    assert root.loads(0.0) == [70, 30, 0]
    assert 0.66 < picks.count(0) / 4000 < 0.74 and 1 not in picks
    for h in range(5):  # the five up servers fail: ejected → no healthy local host
        for _ in range(5):
            root.on_reply(1.0, h, False)
    assert root.loads(1.0) == [0, 100, 0]
    assert root.loads(31.0) == [70, 30, 0]  # un-ejected


def test_hub_score_orders_by_queue_kv_and_locality() -> None:
    s = hub_scores(np.array([0.0, 4.0, 2.0]), np.array([0.2, 0.2, 0.2]), np.array([0.1, 0.0, 0.05]))
    # Queue dominates locality: the empty far cell beats the loaded near one.
    assert int(np.argmax(s)) == 0 and s[0] == pytest.approx(0.4 + 0.32 + 0.0)
    s = hub_scores(np.array([1.0, 1.0]), np.array([0.9, 0.1]), np.array([0.0, 0.1]))
    assert s[1] > s[0]  # KV 0.8 apart outweighs the locality term
    s = hub_scores(np.array([1.0, 1.0]), np.array([0.5, 0.5]), np.array([0.0, 0.1]))
    assert s[0] > s[1]  # all else equal, the nearer cell


def test_hub_score_root_picks_on_the_last_signals_and_skips_dead_cells() -> None:
    t = Topology.build(["a", "b"], [2, 2], [[0, 0.05], [0.05, 0]])
    root = HubScoreRoot(t, 0)
    assert root.pick(0.0) == 0  # no signals yet: the nearest cell
    root.on_signals(0, 3.0, 0.9)
    root.on_signals(1, 0.0, 0.1)
    assert root.pick(0.0) == 1
    root.on_signals(1, 0.0, 0.1, up=False)
    assert root.pick(0.0) == 0
    root.on_signals(0, 0.0, 0.1, up=False)
    assert root.pick(0.0) == NO_CELL  # every cell down
