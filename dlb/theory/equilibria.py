"""Steady states of the fluid model, computed independently of the routers (paper section 4, App. C.2).

The fluid model (paper section 4): cell i receives λ_i requests/s and sends a fraction x_ij to cell j;
in steady state cell j's inflow ``z_j = Σ_i λ_i x_ij`` equals its service rate μ_j(N_j), so the
workload is ``N_j = μ_j⁻¹(z_j)``. Every quantity here is a function of the flows ``f_ij = λ_i x_ij``
and of the latency model ℓ_j alone, and is solved with ``scipy.optimize``; none of it calls the routing
costs (:mod:`dlb.core.costs`) or the routers, so agreement between these solutions and the
routers' end states is evidence, not a tautology.

- **Optimum** (what Flow-Grad should reach): minimise the total latency rate
  ``L(f) = Σ_j N_j(z_j) + Σ_ij f_ij·2τ_ij`` (requests in service, by Little's law ``z·ℓ(N) = N``, plus
  requests on the wire). Mean latency per request is ``L/Σλ``.
- **Wardrop equilibrium** (Flow-Lat, cost ``ℓ_j(N_j) + 2τ_ij``): minimise the Beckmann potential
  ``B(f) = Σ_j ∫₀^{z_j} ℓ_j(μ_j⁻¹(s)) ds + Σ_ij f_ij·2τ_ij``. The cost depends on the cell only through
  its inflow, so B's gradient is exactly the cost and its KKT conditions are Wardrop's (every used arc
  of a source has the least cost).
- **RIF equilibrium** (Disc-RIF, cost ``N_j/k_j``): the same potential with ``ℓ`` replaced by ``N/k``.
  On a complete graph it is the water level w with ``Σ_j μ_j(k_j·w) = Σλ`` (:func:`rif_waterfill`, via
  ``brentq``), which the tests use to cross-check the general solver.

Cells are strictly below capacity at every solution (Assumption 2 makes a feasible routing exist and
the marginal costs blow up at capacity); with buffers (``FluidNetwork.buffer``) a cell's workload is
also bounded by its buffer, and a cell held there may be cheaper than the arcs in use. :func:`solve` starts from the routing that minimises the
largest utilisation (an LP) and works in workload space, where the problem stays well conditioned;
every answer is checked by its complementary-slackness residual (:func:`kkt_residual`), and when SLSQP
stopped short (it sometimes reports success at a non-stationary point) it is rerun over the routing
alone, with N = μ⁻¹(z) by bisection, from where it stopped.
Only the workloads are unique (Lemma 1); for RIF, whose cost ignores the network, several routings
give the same N and different network latency.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq, linprog, minimize

from dlb.core.latency_model import d_service_rate, latency, service_rate

#: Gauss–Legendre nodes for the potential integrals (integrands are smooth; 64 nodes is exact to ~1e-12).
_GL_X, _GL_W = np.polynomial.legendre.leggauss(64)


class Objective(str, enum.Enum):
    OPTIMUM = "optimum"
    WARDROP = "wardrop"
    RIF = "rif"


@dataclass(frozen=True, eq=False)
class FluidNetwork:
    """The data of the fluid model: arrival rates, latency models, one-way delays, allowed arcs.

    Arrays: ``lam`` (n,), ``a, b, c, s, replicas`` (n,), ``tau`` (n, n) one-way seconds, ``allowed``
    (n, n) bool, ``buffer`` (n,) or None. ``name`` labels reports.
    """

    name: str
    lam: np.ndarray
    a: np.ndarray
    b: np.ndarray
    c: np.ndarray
    s: np.ndarray
    replicas: np.ndarray
    tau: np.ndarray
    allowed: np.ndarray
    #: Per-cell buffer (requests a cell can hold: servers' slots + queues); inflow beyond it is lost.
    #: ``None``: unbounded (the paper's model).
    buffer: np.ndarray | None = None

    @property
    def n(self) -> int:
        return int(self.lam.shape[0])

    @property
    def capacity(self) -> np.ndarray:
        return 1.0 / self.b

    @property
    def utilisation(self) -> float:
        return float(self.lam.sum() / self.capacity.sum())


@dataclass(frozen=True)
class Equilibrium:
    """A steady state: routing ``x`` (n, n), inflows ``z``, workloads ``N``, total latency rate ``L``."""

    objective: Objective
    x: np.ndarray
    z: np.ndarray
    N: np.ndarray
    total_latency: float
    #: Largest violation of the objective's KKT conditions (seconds or RIF/replica), see :func:`kkt_residual`.
    kkt: float

    def mean_latency(self, net: FluidNetwork) -> float:
        return self.total_latency / float(net.lam.sum())


# -- the inverse service rate ---------------------------------------------------------------------------
def workload(z: np.ndarray, net: FluidNetwork) -> np.ndarray:
    """N_j = μ_j⁻¹(z_j) for every cell at once (vectorised bisection, then Newton polish).

    Exact (to ~1e-13 relative) for ``0 ≤ z < 1/b``; ``inf`` at or beyond capacity.
    """
    z = np.asarray(z, float)
    a, b, c, s = net.a, net.b, net.c, net.s
    out = np.full(z.shape, np.inf)
    ok = z * b < 1.0
    zz = np.where(ok, np.maximum(z, 0.0), 0.0)
    # μ(N) ≥ N/(a + bN + b·s·ln2) gives an upper bracket for μ⁻¹.
    hi = zz * (a + b * s * np.log(2.0)) / np.maximum(1.0 - b * zz, 1e-300) + 1e-9
    lo = np.zeros_like(zz)
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        below = service_rate(mid, a, b, c, s) < zz
        lo = np.where(below, mid, lo)
        hi = np.where(below, hi, mid)
    n = 0.5 * (lo + hi)
    for _ in range(2):
        n = np.clip(n - (service_rate(n, a, b, c, s) - zz) / d_service_rate(n, a, b, c, s), lo, hi)
    out[ok] = n[ok]
    return out


def _cell_primitive(objective: Objective, n_upper: np.ndarray, net: FluidNetwork) -> np.ndarray:
    """``∫₀^{z} g_j(μ_j⁻¹(s)) ds`` written as ``∫₀^{N(z)} g_j(N) μ_j'(N) dN`` (Gauss–Legendre).

    g = 1 for the optimum (the integral is N itself, returned exactly), ℓ_j for Wardrop, N/k_j for RIF.
    """
    if objective is Objective.OPTIMUM:
        return n_upper
    half = 0.5 * n_upper[:, None]
    nodes = half * (_GL_X[None, :] + 1.0)
    a, b, c, s = (p[:, None] for p in (net.a, net.b, net.c, net.s))
    dmu = d_service_rate(nodes, a, b, c, s)
    g = latency(nodes, a, b, c, s) if objective is Objective.WARDROP else nodes / net.replicas[:, None]
    return half[:, 0] * ((g * dmu) @ _GL_W)


def _cell_marginal(objective: Objective, n: np.ndarray, net: FluidNetwork) -> np.ndarray:
    """d/dz of the primitive at inflow z = μ(N): 1/μ'(N), ℓ(N) or N/k."""
    if objective is Objective.OPTIMUM:
        return 1.0 / d_service_rate(n, net.a, net.b, net.c, net.s)
    if objective is Objective.WARDROP:
        return latency(n, net.a, net.b, net.c, net.s)
    return n / net.replicas


