"""What a leaf measures about its cell: the latency model (sliding-window fit) and the error rate.

Pure and clock-free (callers pass ``now``), so the leaf agent (real time) and the simulator
(simulated time) run the same code:

- :class:`LatencyEstimator` keeps a sliding window of completed requests, each tagged with the cell's
  RIF at its arrival, and refits :func:`dlb.core.fit.fit_latency_model` every
  ``refit_period`` seconds. The published parameters are the fit blended toward the prior by the
  fit's confidence (:func:`shrink_toward_prior`), so a cell that has seen little traffic reports
  something close to the fleet prior rather than a wild guess. A window of *completed* requests is
  biased toward short ones (long ones are still in flight); the paper notes this and so do we.
  The window is bounded in *time*, and its sample count is bounded by thinning: when the request
  rate would put more than ``max_samples`` in the window, only every k-th completion is kept
  (k from the rate seen at the last refit). Keeping the *newest* ``max_samples`` instead would shrink
  a busy cell's window to a few seconds of one transient, which the fit then mistakes for the curve.
- **Learning without traffic** (issue 12; paper §6 "Estimation and routing form a closed loop":
  background probing, shrinkage toward a prior, dithering). Three parts live here:
  *measured prior* — after :data:`~dlb.core.fit.MIN_PRIOR_SAMPLES` samples the configured prior's
  time scale is replaced by what the samples show (:func:`~dlb.core.fit.measured_prior`), and the
  knee by the servers' reported concurrency limit when the leaf knows it; the fit and the shrinkage
  then pull toward that, not toward a guess that may be off ×50. *Recency* — samples are weighted
  ``2^(−age/half_life_s)`` in the fit, and the confidence counts that weighted evidence, so
  confidence rises with evidence and falls with age, and a cell that changed (3× slower) is
  refitted from its recent behaviour within about a half-life instead of a whole window.
  *Dithering* — the published time scale is multiplied by ``1 + dither·ξ``, ξ ~ U[−1, 1] drawn
  at each refit, so cells whose estimates are within a few percent of each other swap places now
  and then instead of one of them being starved of samples forever. The samples themselves come
  from traffic or, on a cell without traffic, from the leaf's background probes
  (:mod:`dlb.core.background`).
- :class:`ErrorTracker` is an exponentially-decaying error *fraction*: errors and outcomes are both
  decayed with time constant ``tau``, and the rate is their ratio. Decaying counts (rather than an EMA
  per sample) makes the value independent of the request rate, which differs by orders of magnitude
  between endpoints.
"""

from __future__ import annotations

import copy
import math
import random
from collections import deque
from dataclasses import dataclass

import numpy as np

from dlb.core.change import ChangeDetector
from dlb.core.fit import (
    MIN_PRIOR_SAMPLES,
    Censored,
    FitResult,
    evidence_confidence,
    fit_latency_model,
    measured_prior,
    shrink_toward_prior,
)
from dlb.core.latency_model import LatencyParams, latency_at


@dataclass(frozen=True)
class EstimatorConfig:
    #: Samples older than this (seconds before ``now``) leave the window.
    window_s: float = 60.0
    #: Seconds between two fits (a fit costs milliseconds; the root only needs fresh-ish curves).
    refit_period_s: float = 5.0
    #: Upper bound on the samples kept (bounds the cost of one fit on high-rate endpoints).
    max_samples: int = 2000
    #: Weight of the shrinkage toward the prior inside the fit.
    prior_weight: float = 1.0
    #: Age (seconds) at which a sample counts half in the fit and in the confidence; ``inf``: no decay.
    half_life_s: float = 15.0
    #: Replace the configured prior's time scale (and knee) by measured ones once samples exist.
    measure_prior: bool = True
    #: Relative amplitude of the dithering noise on the published time scale (0 disables it).
    dither: float = 0.05
    #: Change detection on every kept sample (:mod:`dlb.core.change`): blocks of this many samples
    #: (0 disables it), a block surprising when its mean measured ÷ predicted latency is off by more
    #: than ``change_tolerance``, ``change_after`` same-sign blocks in a row = the cell changed.
    change_block: int = 16
    change_tolerance: float = 1.0
    change_after: int = 3

    def __post_init__(self) -> None:
        if self.window_s <= 0 or self.refit_period_s <= 0 or self.max_samples < 1:
            raise ValueError(
                f"estimator window_s and refit_period_s must be > 0 and max_samples >= 1: {self}"
            )
        if not self.half_life_s > 0:
            raise ValueError(f"estimator half_life_s must be > 0 (inf disables the decay): {self.half_life_s}")
        if not 0 <= self.dither < 1:
            raise ValueError(f"estimator dither must be in [0, 1): {self.dither}")
        if self.change_block < 0 or self.change_after < 1 or not self.change_tolerance > 0:
            raise ValueError(f"estimator change_block must be >= 0, change_after >= 1, change_tolerance > 0: {self}")

    @classmethod
    def static(cls, window_s: float = 60.0, refit_period_s: float = 5.0, max_samples: int = 2000) -> EstimatorConfig:
        """The estimator before issue 12: config prior, no recency weights, no dithering (for comparisons)."""
        return cls(window_s=window_s, refit_period_s=refit_period_s, max_samples=max_samples,
                   half_life_s=math.inf, measure_prior=False, dither=0.0, change_block=0)


