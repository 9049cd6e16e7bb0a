"""The softplus latency model ℓ(N; θ) and the quantities the costs derive from it.

``ℓ(N) = a + b·s·softplus((N − c)/s)``: flat at ``a`` (unloaded latency) while the cell has free
slots, then growing with slope ``b`` (≈ 1/throughput) past the knee ``c``; ``s`` sets how smooth the
knee is. By Little's law μ(N) = N/ℓ(N), and the gradient cost uses
``1/μ'(N) = ℓ(N)² / (ℓ(N) − N·ℓ'(N))``. Requiring ``c < a/b`` keeps μ increasing (the denominator is
positive for all N) and bounded by ``1/b``, which is the paper's Assumption 1.

All functions are numpy-vectorised over N and over parameter arrays, so a root can evaluate every cell
in one call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: A scalar parameter or one per cell (the model is evaluated for every cell at once).
Num = np.ndarray | float

#: Floor for the denominator ℓ − Nℓ' of 1/μ': the exact value is > 0 under ``c < a/b`` but can
#: approach 0 for fitted parameters near the boundary, where 1/μ' would explode.
GRAD_EPS = 1e-6

#: The utilisation at which the gradient cost stops growing faster than latency. Past the knee
#: ``(ℓ − Nℓ')/ℓ = 1 − bN/ℓ = 1 − ρ``, so ``1/μ' = ℓ/(1 − ρ)``: near a fitted ``a ≈ bc`` the
#: denominator is a small difference of two estimates, and a ±5 % change of ``a`` moved the cost of a
#: full cell between 67 and 185 s while its latency moved 2 %. Flooring ``1 − ρ`` at ``1 − GRAD_MAX_RHO``
#: bounds the cost by ``ℓ/(1 − GRAD_MAX_RHO)`` (20 ℓ): still increasing in N (through ℓ), insensitive to
#: the estimate's dither, and load past that utilisation is the overflow term's and shedding's to handle.
GRAD_MAX_RHO = 0.95


@dataclass(frozen=True)
class LatencyParams:
    """θ = (a, b, c, s): a in seconds, b in seconds per request, c and s in requests."""

    a: float
    b: float
    c: float
    s: float

    def __post_init__(self) -> None:
        if not (self.a > 0 and self.b > 0 and self.s > 0 and self.c >= 0) or math.isinf(self.a + self.b + self.c + self.s):
            raise ValueError(f"latency parameters need finite a, b, s > 0 and c >= 0: {self}")

    def as_array(self) -> np.ndarray:
        return np.array([self.a, self.b, self.c, self.s])

    @property
    def capacity(self) -> float:
        """sup μ = 1/b (requests per second)."""
        return 1.0 / self.b

    def is_stable_shape(self) -> bool:
        """``c < a/b``: μ strictly increasing for every N ≥ 0."""
        return self.c * self.b < self.a


def softplus(x: np.ndarray | float) -> np.ndarray:
    """log(1 + e^x) without overflow."""
    x = np.asarray(x, dtype=float)
    return np.logaddexp(0.0, x)


def sigmoid(x: np.ndarray | float) -> np.ndarray:
    x = np.asarray(x, dtype=float)
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def latency(n: np.ndarray | float, a: Num, b: Num, c: Num, s: Num) -> np.ndarray:
    """ℓ(N)."""
    return a + b * s * softplus((np.asarray(n, float) - c) / s)


def latency_at(n: float, a: float, b: float, c: float, s: float) -> float:
    """ℓ(N) of one model, in floats: no numpy on the request and probe paths (the same arithmetic as
    :func:`latency`, softplus written overflow-free)."""
    z = (n - c) / s
    return a + b * s * (math.log1p(math.exp(-abs(z))) + max(z, 0.0))


def d_latency(n: np.ndarray | float, a: Num, b: Num, c: Num, s: Num) -> np.ndarray:
    """ℓ'(N) = b·σ((N − c)/s)."""
    return b * sigmoid((np.asarray(n, float) - c) / s)


def service_rate(n: np.ndarray | float, a: Num, b: Num, c: Num, s: Num) -> np.ndarray:
    """μ(N) = N / ℓ(N) (Little's law applied to the instantaneous state)."""
    n = np.asarray(n, float)
    return n / latency(n, a, b, c, s)


def d_service_rate(n: np.ndarray | float, a: Num, b: Num, c: Num, s: Num) -> np.ndarray:
    """μ'(N) = (ℓ − Nℓ') / ℓ²."""
    n = np.asarray(n, float)
    ell = latency(n, a, b, c, s)
    return (ell - n * d_latency(n, a, b, c, s)) / (ell * ell)


def inv_marginal_rate(n: np.ndarray | float, a: Num, b: Num, c: Num, s: Num, eps: float = GRAD_EPS,
                      floor: Num | None = None) -> np.ndarray:
    """1/μ'(N) = ℓ² / (ℓ − Nℓ'), with the denominator floored at ``floor·ℓ`` (and ``eps``).

    ``floor``: the least ``1 − ρ`` per cell (:mod:`dlb.core.grad_floor`); default ``1 − GRAD_MAX_RHO``.
    """
    n = np.asarray(n, float)
    ell = latency(n, a, b, c, s)
    f = (1.0 - GRAD_MAX_RHO) if floor is None else floor
    denom = np.maximum(ell - n * d_latency(n, a, b, c, s), np.maximum(f * ell, eps))
    return ell * ell / denom


def workload_for_rate(lam: float, a: float, b: float, c: float, s: float, tol: float = 1e-12) -> float:
    """Inverse of μ: the workload N at which the cell processes ``lam`` requests per second.

    Used by the theory check and the simulator's sanity tests; μ is increasing, so bisection is exact.
    Returns ``inf`` when ``lam >= 1/b`` (beyond capacity).
    """
    if lam <= 0:
        return 0.0
    if lam * b >= 1.0 - 1e-12:
        return float("inf")
    lo, hi = 0.0, 1.0
    while float(service_rate(hi, a, b, c, s)) < lam:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if float(service_rate(mid, a, b, c, s)) < lam:
            lo = mid
        else:
            hi = mid
        if hi - lo <= tol * max(1.0, hi):
            break
    return 0.5 * (lo + hi)
