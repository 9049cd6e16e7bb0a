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

import math
from dataclasses import dataclass

import numpy as np

from dlb.core.costs import Cost
from dlb.core.router import NO_CELL, RootRouter

#: The largest EDS weight written (the smallest is 1: Envoy refuses 0).
WEIGHT_SCALE = 1000
#: Default sharpness γ: a cell whose cost is twice the best's gets a quarter of its per-replica share.
SHARPNESS = 2.0


@dataclass(frozen=True)
class NativeWeights:
    """Per cell (index order): the integer EDS weight and whether the cell is offered to Envoy (healthy)."""

    weights: tuple[int, ...]
    healthy: tuple[bool, ...]


def cost_offset(cost: Cost) -> float:
    """The ``o`` above for an endpoint's cost: 1 for RIF (an idle cell costs 0), else 0."""
    return 1.0 if cost is Cost.RIF else 0.0


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


class NativeDiscreteRoot:
    """A root Envoy under ``native-discrete`` as the simulator runs it (time passed in, no I/O).

    Two parts, as deployed: the control plane's discrete ``router`` (probes in, no requests booked: it
    sees none) turned into :func:`native_weights` every ``period_s`` (the flow loop's cadence); and the
    root Envoy's ``LEAST_REQUEST`` over the cells with those weights, whose effective weight is
    ``w_j / (active_j + 1)`` with ``active_j`` this root's own requests at cell j not answered yet.
    Envoy serves effective weights by earliest-deadline scheduling; a draw in proportion to them is
    the same share per request without its state.
    """

    def __init__(self, router: RootRouter, rng: np.random.Generator, period_s: float = 0.2) -> None:
        self.router = router
        self.rng = rng
        self.period_s = period_s
        self.offset = cost_offset(router.policy.cost)
        self.on_probe = router.on_probe  # probes go to the control plane's router as they are
        self.active = np.zeros(len(router.allowed))
        self._w = np.where(router.allowed, router.replicas, 0.0)
        self._due = -math.inf

    def tick(self, now: float) -> None:
        self.router.tick(now)
        if now >= self._due:
            self._refresh(now)

    def _refresh(self, now: float) -> None:
        r = self.router
        nw = native_weights(r.costs(now), r.replicas, r.aversion, r.usable(now), r.allowed, self.offset)
        self._w = np.where(nw.healthy, np.asarray(nw.weights, dtype=float), 0.0)
        self._due = now + self.period_s

    def pick(self, now: float, session: str | None = None) -> int:
        if now >= self._due:
            self._refresh(now)
        eff = self._w / (self.active + 1.0)
        total = float(eff.sum())
        if total <= 0.0:
            return NO_CELL
        j = int(np.searchsorted(np.cumsum(eff), self.rng.random() * total, side="right"))
        j = min(j, len(eff) - 1)
        self.active[j] += 1
        return j

    def on_cell_reply(self, now: float, cell: int, ok: bool) -> None:
        """The answer to a request this root sent to ``cell`` arrived (or its failure did)."""
        self.active[cell] -= 1
