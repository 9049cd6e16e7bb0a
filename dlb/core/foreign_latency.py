"""Latency samples of a cell DLB does not run, from the cumulative latency histograms its software exports.

A DLB leaf times every request and records it with the cell's RIF at its arrival
(:meth:`dlb.core.estimator.LatencyEstimator.record`). A foreign cell only exports histograms that count
since its start: each vLLM server its ``vllm:e2e_request_latency_seconds`` (one series per model), a
GIE / llm-d endpoint picker its ``…request_duration_seconds`` (per model and target model). Between two
scrapes, ΣΔsum / ΣΔcount over every series is the mean latency of the requests that completed in the
interval. :class:`IntervalLatency` turns successive readings into one such sample per interval, paired
with the cell's mean RIF over the window those requests arrived in (the interval moved back by their
mean latency: the leaf's "RIF at arrival", for the mean request), for the same estimator the leaf feeds.

What the resulting model means for a foreign cell: the latency of whole requests as the cell's own
software timed them (vLLM: arrival at the server to the last token; GIE: the gateway's request duration),
one point per interval instead of one per request, so it is smoother than a leaf's. Few completions are
evidence too: if the cell held r requests at some reading and only c completed since, at least r − c of
those are still running, each a lower bound on latency at that RIF (:meth:`IntervalLatency.in_flight`,
the leaf's :class:`~dlb.core.fit.Censored`, but without each request's own age). A cell that slowed
20× completes almost nothing for the first tens of seconds, so these bounds are all that shows it
soon. It assumes the histograms cover every request the RIF counts.

Counter rules (Prometheus' ``rate``): a series whose sum or count went down was restarted, and its new
value is all it counted since, after the previous scrape; a series that appears on a source read last
time started from zero in the interval; a source not read last time (new, or back after failing) only
sets its baseline, since what it counted meanwhile has no interval.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from scipy.special import pdtr  # the Poisson CDF (scipy.stats: same values, a far slower import)

from dlb.core.fit import Censored
from dlb.core.latency_model import LatencyParams, latency

#: One source's histogram: series (its labels, as text) → (sum of seconds, count).
Series = Mapping[str, tuple[float, float]]
#: Points over the arrival window the mean RIF is taken at (piecewise-linear between probe answers).
RIF_GRID = 9


def _valid(sc: tuple[float, float]) -> bool:
    return math.isfinite(sc[0]) and math.isfinite(sc[1]) and sc[0] >= 0 and sc[1] >= 0


def interval_totals(prev: Mapping[str, Series], cur: Mapping[str, Series]) -> tuple[float, float]:
    """ΣΔsum, ΣΔcount from one reading of every source (``source → series``) to the next, by the
    counter rules of the module docstring; a value that is not finite or is negative counts as absent."""
    d_sum = d_count = 0.0
    for source, series in cur.items():
        before = prev.get(source)
        if before is None:
            continue  # a baseline only
        for key, now in series.items():
            if not _valid(now):
                continue
            old = before.get(key)
            if old is None or not _valid(old):
                d_sum, d_count = d_sum + now[0], d_count + now[1]  # new series: from zero in the interval
            elif now[0] < old[0] or now[1] < old[1]:
                d_sum, d_count = d_sum + now[0], d_count + now[1]  # restarted: its new value is since then
            else:
                d_sum, d_count = d_sum + now[0] - old[0], d_count + now[1] - old[1]
    return d_sum, d_count


@dataclass(frozen=True)
class IntervalSample:
    """One interval's evidence: at ``t`` (its end), ``completed`` requests had taken ``latency_s`` on
    average, and the cell held ``rif`` requests on average while they arrived."""

    t: float
    rif: float
    latency_s: float
    completed: float


@dataclass
class IntervalLatency:
    """Successive readings of a foreign cell (its RIF and its sources' histograms) → one sample per interval."""

    #: RIF history kept, seconds: the arrival window of a request slower than this starts at its oldest point.
    history_s: float = 120.0
    _prev: dict[str, dict[str, tuple[float, float]]] | None = None
    _t_prev: float = -math.inf
    _rif_t: deque[float] = field(default_factory=deque)
    _rif_v: deque[float] = field(default_factory=deque)
    #: Readings the in-flight bound can start from: (t, RIF then, completions counted up to then). Cleared
    #: when completions went uncounted (a source came or went, or the RIF was unknown).
    _held: deque[tuple[float, float, float]] = field(default_factory=deque)
    _done: float = 0.0

    def observe(self, now: float, rif: float, readings: Mapping[str, Series]) -> IntervalSample | None:
        """One probe's figures at ``now``: the cell's RIF and each source's histogram (a source that did
        not answer is left out). The sample of the interval since the previous call, or None when there is
        none (the first call, nothing completed, or time did not advance)."""
        if math.isfinite(rif) and rif >= 0:
            while self._rif_t and self._rif_t[0] < now - self.history_s:
                self._rif_t.popleft()
                self._rif_v.popleft()
            if not self._rif_t or now > self._rif_t[-1]:
                self._rif_t.append(now)
                self._rif_v.append(rif)
        prev, t0 = self._prev, self._t_prev
        self._prev = {src: dict(series) for src, series in readings.items()}
        self._t_prev = now
        if prev is None or not now > t0:
            self._hold(now, rif, bool(readings), restart=True)
            return None
        d_sum, d_count = interval_totals(prev, readings)
        self._done += d_count
        self._hold(now, rif, bool(readings), restart=not readings or prev.keys() != readings.keys())
        if not (d_count > 0 and d_sum > 0) or not self._rif_t:
            return None
        latency = d_sum / d_count
        return IntervalSample(now, self.mean_rif(t0 - latency, now - latency), latency, d_count)

    def _hold(self, now: float, rif: float, read: bool, restart: bool) -> None:
        """Keep this reading as a start for :meth:`in_flight`; forget the older ones when completions
        between them and now may have gone uncounted (``restart``), or this one when nothing was read."""
        held = self._held
        if restart or not read or not (math.isfinite(rif) and rif >= 0):
            held.clear()
        if read and math.isfinite(rif) and rif >= 0:
            while held and held[0][0] < now - self.history_s:
                held.popleft()
            held.append((now, rif, self._done))

    def in_flight(self, now: float, rif: float) -> Censored | None:
        """The requests known to be still running, as lower bounds for the fit. Of the r the cell held at a
        past reading, c completed since, so at least r − c remain (no more than it held at any reading
        since, ``rif`` now included), each at least that reading's age at the RIF then. Over every reading
        a staircase: the survivors of the oldest, then each newer reading's extra ones at its younger age.
        None when unknown or none."""
        if not math.isfinite(rif) or rif < 1:
            return None
        low, steps = rif, list[tuple[int, float, float]]()
        for t, held, done in reversed(self._held):
            low = min(low, held)
            if now > t:
                steps.append((math.floor(min(held - (self._done - done), low) + 1e-9), held, now - t))
        rifs, ages, most = list[float](), list[float](), 0
        for k, held, age in reversed(steps):  # oldest first
            if k > most:
                rifs += [held] * (k - most)
                ages += [age] * (k - most)
                most = k
        return Censored(np.array(rifs), np.array(ages)) if rifs else None

    def mean_rif(self, start: float, end: float) -> float:
        """The cell's mean RIF over ``[start, end]``, linear between readings, the nearest one outside them."""
        grid = np.linspace(start, end, RIF_GRID)
        return float(np.interp(grid, np.fromiter(self._rif_t, float), np.fromiter(self._rif_v, float)).mean())


@dataclass(frozen=True)
class Outlived:
    """Requests still running that the model cannot explain: ``factor`` = their age ÷ the model's latency
    at their RIF, known to run since ``since``; ``survivors`` of them."""

    factor: float
    since: float
    survivors: int


def outlived(now: float, bounds: Censored, params: LatencyParams, alpha: float) -> Outlived | None:
    """Whether :meth:`IntervalLatency.in_flight`'s staircase says the model is too fast. At a step of age
    T, RIF x and K survivors, at most x − K of the requests held then completed; a cell serving as the
    model says completes T·x/ℓ(x) in that time on average (Little's law), so so few completions have
    probability P(Poisson(T·x/ℓ(x)) ≤ x − K). The most improbable step, if that times the number of steps
    (a test of each) is at most ``alpha``.

    Why a test and not "older than 2×ℓ": latencies spread, and a cell holding one or two requests has one
    outlive twice the mean every few seconds (simulated: 22–86 alarms in 10 min at 1–4 in flight);
    what a slowed cell shows is *many* fewer completions than its load implies."""
    x, age = np.asarray(bounds.rif, dtype=float), np.asarray(bounds.age, dtype=float)
    if not x.size:
        return None
    last = np.r_[age[1:] != age[:-1], True]  # each step's last entry: its cumulative survivor count
    k = np.flatnonzero(last) + 1
    x, age = x[last], age[last]
    pred = np.maximum(latency(x, params.a, params.b, params.c, params.s), 1e-12)
    p = pdtr(np.maximum(x - k, 0.0), age * x / pred)
    i = int(np.argmin(p))
    if not p[i] * p.size <= alpha:  # Bonferroni: the most improbable of this many steps
        return None
    return Outlived(float(age[i] / pred[i]), now - float(age[i]), int(k[i]))
