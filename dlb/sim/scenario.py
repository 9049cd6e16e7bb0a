"""Scenario generator (paper, Appendix B.1).

A scenario fixes everything that is not a routing decision: the cells (sampled hierarchically from
real regions, :mod:`dlb.sim.regions`), servers per cell (Poisson(10), at least 1), per-cell token
times (log-normal, 20 % standard deviation across cells, drawn separately for prefill and decode),
the request-size distributions (shifted Gamma), and the demand (target utilisation × theoretical
capacity, split over source cells uniformly on the simplex), modulated in time, plus an optional
disruption (demand burst or capacity outage) and latency-model noise.

Variants of one experiment reuse the same base draw (the same seed gives the same cells, servers,
speeds and demand split), so a sweep changes only the swept quantity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from dlb.core.latency_model import LatencyParams
from dlb.sim.regions import sample_cells


@dataclass(frozen=True)
class Workload:
    """Request sizes and server shape. Token counts: ``shift + Gamma(shape, scale)``.

    Defaults give ≈ 0.13 s of prefill and ≈ 1.3 s of decode on a median cell: serving latencies of
    hundreds of ms to seconds, as in the paper's baseline.
    """

    prefill_shift: float = 32.0
    prefill_shape: float = 2.0
    prefill_scale: float = 300.0
    decode_shift: float = 8.0
    decode_shape: float = 1.5
    decode_scale: float = 100.0
    #: Fleet-median seconds per token in each stage (divided by the length factor y).
    prefill_token_s: float = 2.0e-4
    decode_token_s: float = 8.0e-3
    decode_engines: int = 2
    slots_per_engine: int = 4
    #: Requests a server may hold waiting (prefill + decode queues); one more is an overflow error.
    queue_limit: int = 16

    @property
    def mean_prefill_tokens(self) -> float:
        return self.prefill_shift + self.prefill_shape * self.prefill_scale

    @property
    def mean_decode_tokens(self) -> float:
        return self.decode_shift + self.decode_shape * self.decode_scale

    @property
    def slots(self) -> int:
        return self.decode_engines * self.slots_per_engine

    def server_rate(self, prefill_token_s: float, decode_token_s: float) -> float:
        """Theoretical requests/s of one server: the slower of its two pipeline stages."""
        prefill = 1.0 / (self.mean_prefill_tokens * prefill_token_s)
        decode = self.slots / (self.mean_decode_tokens * decode_token_s)
        return min(prefill, decode)


@dataclass(frozen=True)
class Disruption:
    """A burst (extra demand at one source cell) or an outage (cells cut to one server) in [start, end)."""

    kind: str
    start_s: float
    end_s: float
    burst_cell: int = -1
    burst_extra: float = 0.0
    #: Servers per cell during an outage (cells not hit keep their count).
    outage_servers: tuple[int, ...] = ()


@dataclass(frozen=True)
class Scenario:
    seed: int
    names: tuple[str, ...]
    tau: np.ndarray
    servers: tuple[int, ...]
    prefill_token_s: np.ndarray
    decode_token_s: np.ndarray
    demand: np.ndarray
    workload: Workload
    utilization: float
    duration_s: float
    #: Time modulation of demand: λ_i(t) = λ_i (1 + amp sin(2π t / period_i + phase_i)).
    mod_amp: float
    mod_period_s: np.ndarray
    mod_phase: np.ndarray
    disruption: Disruption | None = None
    noise_eps: float = 0.0
    meta: dict = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.names)

    def server_rate(self) -> np.ndarray:
        w = self.workload
        return np.array([w.server_rate(p, d) for p, d in zip(self.prefill_token_s, self.decode_token_s, strict=True)])

    def capacity(self, servers: tuple[int, ...] | None = None) -> np.ndarray:
        """Theoretical requests/s of every cell."""
        k = np.asarray(self.servers if servers is None else servers, float)
        return k * self.server_rate()

    def nominal_server_latency(self) -> float:
        """Unloaded serving latency of a fleet-median server (seconds)."""
        w = self.workload
        p = float(np.exp(np.mean(np.log(self.prefill_token_s))))
        d = float(np.exp(np.mean(np.log(self.decode_token_s))))
        return w.mean_prefill_tokens * p + w.mean_decode_tokens * d

    def prior(self, servers: float) -> LatencyParams:
        """Fleet prior of a cell's latency model: unloaded latency until the slots fill, then 1/capacity."""
        a = self.nominal_server_latency()
        w = self.workload
        p = float(np.exp(np.mean(np.log(self.prefill_token_s))))
        d = float(np.exp(np.mean(np.log(self.decode_token_s))))
        b = 1.0 / (max(servers, 1.0) * w.server_rate(p, d))
        c = min(w.slots * max(servers, 1.0), 0.9 * a / b)
        return LatencyParams(a=a, b=b, c=c, s=max(1.0, 0.25 * c))


