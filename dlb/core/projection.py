"""Euclidean projection onto the probability simplex restricted to allowed arcs.

Flow routing keeps, for each source cell i, a routing vector on
``Δ_i = {z ≥ 0, Σ z = 1, z_j = 0 for j ∉ C+(i)}``; after every gradient step the vector is projected
back. We use the exact sort-based algorithm (Held–Wolfe–Crowder; Duchi et al. 2008): O(n log n),
no iteration, exact up to floating point. With at most a few hundred cells the sort is cheaper than
Condat's pivoting in numpy.
"""

from __future__ import annotations

import numpy as np


def project_simplex(v: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """argmin_{z ∈ Δ(mask)} ||z − v||₂.

    ``mask`` marks allowed coordinates (default: all). Disallowed coordinates are exactly 0 in the
    result. Raises ``ValueError`` when no coordinate is allowed (an empty simplex).
    """
    v = np.asarray(v, dtype=float)
    out = np.zeros_like(v)
    idx: slice | np.ndarray
    if mask is None:
        idx = slice(None)
        w = v
    else:
        idx = arcs = np.flatnonzero(mask)
        if arcs.size == 0:
            raise ValueError("cannot project onto an empty simplex (no allowed arc)")
        w = v[idx]
    if not np.all(np.isfinite(w)):
        raise ValueError(f"cannot project a non-finite vector: {w}")
    u = np.sort(w)[::-1]
    css = np.cumsum(u) - 1.0
    k = np.arange(1, u.size + 1)
    # ρ = the largest k with u_k − (Σ_{r≤k} u_r − 1)/k > 0; it always exists (k = 1 qualifies).
    rho = np.flatnonzero(u - css / k > 0)[-1]
    theta = css[rho] / (rho + 1)
    out[idx] = np.maximum(w - theta, 0.0)
    return out


def project_simplex_scaled(v: np.ndarray, w: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """argmin_{z ∈ Δ(mask)} Σ_j (z_j − v_j)²/w_j for weights ``w > 0`` (the projection in the metric diag(1/w)).

    The solution is ``z_j = max(v_j − θ·w_j, 0)`` with θ fixing Σ z = 1: the same sort-based search as
    :func:`project_simplex` over the breakpoints ``v_j/w_j``. Why flow routing needs it: a step scaled
    per cell (``w_j``) and then projected in the plain Euclidean metric has biased fixed points (costs
    on the support differ by θ·/w_j); projected in this metric they are exactly the KKT points, as
    for the unscaled step. With equal weights it is :func:`project_simplex`.
    """
    v = np.asarray(v, dtype=float)
    w = np.asarray(w, dtype=float)
    out = np.zeros_like(v)
    arcs = np.arange(v.size) if mask is None else np.flatnonzero(mask)
    if arcs.size == 0:
        raise ValueError("cannot project onto an empty simplex (no allowed arc)")
    vv, ww = v[arcs], w[arcs]
    if not (np.all(np.isfinite(vv)) and np.all(np.isfinite(ww))):
        raise ValueError(f"cannot project a non-finite vector: {vv} (weights {ww})")
    if np.any(ww <= 0):
        raise ValueError(f"projection weights must be > 0: {ww}")
    order = np.argsort(-vv / ww, kind="stable")
    cv = np.cumsum(vv[order]) - 1.0
    cw = np.cumsum(ww[order])
    # Largest k whose k-th breakpoint is above the θ of the top-k support (k = 1 always qualifies).
    k = np.flatnonzero(vv[order] / ww[order] - cv / cw > 0)[-1]
    theta = cv[k] / cw[k]
    out[arcs] = np.maximum(vv - theta * ww, 0.0)
    return out
