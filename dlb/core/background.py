"""When a leaf sends a background probe request: the rule the leaf agent and the simulator share.

A cell that gets no traffic gets no latency samples, so its model stays whatever it was — a prior
off by ×50, or a curve from before the cell slowed down — and a router that believes it never sends
traffic to find out (paper §6: "the router observes a cell's latency only when routing traffic to
it"). The remedy is out-of-band probing with *real* requests: one small inference request, sent
through the cell's own data path, whose completion is a sample like any other.

Why the **leaf** sends them (not the roots, not the control plane): the leaf owns the estimator, so it
knows when its window has gone quiet; there is one leaf per cell, so the probe rate is set once per
cell (R roots probing C cells would multiply it by R and need coordination); its request goes
through the leaf Envoy, the leaf's server pick and the access log exactly as real traffic does,
without crossing the WAN (the model is of serving latency; roots add the network themselves); and a
cell with traffic never probes, because the rule below only fires on silence.

The rule: send one probe when the cell has received no request (real or probe) for ``interval`` and
no probe is outstanding, where ``interval = clip(1 / (budget × capacity), min_interval_s,
max_interval_s)`` with the capacity from :func:`capacity_floor`: the model's saturation
throughput ``1/b``, but never more than ``servers / a`` — one request per server at a time at the
measured unloaded latency. ``a`` is what the probes measure; ``b`` keeps the configured prior's
shape until the cell is loaded, and a guessed shape 13× too optimistic was measured to put an
idle 1-server cell's probes at 1.8 % of its capacity. So an idle cell spends at
most ``budget`` of its request capacity on probes (a busy cell nothing), except that it probes at
least every ``max_interval_s``: the capacity comes from the very model the probes are there to
check, and a prior 50× too slow would otherwise space them minutes apart. That ceiling is set by
freshness, not by a rate: a change on an idle cell is seen by its next probe, and declared
``change_after − 1`` probes of ``min_interval_s`` later, so ``max_interval_s`` = 15 s keeps that
within the 30-s convergence target (≈ 17 s plus a refit) and still leaves ≥ 4 probes in the
estimator's 60-s window. It was 5 s, which put a quarter-speed 1-server cell at 1.43 % of its
capacity (measured through real Envoys); at 15 s only a cell under 1/(0.01 × 15 s) ≈ 6.7 requests/s
of capacity pays more than 1 %. A new prober (a leaf
that just started or restarted) sends its first ``warmup`` probes one after another, whatever the traffic:
those few samples are what replaces the configured prior (:func:`dlb.core.fit.measured_prior`), so
a restarted leaf is back in the roots' view one probe latency after it is ready (the leaf refits as
soon as they are in), not after the cell happens to get traffic. A cell so small that one
request per ``max_interval_s`` exceeds the budget pays that floor; the share is reported, not
assumed. Pure and clock-free (``now`` passed in).

**Change detection.** A cell that recovered after being slow is the starvation loop itself: its
window is full of slow samples from when it had traffic, and one probe per ``max_interval_s`` takes
2–3 half-lives to outvote them (measured through real Envoys: 36–60 s). So the caller reports each
probe's *surprise* — the sign of its latency's deviation from the cell's model beyond
``tolerance`` — and while probes keep surprising the prober probes every ``min_interval_s``; after
``change_after`` surprises in a row of the same sign, :attr:`BackgroundProber.changed_since`
gives the time of the first one: the cell changed then, and the caller drops the samples older
than that (:meth:`dlb.core.estimator.LatencyEstimator.forget_before`).

**An abandoned slow cell is watched.** Two things made a cell whose servers had slowed and then
recovered wait 17 s for its first probe (the fault bench's `cell_overload` row, traced at the leaf):
silence was counted from the last *completion*, and the slow requests still running kept completing
for 18 s after the roots had stopped sending, the last one a second after the recovery; and the budget
was a share of the capacity the *slow* model gives, so the slowdown itself spread the probes that are
there to see its end (up to ``max_interval_s``). So silence counts from the last *arrival* (a cell the
roots stopped choosing is the one that needs a probe, whatever it still has running), and a cell whose
measured capacity fell below ``1/watch_ratio`` of the best it showed (remembered, fading by ``e`` every
``memory_s``) is probed every ``watch_interval_s``, counted from each probe's *send* (a probe of
a still-slow cell takes seconds; counted from its end, the bench's seed 4 recovered in 11.75 s), and
whatever traffic it still has: a flow policy that equalises requests in flight keeps a trickle of a
few requests a second on the slowed cell, so it was never idle, no probe saw its recovery, and the
trickle was too thin for the traffic's own change detector (48 samples; Flow-RIF recovered in up to
11 s in the fault bench). Its probes add one small request per interval to a cell the roots have
mostly left, and its recovery is then declared within ≈
``watch_interval_s`` + ``change_after − 1`` probes + a refit, and the roots' traffic follows within a
probe period (5 + 2.6 + 0.1 s, inside the fault matrix's 10-s recovery target). A cell that stays slow
pays that rate until its memory fades below ``watch_ratio`` (≈ 590 s for a 4× slowdown: ~120 probes),
then the budget again. Only *measured* capacities are remembered: a configured prior 50× too fast would
otherwise be a best that no slowdown caused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import overload

import numpy as np

from dlb.core.latency_model import Num


def surprise(latency_s: float, predicted_s: float, tolerance: float) -> int:
    """+1 if a probe took longer than the model predicted by more than ``tolerance``, −1 if shorter, else 0."""
    if not (predicted_s > 0 and latency_s > 0):
        return 0
    r = latency_s / predicted_s
    return 1 if r > 1.0 + tolerance else (-1 if r < 1.0 / (1.0 + tolerance) else 0)


@overload
def capacity_floor(servers: float, a: float, b: float) -> float: ...


@overload
def capacity_floor(servers: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray: ...


def capacity_floor(servers: Num, a: Num, b: Num) -> Num:
    """Requests/s the probe budget is taken of: ``min(1/b, servers/a)`` (see the module docstring); per
    cell for arrays, so the root's flow memory (:mod:`dlb.core.slowed_share`) reads the same capacity."""
    return np.minimum(1.0 / b, np.maximum(servers, 1) / a)


