"""Fitting the latency model to (RIF-at-arrival, latency) samples.

``scipy.optimize.least_squares`` with bounds and a robust (soft-L1) loss, because serving latencies
are heavy-tailed (a few very long generations must not drag the whole curve). When samples are few
or cover only part of the load range, the fit is unidentifiable (no knee seen yet), so we add
*shrinkage residuals* pulling each parameter toward the fleet prior with a fixed weight, so their
share of the objective fades like 1/n as data accumulates. The returned confidence in [0, 1] combines the
sample count and the spread of RIF seen, so roots can tell a fitted model from a guess.

Caveat the paper notes and we inherit: a window of *completed* requests is biased toward short
requests (long ones are still in flight, censored); the leaf should use a window long enough for
typical requests to complete.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from dlb.core.latency_model import LatencyParams, latency

#: Below this many samples the fit returns the prior with zero confidence.
MIN_SAMPLES = 8
#: Largest knee as a fraction of a/b (the stability boundary c < a/b).
R_MAX = 0.99
#: Share of the window's evidence that must lie at or below the prior's knee (RIF ≤ c + s) for the
#: intercept ``a`` and the knee ``c`` to be fitted. With less, every sample sits on the queueing
#: slope, where any (a, b) pair through the window's mean fits as well as any other: a busy batched
#: cell (RIF 1,000 past a knee of 60) was fitted with a = 15 s and 1/b = 1,641 req/s against a true
#: 1.1 s and 56 req/s, and its gradient cost swung 20× between refits. Then only ``b`` is fitted,
#: with ``a``, ``c`` and ``s`` held at the (measured) prior: the slope through the window given the
#: unloaded latency. (Wider rules let ramp-up windows start full fits; research/routing-stress.)
MIN_FLAT_SHARE = 0.1


@dataclass(frozen=True)
class FitResult:
    params: LatencyParams
    confidence: float
    samples: int
    rmse: float
    converged: bool


@dataclass(frozen=True)
class Censored:
    """Requests still in flight: their RIF at arrival and how long they have run so far.

    A window of completed requests misses the slow ones still running, and it misses more of them
    the faster the cell's queue grows: a batched cell whose RIF climbed 400 → 1,800 was fitted with
    2.2× its real capacity, so its costs read low and the roots kept feeding it. An in-flight
    request's latency is at least its age, so the model must not predict less at its arrival RIF: each
    adds a one-sided residual ``min(0, ℓ(N) − age)``, never larger than the residual its eventual
    completion will add, so it moves the fit toward the uncensored one and never past it.
    """

    rif: np.ndarray
    age: np.ndarray
    #: Requests running before ``rif``/``age`` were thinned to a sample (None: they are all of them).
    total: int | None = None

    @property
    def count(self) -> int:
        """How many requests are running (not how many are in the sample)."""
        return self.total if self.total is not None else int(np.asarray(self.rif).size)


def _censored(censored: Censored | None) -> tuple[np.ndarray, np.ndarray]:
    if censored is None:
        return np.zeros(0), np.zeros(0)
    x = np.asarray(censored.rif, dtype=float).reshape(-1)
    t = np.asarray(censored.age, dtype=float).reshape(-1)
    if x.shape != t.shape:
        raise ValueError(f"censored rif and age must have one value per request: {x.shape} vs {t.shape}")
    ok = np.isfinite(x) & np.isfinite(t) & (x >= 0) & (t > 0)
    return x[ok], t[ok]


def fit_latency_model(
    rif: np.ndarray,
    lat: np.ndarray,
    prior: LatencyParams,
    prior_weight: float = 1.0,
    loss: str = "soft_l1",
    weights: np.ndarray | None = None,
    censored: Censored | None = None,
) -> FitResult:
    """Fit θ = (a, b, c, s) to samples; shrink toward ``prior`` when evidence is thin.

    ``weights`` (in (0, 1], one per sample; the estimator passes recency weights) scale each
    sample's residual by √w, and the evidence behind the confidence is Σw rather than the count:
    a window of old samples is worth less than as many fresh ones. ``censored``: requests still in
    flight, each a lower bound on the latency at its arrival RIF (:class:`Censored`); they add no
    evidence to the confidence (they say "at least", not "this much").
    """
    x = np.asarray(rif, dtype=float).reshape(-1)
    y = np.asarray(lat, dtype=float).reshape(-1)
    w = np.ones_like(x) if weights is None else np.asarray(weights, dtype=float).reshape(-1)
    if w.shape != x.shape:
        raise ValueError(f"weights must have one value per sample: {w.shape} vs {x.shape}")
    ok = np.isfinite(x) & np.isfinite(y) & (x >= 0) & (y > 0) & np.isfinite(w) & (w > 0)
    x, y, w = x[ok], y[ok], w[ok]
    n = int(x.size)
    if n < MIN_SAMPLES:
        return FitResult(prior, 0.0, n, math.nan, False)
    cx, ct = _censored(censored)
    sqrt_w = np.sqrt(w)
    n_eff = float(w.sum())
    p0 = prior.as_array()
    if float(w[x <= p0[2] + p0[3]].sum()) < MIN_FLAT_SHARE * n_eff:
        return _fit_slope_only(x, y, w, prior, prior_weight, loss, cx, ct)

    y_scale = float(np.median(y))
    x_max = max(float(x.max()), 1.0)
    # Work in scaled units so the optimiser sees O(1) numbers whatever the endpoint's latency scale.
    # The knee is searched as r = c·b/a ∈ [0, R_MAX] so every candidate satisfies the stability
    # shape c < a/b. (Fitting c freely and clamping afterwards moved the knee far left of the data
    # whenever the unconstrained optimum had c·b ≥ a, e.g. a window seen only near saturation, and
    # the published curve then overestimated latency by 10×.)
    scale = np.array([y_scale, y_scale / x_max, 1.0, x_max])
    z0 = np.clip(p0 / scale, 1e-6, 1e6)
    z0[2] = p0[2] * p0[1] / p0[0]
    lo = np.array([1e-6, 1e-9, 0.0, 1e-3])
    hi = np.array([1e3, 1e3, R_MAX, 10.0])
    z0 = np.clip(z0, lo * 1.0001, hi * 0.9999)
    # Data residuals are not scaled by n (the robust loss must see them at their natural size); the
    # shrinkage residuals have a fixed weight, so their share of the objective fades like 1/n.
    w_prior = prior_weight
    log_p0_abs = np.log(np.maximum(p0, 1e-12))[[0, 1, 3]]
    abs_idx = [0, 1, 3]
    logaddexp = np.logaddexp

    def residuals(z: np.ndarray) -> np.ndarray:
        # Called ~50 times per fit (numerical Jacobian); :func:`latency` is inlined with the same
        # operations in the same order (bit-identical results, fewer Python calls).
        p = z * scale
        p[2] = z[2] * p[0] / p[1]
        a, b, c, s = p
        r = sqrt_w * (a + b * s * logaddexp(0.0, (x - c) / s) - y) / y_scale
        # Shrinkage on log-parameters (c may be 0, so it is shrunk additively relative to x_max).
        shrink_log = np.log(np.maximum(p[abs_idx], 1e-12)) - log_p0_abs
        shrink_c = (c - p0[2]) / x_max
        under = np.minimum(a + b * s * logaddexp(0.0, (cx - c) / s) - ct, 0.0) / y_scale
        return np.concatenate([r, under, w_prior * shrink_log, [w_prior * shrink_c]])

    try:
        res = least_squares(residuals, z0, bounds=(lo, hi), loss=loss, f_scale=0.25, max_nfev=200)
        p = res.x * scale
        p[2] = res.x[2] * p[0] / p[1]
        converged = bool(res.success)
    except (ValueError, np.linalg.LinAlgError):
        return FitResult(prior, 0.0, n, math.nan, False)
    a, b, c, s = (float(v) for v in p)
    return _result(x, y, n_eff, a, b, c, s, converged)


def _result(x: np.ndarray, y: np.ndarray, n_eff: float, a: float, b: float, c: float, s: float,
            converged: bool) -> FitResult:
    """A fit's parameters in the stability shape, with its error and confidence (both fits end here)."""
    # Enforce the stability shape c < a/b (μ increasing): pull the knee just inside the boundary.
    if c * b >= a:
        c = 0.99 * a / b
    rmse = float(np.sqrt(np.mean((latency(x, a, b, c, s) - y) ** 2)))
    # Confidence: grows with (weighted) evidence (half at 50 samples' worth) and with the RIF range
    # observed relative to the knee.
    coverage = min(1.0, float(np.ptp(x)) / max(c + 2 * s, 1.0))
    return FitResult(LatencyParams(a, b, c, s), evidence_confidence(n_eff, coverage), int(x.size), rmse, converged)


