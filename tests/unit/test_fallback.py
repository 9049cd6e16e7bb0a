"""The fallback cell of a request whose cell fails before answering: the next-best usable cell, else
the next-best allowed one."""

import math

from dlb.core.fallback import NO_FALLBACK, next_best


def test_each_cell_falls_back_to_the_best_other_usable_cell() -> None:
    costs = [3.0, 1.0, 2.0, 0.5]
    # cell 3 is cheapest but not usable (stale or dead): never a fallback
    assert next_best(costs, [0, 1, 2], 4) == [1, 2, 1, 1]


def test_one_usable_cell_has_no_fallback_and_nan_costs_rank_last() -> None:
    assert next_best([1.0, 2.0], [1], 2) == [1, NO_FALLBACK]
    assert next_best([math.nan, 2.0, 3.0], [0, 1, 2], 3) == [1, 2, 1]
    assert next_best([1.0], [], 1) == [NO_FALLBACK]


def test_one_usable_cell_falls_back_on_the_best_other_allowed_cell() -> None:
    """Usable cells first; with none other usable, the cheapest other allowed cell (stale probes are not death)."""
    assert next_best([1.0, 2.0], [1], 2, allowed=[0, 1]) == [1, 0]
    assert next_best([1.0, math.nan, 0.5, 9.0], [0], 4, allowed=[0, 1, 2]) == [2, 0, 0, 0]  # 3 is not allowed: never
    assert next_best([1.0, 2.0], [0, 1], 2, allowed=[0, 1]) == [1, 0]  # two usable: as without `allowed`
    assert next_best([1.0], [0], 1, allowed=[0]) == [NO_FALLBACK]  # residency: only its own cell