@dataclass(frozen=True)
class BackgroundProbeConfig:
    #: Never probe more often than this (seconds), whatever the capacity.
    min_interval_s: float = 1.0
    #: Probe at least this often (seconds) while idle, whatever the model says about capacity (see the
    #: module docstring: the freshness a 30-s convergence target allows).
    max_interval_s: float = 15.0
    #: Largest fraction of the cell's request capacity an idle cell spends on probes.
    budget: float = 0.008
    #: A probe not completed after this long is written off (its completion was lost).
    timeout_s: float = 30.0
    #: Probes a new prober sends at once (a fresh leaf's first samples).
    warmup: int = 3
    #: A probe whose latency is off the model's prediction by more than this (relative) is a surprise.
    tolerance: float = 0.5
    #: Surprises of the same sign in a row that declare the cell changed.
    change_after: int = 3
    #: A cell whose measured capacity is below ``1/watch_ratio`` of its remembered best is probed every
    #: ``watch_interval_s``, idle or not (never more often than ``min_interval_s``); see the module docstring.
    watch_interval_s: float = 5.0
    watch_ratio: float = 2.0
    #: Seconds in which the remembered best capacity fades by a factor ``e`` toward the current one.
    memory_s: float = 600.0

    def __post_init__(self) -> None:
        if not (0 < self.min_interval_s <= self.max_interval_s and 0 < self.budget <= 1 and self.timeout_s > 0):
            raise ValueError("background probes need 0 < min_interval_s <= max_interval_s, 0 < budget <= 1 and "
                             f"timeout_s > 0: {self}")
        if not (self.watch_interval_s > 0 and self.watch_ratio > 1 and self.memory_s > 0):
            raise ValueError(f"background probes need watch_interval_s > 0, watch_ratio > 1 and memory_s > 0: {self}")


