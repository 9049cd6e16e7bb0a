"""The discrete mechanism's decision as weights a root Envoy applies itself (``native-discrete``).

Why weights and not a pick: with no ext_proc call per request, the per-request choice is Envoy's own
load balancer over a cluster whose hosts are the cells; the control plane turns each cell's probed
cost ``c_j`` into its EDS weight every period, so a costlier cell (slower, more loaded, farther) gets
a smaller share:

    s_j ∝ k_j · ((c_min + o) / (c_j + o))^γ,     w = averted(s, a)

``k_j`` replicas, ``γ`` the sharpness (the ext_proc's argmin is γ → ∞), ``o`` an offset for costs
that can be 0 (the RIF cost: one request per replica), ``a_j`` the aversion rate: the weights are the
split the ext_proc's rule would make of ``s`` (skip each cell with probability ``a_j``, then choose among
the rest by ``s``; :func:`averted_split`). A plain factor ``(1 − a_j)`` on ``s`` does not: at γ = 32 a
cheaper cell averted at the cap kept ~97 % of a root's traffic, where the ext_proc sends it 10 %. Cells the root may
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
- ``round-robin-fill``: ``ROUND_ROBIN`` with weights that are the split the discrete argmin would make
  of the fleet's next 0.5 s of arrivals (:func:`fill_split`), not cost ratios, for the latency cost: at γ = 32
  one request of probed RIF moves a weight 2–4 × and the top cell changed on 25–30 % of refreshes.

Both the control plane and the simulator's root compute weights with :func:`router_weights`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from dlb.core.costs import Cost, ModelTable, cost_vector
from dlb.core.envoy_lb import LEAST_REQUEST, ROUND_ROBIN, EnvoyLb
from dlb.core.flow import fleet_rate
from dlb.core.router import NO_CELL, RootRouter

#: The largest EDS weight written (the smallest is 1: Envoy refuses 0).
WEIGHT_SCALE = 1000
#: Default sharpness γ: a cell whose cost is twice the best's gets a quarter of its per-replica share.
SHARPNESS = 2.0
#: Water-filling's increments per fill (:func:`fill_split`): the split's resolution.
FILL_STEPS = 32
#: The cost split's share added under the fill's (:func:`router_weights`): where an averted cell's skipped mass goes.
FILL_TRACE = 1e-3


class Pick(NamedTuple):
    """One ``pick``: the native cluster's Envoy ``lb_policy``, the weights' sharpness γ, and ``fill_s``:
    when > 0, an endpoint whose cost is in ``fill_costs`` gets :func:`fill_split`'s weights over that
    horizon instead of cost ratios. Latency only: on the tuning seeds the fill cut Disc-Lat-native's
    mean 1–4 % but raised RIF's and Grad's 1–2 % (research/native-discrete.md)."""

    lb_policy: str
    sharpness: float
    fill_s: float = 0.0
    fill_costs: frozenset[Cost] = frozenset({Cost.LATENCY})


#: The plugin's ``pick`` → how the control plane weighs the cells and how Envoy picks among them.
PICKS: dict[str, Pick] = {"least-request": Pick(LEAST_REQUEST, SHARPNESS), "round-robin": Pick(ROUND_ROBIN, 32.0),
                          "round-robin-fill": Pick(ROUND_ROBIN, 32.0, 0.5)}
DEFAULT_PICK = "least-request"


@dataclass(frozen=True)
class NativeWeights:
    """Per cell (index order): the integer EDS weight and whether the cell is offered to Envoy (healthy)."""

    weights: tuple[int, ...]
    healthy: tuple[bool, ...]


def cost_offset(cost: Cost) -> float:
    """The ``o`` above for an endpoint's cost: 1 for RIF (an idle cell costs 0), else 0."""
    return 1.0 if cost is Cost.RIF else 0.0


#: Up to this many averted cells :func:`averted_split` sums every keep/skip outcome exactly (2^n terms);
#: beyond it, a fixed sample of :data:`AVERSION_SAMPLES` outcomes (deterministic: same input, same weights).
EXACT_AVERTED = 12
AVERSION_SAMPLES = 4096


