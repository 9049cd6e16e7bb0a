"""The cell a request is retried on when its own cell fails before answering: the next-best usable cell
(else the next-best allowed one).

Why the root decides it rather than Envoy: Envoy can retry on another cluster (an aggregate cluster
of the primary and one fallback cell), but not rank cells; the root has the costs. The table is
rebuilt from the costs a few times per probe period, not per request (the request path stays a
lookup). Pure: costs, the usable and the allowed cells are passed in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: No fallback: only one cell is usable (the request is not retried across cells).
NO_FALLBACK = -1


def next_best(costs: Sequence[float], usable: Sequence[int], n: int, allowed: Sequence[int] = ()) -> list[int]:
    """For each of ``n`` cells: the usable cell other than it with the lowest cost (NaN counts as +inf;
    ties go to the lower index); with no other usable cell, the best other of ``allowed`` (cells the
    root may send to); else :data:`NO_FALLBACK`.

    Why an unusable cell at all: with one cell usable, a request there has nowhere else to go, and the
    others may be unusable only because their probe answers are late (a starved root). The retry is one,
    and only for a request that already failed before answering: a dead cell fails it again, a live one
    serves it. A usable cell is still always preferred."""
    def key(j: int) -> tuple[float, int]:
        return (math.inf if math.isnan(costs[j]) else costs[j], j)

    ranked = sorted(usable, key=key)
    ranked += sorted((j for j in allowed if j not in ranked), key=key)
    return [next((k for k in ranked if k != j), NO_FALLBACK) for j in range(n)]
