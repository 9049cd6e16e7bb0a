"""The eight policies of the paper as root objects the simulator drives.

DLB policies are :class:`dlb.core.router.RootRouter` instances — the exact objects the root
service runs. The baselines use the core's :func:`rand_weights`, :func:`mnlb_solve` and
:class:`WeightedRouter`:

- **Rand** (paper B.1: "Rand is integrated into the DLB stack, it naturally adapts to capacity outages
  by adjusting replica counts and utilizes our error aversion mechanism"): replica-weighted sampling
  where the replica counts are the live ones from probes and the weights are scaled by ``1 − a_j``
  with ``a_j`` from the core's :func:`update_aversion`.
- **MNLB**: a central controller re-solves the LP every 10 s from the arrival rates the roots measured
  in the last period and the cells' theoretical capacities at their current replica counts (it is
  capacity-aware); roots sample from the result between solves. No error aversion (legacy system).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dlb.core.aversion import AversionConfig, update_aversion
from dlb.core.baselines import WeightedRouter, mnlb_solve, rand_weights
from dlb.core.costs import Cost
from dlb.core.latency_model import LatencyParams
from dlb.core.router import Mechanism, PolicyConfig, RootRouter
from dlb.core.topology import Topology

POLICIES: tuple[str, ...] = ("Rand", "MNLB", "Disc-RIF", "Disc-Lat", "Disc-Grad", "Flow-RIF", "Flow-Lat", "Flow-Grad")
_COSTS = {"RIF": Cost.RIF, "Lat": Cost.LATENCY, "Grad": Cost.GRADIENT}


def policy_config(name: str) -> PolicyConfig:
    """PolicyConfig of a DLB policy name such as ``Flow-Grad`` (core defaults otherwise)."""
    try:
        mech, cost = name.split("-")
        mechanism = {"Disc": Mechanism.DISCRETE, "Flow": Mechanism.FLOW}[mech]
        return PolicyConfig(mechanism=mechanism, cost=_COSTS[cost])
    except (ValueError, KeyError):
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}") from None


def uses_latency_model(name: str) -> bool:
    return name.endswith("-Lat") or name.endswith("-Grad")


class RandRoot:
    """Rand as integrated into DLB: live replica weights × (1 − error aversion)."""

    def __init__(self, topology: Topology, source: int, rng: np.random.Generator, aversion: AversionConfig | None = None) -> None:
        self.allowed = topology.allowed[source]
        self.replicas = topology.replicas.copy()
        self.errors = np.zeros(topology.n)
        self.fresh = np.zeros(topology.n, bool)
        self.aversion_cfg = aversion or AversionConfig()
        self.aversion = np.zeros(topology.n)
        self._last_aversion = -math.inf
        self.inner = WeightedRouter(rand_weights(topology)[source], rng)
        self.pick = self.inner.pick

    def on_probe(self, cell: int, now: float, rif: float, params: LatencyParams | None = None,
                 error_rate: float = 0.0, confidence: float = 1.0, replicas: float | None = None,
                 seen_until: float | None = None) -> None:
        self.errors[cell] = error_rate
        self.fresh[cell] = True
        if replicas is not None and replicas > 0:
            self.replicas[cell] = replicas

    def tick(self, now: float) -> None:
        if now - self._last_aversion < self.aversion_cfg.period_s:
            return
        self._last_aversion = now
        self.aversion = update_aversion(self.aversion, self.errors, self.allowed & self.fresh, self.aversion_cfg)
        w = np.where(self.allowed, self.replicas * (1.0 - self.aversion), 0.0)
        self.inner.set_weights(w)


@dataclass
class MnlbController:
    """The central MNLB loop: every ``period_s`` solve the LP and push weights to every root."""

    topology: Topology
    roots: list[WeightedRouter]
    server_rate: np.ndarray
    period_s: float = 10.0
    rho: float = 0.85

    def solve(self, demand: np.ndarray, servers: np.ndarray) -> np.ndarray:
        y = mnlb_solve(self.topology, demand, servers * self.server_rate, rho=self.rho)
        n = self.topology.n
        for k, root in enumerate(self.roots):  # replica-major: root k serves source cell k mod n
            root.set_weights(y[k % n])
        return y


def build_roots(
    name: str, topology: Topology, prior: LatencyParams, rng_for: "callable[[int], np.random.Generator]"
) -> list:
    """One root object per source cell for policy ``name``."""
    n = topology.n
    if name == "Rand":
        return [RandRoot(topology, i, rng_for(i)) for i in range(n)]
    if name == "MNLB":
        w = rand_weights(topology)
        return [WeightedRouter(w[i], rng_for(i)) for i in range(n)]
    cfg = policy_config(name)
    return [RootRouter(topology, i, cfg, prior, rng_for(i)) for i in range(n)]