@dataclass
class BackgroundProber:
    """The probe schedule of one cell: feed it the cell's arrivals, ask it whether a probe is due."""

    config: BackgroundProbeConfig
    sent: int = 0
    completed: int = 0
    lost: int = 0
    _count: int = -1
    _last_activity: float = -math.inf  # the last arrival, probe sent or probe done
    _outstanding_since: float | None = None
    _last_sent: float = math.nan
    _last_done: float = -math.inf  # the last probe's completion
    _watch_since: float = -math.inf  # when the cell last became watched
    _streak: int = 0  # signed count of same-sign surprises in a row
    _streak_since: float = math.nan
    #: Set when ``change_after`` same-sign surprises in a row declared a change: when it began.
    changed_since: float | None = None
    #: The best measured capacity (requests/s), fading over ``memory_s``, and when it was last updated.
    best_capacity: float = 0.0
    _best_at: float = math.nan
    #: Whether the last :meth:`due` found the cell watched (exported, so an operator sees why it probes).
    watching: bool = False

    def interval(self, capacity_rps: float) -> float:
        """Seconds of silence before a probe, so idle probing stays within the budget."""
        cfg = self.config
        if not (capacity_rps > 0 and math.isfinite(capacity_rps)):
            return cfg.min_interval_s
        return min(cfg.max_interval_s, max(cfg.min_interval_s, 1.0 / (cfg.budget * capacity_rps)))

    def remember(self, now: float, capacity_rps: float, measured: bool) -> float:
        """Fade the remembered best capacity to ``now`` and raise it to ``capacity_rps`` if that is
        measured (not the configured prior) and higher; returns it."""
        if not math.isnan(self._best_at) and now > self._best_at:
            self.best_capacity *= math.exp(-(now - self._best_at) / self.config.memory_s)
        self._best_at = now
        if measured and math.isfinite(capacity_rps) and capacity_rps > self.best_capacity:
            self.best_capacity = capacity_rps
        return self.best_capacity

    def watched(self, capacity_rps: float) -> bool:
        """Whether the cell is well below the best capacity it showed (see the module docstring)."""
        return capacity_rps * self.config.watch_ratio < self.best_capacity

    def due(self, now: float, arrivals: int, capacity_rps: float, measured: bool = True) -> bool:
        """Whether to send a probe now. ``arrivals``: the cell's running count of requests it received
        (probes included); ``measured``: the model behind ``capacity_rps`` was fitted to samples (False
        while it is the configured prior)."""
        self.remember(now, capacity_rps, measured)
        watching = self.watched(capacity_rps)
        if watching and not self.watching:
            self._watch_since = now
        self.watching = watching
        if self.sent < self.config.warmup:
            # One after another, not all at once: the first request down a cold path (new connections,
            # a first ext_proc stream, a server's first batch) is slow by nature, and three sent together
            # are all first. Their median then put a ×2.5 prior on an idle cell of a loaded CI box, whose
            # roots sent it nothing until its next probe 15 s later. In sequence, the median is a warm one.
            return self._outstanding_since is None
        if arrivals != self._count:
            self._count = arrivals
            self._last_activity = now
        if self._outstanding_since is not None:
            if now - self._outstanding_since < self.config.timeout_s:
                return False
            self._outstanding_since = None
            self.lost += 1
        cfg = self.config
        if self.watching:
            # On the probes' own clock, whatever the traffic (a trickle of real requests hid a recovery),
            # and from the last send, not the last completion: a probe of a still-slow cell takes
            # seconds, and timing the next from its end put a recovery ~3 s later (module docstring).
            if self._streak:
                return now - self._last_done >= cfg.min_interval_s
            watch = min(self.interval(capacity_rps), max(cfg.min_interval_s, cfg.watch_interval_s))
            last = self._last_sent if not math.isnan(self._last_sent) else -math.inf
            return now - max(last, self._watch_since) >= watch
        if self._streak:
            return now - self._last_activity >= cfg.min_interval_s
        return now - self._last_activity >= self.interval(capacity_rps)

    def on_sent(self, now: float) -> None:
        self.sent += 1
        self._last_sent = now
        self._outstanding_since = now
        self._last_activity = now

    def on_done(self, now: float, surprised: int = 0) -> None:
        """The probe finished (success or error); ``surprised`` from :func:`surprise` (0 for an error)."""
        self.completed += 1
        self._outstanding_since = None
        self._last_activity = self._last_done = now
        if surprised == 0:
            self._streak = 0
            return
        if self._streak * surprised <= 0:  # a new streak (or the sign flipped): it began when this probe was sent
            self._streak, self._streak_since = 0, self._last_sent
        self._streak += surprised
        if abs(self._streak) >= self.config.change_after:
            self.changed_since = self._streak_since
            self._streak = 0

    def take_change(self) -> float | None:
        """The start of a declared change, once (the caller forgets samples older than it)."""
        t, self.changed_since = self.changed_since, None
        return t