# -- the solver ----------------------------------------------------------------------------------------
def _arcs(net: FluidNetwork) -> tuple[np.ndarray, np.ndarray]:
    rows, cols = np.nonzero(net.allowed)
    return rows, cols


def _network_terms(objective: Objective, net: FluidNetwork) -> np.ndarray:
    """Per-arc additive cost: 2τ_ij for the latency objectives, 0 for RIF (which ignores the network)."""
    if objective is Objective.RIF:
        return np.zeros_like(net.tau)
    return 2.0 * net.tau


def total_latency(x: np.ndarray, net: FluidNetwork) -> float:
    """Total latency rate of a routing ``x``: Σ_j μ_j⁻¹(z_j) + Σ_ij λ_i x_ij 2τ_ij (requests in system)."""
    f = net.lam[:, None] * x
    return float(workload(f.sum(axis=0), net).sum() + (f * 2.0 * net.tau).sum())


def kkt_residual(objective: Objective, x: np.ndarray, net: FluidNetwork, tol: float = 1e-6) -> float:
    """Largest complementary-slackness violation of ``x`` for the objective's costs.

    For each source i the arcs with flow (x_ij > tol) must all have the least cost over its allowed
    arcs: the residual is ``max_i max_{j used} (c_ij − min_{k allowed} c_ik)`` in cost units.
    """
    z = (net.lam[:, None] * x).sum(axis=0)
    n = workload(z, net)
    cost = _cell_marginal(objective, n, net)[None, :] + _network_terms(objective, net)
    # A cell held at its buffer has a binding capacity constraint: it may be cheaper than the arcs in use.
    full = n >= net.buffer * (1.0 - 1e-6) if net.buffer is not None else np.zeros(net.n, bool)
    worst = 0.0
    for i in range(net.n):
        allowed = net.allowed[i]
        open_ = allowed & ~full if (allowed & ~full).any() else allowed
        best = float(cost[i, open_].min())
        used = allowed & (x[i] > tol)
        if used.any():
            worst = max(worst, float((cost[i, used] - best).max()))
    return worst


