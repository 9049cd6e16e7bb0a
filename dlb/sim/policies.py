"""The eight policies of the paper as root objects the simulator drives.

DLB policies are :class:`dlb.core.router.RootRouter` instances — the exact objects the root
service runs. The baselines use the core's :func:`rand_weights`, :func:`mnlb_solve` and
:class:`WeightedRouter`:

- **Rand** (paper B.1: "Rand is integrated into the DLB stack, it naturally adapts to capacity outages
  by adjusting replica counts and utilizes our error aversion mechanism"): replica-weighted sampling
  where the replica counts are the live ones from probes and the weights are scaled by ``1 − a_j``
  with ``a_j`` from the core's :func:`update_aversion`.
- **MNLB**: a central controller re-solves the LP every 10 s from what an operator's MNLB can know:
  the arrival rates the roots measured in the last period and each cell's *estimated* capacity, the
  ``1/b`` of the latency model its leaf publishes (the same fitted, possibly noisy model DLB's
  Lat/Grad policies read). Until the first period has been measured the roots use Rand's weights.
  Roots sample from the result between solves. No error aversion (legacy system).
- **MNLB-oracle**: the same loop handed the truth — the exact demand at t = 0 and the cells'
  theoretical capacities at their live replica counts. Stronger than any MNLB that has to estimate
  them; kept as a labelled upper bound for the baseline.
- **lr-global**, **locality-failover**, **hub-score**: what operators run (DESIGN §3), the core's
  :mod:`dlb.core.operator_baselines` roots; the engine wires their server-naming, reply and signal
  hooks. They run by default: DLB has to beat what operators run, not only Rand.
- **Disc-RIF-native**, **Disc-Lat-native**, **Disc-Grad-native**: the discrete policies in the
  ``native-discrete`` mechanism (:class:`dlb.core.native_discrete.NativeDiscreteRoot`); on request only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from dlb.core.aversion import AversionConfig, update_aversion
from dlb.core.baselines import WeightedRouter, mnlb_solve, rand_weights, without_dead_cells
from dlb.core.costs import Cost
from dlb.core.latency_model import LatencyParams
from dlb.core.native_discrete import NativeDiscreteRoot
from dlb.core.operator_baselines import HubScoreRoot, LocalityFailoverRoot, LrGlobalRoot
from dlb.core.router import POLICY_NAMES, Mechanism, PolicyConfig, RootRouter, Router
from dlb.core.shedding import ShedConfig
from dlb.core.topology import Topology

#: One root object for (topology, source cell, prior model, its random generator).
RootFactory = Callable[[Topology, int, LatencyParams, np.random.Generator], Router]


@dataclass(frozen=True)
class PolicySpec:
    """A policy the simulator can run: how to build its roots, and whether it needs fitted models."""

    factory: RootFactory
    needs_model: bool  # the policy's cost reads latency models (so the simulator fits them)


def _dlb(cfg: PolicyConfig) -> PolicySpec:
    def build(topology: Topology, source: int, prior: LatencyParams, rng: np.random.Generator) -> Router:
        return RootRouter(topology, source, cfg, prior, rng)

    return PolicySpec(build, needs_model=cfg.cost is not Cost.RIF)


def _native(cfg: PolicyConfig) -> PolicySpec:
    def build(topology: Topology, source: int, prior: LatencyParams, rng: np.random.Generator) -> Router:
        return NativeDiscreteRoot(RootRouter(topology, source, cfg, prior, rng), rng)

    return PolicySpec(build, needs_model=cfg.cost is not Cost.RIF)


def _mnlb(topology: Topology, source: int, prior: LatencyParams, rng: np.random.Generator) -> Router:
    return WeightedRouter(rand_weights(topology)[source], rng)


#: The one table from policy name to (factory, needs model): the simulator, its CLI and its report
#: read it; DLB policies take their names from :data:`dlb.core.router.POLICY_NAMES`.
REGISTRY: dict[str, PolicySpec] = {
    "Rand": PolicySpec(lambda topology, source, prior, rng: RandRoot(topology, source, rng), needs_model=False),
    "MNLB": PolicySpec(_mnlb, needs_model=False),
    "MNLB-oracle": PolicySpec(_mnlb, needs_model=False),
    **{name: _dlb(PolicyConfig(mechanism=m, cost=c)) for (m, c), name in POLICY_NAMES.items()},
    "lr-global": PolicySpec(lambda topology, source, prior, rng: LrGlobalRoot(topology, source, rng), needs_model=False),
    "locality-failover": PolicySpec(lambda topology, source, prior, rng: LocalityFailoverRoot(topology, source, rng),
                                    needs_model=False),
    "hub-score": PolicySpec(lambda topology, source, prior, rng: HubScoreRoot(topology, source), needs_model=False),
    # native-discrete (the mechanism, not a new policy): the discrete policy's costs as the root Envoy's
    # least-request weights, refreshed by the control plane (dlb.core.native_discrete). Appended last:
    # every other policy keeps its index, hence its random streams.
    **{f"{name}-native": _native(PolicyConfig(mechanism=m, cost=c))
       for (m, c), name in POLICY_NAMES.items() if m is Mechanism.DISCRETE},
}
#: Every policy the engine runs; ``POLICIES`` (the paper's, the baselines) is what ``dlb sim`` and its report
#: enumerate, the native-discrete ones run on request (``dlb bench sim-twin --policies``).
ALL_POLICIES: tuple[str, ...] = tuple(REGISTRY)
NATIVE_POLICIES: tuple[str, ...] = tuple(p for p in ALL_POLICIES if p.endswith("-native"))
POLICIES: tuple[str, ...] = tuple(p for p in ALL_POLICIES if p not in NATIVE_POLICIES)
#: What operators run instead of DLB (DESIGN §3); the report compares DLB with the best of them.
OPERATOR_BASELINES: tuple[str, ...] = ("lr-global", "locality-failover", "hub-score")
#: The policies ``dlb sim`` runs when ``--policies`` is not given: all of them, operator baselines included.
DEFAULT_POLICIES: tuple[str, ...] = POLICIES
#: The baselines (not DLB policies).
BASELINES: tuple[str, ...] = ("Rand", "MNLB", "MNLB-oracle", *OPERATOR_BASELINES)


def uses_latency_model(name: str) -> bool:
    return REGISTRY[name].needs_model


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
                 seen_until: float | None = None, capacity: float | None = None) -> None:
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
    period_s: float = 10.0
    rho: float = 0.85

    def solve(self, demand: np.ndarray, capacity: np.ndarray) -> np.ndarray:
        """Solve for ``demand`` (req/s per source cell) and ``capacity`` (req/s per cell); push to roots.

        As the control plane's loop (:class:`dlb.control_plane.mnlb.MnlbLoop`): a cell without
        capacity gets no share.
        """
        y = mnlb_solve(self.topology, demand, capacity, rho=self.rho)
        n = self.topology.n
        y = without_dead_cells(self.topology, y, capacity, np.stack([self.roots[i].weights for i in range(n)]))
        for k, root in enumerate(self.roots):  # replica-major: root k serves source cell k mod n
            root.set_weights(y[k % n])
        return y


def build_roots(
    name: str, topology: Topology, prior: LatencyParams, rng_for: Callable[[int], np.random.Generator],
    shed: ShedConfig | None = None,
) -> list[Router]:
    """One root object per source cell for policy ``name``; ``shed``, when given, replaces a DLB root's
    shedding config (the simulator's request timeout is the roots' deadline)."""
    try:
        spec = REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(ALL_POLICIES)}") from None
    roots = [spec.factory(topology, i, prior, rng_for(i)) for i in range(topology.n)]
    if shed is not None:
        for root in roots:
            if isinstance(root, RootRouter):
                root.policy = replace(root.policy, shed=shed)
    return roots