def averted_split(split: np.ndarray, aversion: np.ndarray, cells: np.ndarray) -> np.ndarray:
    """Each cell's expected share when every cell in ``cells`` is skipped with probability ``a_j`` and
    the request then goes to the kept cells in proportion to ``split`` (to all of ``cells`` when every
    one was skipped), as the ext_proc's ``pick`` treats aversion. Sums to 1 over ``cells``.

    Why exact and not ``split × (1 − a)``: renormalising a factor keeps the ratios of a sharpened split, so
    a cell holding 99.7 % keeps 97 % at a = 0.9; and the one-skip correction (hand a cell's skipped mass
    to the others) overshoots when they are averted too (10 % where the rule gives 91 %).
    """
    ok = np.asarray(cells, dtype=bool)
    s = np.where(ok, np.asarray(split, dtype=float), 0.0)
    total = float(s.sum())
    if total <= 0.0:
        return s
    s = s / total
    a = np.where(ok, np.clip(np.asarray(aversion, dtype=float), 0.0, 1.0), 0.0)
    av = np.flatnonzero(a > 0.0)
    if av.size == 0:
        return s
    if av.size <= EXACT_AVERTED:  # every keep (1) / skip (0) outcome of the averted cells
        keep = ((np.arange(1 << av.size)[:, None] >> np.arange(av.size)) & 1).astype(bool)
        prob = np.prod(np.where(keep, 1.0 - a[av], a[av]), axis=1)
    else:  # a fixed sample: the weights stay a function of their inputs
        keep = np.random.default_rng(0).random((AVERSION_SAMPLES, av.size)) >= a[av]
        prob = np.full(AVERSION_SAMPLES, 1.0 / AVERSION_SAMPLES)
    rest = float(s.sum() - s[av].sum())  # the cells never skipped
    kept_mass = rest + keep @ s[av]
    none = kept_mass <= 0.0  # nothing kept: the ext_proc chooses among all of them
    inv = np.where(none, 0.0, prob / np.where(none, 1.0, kept_mass))
    p_none = float(prob[none].sum())
    out = s * (float(inv.sum()) + p_none)
    out[av] = s[av] * ((keep * inv[:, None]).sum(axis=0) + p_none)
    return out


def cost_split(costs: np.ndarray, replicas: np.ndarray, cells: np.ndarray, sharpness: float) -> np.ndarray:
    """``k_j (c_min / c_j)^γ`` over ``cells`` (finite, offset costs), 0 elsewhere: the weights before aversion."""
    c = np.maximum(np.asarray(costs, dtype=float), 1e-12)
    best = float(c[cells].min())
    return np.where(cells, np.asarray(replicas, dtype=float) * (best / np.where(cells, c, 1.0)) ** sharpness, 0.0)


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
        w = averted_split(cost_split(c, replicas, ok, sharpness), aversion, ok)
    top = float(w.max()) if w.size else 0.0
    ints = np.where(allowed, np.maximum(1, np.round(w / top * scale) if top > 0 else 1), 0).astype(int)
    return NativeWeights(tuple(int(x) for x in ints), tuple(bool(x) for x in ok))


def fill_split(cost: Cost, workload: np.ndarray, replicas: np.ndarray, models: ModelTable | None, rtt: np.ndarray,
               cells: np.ndarray, amount: float, steps: int = FILL_STEPS) -> np.ndarray:
    """The split of ``amount`` new requests over ``cells`` that the discrete argmin with its own-sends
    correction would make: ``steps`` equal increments, each to the cell cheapest at its workload plus
    what the fill has put there (water-filling by cost). Why not cost ratios: ``(c_min/c_j)^γ`` at γ = 32
    moves a US cell's weight 2–3 × on one request of probed RIF (research/native-discrete.md), so the
    split follows probe noise; the fill's split moves only as far as the costs' levels do.
    """
    ok = np.asarray(cells, dtype=bool)
    fill = np.zeros(len(workload))
    if not ok.any() or amount <= 0:
        return fill
    dx = amount / steps
    base = np.asarray(workload, dtype=float)
    for _ in range(steps):
        c = cost_vector(cost, base + fill, replicas, models, rtt)
        c = np.where(ok & ~np.isnan(c), c, np.inf)
        fill[int(np.argmin(c)) if np.isfinite(c).any() else int(np.flatnonzero(ok)[0])] += dx
    return fill / amount


