"""Flow weights → Envoy's integer ``weighted_clusters`` weights.

Envoy samples a weighted cluster with probability ``w_j / Σ w``, with ``w_j`` a uint32. We round the
routing vector ``x`` to integers summing to ``total`` by the largest-remainder method (the rounding
that minimises the largest error), then make sure no arc with ``x_j > 0`` is rounded to 0: flow
routing needs a trickle on every arc it uses, or it stops observing that arc's response to load. The
weight those arcs receive is taken from the largest weights, so the total stays exact. Arcs with
``x_j = 0`` are omitted from the route altogether (gRPC xDS clients drop weight-0 clusters, and a
zero entry says nothing Envoy needs).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

DEFAULT_TOTAL = 10_000


def round_weights(x: Sequence[float] | np.ndarray, total: int = DEFAULT_TOTAL) -> list[int]:
    """Integer weights summing to ``total``, each positive entry of ``x`` getting at least 1."""
    v = np.asarray(x, dtype=float)
    if v.ndim != 1 or v.size == 0 or np.any(~np.isfinite(v)) or np.any(v < 0) or v.sum() <= 0:
        raise ValueError(f"weights must be a non-empty, finite, non-negative vector with a positive sum: {v}")
    positive = v > 0
    if int(positive.sum()) > total:
        raise ValueError(f"{int(positive.sum())} positive arcs cannot each get a weight out of {total}")
    scaled = v / v.sum() * total
    w = np.floor(scaled).astype(np.int64)
    short = total - int(w.sum())
    if short:
        # Largest remainders first; ties broken by index for determinism.
        order = np.lexsort((np.arange(v.size), -(scaled - w)))
        w[order[:short]] += 1
    for j in np.flatnonzero(positive & (w == 0)):
        donor = int(np.argmax(w))
        w[donor] -= 1
        w[j] = 1
    return [int(k) for k in w]
