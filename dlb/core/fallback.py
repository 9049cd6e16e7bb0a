"""The cell a request is retried on when its own cell fails before answering: the next-best usable cell.

Why the root decides it rather than Envoy: Envoy can retry on another cluster (an aggregate cluster
of the primary and one fallback cell), but not rank cells; the root has the costs. The table is
rebuilt from the costs a few times per probe period, not per request (the request path stays a
lookup). Pure: costs and the usable cells are passed in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: No fallback: only one cell is usable (the request is not retried across cells).
NO_FALLBACK = -1


def next_best(costs: Sequence[float], usable: Sequence[int], n: int) -> list[int]:
    """For each of ``n`` cells: the usable cell other than it with the lowest cost (NaN counts as +inf;
    ties go to the lower index), or :data:`NO_FALLBACK` when there is none."""
    ranked = sorted(usable, key=lambda j: (math.inf if math.isnan(costs[j]) else costs[j], j))
    if not ranked:
        return [NO_FALLBACK] * n
    best = ranked[0]
    second = ranked[1] if len(ranked) > 1 else NO_FALLBACK
    return [second if j == best else best for j in range(n)]