def router_weights(r: RootRouter, now: float, pick: Pick, offset: float) -> NativeWeights:
    """The weights the control plane pushes for router ``r``'s source now, and the simulator's native root applies.

    ``pick.fill_s`` > 0 and the cost in ``pick.fill_costs``: the fleet's arrivals over the next ``fill_s`` seconds (Λ̂ from probes by Little's
    law, :func:`~dlb.core.flow.fleet_rate`: no per-source rate is needed, and every root sharing the
    cells fills the same amount) water-filled onto the usable cells (:func:`fill_split`), then averted (:func:`averted_split`).
    """
    usable = r.usable(now)
    if pick.fill_s <= 0 or r.policy.cost not in pick.fill_costs:
        return native_weights(r.costs(now), r.replicas, r.aversion, usable, r.allowed, offset, pick.sharpness)
    ok = r.allowed & usable
    if not ok.any():
        return native_weights(np.full(len(ok), np.nan), r.replicas, r.aversion, ok, r.allowed)  # fail-open
    n, m = r.workload(), r.models
    lam = fleet_rate(n[ok], m.a[ok], m.b[ok], m.c[ok], m.s[ok], r.policy.flow.min_rate_fraction)
    split = fill_split(r.policy.cost, n, r.replicas, m, r.rtt, ok, lam * pick.fill_s)
    # With a cell averted, cells the fill left empty get a trace of the cost split, so its skipped share
    # goes to the next cheapest, as the ext_proc's argmin over the kept cells would send it.
    if (r.aversion[split > 0] > 0).any():
        c = r.costs(now) + offset
        fin = ok & np.isfinite(c)
        if fin.any():
            trace = cost_split(c, r.replicas, fin, pick.sharpness)
            split = split + FILL_TRACE * trace / float(trace.sum())
    w = averted_split(split, r.aversion, split > 0)
    top = float(w.max())
    if not top > 0:  # nothing to fill (no arrivals expected): the replica split among the usable cells
        w = np.where(ok, r.replicas, 0.0).astype(float)
        top = float(w.max())
    ints = np.where(r.allowed, np.maximum(1, np.round(w / top * WEIGHT_SCALE)), 0).astype(int)
    return NativeWeights(tuple(int(x) for x in ints), tuple(bool(x) for x in ok))


class NativeDiscreteRoot:
    """A root Envoy under ``native-discrete`` as the simulator runs it (time passed in, no I/O).

    Two parts, as deployed: the control plane's discrete ``router`` (probes in, no requests booked: it
    sees none) turned into :func:`native_weights` every ``period_s`` (the EDS push cadence, pushed
    only when they changed); and the root Envoy's ``lb_policy`` over the cells with those weights
    (:class:`~dlb.core.envoy_lb.EnvoyLb`: Envoy's schedule and, under ``LEAST_REQUEST``, its active counts).
    """

    def __init__(self, router: RootRouter, rng: np.random.Generator, period_s: float = 0.2, pick: str = DEFAULT_PICK,
                 sharpness: float | None = None, lb_policy: str | None = None, active_request_bias: float = 1.0,
                 fill_s: float | None = None) -> None:
        """``pick``: the plugin's (:data:`PICKS`); ``sharpness``, ``lb_policy`` and ``fill_s`` override its (tuning)."""
        self.router = router
        self.period_s = period_s
        p = PICKS[pick]
        self.pick_rule = Pick(p.lb_policy if lb_policy is None else lb_policy, p.sharpness if sharpness is None else sharpness,
                              p.fill_s if fill_s is None else fill_s)
        lb_policy = self.pick_rule.lb_policy
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
        nw = router_weights(self.router, now, self.pick_rule, self.offset)
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
