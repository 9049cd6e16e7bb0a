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
from dlb.core.envoy_lb import LEAST_REQUEST, EnvoyLb
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
    sees none) turned into :func:`native_weights` every ``period_s`` (the EDS push cadence); and the
    root Envoy's ``lb_policy`` over the cells with those weights (:class:`~dlb.core.envoy_lb.EnvoyLb`:
    Envoy's schedule and, under ``LEAST_REQUEST``, its active counts).
    """

    def __init__(self, router: RootRouter, rng: np.random.Generator, period_s: float = 0.2,
                 sharpness: float = SHARPNESS, lb_policy: str = LEAST_REQUEST, active_request_bias: float = 1.0) -> None:
        self.router = router
        self.period_s = period_s
        self.sharpness = sharpness
        self.offset = cost_offset(router.policy.cost)
        self.on_probe = router.on_probe  # probes go to the control plane's router as they are
        self.envoy = EnvoyLb(np.where(router.allowed, router.replicas, 0.0), rng, lb_policy, active_request_bias)
        self._pushed: NativeWeights | None = None
        self._due = -math.inf

    @property
    def active(self) -> np.ndarray:
        """This Envoy's requests in flight per cell (its ``rq_active``)."""
        return self.envoy.active

    @property
    def weights(self) -> np.ndarray:
        """The weights Envoy applies now per cell (0: not a candidate; replicas until the first refresh)."""
        w = self.envoy.weights
        return np.where(self._pushed.healthy, w, 0.0) if self._pushed is not None else w

    def tick(self, now: float) -> None:
        self.router.tick(now)
        if now >= self._due:
            self._refresh(now)

    def _refresh(self, now: float) -> None:
        r = self.router
        nw = native_weights(r.costs(now), r.replicas, r.aversion, r.usable(now), r.allowed, self.offset, self.sharpness)
        if nw != self._pushed:  # the control plane pushes only a changed assignment; Envoy rebuilds on each
            self.envoy.update(np.asarray(nw.weights, dtype=float), np.asarray(nw.healthy))
            self._pushed = nw
        self._due = now + self.period_s

    def pick(self, now: float, session: str | None = None) -> int:
        if now >= self._due:
            self._refresh(now)
        h = self.envoy.pick()
        return NO_CELL if h < 0 else h

    def on_cell_reply(self, now: float, cell: int, ok: bool) -> None:
        """The answer to a request this root sent to ``cell`` arrived (or its failure did)."""
        self.envoy.answered(cell)