def _fit_slope_only(x: np.ndarray, y: np.ndarray, w: np.ndarray, prior: LatencyParams, prior_weight: float,
                    loss: str, cx: np.ndarray, ct: np.ndarray) -> FitResult:
    """Fit ``b`` alone, ``a``, ``c`` and ``s`` held at ``prior`` (see :data:`MIN_FLAT_SHARE`).

    The model is linear in ``b`` (ℓ = a + b·g(N)), so this is a one-parameter robust regression,
    shrunk toward the prior's ``b`` on the log scale like the full fit; ``cx``, ``ct``: the censored
    requests' RIF and age, one-sided residuals as in the full fit.
    """
    a, b0, c, s = prior.a, prior.b, prior.c, prior.s
    g = s * np.logaddexp(0.0, (x - c) / s)
    gc = s * np.logaddexp(0.0, (cx - c) / s)
    sqrt_w = np.sqrt(w)
    y_scale = float(np.median(y))
    log_b0 = math.log(b0)

    def residuals(z: np.ndarray) -> np.ndarray:
        b = b0 * math.exp(z[0])
        return np.concatenate([sqrt_w * (a + b * g - y) / y_scale, np.minimum(a + b * gc - ct, 0.0) / y_scale,
                               [prior_weight * (math.log(b) - log_b0)]])

    try:
        res = least_squares(residuals, np.zeros(1), bounds=(-20.0, 20.0), loss=loss, f_scale=0.25, max_nfev=100)
    except (ValueError, np.linalg.LinAlgError):
        return FitResult(prior, 0.0, int(x.size), math.nan, False)
    return _result(x, y, float(w.sum()), a, b0 * math.exp(float(res.x[0])), c, s, bool(res.success))


