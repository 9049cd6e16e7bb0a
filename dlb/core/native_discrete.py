"""The discrete mechanism's decision as weights a root Envoy applies itself (``native-discrete``).

Why weights and not a pick: with no ext_proc call per request, the per-request choice is Envoy's own
load balancer over a cluster whose hosts are the cells; the control plane turns each cell's probed
cost ``c_j`` into its EDS weight every period, so a costlier cell (slower, more loaded, farther) gets
a smaller share:

    w_j = k_j · (1 − a_j) · ((c_min + o) / (c_j + o))^γ

``k_j`` replicas, ``a_j`` the aversion rate (a cell skipped with probability ``a_j`` under the
ext_proc keeps ``1 − a_j`` of its share), ``γ`` the sharpness (the ext_proc's argmin is γ → ∞),
``o`` an offset for costs that can be 0 (the RIF cost: one request per replica). Cells the root may
not send to (residency) are not hosts at all; cells not usable now (stale or failed probes) are
marked unhealthy, unless none is usable (then all allowed cells serve: fail-open).

Two picks (:data:`PICKS`, the plugin's ``pick``), each an Envoy ``lb_policy`` with its γ:

- ``least-request`` (default): ``LEAST_REQUEST``, γ = 2. Envoy divides each weight by this Envoy's
  own requests in flight at the cell plus one. Measured in the simulator's twin of the demo
  (research/native-discrete.md): means 1.12–1.53 × the ext_proc decision's. Why: in-flight counts
  are share × latency, so the schedule's shares go as √(w/ℓ) rather than w, and a cell this root
  sends little to looks idle however loaded the other roots keep it (the US root sent 14 % to the
  slow European cells, the ext_proc 1.4 %); γ = 2 barely separates costs 1.5–3 × apart.
- ``round-robin``: ``ROUND_ROBIN`` (Envoy's weighted round robin, the weights alone), γ = 32, tuned
  on seeds the evaluation does not use: 0.97–1.04 × the ext_proc decision's on the same runs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dlb.core.costs import Cost
from dlb.core.envoy_lb import LEAST_REQUEST, ROUND_ROBIN, EnvoyLb
from dlb.core.router import NO_CELL, RootRouter

#: The largest EDS weight written (the smallest is 1: Envoy refuses 0).
WEIGHT_SCALE = 1000
#: Default sharpness γ: a cell whose cost is twice the best's gets a quarter of its per-replica share.
SHARPNESS = 2.0
#: The plugin's ``pick`` → (the native cluster's Envoy ``lb_policy``, the weights' sharpness γ).
PICKS: dict[str, tuple[str, float]] = {"least-request": (LEAST_REQUEST, SHARPNESS), "round-robin": (ROUND_ROBIN, 32.0)}
DEFAULT_PICK = "least-request"


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
    sees none) turned into :func:`native_weights` every ``period_s`` (the EDS push cadence, pushed
    only when they changed); and the root Envoy's ``lb_policy`` over the cells with those weights
    (:class:`~dlb.core.envoy_lb.EnvoyLb`: Envoy's schedule and, under ``LEAST_REQUEST``, its active counts).
    """

    def __init__(self, router: RootRouter, rng: np.random.Generator, period_s: float = 0.2, pick: str = DEFAULT_PICK,
                 sharpness: float | None = None, lb_policy: str | None = None, active_request_bias: float = 1.0) -> None:
        """``pick``: the plugin's (:data:`PICKS`); ``sharpness`` and ``lb_policy`` override its pair (tuning)."""
        self.router = router
        self.period_s = period_s
        policy, gamma = PICKS[pick]
        self.sharpness = gamma if sharpness is None else sharpness
        lb_policy = policy if lb_policy is None else lb_policy
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
