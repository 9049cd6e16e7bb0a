"""BF-IO: balance data-parallel decode ranks that step behind a barrier (pure: no I/O, time passed in).

Why: in data-parallel decoding (DP attention + expert parallelism) a server is G ranks whose forward
passes are synchronised every step, so a step lasts as long as the *heaviest* rank and the others idle.
A request's KV cache never moves (assignments are sticky), and its workload grows by one token per step
until it finishes. Balancing request *counts* (JSQ, round robin) ignores that; BF-IO instead puts work
where it minimises the *predicted* imbalance ``max_g W_g(h) − mean_g W_g(h)`` over the next H steps
(the seed paper's short-horizon integer programme, ``../shared/seeds/bf-io-summary.txt``).

The prediction uses the geometric decode-length model the paper measures on production traces: a
resident request survives each step with probability ``q = 1 − 1/mean_decode_tokens`` whatever its age
(memoryless), so the expected workload of a rank holding ``n`` requests with ``S`` resident KV tokens is

    E[W(h)] = q^h · (S + n·h)          for h = 0..H.

Adding a request with ``p`` prompt tokens to rank k adds ``q^h · (p + h)``. The mean over ranks rises by
the same amount wherever the request goes, so minimising max-minus-mean is minimising the max term:

    cost(k) = Σ_h q^h · max( max_{g≠k} base_g(h),  base_k(h) + p + h ),   base_g(h) = S_g + n_g·h

(the common factor q^h of every rank at step h comes out of the max). :class:`GreedyPicker` computes
this exactly for all G candidates at once from the top-two of each column — O(G·H), the request path.
Ties (the new request stays under the current maximum wherever it goes) are broken by the candidate's
own predicted workload, so BF-IO degrades to "least predicted workload" rather than to an arbitrary rank.
:func:`assign_batch_milp` solves the paper's integer programme for a batch of arrivals jointly with
``scipy.optimize.milp``; it is for off-path use (studies, a batch admission loop), not per request.

:class:`DpBalancer` is the state a leaf keeps per DP group: each rank's resident requests as running
sums (prompt tokens, count, start times), so the predicted KV of every rank at ``now`` is O(G) without
walking requests: a request started at ``t0`` has decoded about ``(now − t0)/step_s`` tokens, where
``step_s`` is learnt from completions (``duration / mean_decode_tokens``). Where the ranks report their
resident KV (``dlb_dp_kv_tokens``; vLLM's KV usage × its cache size), that measurement replaces the
estimate and the model only bridges the time since the last report. A request whose response stream the
leaf counts (:meth:`DpBalancer.progress`) is bridged by that count instead of elapsed time.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from dlb.core.hold_queue import Held, HoldQueue

FloatArray = npt.NDArray[np.float64]
Policy = Literal["bf-io", "jsq", "round-robin", "least-kv"]
POLICIES: tuple[str, ...] = ("bf-io", "jsq", "round-robin", "least-kv")


def survival(mean_decode_tokens: float) -> float:
    """Per-step survival probability q of a geometric decode length with the given mean (>= 1)."""
    if not math.isfinite(mean_decode_tokens) or mean_decode_tokens < 1.0:
        raise ValueError(f"mean_decode_tokens: must be a finite number >= 1, got {mean_decode_tokens!r}")
    return 1.0 - 1.0 / mean_decode_tokens


def predicted_workload(kv: FloatArray, n: FloatArray, horizon: int, mean_decode_tokens: float) -> FloatArray:
    """Expected workload of each rank over the next ``horizon`` steps: a (G, H+1) matrix q^h·(S + n·h)."""
    if horizon < 0:
        raise ValueError(f"horizon: must be >= 0, got {horizon}")
    hs = np.arange(horizon + 1, dtype=np.float64)
    qh = survival(mean_decode_tokens) ** hs
    return (np.asarray(kv, dtype=np.float64)[:, None] + np.asarray(n, dtype=np.float64)[:, None] * hs) * qh


def imbalance(workload: FloatArray) -> float:
    """``max − mean`` of per-rank workloads (summed over the columns of a (G, H+1) matrix)."""
    w = np.asarray(workload, dtype=np.float64)
    if w.ndim == 1:
        return float(w.max() - w.mean())
    return float((w.max(axis=0) - w.mean(axis=0)).sum())


#: Horizon points the request-path picker evaluates at most (:func:`horizon_quadrature`).
PICK_POINTS = 12


def horizon_quadrature(horizon: int, mean_decode_tokens: float, points: int | None) -> tuple[FloatArray, FloatArray]:
    """(h points, weights) standing for the sum Σ_{h=0..H} q^h · f(h) as Σ_i w_i · f(h_i).

    With ``points`` None or ≥ H+1: every step, weight q^h — the exact sum. Otherwise the steps are cut
    into ``points`` consecutive bins of equal weight, and each bin becomes one point at its
    q^h-weighted mean step with the bin's total weight: for any f *linear* on a bin this is exact
    (Σ q^h (α + βh) = W·(α + β·h̄)). The BF-IO cost is piecewise linear in h — a maximum of lines —
    so only bins holding a kink (where the heaviest rank changes, or where the candidate overtakes
    it) are approximated, and there Jensen's inequality makes the point a slight under-estimate.
    This is what makes the request-path decision cost independent of H (``dlb bfio bench``).
    """
    if horizon < 0:
        raise ValueError(f"horizon: must be >= 0, got {horizon}")
    hs = np.arange(horizon + 1, dtype=np.float64)
    qh = survival(mean_decode_tokens) ** hs
    if points is None or points >= horizon + 1:
        return hs, qh
    if points < 1:
        raise ValueError(f"points: must be >= 1, got {points}")
    cum = np.cumsum(qh)
    # Bin i holds the steps whose cumulative weight falls in its equal share (at least one step each).
    edges = np.searchsorted(cum, cum[-1] * np.arange(1, points) / points, side="right")
    edges = np.unique(np.clip(edges, 1, horizon))
    bins = np.split(np.arange(horizon + 1), edges)
    w = np.array([qh[b].sum() for b in bins])
    keep = w > 0  # q = 0 (every request decodes one token) leaves later bins without weight
    pts = np.array([(qh[b] * hs[b]).sum() for b in bins])[keep] / w[keep]
    return pts, w[keep]


class GreedyPicker:
    """Single-request BF-IO over a fixed horizon (the request-path decision).

    The horizon points and weights are computed once (:func:`horizon_quadrature`: every step up to
    ``points`` of them, so exact for H < ``points``; ``points=None`` is always exact); :meth:`pick`
    works on (G, points) buffers, so its cost does not grow with H (``dlb bfio bench``; target
    ≤ 20 µs for G = 32).
    """

    def __init__(self, horizon: int, mean_decode_tokens: float, points: int | None = PICK_POINTS) -> None:
        if horizon < 0:
            raise ValueError(f"horizon: must be >= 0, got {horizon}")
        self.horizon = horizon
        self.mean_decode_tokens = mean_decode_tokens
        self.hs, self.qh = horizon_quadrature(horizon, mean_decode_tokens, points)

    def costs(self, kv: FloatArray, n: FloatArray, prompt: float) -> tuple[FloatArray, FloatArray]:
        """(primary, secondary) cost of putting a ``prompt``-token request on each rank.

        Primary: Σ_h q^h · max over ranks after the placement (the imbalance up to a constant).
        Secondary: the candidate rank's own predicted workload, the tie-break. (The readable form of
        what :meth:`pick` computes in preallocated buffers.)
        """
        base = kv[:, None] + n[:, None] * self.hs  # (G, H+1)
        # max_{g≠k} base_g(h) can be replaced by the column max: where k holds the max, its candidate
        # base_k(h) + p + h is >= that max anyway, so max(top1, cand) = cand = max(top2, cand).
        top1 = base.max(axis=0)
        return np.maximum(base + (prompt + self.hs), top1) @ self.qh, base @ self.qh

    def _buffers(self, g: int) -> None:
        h1 = len(self.hs)
        self._g = g
        self._base = np.empty((g, h1))
        self._cand = np.empty((g, h1))
        self._top = np.empty(h1)
        self._ph = np.empty(h1)
        self._prim = np.empty(g)
        self._sec = np.empty(g)
        self._blocked = np.empty(g, dtype=bool)
        # Σ_h q^h (kv + n h) = kv·Q0 + n·Q1: the tie-break needs no (G, H+1) work.
        self._q0 = float(self.qh.sum())
        self._q1 = float((self.qh * self.hs).sum())

    def pick(self, kv: FloatArray, n: FloatArray, prompt: float, allowed: npt.NDArray[np.bool_] | None = None) -> int:
        """The rank minimising the predicted imbalance (ties: least own predicted workload).

        ``allowed`` masks ranks that cannot take the request (full, ejected); at least one must be True.
        Works in buffers allocated once per group size: the request path allocates nothing of size G·H.
        """
        g = len(kv)
        if g != getattr(self, "_g", -1):
            self._buffers(g)
        base, cand, top, prim = self._base, self._cand, self._top, self._prim
        np.multiply(n[:, None], self.hs, out=base)
        base += kv[:, None]
        base.max(axis=0, out=top)
        np.add(self.hs, prompt, out=self._ph)
        np.add(base, self._ph, out=cand)
        np.maximum(cand, top, out=cand)
        np.dot(cand, self.qh, out=prim)
        if allowed is not None:
            np.logical_not(allowed, out=self._blocked)
            np.putmask(prim, self._blocked, np.inf)
        k = int(prim.argmin())
        best = float(prim[k])
        if best == np.inf:
            raise ValueError("no rank is allowed")
        floor = float(top @ self.qh)  # the cost when the request raises no maximum anywhere
        tol = 1e-9 * max(1.0, abs(floor))
        if best > floor + tol:
            return k
        sec = self._sec
        np.multiply(kv, self._q0, out=sec)
        sec += n * self._q1
        np.putmask(sec, prim > floor + tol, np.inf)
        return int(sec.argmin())


def assign_batch_milp(kv: FloatArray, n: FloatArray, prompts: list[float] | FloatArray, horizon: int,
                      mean_decode_tokens: float, capacity: npt.NDArray[np.int64] | None = None,
                      time_limit_s: float = 10.0) -> list[int]:  # fmt: skip
    """The paper's integer programme for a batch of arrivals: one rank per request, min Σ_h q^h·z_h with
    ``z_h ≥ base_k(h) + Σ_i x_ik (p_i + h)`` for every rank k (and at most ``capacity[k]`` new requests
    on rank k). Off the request path: it calls a MILP solver (HiGHS through ``scipy.optimize.milp``).
    """
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import lil_matrix

    p = np.asarray(prompts, dtype=np.float64)
    m, g = len(p), len(kv)
    if m == 0:
        return []
    hs = np.arange(horizon + 1, dtype=np.float64)
    qh = survival(mean_decode_tokens) ** hs
    base = np.asarray(kv, dtype=np.float64)[:, None] + np.asarray(n, dtype=np.float64)[:, None] * hs
    nx, nz = m * g, horizon + 1  # x_ik at i*g + k, then z_h
    # Tie-break (ours, as in GreedyPicker): among placements with the same predicted maximum, prefer
    # lighter ranks. Without it the solver returns an arbitrary optimum, which measurably balances worse
    # (dlb bfio study --milp). Its total stays below 0.1 token-steps, under any real primary difference.
    own = base @ qh
    tie = 0.1 * (own - own.min()) / max(1.0, float(own.max() - own.min())) / m
    c = np.concatenate([np.tile(tie, m), qh])
    rows: list[tuple[lil_matrix, FloatArray, FloatArray]] = []
    a_eq = lil_matrix((m, nx + nz))
    for i in range(m):
        a_eq[i, i * g:(i + 1) * g] = 1.0
    rows.append((a_eq, np.ones(m), np.ones(m)))
    if capacity is not None:
        a_cap = lil_matrix((g, nx + nz))
        for k in range(g):
            a_cap[k, [i * g + k for i in range(m)]] = 1.0
        rows.append((a_cap, np.full(g, -np.inf), np.asarray(capacity, dtype=np.float64)))
    # base_k(h) + Σ_i x_ik (p_i + h) − z_h ≤ 0
    a_max = lil_matrix((g * nz, nx + nz))
    ub = np.empty(g * nz)
    for k in range(g):
        for h in range(nz):
            r = k * nz + h
            for i in range(m):
                a_max[r, i * g + k] = p[i] + hs[h]
            a_max[r, nx + h] = -1.0
            ub[r] = -base[k, h]
    rows.append((a_max, np.full(g * nz, -np.inf), ub))
    constraints = [LinearConstraint(a.tocsr(), lo, hi) for a, lo, hi in rows]
    integrality = np.concatenate([np.ones(nx), np.zeros(nz)])
    bounds = Bounds(np.concatenate([np.zeros(nx), np.full(nz, -np.inf)]), np.concatenate([np.ones(nx), np.full(nz, np.inf)]))
    res = milp(c, constraints=constraints, integrality=integrality, bounds=bounds,
               options={"time_limit": time_limit_s, "mip_rel_gap": 1e-9})  # fmt: skip
    if res.x is None:
        raise RuntimeError(f"BF-IO MILP found no assignment: {res.message}")
    x = res.x[:nx].reshape(m, g)
    return [int(k) for k in x.argmax(axis=1)]


@dataclass
class _Resident:
    rank: int
    prompt: float
    started: float  # when it started decoding (admission to a running slot)
    running: bool = True
    decoded: float = -1.0  # tokens counted from its response stream (-1: none yet, elapsed time estimates it)


@dataclass
class DpBalancer:
    """One DP group's rank picker and the resident-request state it decides on (clock-free).

    ``assign`` opens a request on a rank, ``finish`` closes it. A rank runs at most ``slots`` requests
    (vLLM's per-rank ``--max-num-seqs``, 0 = unknown: all run); later ones wait in that rank's FCFS
    queue and hold no KV until a finish frees a slot, when the oldest is promoted — as the server's
    scheduler does. Predicted KV of a rank at ``now`` = its *running* requests' prompt tokens + tokens
    decoded since they started running, kept as running sums so it costs O(G): counted from the response
    stream (:meth:`progress`) where the leaf sees one, else elapsed / ``step_s``.
    """

    ranks: int
    policy: str = "bf-io"
    horizon: int = 10
    mean_decode_tokens: float = 256.0
    step_s: float = 0.02  # initial per-token step time; refined from completions
    step_ema: float = 0.1  # weight of one completion in the step-time estimate
    slots: int = 0  # running sequences per rank (vLLM --max-num-seqs); 0 = unknown
    count_slack: int = -1  # residents above the fewest a full rank may hold; -1 = max(1, slots // 4)
    #: A rank's KV report leaves out requests the leaf placed in about the last this many steps: one
    #: reaches the rank during a step, is admitted at the next, and the report is taken at a step's end.
    report_lag_steps: float = 2.0
    #: Requests the leaf holds while no rank can admit (None: send at once, as without a queue).
    hold: HoldQueue | None = None
    #: BF-IO holds arrivals already once at most this share of the group's slots is free, and releases
    #: them together (:meth:`next_held`), so it chooses which request fills which of the last slots. Held
    #: only when every rank is full, the last slots went to whatever arrived next, one at a time — the
    #: state the backlog then ran on (``research/bfio.md``, C9). 0: hold only when no rank admits.
    hold_early: float = 0.25
    residents: dict[str, _Resident] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.ranks < 1:
            raise ValueError(f"dp_ranks: must be >= 1, got {self.ranks}")
        if self.policy not in POLICIES:
            raise ValueError(f"policy: must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        self.picker = GreedyPicker(self.horizon, self.mean_decode_tokens)
        if self.count_slack < 0:
            self.count_slack = max(1, self.slots // 4)
        self.n = np.zeros(self.ranks)  # residents: running + waiting (what JSQ and the slack rule count)
        self.nrun = np.zeros(self.ranks)  # running: what grows the KV
        self.prompt_sum = np.zeros(self.ranks)  # of running requests
        #: Running requests whose decoded tokens are estimated from elapsed time (no stream count yet),
        #: the sum of their start times, and the counted tokens of the others.
        self.est_n = np.zeros(self.ranks)
        self.est_start_sum = np.zeros(self.ranks)
        self.counted_sum = np.zeros(self.ranks)
        self.assigned = np.zeros(self.ranks, dtype=np.int64)
        self.queues: list[deque[str]] = [deque() for _ in range(self.ranks)]
        self._rr = 0
        #: Each rank's admission bound in requests (its running slots), as the rank reports it; 0 = unknown.
        self.limit = np.full(self.ranks, float(self.slots))
        #: Ranks whose reported KV cache is full: they admit nothing whatever their slot count says.
        self.kv_blocked = np.zeros(self.ranks, dtype=bool)
        #: KV tokens each rank last reported (nan: never) and the leaf's own prediction at that moment.
        self.kv_reported = np.full(self.ranks, np.nan)
        self.kv_predicted_then = np.zeros(self.ranks)
        #: report − prediction at the report, per rank (0 for a rank that never reported): :meth:`kv` adds it.
        self._kv_offset = np.zeros(self.ranks)
        self._unbounded = self.limit <= 0  # ranks with no admission bound, kept with ``limit``
        #: (start, key) of each rank's recently started requests, oldest first: what a report may lack.
        self._recent: list[deque[tuple[float, str]]] = [deque(maxlen=256) for _ in range(self.ranks)]
        self._batch_at = -math.inf  # when the last batch of held requests was released (:meth:`next_held`)

    def observe_kv(self, rank: int, kv_tokens: float, now: float) -> None:
        """A rank's own count of its resident KV tokens (its metrics): from now on :meth:`kv` is this
        measurement plus only the change the leaf predicts since — what it placed, what finished and
        the tokens decoded in between — instead of an estimate of every request's decoded tokens.

        Requests started on the rank within :attr:`report_lag_steps` steps are taken as not yet in the
        report: without that, each report erased the prompts just placed on the rank for about a step,
        and BF-IO kept feeding large prompts to the rank that had just taken one."""
        recent = self._recent[rank]
        cut = now - self.report_lag_steps * self.step_s
        while recent and recent[0][0] < cut:
            recent.popleft()
        young = 0.0
        for started, key in recent:
            res = self.residents.get(key)
            if res is not None and res.running and res.rank == rank and res.started == started:
                young += res.prompt + (res.decoded if res.decoded >= 0 else max(0.0, now - started) / self.step_s)
        self.kv_reported[rank] = kv_tokens
        self.kv_predicted_then[rank] = self._predicted(now)[rank] - young
        self._kv_offset[rank] = kv_tokens - self.kv_predicted_then[rank]

    def set_admission(self, rank: int, limit: float | None, kv_full: bool) -> None:
        """What a rank's own metrics say about its admission: slot bound (None: not reported) and KV full."""
        if limit is not None and limit > 0:
            self.limit[rank] = limit
            self._unbounded[rank] = False
            if self.slots <= 0:  # the running/waiting model needs a bound too: the first one reported
                self.slots = int(limit)
        self.kv_blocked[rank] = kv_full

    def admitting(self, allowed: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
        """Ranks that can start one more request now: allowed, KV not full, residents under the bound."""
        room: npt.NDArray[np.bool_] = self.n < self.limit
        room |= self._unbounded
        room &= allowed
        room &= ~self.kv_blocked
        return room

    def should_hold(self, allowed: npt.NDArray[np.bool_], admit: npt.NDArray[np.bool_]) -> bool:
        """Whether a new arrival waits in :attr:`hold` instead of going to a rank at once: no rank can
        admit it, requests are held already (they go first), or — BF-IO — at most :attr:`hold_early` of
        the group's slots are free, so the last ones are filled by choice (:meth:`next_held`), not by
        arrival order. ``admit``: :meth:`admitting` of ``allowed``, which the caller also picks among."""
        if self.hold is None:
            return False
        if not admit.any() or len(self.hold):
            return True
        if self.policy != "bf-io" or self.hold_early <= 0 or (self._unbounded & allowed).any():
            return False
        free = float(np.maximum(self.limit - self.n, 0.0)[admit].sum())
        return free <= self.hold_early * float(self.limit[allowed].sum())

    def _predicted(self, now: float) -> FloatArray:
        out: FloatArray = self.est_n * now
        out -= self.est_start_sum
        np.maximum(out, 0.0, out=out)
        out /= self.step_s
        out += self.prompt_sum
        out += self.counted_sum
        return out

    def progress(self, request_id: str, decoded: float) -> None:
        """Tokens a running request has decoded, counted from its response stream by the leaf: from now
        on its share of the rank's predicted KV is this count, not elapsed time over ``step_s``."""
        res = self.residents.get(request_id)
        if res is None or not res.running or decoded < 0:
            return
        r = res.rank
        if res.decoded < 0:  # its first count: it leaves the elapsed-time estimate
            self.est_n[r] -= 1
            self.est_start_sum[r] -= res.started
            res.decoded = 0.0
        self.counted_sum[r] += decoded - res.decoded
        res.decoded = float(decoded)

    def kv(self, now: float) -> FloatArray:
        """Resident KV tokens per rank at ``now``: the rank's last report plus the predicted change since
        (:meth:`observe_kv`); for a rank that never reported, the prediction alone (running requests'
        prompts plus elapsed time over ``step_s``)."""
        # A rank that never reported has offset 0, and its prediction is >= 0: max(0, pred) = pred.
        out = self._predicted(now)
        out += self._kv_offset
        np.maximum(out, 0.0, out=out)
        return out

    def choose(self, now: float, prompt_tokens: float, allowed: npt.NDArray[np.bool_] | None = None) -> int:
        """The rank this group's policy picks for a new request (no side effects except round robin's cursor)."""
        if self.policy == "round-robin":
            for _ in range(self.ranks):
                r = self._rr
                self._rr = (self._rr + 1) % self.ranks
                if allowed is None or allowed[r]:
                    return r
            raise ValueError("no rank is allowed")
        if self.policy == "jsq":
            load = self.n if allowed is None else np.where(allowed, self.n, np.inf)
            return int(np.argmin(load))
        kv = self.kv(now)
        open_ = self.open_ranks(allowed)
        if self.policy == "least-kv":
            return int(np.argmin(np.where(open_, kv, np.inf)))
        return self.picker.pick(kv, self.nrun, prompt_tokens, open_)

    def choose_backlog(self, now: float, prompts: list[float], admit: npt.NDArray[np.bool_]) -> tuple[int, int]:
        """(which of ``prompts``, which rank): the held request and rank to place next.

        BF-IO takes the pair that leaves the least predicted imbalance ``max − mean``: placing prompt p
        on rank r costs ``Σ_h q^h·max(top(h), base_r(h) + p + h)`` (:meth:`GreedyPicker.costs`) and
        lowers the imbalance by the mean's rise ``Σ_h q^h·(p + h)/G`` — so a light rank gets the largest
        request that stays under the heaviest, the heaviest the smallest. Other policies ignore sizes:
        the oldest request, on the rank the policy picks.
        """
        if self.policy != "bf-io" or len(prompts) == 1:
            return 0, self.choose(now, prompts[0], admit)
        kv = self.kv(now)
        open_ = self.open_ranks(admit)
        hs, qh = self.picker.hs, self.picker.qh
        p = np.asarray(prompts, dtype=np.float64)
        base = kv[:, None] + self.nrun[:, None] * hs  # (G, H')
        # Only open ranks are candidates (one, when a single completion freed a slot): (W, open, H').
        cand = base[open_][None, :, :] + (p[:, None, None] + hs[None, None, :])
        prim = np.maximum(cand, base.max(axis=0)) @ qh  # (W, open), as GreedyPicker.costs for every p at once
        # Lower is better; the mean's rise Σ_h q^h (p + h) / G is subtracted (ties: the older request).
        cost = prim.min(axis=1) - (p * float(qh.sum()) + float((qh * hs).sum())) / self.ranks
        pick = int(np.argmin(cost))
        return pick, self.choose(now, prompts[pick], admit)  # the rank with BF-IO's own tie-break

    def next_held(self, now: float, allowed: npt.NDArray[np.bool_], window: int) -> tuple[Held, int] | None:
        """Take the held request to place next and its rank (None: nothing held, no rank can admit, or
        BF-IO's batch is not due).

        The policy chooses among the ``window`` oldest (:meth:`choose_backlog`); the caller opens it
        (:meth:`open`) under the key it records. The leaf and ``dlb bfio heldrun`` both release this way.
        BF-IO releases in batches: while fewer than ``window`` are held, at most once per learnt step
        (``step_s``; every call at the same ``now`` belongs to one batch) — a request released alone
        would take the slot with no choice, and a rank admits only at a step's end anyway.
        """
        q = self.hold
        if q is None:
            return None
        cands = q.window(window)
        if not cands:
            return None
        admit = self.admitting(allowed)
        if not admit.any():
            return None
        if self.policy == "bf-io" and len(q) < window and now != self._batch_at and now < self._batch_at + self.step_s:
            return None
        self._batch_at = now
        i, r = self.choose_backlog(now, [c.prompt_tokens for c in cands], admit)
        return q.take(cands[i].key, now), r

    def open_ranks(self, allowed: npt.NDArray[np.bool_] | None = None) -> npt.NDArray[np.bool_]:
        """Ranks a workload-aware policy may choose from.

        The paper's scheduler holds the queue and places a request only when a slot frees; a leaf in
        front of vLLM's external DP load balancing must send at once, and a request sent to a full rank
        waits in *that* rank's queue. So BF-IO places by workload among ranks with a free slot; when
        every rank is full (or ``slots`` is unknown) among the ranks within ``count_slack`` residents of
        the fewest. With no slack, a steadily overloaded group leaves no choice at all: each completion
        frees one rank, which is then the only least-loaded one, and BF-IO collapses into JSQ.
        """
        ok = np.ones(self.ranks, dtype=bool) if allowed is None else allowed
        if self.slots > 0:
            free = ok & (self.n < self.slots)
            if free.any():
                return free
        least = float(self.n[ok].min())
        out: npt.NDArray[np.bool_] = ok & (self.n <= least + self.count_slack)
        return out

    def assign(self, now: float, request_id: str, prompt_tokens: float,
               allowed: npt.NDArray[np.bool_] | None = None) -> int:  # fmt: skip
        """Pick a rank and count the request resident there until :meth:`finish`."""
        old = self.residents.get(request_id)
        if old is not None:
            return old.rank
        r = self.choose(now, prompt_tokens, allowed)
        self.open(now, request_id, r, prompt_tokens)
        return r

    def open(self, now: float, request_id: str, rank: int, prompt_tokens: float) -> None:
        """Count a request resident on ``rank`` (a duplicate id is ignored)."""
        if request_id in self.residents:
            return
        res = _Resident(rank, float(prompt_tokens), now)
        self.residents[request_id] = res
        self.n[rank] += 1
        self.assigned[rank] += 1
        if self.slots > 0 and self.nrun[rank] >= self.slots:
            res.running = False
            self.queues[rank].append(request_id)
        else:
            self._run(request_id, res, now)

    def _run(self, key: str, res: _Resident, now: float) -> None:
        res.running, res.started = True, now
        r = res.rank
        self._recent[r].append((now, key))
        self.nrun[r] += 1
        self.prompt_sum[r] += res.prompt
        self.est_n[r] += 1
        self.est_start_sum[r] += now

    def finish(self, request_id: str, now: float, duration_s: float | None = None, ok: bool = True) -> int | None:
        """Close a request (returns its rank, None if unknown); a successful one refines ``step_s``.

        ``duration_s`` is accepted for callers that have only it; the estimate uses the time since the
        request started *running*, which excludes its wait in the rank's queue.
        """
        res = self.residents.pop(request_id, None)
        if res is None:
            return None
        r = res.rank
        self.n[r] -= 1
        if not res.running:
            self.queues[r].remove(request_id)  # left before it ran (client gone, record expired)
            return r
        self.nrun[r] -= 1
        self.prompt_sum[r] -= res.prompt
        if res.decoded >= 0:
            self.counted_sum[r] -= res.decoded
        else:
            self.est_n[r] -= 1
            self.est_start_sum[r] -= res.started
        if self.nrun[r] <= 0:  # drop float residue so an empty rank reads exactly zero
            self.nrun[r], self.prompt_sum[r] = 0.0, 0.0
            self.est_n[r], self.est_start_sum[r], self.counted_sum[r] = 0.0, 0.0, 0.0
        if ok and duration_s is not None and duration_s > 0:
            ran = min(duration_s, now - res.started) if now > res.started else duration_s
            # Its own decode length when the stream was counted, else the mean one.
            sample = ran / (res.decoded if res.decoded >= 1 else self.mean_decode_tokens)
            self.step_s += self.step_ema * (sample - self.step_s)
        q = self.queues[r]
        while q and self.nrun[r] < self.slots:
            key = q.popleft()
            self._run(key, self.residents[key], now)
        return r