def _lognormal_cv(rng: np.random.Generator, mean: float, cv: float, size: int) -> np.ndarray:
    """Log-normal draws with the given mean and coefficient of variation."""
    sigma = math.sqrt(math.log(1.0 + cv * cv))
    mu = math.log(mean) - 0.5 * sigma * sigma
    return rng.lognormal(mu, sigma, size)


def generate(
    seed: int,
    *,
    utilization: float = 0.8,
    length_factor: float = 1.0,
    homogeneous: bool = False,
    disruption: str | None = None,
    noise_eps: float = 0.0,
    duration_s: float = 600.0,
    workload: Workload | None = None,
    token_cv: float = 0.2,
) -> Scenario:
    """Draw scenario ``seed`` and apply one experiment's variation to it."""
    if not 0 < utilization < 1.5:
        raise ValueError(f"utilization must be in (0, 1.5): {utilization}")
    if length_factor <= 0:
        raise ValueError(f"length_factor must be > 0: {length_factor}")
    if disruption not in (None, "burst", "outage"):
        raise ValueError(f"disruption must be None, 'burst' or 'outage': {disruption!r}")
    w = workload or Workload()
    rng = np.random.default_rng([seed, 0xD1B])
    n = int(rng.integers(2, 11))
    names, tau = sample_cells(rng, n)
    servers = tuple(int(max(1, k)) for k in rng.poisson(10.0, n))
    tp = _lognormal_cv(rng, w.prefill_token_s, token_cv, n)
    td = _lognormal_cv(rng, w.decode_token_s, token_cv, n)
    split = rng.dirichlet(np.ones(n))
    mod_period = rng.uniform(60.0, 300.0, n)
    mod_phase = rng.uniform(0.0, 2 * math.pi, n)
    burst_cell = int(rng.integers(n))
    outage_order = rng.permutation(n)
    if homogeneous:
        tp = np.full(n, w.prefill_token_s)
        td = np.full(n, w.decode_token_s)
    tp = tp / length_factor
    td = td / length_factor
    sc = Scenario(
        seed=seed,
        names=tuple(names),
        tau=tau,
        servers=servers,
        prefill_token_s=tp,
        decode_token_s=td,
        demand=np.zeros(n),
        workload=w,
        utilization=utilization,
        duration_s=duration_s,
        mod_amp=0.1,
        mod_period_s=mod_period,
        mod_phase=mod_phase,
        noise_eps=noise_eps,
    )
    total = utilization * float(sc.capacity().sum())
    sc = replace(sc, demand=total * split)
    if disruption is not None:
        start, end = 0.3 * duration_s, 0.7 * duration_s
        cap = sc.capacity()
        if disruption == "burst":
            extra = max(0.0, 0.95 * float(cap.sum()) - total)
            sc = replace(sc, disruption=Disruption("burst", start, end, burst_cell=burst_cell, burst_extra=extra))
        else:
            k = list(servers)
            for j in outage_order:
                if total / float(sc.capacity(tuple(k)).sum()) > 0.95:
                    break
                k[int(j)] = 1
            sc = replace(sc, disruption=Disruption("outage", start, end, outage_servers=tuple(k)))
    return sc
