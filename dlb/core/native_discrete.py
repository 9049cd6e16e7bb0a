"""The discrete mechanism's decision as weights a root Envoy applies itself (``native-discrete``).

Why weights and not a pick: with no ext_proc call per request, the per-request choice is Envoy's
``LEAST_REQUEST`` over a cluster whose hosts are the cells. With unequal weights Envoy picks the host
with the largest ``weight / (active + 1)`` (its active requests: an exact, local count of what this
root has in flight at each cell — the discrete root's "sent since the last probe", never stale). So at
equal weights per replica Envoy keeps its in-flight requests in proportion to the cells' replicas,
which is where Disc-RIF's argmin settles; the control plane turns each cell's probed cost ``c_j``
into its weight so a costlier cell (slower, more loaded, farther) gets a smaller share:

    w_j = k_j · (1 − a_j) · ((c_min + o) / (c_j + o))^γ

``k_j`` replicas, ``a_j`` the aversion rate (a cell skipped with probability ``a_j`` under the
ext_proc keeps ``1 − a_j`` of its share), ``γ`` the sharpness (the ext_proc's argmin is γ → ∞; a
finite γ keeps the split smooth between probes, which arrive every ~50 ms while Envoy decides every
request), ``o`` an offset for costs that can be 0 (the RIF cost: one request per replica).
Cells the root may not send to (residency) are not hosts at all; cells not usable now (stale or
failed probes) are marked unhealthy, unless none is usable (then all allowed cells serve: fail-open).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: The largest EDS weight written (the smallest is 1: Envoy refuses 0).
WEIGHT_SCALE = 1000
#: Default sharpness γ: a cell whose cost is twice the best's gets a quarter of its per-replica share.
SHARPNESS = 2.0


@dataclass(frozen=True)
class NativeWeights:
    """Per cell (index order): the integer EDS weight and whether the cell is offered to Envoy (healthy)."""

    weights: tuple[int, ...]
    healthy: tuple[bool, ...]


def native_weights(costs: np.ndarray, replicas: np.ndarray, aversion: np.ndarray, usable: np.ndarray, allowed: np.ndarray,
                   offset: float = 0.0, sharpness: float = SHARPNESS, scale: int = WEIGHT_SCALE) -> NativeWeights:
    """The weights above; cells off ``allowed`` get weight 0 (they are not in the cluster)."""
    allowed = np.asarray(allowed, dtype=bool)
    c = np.asarray(costs, dtype=float) + offset
    ok = allowed & np.asarray(usable, dtype=bool) & np.isfinite(c)
    if not ok.any():  # fail-open: nothing known usable, serve by replicas
        w = np.where(allowed, np.asarray(replicas, dtype=float), 0.0)
        ok = allowed.copy()
    else:
        c = np.maximum(c, 1e-12)
        best = float(c[ok].min())
        rel = np.where(ok, (best / np.where(ok, c, 1.0)) ** sharpness, 0.0)
        w = np.asarray(replicas, dtype=float) * (1.0 - np.clip(aversion, 0.0, 1.0)) * rel
        w = np.where(ok, w, 0.0)
    top = float(w.max()) if w.size else 0.0
    ints = np.where(allowed, np.maximum(1, np.round(w / top * scale) if top > 0 else 1), 0).astype(int)
    return NativeWeights(tuple(int(x) for x in ints), tuple(bool(x) for x in ok))
