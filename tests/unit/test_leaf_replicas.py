"""One cell from its leaf replicas' probe answers (dlb.core.leaf_replicas): each rule is a test."""

from __future__ import annotations

import numpy as np
import pytest

from dlb.core.latency_model import latency
from dlb.core.leaf_replicas import ReplicaAnswer, ReplicaMerge, combine_models, rescale


def answer(rif: float, completed: int = 0, errors: int = 0, **kw: object) -> ReplicaAnswer:
    return ReplicaAnswer(rif=rif, counters={"completed": completed, "errors": errors}, **kw)  # type: ignore[arg-type]


def test_rif_is_the_sum_of_live_replicas_and_a_failed_replica_drops_out_not_the_cell() -> None:
    m = ReplicaMerge()
    m.update(0, answer(3), 0.0)
    cell = m.update(1, answer(5), 0.0)
    assert cell is not None and cell.rif == 8 and cell.live == 2
    cell = m.update(1, None, 0.1)
    assert cell is not None and cell.rif == 3 and cell.live == 1
    assert m.update(0, None, 0.2) is None  # every replica failed: only now is the cell unusable
    cell = m.update(1, answer(2), 0.3)
    assert cell is not None and cell.rif == 2


def test_one_replica_passes_through_unchanged() -> None:
    m = ReplicaMerge()
    a = answer(4, 10, 1, error_rate=0.1, healthy=3, params=(0.5, 0.02, 8.0, 1.0), confidence=0.7, samples=40, capacity=64.0)
    cell = m.update(0, a, 0.0)
    assert cell is not None
    assert (cell.rif, cell.error_rate, cell.healthy, cell.params, cell.confidence, cell.samples, cell.capacity) == (
        4, 0.1, 3, (0.5, 0.02, 8.0, 1.0), 0.7, 40, 64.0)
    assert cell.counters == {"completed": 10, "errors": 1}


def test_healthy_servers_are_shared_not_added() -> None:
    m = ReplicaMerge()
    m.update(0, answer(1, healthy=4), 0.0)
    cell = m.update(1, answer(1, healthy=3), 0.0)  # one replica's Envoy has ejected a server the other reaches
    assert cell is not None and cell.healthy == 4


def test_error_rate_is_weighted_by_traffic_share() -> None:
    m = ReplicaMerge(tau_s=0.001)  # the rate EMA follows the last interval
    m.update(0, answer(0, 0, error_rate=0.0), 0.0)
    m.update(1, answer(0, 0, error_rate=0.0), 0.0)
    m.update(0, answer(0, 300, error_rate=0.0), 1.0)  # 300 completions/s
    cell = m.update(1, answer(0, 100, error_rate=0.4), 1.0)  # 100/s, 40 % failing
    assert cell is not None
    assert m.shares() == pytest.approx({0: 0.75, 1: 0.25})
    assert cell.error_rate == pytest.approx(0.25 * 0.4)


def test_shares_are_equal_until_rates_are_known() -> None:
    m = ReplicaMerge()
    m.update(0, answer(0, error_rate=0.2), 0.0)
    cell = m.update(1, answer(0, error_rate=0.0), 0.0)
    assert cell is not None and cell.error_rate == pytest.approx(0.1)


def test_counters_stay_monotone_when_a_replica_restarts_or_drops_out() -> None:
    m = ReplicaMerge()
    m.update(0, answer(0, 100, 5), 0.0)
    cell = m.update(1, answer(0, 50, 2), 0.0)
    assert cell is not None and cell.counters == {"completed": 150, "errors": 7}
    cell = m.update(1, None, 0.1)  # dropped: its last counts stay in the sum
    assert cell is not None and cell.counters == {"completed": 150, "errors": 7}
    cell = m.update(1, answer(0, 3, 0), 0.5)  # restarted from 0: a new base, the sum still rises
    assert cell is not None and cell.counters == {"completed": 153, "errors": 7}
    cell = m.update(1, answer(0, 4, 1), 0.6)
    assert cell is not None and cell.counters == {"completed": 154, "errors": 8}


def test_a_replica_back_without_a_restart_is_not_counted_twice() -> None:
    m = ReplicaMerge()
    m.update(0, answer(0, 10, 1), 0.0)
    m.update(0, None, 0.1)
    cell = m.update(0, answer(0, 12, 1), 0.2)  # probes failed for a while, the agent kept counting
    assert cell is not None and cell.counters == {"completed": 12, "errors": 1}


def test_rescaled_curve_on_the_cells_axis_equals_the_replicas_curve_at_its_share() -> None:
    a, b, c, s = 0.4, 0.03, 6.0, 1.5
    for f in (0.25, 0.5, 1.0):
        a2, b2, c2, s2 = rescale((a, b, c, s), f)
        n = np.linspace(0, 60, 13)
        assert latency(n, a2, b2, c2, s2) == pytest.approx(latency(f * n, a, b, c, s))
        assert c2 * b2 < a2  # the stable shape survives


def test_two_half_replicas_of_one_cell_combine_to_the_cells_curve() -> None:
    """Each replica sees half the cell's RIF: its fit has the knee at c/2 and twice the slope; combined
    (equal shares) the curve is the cell's again."""
    cell_curve = (0.4, 0.03, 6.0, 1.5)
    half = rescale(cell_curve, 2.0)  # the cell's curve seen on a half-share axis
    params, conf, samples = combine_models({0: (half, 0.8, 100), 1: (half, 0.6, 300)}, {0: 0.5, 1: 0.5})
    assert params == pytest.approx(cell_curve)
    assert samples == 400 and conf == pytest.approx((0.8 * 100 + 0.6 * 300) / 400)


def test_fits_are_weighted_by_samples_and_a_replica_without_a_model_is_left_out() -> None:
    params, _, samples = combine_models({0: ((1.0, 0.01, 1.0, 1.0), 1.0, 30), 1: ((2.0, 0.01, 1.0, 1.0), 1.0, 10),
                                         2: (None, 0.0, 0)}, {0: 1 / 3, 1: 1 / 3, 2: 1 / 3})
    assert params is not None and params[0] == pytest.approx(1.25) and samples == 40
    assert combine_models({0: (None, 0.0, 0)}, {0: 1.0}) == (None, 0.0, 0)


def test_shared_servers_capacity_and_queue_are_not_added() -> None:
    m = ReplicaMerge()
    m.update(0, answer(1, capacity=64.0, waiting=3.0, kv_usage=0.5), 0.0)
    cell = m.update(1, answer(1, capacity=None, waiting=4.0, kv_usage=0.4), 0.0)
    assert cell is not None and (cell.capacity, cell.waiting, cell.kv_usage) == (64.0, 4.0, 0.5)