def balanced_routing(lam: np.ndarray, capacity: np.ndarray, allowed: np.ndarray) -> tuple[np.ndarray, float]:
    """The routing minimising the largest cell utilisation (an LP), and that utilisation.

    A value below 1 means the demand is servable (the paper's Assumption 2); the routing is a strictly
    feasible starting point for :func:`solve`. Returns ``(None, inf)`` when the LP fails.
    """
    n = lam.size
    rows, cols = np.nonzero(allowed)
    m = rows.size
    cvec = np.zeros(m + 1)
    cvec[-1] = 1.0  # variables: flows f (m), then r; minimise r subject to z_j ≤ r·cap_j
    a_eq = np.zeros((n, m + 1))
    a_eq[rows, np.arange(m)] = 1.0
    a_ub = np.zeros((n, m + 1))
    a_ub[cols, np.arange(m)] = 1.0 / capacity[cols]
    a_ub[:, -1] = -1.0
    res = linprog(cvec, A_ub=a_ub, b_ub=np.zeros(n), A_eq=a_eq, b_eq=lam, bounds=[(0, None)] * (m + 1), method="highs")
    if not res.success:
        return None, float("inf")  # type: ignore[return-value]
    x = np.zeros((n, n))
    x[rows, cols] = np.maximum(res.x[:m], 0.0)
    x = np.where(x.sum(axis=1, keepdims=True) > 0, x, allowed.astype(float))  # a source with ~no demand
    return x / x.sum(axis=1, keepdims=True), float(res.x[-1])


def _inflow_cap(net: FluidNetwork) -> np.ndarray:
    """Largest inflow the solvers treat as servable: 99.9 % of capacity, or what the buffer holds."""
    cap = 0.999 * net.capacity
    if net.buffer is None:
        return cap
    return np.minimum(cap, service_rate(net.buffer, net.a, net.b, net.c, net.s))


def _inflow_objective(objective: Objective, z: np.ndarray, net: FluidNetwork) -> tuple[np.ndarray, np.ndarray]:
    """Per-cell potential P_j(z_j) and P_j'(z_j), continued past 99.9 % of capacity by a steep quadratic.

    The continuation keeps P convex and C¹ so a line search may probe beyond capacity without
    meeting ``inf``; it never changes the minimiser, which is strictly inside capacity.
    """
    zc = _inflow_cap(net)
    inside = np.minimum(z, zc)
    nn = workload(inside, net)
    p = _cell_primitive(objective, nn, net)
    dp = _cell_marginal(objective, nn, net)
    over = np.maximum(z - zc, 0.0)
    k = 1e3 * np.maximum(dp, 1.0) / zc
    return p + dp * over + k * over * over, dp + 2.0 * k * over


def _solve_inflow_space(objective: Objective, net: FluidNetwork, x0: np.ndarray, maxiter: int) -> np.ndarray:
    """SLSQP over the routing alone, the cell terms evaluated through N = μ⁻¹(z) (convex in x)."""
    rows, cols = _arcs(net)
    m = rows.size
    lam_tot = float(net.lam.sum())
    lam_r = net.lam[rows]
    g = _network_terms(objective, net)[rows, cols]

    def fun(v: np.ndarray) -> tuple[float, np.ndarray]:
        f = lam_r * v
        z = np.bincount(cols, weights=f, minlength=net.n)
        p, dp = _inflow_objective(objective, z, net)
        return float((p.sum() + (f * g).sum()) / lam_tot), lam_r * (dp[cols] + g) / lam_tot

    a_eq = np.zeros((net.n, m))
    a_eq[rows, np.arange(m)] = 1.0
    cons = [{"type": "eq", "fun": lambda v: a_eq @ v - 1.0, "jac": lambda v: a_eq}]
    res = minimize(fun, x0[rows, cols], jac=True, method="SLSQP", bounds=[(0.0, 1.0)] * m, constraints=cons,
                   options={"maxiter": maxiter, "ftol": 1e-15})
    x = np.zeros((net.n, net.n))
    x[rows, cols] = np.clip(res.x, 0.0, 1.0)
    return x / x.sum(axis=1, keepdims=True)


