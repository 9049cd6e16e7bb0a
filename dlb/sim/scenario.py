"""Scenario generator (paper, Appendix B.1).

A scenario fixes everything that is not a routing decision: the cells (sampled hierarchically from
real regions, :mod:`dlb.sim.regions`), servers per cell (Poisson(10), at least 1), per-cell token
times (log-normal, 20 % standard deviation across cells, drawn separately for prefill and decode),
the request-size distributions (shifted Gamma), and the demand (target utilisation × theoretical
capacity, split over source cells uniformly on the simplex), modulated in time, plus an optional
disruption (demand burst or capacity outage) and latency-model noise.

Two server models (``Workload.server_model``):

- ``pipeline`` — the paper's Appendix B.1 server: one FIFO prefill engine and 8 decode slots, each
  request's stage time fixed by its token counts, a fixed queue of ``queue_limit`` requests. Latency
  does not depend on how many requests share the GPU until the slots fill.
- ``batched`` — the emulator's continuous-batching engine (:class:`dlb.emulator.engine.Engine`, the
  *same* class the emulated servers run): prefill and decode share every step, the step time follows
  the measured H200 curve (flat to the knee, then linear in the KV context the step reads), admission
  is limited by the KV cache, decode growth past it preempts the youngest request (recompute, as
  vLLM), and the waiting queue is bounded in prompt tokens (:meth:`Workload.max_waiting_tokens`). The curve's
  *shape* is the measurement's (knee and past-knee slope relative to the floor); its floor and
  per-prompt-token cost are the cell's decode and prefill token times, so the two models differ in
  structure only, not in the fleet's speeds.

Variants of one experiment reuse the same base draw (the same seed gives the same cells, servers,
speeds and demand split), so a sweep changes only the swept quantity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from dlb.core.latency_model import LatencyParams
from dlb.emulator.profile import BUILTIN_PROFILES, Profile
from dlb.sim.regions import sample_cells

SERVER_MODELS = ("pipeline", "batched")
#: What ``dlb sim`` runs when ``--server-model`` is not given: the realistic server. ``Workload``'s own
#: default stays ``pipeline``, the paper's, for the library callers and tests that model it.
DEFAULT_SERVER_MODEL = "batched"
LEAF_PICKS = ("rif", "prequal")


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
    #: ``pipeline`` (paper B.1) or ``batched`` (the emulator's engine on the measured step-time curve).
    server_model: str = "pipeline"
    #: Batched model: the step-time shape (an emulator profile name), batch cap and KV cache.
    step_profile: str = "llama-8b-h200-eager"
    max_batch: int = 256  # vLLM's default max_num_seqs
    kv_cache_tokens: int = 400_000  # ≈ an 8B model's KV on an 80 GB GPU (the emulator's default)
    #: The leaf's server pick: ``rif`` (power of two choices on RIF) or ``prequal`` (tokens waiting,
    #: :mod:`dlb.core.server_pick`, as the leaf agent's default).
    leaf_pick: str = "rif"

    @property
    def mean_prefill_tokens(self) -> float:
        return self.prefill_shift + self.prefill_shape * self.prefill_scale

    @property
    def mean_decode_tokens(self) -> float:
        return self.decode_shift + self.decode_shape * self.decode_scale

    @property
    def mean_context_tokens(self) -> float:
        """Mean KV context of a decoding request, weighted by the steps it decodes: its prompt plus half
        its output, E[P] + E[D²] / (2 E[D]) (a long answer stays in the batch longer)."""
        d = self.mean_decode_tokens
        return self.mean_prefill_tokens + (self.decode_shape * self.decode_scale**2 + d * d) / (2.0 * d)

    @property
    def slots(self) -> int:
        return self.decode_engines * self.slots_per_engine

    def __post_init__(self) -> None:
        if self.server_model not in SERVER_MODELS:
            raise ValueError(f"Workload.server_model: must be one of {', '.join(SERVER_MODELS)}, got {self.server_model!r}")
        if self.leaf_pick not in LEAF_PICKS:
            raise ValueError(f"Workload.leaf_pick: must be one of {', '.join(LEAF_PICKS)}, got {self.leaf_pick!r}")

    def cell_profile(self, prefill_token_s: float, decode_token_s: float) -> Profile:
        """The batched model's step-time profile of a cell with these token times: the measured
        curve's shape, its floor set to ``decode_token_s`` and its prompt cost to ``prefill_token_s``."""
        shape = BUILTIN_PROFILES[self.step_profile]
        k = decode_token_s * 1e3 / shape.base_ms
        return Profile(
            name=f"{shape.name}@{decode_token_s * 1e3:.2f}ms",
            base_ms=decode_token_s * 1e3,
            prefill_us_per_token=prefill_token_s * 1e6,
            decode_us_per_seq=shape.decode_us_per_seq * k,
            batch_knee=shape.batch_knee,
            past_knee_ms_per_seq=shape.past_knee_ms_per_seq * k,
            max_batch_tokens=shape.max_batch_tokens,
            kv_cache_tokens=self.kv_cache_tokens,
            ref_context_tokens=shape.ref_context_tokens,
            source=f"shape of {shape.source}",
        )

    def max_concurrency(self) -> int:
        """Batched model: sequences that can run at once (batch cap, or KV cache at mean request size)."""
        per_request = self.mean_prefill_tokens + self.mean_decode_tokens
        return max(1, min(self.max_batch, int(self.kv_cache_tokens // per_request)))

    def unloaded_latency(self, prefill_token_s: float, decode_token_s: float) -> float:
        """Serving latency of a mean request on an idle server."""
        if self.server_model == "pipeline":
            return self.mean_prefill_tokens * prefill_token_s + self.mean_decode_tokens * decode_token_s
        prof = self.cell_profile(prefill_token_s, decode_token_s)
        return prof.step_time(1, int(self.mean_prefill_tokens)) + (self.mean_decode_tokens - 1) * prof.step_time(1)

    def server_rate(self, prefill_token_s: float, decode_token_s: float) -> float:
        """Theoretical requests/s of one server.

        Pipeline: the slower of its two stages. Batched: the best throughput over batch sizes up to
        :meth:`max_concurrency`, where a mean request costs its prompt's share of step time plus
        ``decode tokens × step_time(B) / B`` (prompts stall the whole batch while they compute), each
        of the B sequences holding :attr:`mean_context_tokens` of KV.
        """
        if self.server_model == "pipeline":
            prefill = 1.0 / (self.mean_prefill_tokens * prefill_token_s)
            decode = self.slots / (self.mean_decode_tokens * decode_token_s)
            return min(prefill, decode)
        prof = self.cell_profile(prefill_token_s, decode_token_s)
        t_prefill = self.mean_prefill_tokens * prof.prefill_us_per_token * 1e-6
        ctx = self.mean_context_tokens
        best = max(b / prof.step_time(b, 0, round(b * ctx)) for b in range(1, self.max_concurrency() + 1))
        return 1.0 / (t_prefill + self.mean_decode_tokens / best)

    def max_waiting_tokens(self, prefill_token_s: float, decode_token_s: float, timeout_s: float) -> int:
        """Batched model: prompt tokens a server lets wait; an arrival past them is rejected (503).

        A KV cache's worth of prompts, but no more than the server admits, at its rate, in the time a
        client waits for an answer (``timeout_s`` less the request's unloaded latency): a request queued
        behind more would time out before it ran, and serving it would spend capacity on a request the
        client has given up on. vLLM itself queues without a bound; its clients' timeouts bound it.
        """
        rate = self.server_rate(prefill_token_s, decode_token_s)
        wait = max(0.0, timeout_s - self.unloaded_latency(prefill_token_s, decode_token_s))
        return max(1, min(self.kv_cache_tokens, int(rate * wait * self.mean_prefill_tokens)))

    @property
    def knee_slots(self) -> float:
        """Requests a server holds before its latency starts to rise (pipeline: its decode slots)."""
        if self.server_model == "pipeline":
            return float(self.slots)
        return float(BUILTIN_PROFILES[self.step_profile].batch_knee)


@dataclass(frozen=True)
class Disruption:
    """A burst (extra demand at one source cell) or an outage (cells cut to one server) in [start, end);
    or, from ``start_s`` on, a cell that silently becomes ``factor`` times slower (``slow``; fast again at
    ``end_s`` if that is before the run's end) or whose leaf restarts, losing its samples (``restart``) —
    the faults of the priors experiment."""

    kind: str
    start_s: float
    end_s: float
    burst_cell: int = -1
    burst_extra: float = 0.0
    #: Servers per cell during an outage (cells not hit keep their count).
    outage_servers: tuple[int, ...] = ()
    #: The cell a ``slow`` or ``restart`` disruption hits, and the slow-down factor.
    cell: int = -1
    factor: float = 1.0


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
    #: Per-cell multiplier of the leaves' configured prior time scale (a wrong prior); () = all 1.
    prior_factor: tuple[float, ...] = ()
    #: ``allowed[i, j]``: may source i send to cell j (residency); None = every pair (the paper's scenarios).
    allowed: np.ndarray | None = None

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
        p = float(np.exp(np.mean(np.log(self.prefill_token_s))))
        d = float(np.exp(np.mean(np.log(self.decode_token_s))))
        return self.workload.unloaded_latency(p, d)

    def prior(self, servers: float) -> LatencyParams:
        """Fleet prior of a cell's latency model: unloaded latency until the slots fill, then 1/capacity."""
        a = self.nominal_server_latency()
        w = self.workload
        p = float(np.exp(np.mean(np.log(self.prefill_token_s))))
        d = float(np.exp(np.mean(np.log(self.decode_token_s))))
        b = 1.0 / (max(servers, 1.0) * w.server_rate(p, d))
        c = min(w.knee_slots * max(servers, 1.0), 0.9 * a / b)
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
    server_model: str | None = None,
    leaf_pick: str | None = None,
) -> Scenario:
    """Draw scenario ``seed`` and apply one experiment's variation to it (``server_model`` replaces
    the workload's)."""
    if not 0 < utilization < 1.5:
        raise ValueError(f"utilization must be in (0, 1.5): {utilization}")
    if length_factor <= 0:
        raise ValueError(f"length_factor must be > 0: {length_factor}")
    if disruption not in (None, "burst", "outage"):
        raise ValueError(f"disruption must be None, 'burst' or 'outage': {disruption!r}")
    w = workload or Workload()
    if server_model is not None:
        w = replace(w, server_model=server_model)
    if leaf_pick is not None:
        w = replace(w, leaf_pick=leaf_pick)
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