class LatencyEstimator:
    """Sliding window of (arrival RIF, latency) samples and the latency model fitted to it."""

    def __init__(self, prior: LatencyParams, config: EstimatorConfig | None = None,
                 rng: random.Random | None = None) -> None:
        #: The configured prior (from the config or the control plane).
        self.prior = prior
        #: What the fit shrinks toward: ``prior`` until samples measure a better one.
        self.effective_prior = prior
        #: The cell's concurrency limit as its servers report it (None: unknown; see set_knee).
        self.knee: float | None = None
        self.config = config or EstimatorConfig()
        self._rng = rng if rng is not None else random.Random(0)
        self._t: deque[float] = deque(maxlen=self.config.max_samples)
        self._rif: deque[float] = deque(maxlen=self.config.max_samples)
        self._lat: deque[float] = deque(maxlen=self.config.max_samples)
        self._last_fit = -math.inf
        self._stride = 1
        self._prior_refused = False
        self._skip = 0
        self.params: LatencyParams = prior
        self.confidence: float = 0.0
        self.last_result: FitResult | None = None
        #: Confidence of a model :meth:`raise_by` published, kept until samples measure one again.
        self._raised: float = 0.0
        cfg = self.config
        self.detector = (ChangeDetector(cfg.change_block, cfg.change_tolerance, cfg.change_after)
                         if cfg.change_block > 0 else None)
        #: Start of a change the detector declared and the caller has not refitted for yet.
        self.changed_since: float | None = None

    def record(self, now: float, rif_at_arrival: float, latency_s: float) -> None:
        """One completed request: the cell's RIF when it arrived and its serving latency.

        With change detection on, a kept sample is also compared with the published model; when the
        detector declares a change, the samples before it are dropped at once and
        :attr:`changed_since` tells the caller to refit now (:meth:`take_change`).
        """
        if self._stride > 1:
            self._skip += 1
            if self._skip < self._stride:
                return
            self._skip = 0
        self._t.append(now)
        self._rif.append(rif_at_arrival)
        self._lat.append(latency_s)
        det = self.detector
        if det is not None:
            p = self.params
            predicted = latency_at(rif_at_arrival, p.a, p.b, p.c, p.s)
            t_change = det.add(now, latency_s / predicted) if predicted > 0 else None
            if t_change is not None:
                self.forget_before(t_change)
                det.reset()
                self.changed_since = t_change

    def take_change(self) -> float | None:
        """The start of a change declared from the samples since the last call (the caller refits now), once."""
        t, self.changed_since = self.changed_since, None
        return t

    def __len__(self) -> int:
        return len(self._t)

    def _expire(self, now: float) -> None:
        horizon = now - self.config.window_s
        t = self._t
        while t and t[0] < horizon:
            t.popleft()
            self._rif.popleft()
            self._lat.popleft()

    def maybe_refit(self, now: float, in_flight: Censored | None = None) -> bool:
        """Refit if ``refit_period`` has passed since the last fit; return whether it did."""
        if now - self._last_fit < self.config.refit_period_s:
            return False
        self.refit(now, in_flight)
        return True

    def refit(self, now: float, in_flight: Censored | None = None) -> FitResult:
        """Fit now on the samples inside the window and publish the shrunk parameters.

        ``in_flight``: the cell's requests still running (RIF at arrival, age), lower bounds on
        latency the fit must respect (:class:`~dlb.core.fit.Censored`); at most ``max_samples`` of
        them are used, evenly spread, so a cell holding thousands does not slow the fit.
        """
        self._last_fit = now
        self._expire(now)
        cfg = self.config
        rif = np.fromiter(self._rif, float, len(self._rif))
        lat = np.fromiter(self._lat, float, len(self._lat))
        weights = None
        if math.isfinite(cfg.half_life_s) and rif.size:
            age = now - np.fromiter(self._t, float, len(self._t))
            weights = np.exp2(-np.maximum(age, 0.0) / cfg.half_life_s)
        measured = False
        if cfg.measure_prior:
            if rif.size >= MIN_PRIOR_SAMPLES:
                scaled = measured_prior(rif, lat, self.prior, self.knee, weights)
                if scaled.a < self.prior.a and self._mostly_running(in_flight):
                    # The first completions of a cell are its shortest requests: while most of its
                    # requests are still running, a *faster* scale from them is unknown (the median
                    # with the running ones counted is not yet observed), so the last one stays.
                    # Measured: a 4-server cell rescaled 0.23x by its five shortest requests with 350
                    # running, then published for the whole run with no sample behind it.
                    self.effective_prior = measured_prior(rif[:0], lat[:0], self.effective_prior, self.knee)
                    self._prior_refused = True  # retried on the refit schedule, not at every sample
                else:
                    self.effective_prior = scaled
                    self._raised = 0.0
                    self._prior_refused = False
                    measured = True
            elif self.knee is not None:
                # Too few samples to measure the time scale: keep the last measured one (an old
                # measurement beats the guess it replaced) and take the servers' knee.
                self.effective_prior = measured_prior(rif[:0], lat[:0], self.effective_prior, self.knee)
        prior = self.effective_prior
        if in_flight is not None and in_flight.rif.size > cfg.max_samples:
            keep = np.linspace(0, in_flight.rif.size - 1, cfg.max_samples).astype(np.int64)
            in_flight = Censored(np.asarray(in_flight.rif)[keep], np.asarray(in_flight.age)[keep], in_flight.count)
        res = fit_latency_model(rif, lat, prior, prior_weight=cfg.prior_weight, weights=weights, censored=in_flight)
        self.last_result = res
        # Thinning for the next period: kept samples per window ≈ max_samples.
        if self._t:
            span = max(now - self._t[0], self.config.refit_period_s)
            rate = len(self._t) * self._stride / span
            self._stride = max(1, math.ceil(rate * self.config.window_s / self.config.max_samples))
        params = shrink_toward_prior(res, prior) if res.confidence > 0 else prior
        confidence = res.confidence
        if confidence <= 0 and measured:
            # Too few samples to fit, but the published prior was measured from them (rescaled or
            # confirmed): evidence, not a guess. Confidence 0 tells a root "this is the configured
            # prior" and it keeps its learned curve instead (RootRouter.on_probe) — after a declared
            # change left a few samples, that kept the slow curve of a recovered cell until 8 probes
            # came in (~30 s behind real Envoys).
            confidence = evidence_confidence(float(weights.sum()) if weights is not None else float(rif.size))
        if confidence <= 0:
            confidence = self._raised  # too few samples since a raise: it still stands
        if cfg.dither > 0:
            g = 1.0 + cfg.dither * (2.0 * self._rng.random() - 1.0)
            params = LatencyParams(params.a * g, params.b * g, params.c, params.s)
        self.params = params
        self.confidence = confidence
        return res

    def _mostly_running(self, in_flight: Censored | None) -> bool:
        """More of the cell's requests are running than completed in the window (thinned samples
        count for the stride they stand for): fewer than half of them have a known latency."""
        return in_flight is not None and in_flight.count > len(self._t) * self._stride

    def refit_due(self, now: float) -> bool:
        """Refit now: on schedule, at once when the samples declared a change (consumed here, see
        :meth:`take_change`), or when the first samples can replace the configured prior."""
        changed = self.take_change() is not None
        return changed or self.prior_measurable() or now - self._last_fit >= self.config.refit_period_s

    @property
    def measured(self) -> bool:
        """The published model rests on samples (a fit, or a prior measured from them), not on the
        configured prior alone: what the background prober may remember as a cell's best capacity."""
        return self.confidence > 0 or self.effective_prior is not self.prior

    def prior_measurable(self) -> bool:
        """The first samples can replace the configured prior: refit at once rather than on schedule."""
        return (self.config.measure_prior and self.effective_prior is self.prior and not self._prior_refused
                and len(self._t) >= MIN_PRIOR_SAMPLES)

    def detached(self) -> LatencyEstimator:
        """A copy with its own sample windows, to refit off the event loop while this one keeps recording
        (the fit takes milliseconds; a worker must never iterate a deque that is being appended to)."""
        shadow = copy.copy(self)
        shadow._t, shadow._rif, shadow._lat = copy.copy(self._t), copy.copy(self._rif), copy.copy(self._lat)
        return shadow

    def adopt(self, fitted: LatencyEstimator, now: float) -> None:
        """Publish what a :meth:`detached` copy's refit found."""
        self.params, self.confidence, self.last_result, self._last_fit = fitted.params, fitted.confidence, fitted.last_result, now
        self.effective_prior, self._stride, self._raised = fitted.effective_prior, fitted._stride, fitted._raised
        self._prior_refused = fitted._prior_refused

    def forget_before(self, t: float, by_arrival: bool = False) -> int:
        """Drop the samples recorded before ``t`` (the cell changed then); returns how many.

        ``by_arrival``: drop those whose request *arrived* before ``t`` (completion − latency), for a change
        whose start is an arrival time (a probe's send). A request that ran across a recovery completes
        after it with the slow latency it mostly had: kept, the 8×-slow tail of an overloaded cell still
        outvoted the three fast probes that declared the recovery (the fault bench's overload row, seed 7).
        """
        if by_arrival:
            keep = [(c, r, x) for c, r, x in zip(self._t, self._rif, self._lat, strict=True) if c - x >= t]
            k = len(self._t) - len(keep)
            self._t.clear()
            self._rif.clear()
            self._lat.clear()
            for c, r, x in keep:
                self._t.append(c)
                self._rif.append(r)
                self._lat.append(x)
            return k
        k = 0
        while self._t and self._t[0] < t:
            self._t.popleft()
            self._rif.popleft()
            self._lat.popleft()
            k += 1
        return k

    def raise_by(self, now: float, factor: float, since: float, evidence: float) -> None:
        """Requests still running outlived the published model ``factor``× since ``since`` (a cell that
        slowed, and so completes almost nothing: all a foreign cell shows of it for tens of seconds):
        publish the model scaled by ``factor`` and forget the samples completed before ``since`` (the cell
        before the change). The confidence is what ``evidence`` samples give a measured prior, so a root
        takes the new curve (confidence 0 would leave it its old one)."""
        p = self.params
        self.forget_before(since)
        self.params = self.effective_prior = LatencyParams(p.a * factor, p.b * factor, p.c, p.s)
        self.confidence = self._raised = evidence_confidence(evidence)

    def set_knee(self, knee: float | None) -> None:
        """The cell's concurrency limit measured from its servers (None: unknown); used from the next refit."""
        self.knee = knee if knee is not None and knee > 0 else None

    def reset_prior(self, prior: LatencyParams) -> None:
        """A new configured prior (from the control plane). A measured one in use stays while samples in the
        window back it; without them it was measured from a past the operator's new prior replaces (a cell
        that looked slow got no traffic, so a reloaded prior never reached its model)."""
        if prior == self.prior:
            return
        if self.effective_prior is self.prior or len(self._t) < MIN_PRIOR_SAMPLES:
            self.effective_prior = prior
            if not self._t:
                self.params, self.confidence = prior, 0.0  # nothing measured backs the published model either
        self.prior = prior


