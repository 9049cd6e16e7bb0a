"""The three routing costs of the paper (section 3.2.3), evaluated for every destination at once.

``c_ij(N_j)``: RIF ``N_j/k_j``; latency ``ℓ_j(N_j) + 2τ_ij``; gradient ``1/μ_j'(N_j) + 2τ_ij``.
Latency-model parameters come as a :class:`ModelTable` (one row per cell), so a root router evaluates
all destinations in a handful of numpy operations.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dlb.core.latency_model import LatencyParams, inv_marginal_rate, latency


class Cost(str, enum.Enum):
    RIF = "rif"
    LATENCY = "latency"
    GRADIENT = "gradient"


@dataclass(frozen=True, eq=False)
class ModelTable:
    """Latency-model parameters of every cell as arrays (a, b, c, s), each of shape (n,).

    ``floor``: the least ``1 − ρ`` the gradient cost uses per cell (:mod:`dlb.core.grad_floor`);
    None: ``1 − GRAD_MAX_RHO`` for all.
    """

    a: np.ndarray
    b: np.ndarray
    c: np.ndarray
    s: np.ndarray
    floor: np.ndarray | None = None

    @classmethod
    def from_params(cls, params: Sequence[LatencyParams]) -> ModelTable:
        m = np.array([p.as_array() for p in params], dtype=float).reshape(-1, 4)
        return cls(m[:, 0].copy(), m[:, 1].copy(), m[:, 2].copy(), m[:, 3].copy())

    def row(self, j: int) -> LatencyParams:
        return LatencyParams(float(self.a[j]), float(self.b[j]), float(self.c[j]), float(self.s[j]))

    @property
    def n(self) -> int:
        return int(self.a.shape[0])


#: Error rates above this are read as this when inflating the workload (a cell failing everything
#: would otherwise have an infinite cost and never be tried again once it recovers).
MAX_OVERFLOW = 0.9


def offered_inflation(error_rate: float) -> float:
    """Offered ÷ admitted workload of a cell that fails ``error_rate`` of its requests: ``1/(1 − e)``.

    A leaf's RIF counts only what its servers admitted, and it is capped by their buffers (slots +
    queue): past that, extra load turns into rejections while the RIF, and every cost computed from
    it, stays flat — an overloaded split could be a fixed point. By Little's law the offered
    workload is the admitted one divided by the admitted fraction, so the costs are evaluated there.
    """
    return 1.0 / (1.0 - min(max(error_rate, 0.0), MAX_OVERFLOW))


def cost_vector(
    cost: Cost,
    workload: np.ndarray,
    replicas: np.ndarray,
    models: ModelTable | None,
    rtt: np.ndarray,
) -> np.ndarray:
    """Costs ``c_ij`` for one source i and every destination j.

    ``workload``: N_j as the source sees it; ``rtt``: 2τ_ij (round trip) for this source, shape (n,).
    """
    if cost is Cost.RIF:
        return workload / replicas
    if models is None:
        raise ValueError(f"cost {cost.value!r} needs latency models")
    if cost is Cost.LATENCY:
        return latency(workload, models.a, models.b, models.c, models.s) + rtt
    if cost is Cost.GRADIENT:
        return inv_marginal_rate(workload, models.a, models.b, models.c, models.s, floor=models.floor) + rtt
    raise ValueError(f"unknown cost {cost!r}")