def solve(objective: Objective, net: FluidNetwork, x0: np.ndarray | None = None, kkt_tol: float = 1e-6, restarts: int = 5) -> Equilibrium:
    """The steady state of ``objective`` on ``net``, by SLSQP in (routing, workload) space.

    Variables: x_ij on allowed arcs (in [0, 1], Σ_j x_ij = 1 per source) and the workloads N_j (≥ 0,
    in units of the cell's knee), tied by the flow balance ``μ_j(N_j) = Σ_i λ_i x_ij``. The objective
    is ``Σ_j Q_j(N_j) + Σ_ij λ_i x_ij g_ij`` divided by Σλ (a mean latency in seconds), with
    ``Q_j(N) = ∫₀^N g_j(n) μ_j'(n) dn`` (= N for the optimum). Working in N rather than in the inflow
    keeps the problem well conditioned near capacity, where ``μ⁻¹`` is nearly vertical.
    """
    rows, cols = _arcs(net)
    m, n = rows.size, net.n
    lam_tot = float(net.lam.sum())
    lam_r = net.lam[rows]
    g = _network_terms(objective, net)[rows, cols]
    theta = (net.a, net.b, net.c, net.s)
    unit = net.c + net.s
    if x0 is None:
        x0, util = balanced_routing(net.lam, net.capacity, net.allowed)
        if not util < 1.0:
            raise ValueError(f"{net.name}: demand cannot be served within capacity (max utilisation {util:.3f})")
    x0 = np.asarray(x0, float)
    z0 = (net.lam[:, None] * x0).sum(axis=0)
    v = np.concatenate([x0[rows, cols], workload(z0, net) / unit])
    a_eq = np.zeros((n, m))
    a_eq[rows, np.arange(m)] = 1.0
    a_in = np.zeros((n, m))
    a_in[cols, np.arange(m)] = lam_r  # inflow z = a_in @ x

    def fun(v: np.ndarray) -> tuple[float, np.ndarray]:
        x, nn = v[:m], v[m:] * unit
        q = _cell_primitive(objective, nn, net)
        dq = _cell_marginal(objective, nn, net) * d_service_rate(nn, *theta)
        val = (q.sum() + (lam_r * x * g).sum()) / lam_tot
        return float(val), np.concatenate([lam_r * g, dq * unit]) / lam_tot

    def balance(v: np.ndarray) -> np.ndarray:
        x, nn = v[:m], v[m:] * unit
        return np.concatenate([a_eq @ x - 1.0, (service_rate(nn, *theta) - a_in @ x) / net.capacity])

    def balance_jac(v: np.ndarray) -> np.ndarray:
        nn = v[m:] * unit
        top = np.hstack([a_eq, np.zeros((n, n))])
        bottom = np.hstack([-a_in / net.capacity[:, None], np.diag(d_service_rate(nn, *theta) * unit / net.capacity)])
        return np.vstack([top, bottom])

    top = net.buffer / unit if net.buffer is not None else [None] * n
    bounds = [(0.0, 1.0)] * m + [(0.0, hi) for hi in top]
    cons = [{"type": "eq", "fun": balance, "jac": balance_jac}]

    def routing(v: np.ndarray) -> np.ndarray:
        x = np.zeros((n, n))
        x[rows, cols] = np.clip(v[:m], 0.0, 1.0)
        return x / x.sum(axis=1, keepdims=True)

    # SLSQP sometimes declares success early (its quasi-Newton model of a linear objective under a
    # curved constraint is poor); the KKT residual is the real test, and a restart resets the model.
    res = minimize(fun, v, jac=True, method="SLSQP", bounds=bounds, constraints=cons,
                   options={"maxiter": 500, "ftol": 1e-15})
    x = routing(res.x)
    # Fallback: the same problem over the routing alone, from where the first attempt stopped.
    for _ in range(restarts):
        if kkt_residual(objective, x, net) <= kkt_tol:
            break
        x = _solve_inflow_space(objective, net, x, 300)
    z = (net.lam[:, None] * x).sum(axis=0)
    if np.any(z >= net.capacity):
        raise RuntimeError(f"{net.name}: {objective.value} solution at capacity (infeasible demand?): z={z}")
    nn = workload(z, net)
    return Equilibrium(objective, x, z, nn, total_latency(x, net), kkt_residual(objective, x, net))


def rif_waterfill(net: FluidNetwork) -> np.ndarray:
    """RIF equilibrium workloads on a complete graph: one level w = N_j/k_j with Σ_j μ_j(k_j w) = Σλ.

    Every cell is used (μ_j(0) = 0 < inflow for any w > 0), so the level is common to all cells.
    """
    if not net.allowed.all():
        raise ValueError("water-filling needs a complete graph (every source may use every cell)")
    total = float(net.lam.sum())
    if total >= net.capacity.sum():
        raise ValueError("demand at or beyond total capacity")

    def excess(w: float) -> float:
        return float(service_rate(net.replicas * w, net.a, net.b, net.c, net.s).sum()) - total

    hi = 1.0
    while excess(hi) < 0:
        hi *= 2.0
    w = brentq(excess, 0.0, hi, xtol=1e-14, rtol=1e-14)
    return net.replicas * w