class ErrorTracker:
    """Time-decayed error fraction e ∈ [0, 1] (what the leaf reports in probes)."""

    def __init__(self, tau_s: float = 5.0) -> None:
        if tau_s <= 0:
            raise ValueError(f"error tracker tau_s must be > 0: {tau_s}")
        self.tau_s = tau_s
        self._errors = 0.0
        self._total = 0.0
        self._t = -math.inf

    def _decay(self, now: float) -> None:
        if now > self._t:
            if self._total > 0:
                f = math.exp(-(now - self._t) / self.tau_s)
                self._errors *= f
                self._total *= f
            self._t = now

    def record(self, now: float, error: bool) -> None:
        """One outcome (a success or an error) at ``now``."""
        self._decay(now)
        self._total += 1.0
        if error:
            self._errors += 1.0

    def remove(self, part: ErrorTracker, now: float) -> None:
        """Take back what ``part`` recorded: a tracker with the same tau fed some of this one's
        outcomes (both decay alike, so what is left is exactly the rest's)."""
        self._decay(now)
        part._decay(now)
        self._errors = max(0.0, self._errors - part._errors)
        self._total = max(0.0, self._total - part._total)

    def rate(self, now: float) -> float:
        """Error fraction over roughly the last ``tau`` seconds (0 when nothing was seen)."""
        self._decay(now)
        return self._errors / self._total if self._total > 1e-9 else 0.0