def evidence_confidence(n_eff: float, coverage: float = 0.0) -> float:
    """Confidence in [0, 1) from Σ recency weights ``n_eff`` (half at 50 samples' worth) and the share of
    the load range seen (``coverage`` in [0, 1]). With ``coverage`` 0 it is what a measured prior is worth:
    :class:`dlb.core.estimator.LatencyEstimator` publishes one from 3 samples, before a fit is possible."""
    return float((n_eff / (n_eff + 50.0)) * (0.5 + 0.5 * coverage)) if n_eff > 0 else 0.0


#: Fewest samples from which :func:`measured_prior` rescales a prior (fewer: the prior is kept).
MIN_PRIOR_SAMPLES = 3


def measured_prior(rif: np.ndarray, lat: np.ndarray, prior: LatencyParams, knee: float | None = None,
                   weights: np.ndarray | None = None, trust: float = 2.0) -> LatencyParams:
    """The prior's shape on the time scale the samples show, and the knee the servers report.

    A configured prior is a guess written before the cell was ever measured; the issue that added
    this measured one off by ×50 (a = 0.8 s against a real 10 ms). Its *shape* (where the knee sits in
    requests, how smooth it is) is the part a guess gets roughly right; its *time scale* is the part
    any sample measures. So the time scale is replaced by the median ratio of measured latency to the
    prior's prediction at the same RIF — exact for a prior wrong only in scale, robust to a few long
    requests — from as few as :data:`MIN_PRIOR_SAMPLES` samples, long before a full fit is identified.
    ``knee``: the cell's concurrency limit as the servers report it (Σ of ``vllm:num_requests_running``
    seen while requests wait), which replaces the prior's knee when known. ``weights`` (recency) make
    it a weighted median, so a cell that recovered is rescaled by its recent probes, not by a window
    still full of samples from when it was slow (measured: 36–60 s to recover instead of ~15 s).
    ``trust``: a prior whose scale the samples confirm within this factor is kept as it is — the
    rescaling assumes the prior's *shape* is right, which a prior of the wrong shape (decode-bound
    knee on a prefill-bound cell) is not, and rescaling such a prior by a loaded cell's queueing
    cost Disc-Lat ~5 % of its gain over Rand in the paper's baseline (5 scenarios, measured).
    """
    x = np.asarray(rif, dtype=float).reshape(-1)
    y = np.asarray(lat, dtype=float).reshape(-1)
    w = np.ones_like(x) if weights is None else np.asarray(weights, dtype=float).reshape(-1)
    ok = np.isfinite(x) & np.isfinite(y) & (x >= 0) & (y > 0) & (w > 0)
    x, y, w = x[ok], y[ok], w[ok]
    base = prior
    if knee is not None and knee > 0:
        # Keep the stability shape c < a/b: a knee further right than the prior allows means the
        # prior's throughput (1/b) was too low for these servers.
        base = LatencyParams(prior.a, min(prior.b, 0.9 * prior.a / knee), float(knee), prior.s)
    if x.size < MIN_PRIOR_SAMPLES:
        return base
    ratio = y / latency(x, base.a, base.b, base.c, base.s)
    order = np.argsort(ratio)
    cum = np.cumsum(w[order])
    f = float(ratio[order][int(np.searchsorted(cum, 0.5 * cum[-1]))])
    if not (math.isfinite(f) and f > 0) or abs(math.log(f)) < math.log(trust):
        return base
    return LatencyParams(base.a * f, base.b * f, base.c, base.s)


def shrink_toward_prior(fit: FitResult, prior: LatencyParams) -> LatencyParams:
    """Blend a fit with the prior by its confidence (geometric for scale parameters)."""
    w = fit.confidence
    p, q = fit.params, prior
    a = math.exp(w * math.log(p.a) + (1 - w) * math.log(q.a))
    b = math.exp(w * math.log(p.b) + (1 - w) * math.log(q.b))
    s = math.exp(w * math.log(p.s) + (1 - w) * math.log(q.s))
    c = w * p.c + (1 - w) * q.c
    if c * b >= a:
        c = 0.99 * a / b
    return LatencyParams(a, b, c, s)
