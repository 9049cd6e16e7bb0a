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
one point per interval instead of one per request, so it is smoother than a leaf's. An interval in which
nothing completed gives no sample, but it is evidence too: while nothing completes, every request the cell
held at its last completion is still running, so each is a lower bound on latency at that RIF
(:meth:`IntervalLatency.in_flight`, the leaf's :class:`~dlb.core.fit.Censored`, but without each
request's own age). It assumes the histograms cover every request the RIF counts.

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

from dlb.core.fit import Censored

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
    #: Since when nothing completed, and the RIF then (None: not known, e.g. a source came or went).
    _idle_since: tuple[float, float] | None = None

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
            self._idle_since = (now, rif) if readings else None
            return None
        d_sum, d_count = interval_totals(prev, readings)
        if d_count > 0 or not readings or prev.keys() != readings.keys() or not (math.isfinite(rif) and rif >= 0):
            self._idle_since = (now, rif) if readings and math.isfinite(rif) and rif >= 0 else None
        if not (d_count > 0 and d_sum > 0) or not self._rif_t:
            return None
        latency = d_sum / d_count
        return IntervalSample(now, self.mean_rif(t0 - latency, now - latency), latency, d_count)

    def in_flight(self, now: float, rif: float) -> Censored | None:
        """The requests known to be running since the last completion (all the cell held then, at most
        ``rif`` now), each with that RIF and that age: lower bounds for the fit. None when unknown or none."""
        if self._idle_since is None:
            return None
        since, held = self._idle_since
        k = int(min(held, rif)) if math.isfinite(rif) else 0
        if k < 1 or not now > since:
            return None
        return Censored(np.full(k, held), np.full(k, now - since))

    def mean_rif(self, start: float, end: float) -> float:
        """The cell's mean RIF over ``[start, end]``, linear between readings, the nearest one outside them."""
        grid = np.linspace(start, end, RIF_GRID)
        return float(np.interp(grid, np.fromiter(self._rif_t, float), np.fromiter(self._rif_v, float)).mean())
