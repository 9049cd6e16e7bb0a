"""Discrete-event simulation of one (scenario, policy, trial), driving the production policy objects.

Model (paper, Appendix B.1 and Figure 9):

- **Cells** of inference servers, in one of two server models (``Workload.server_model``).
  ``pipeline`` (the paper's): one prefill engine (FIFO, one request at a time,
  ``prefill_tokens × prefill_token_s``) and two decode engines × four slots (eight parallel slots,
  ``decode_tokens × decode_token_s`` each). Requests wait in the server's prefill queue and then its
  decode queue; a request that finds ``queue_limit`` requests waiting is rejected: an overflow error.
  ``batched``: the emulator's continuous-batching engine on the measured step-time curve, with its
  context term and KV preemption (:mod:`dlb.sim.batched`); a request that finds the waiting queue
  full (the prompts the server admits within the request timeout) is rejected.
- **Roots** (``root_replicas`` per cell, requests round-robin over them) pick the destination cell with the policy object (``pick(now)``); the
  request reaches the leaf ``τ_ij`` later and the response returns ``τ_ji`` after completion. A DLB
  root sends a request its cell refused before serving it (full server, leaf admission, no live server)
  once more, to its fallback cell, when the refusal is back (``SimConfig.cross_cell_retry``).
- **Leaves** pick a server inside the cell by power-of-two choices on server RIF or, with
  ``Workload.leaf_pick = "prequal"``, by tokens waiting with the leaf agent's Prequal pool
  (:mod:`dlb.core.server_pick`; a request's size is its prompt plus the workload's mean output, what a
  leaf can know before the answer), count the cell's RIF, fit the latency model with :class:`LatencyEstimator` on (RIF-at-arrival, serving latency) of
  completed requests, and track the error fraction with :class:`ErrorTracker`.
- **Probes**: every ``probe_period_s`` each root replica (in turn: replica r at offset
  r·period/R on the snapshot grid) receives every leaf's state (RIF, model, error rate,
  confidence, live replica count). A probe answer received at t carries the RIF the leaf had at
  ``t − τ_ij`` (the leaf answered when the probe reached it), quantised to the ``snapshot_s`` grid;
  the slowly-changing model/error/replica fields are taken as of delivery. Then ``tick(now)``.
- **Arrivals**: time-varying Poisson per source cell (thinning), generated up front with numpy (all
  policies of a (scenario, trial) see the same arrivals and request sizes: common random numbers).
- **Disruptions**: a burst adds demand at one cell; an outage takes servers out of the leaf's pick
  set (they finish what they hold).
- **Background probes** (issue 12, :mod:`dlb.core.background`): every ``background_tick_s`` each
  leaf of a latency-model policy asks its :class:`BackgroundProber` whether a probe is due; a probe
  is a request of the workload's mean size, injected at the leaf (no root, no WAN), served like any
  other, counted in the cell's RIF, and its completion is a latency sample. Probes are not in the
  latency results; ``RunResult.probes`` counts them per cell.
- **Operator baselines** (:mod:`dlb.core.operator_baselines`) use three optional root hooks, found by
  attribute: ``pick_server(now)`` names the server itself (a global, cell-major server id), and the
  request then bypasses the leaf's pick (``lr-global``: Envoy picks the host); ``on_reply(now, server,
  ok)`` is called when the answer (or the 5xx of an overflow or a down server) is back at the root
  that sent it, a return trip after the server answered (active requests and outlier detection);
  ``on_signals(cell, queue, kv, up)`` delivers, with the RIF's staleness, each cell's mean waiting
  requests per live server and mean KV-cache utilisation (``pipeline``: busy decode slots / slots).
  Roots without them run exactly as before.
- **Client timeouts** (``SimConfig.timeouts``, default ``cancel``): at arrival + ``request_timeout_s``
  an unanswered request is cancelled wherever it is, as on the real path (the root route's timeout
  answers 504 and resets the stream; the server aborts it). Its server frees the slot and KV at once,
  the leaf releases its RIF with neither an error nor a latency sample (the leaf agent's client abort),
  and a root with ``on_reply``/``on_cell_reply`` hears a failure then. An answer that would reach the
  root after the deadline is a timeout as well. ``serve`` lets it keep its place until served.
- **Scoring** (:mod:`dlb.sim.outcome`): besides the served requests' latencies, the result counts
  overflow errors, root refusals (no usable cell) and sheds (``pick`` returned
  :data:`~dlb.core.router.SHED`) apart; the failure-counting figures put every unserved request at
  ``SimConfig.request_timeout_s``.
- **Latency-model noise** (paper 5.4): the parameters a leaf reports are multiplied by
  ``1 + ε ξ_j``, ``ξ_j ~ U[−1, 1]`` fixed per cell and trial.

Determinism: every random stream is derived from (scenario seed, trial, policy), so a run is
reproducible bit for bit. Event order at equal times follows a sequence number (FIFO).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from dlb.core.admission import AdmissionConfig, CompletionRate, StayFloor, admits, record_done
from dlb.core.background import (
    BackgroundProbeConfig,
    BackgroundProber,
    capacity_floor,
    surprise,
)
from dlb.core.baselines import WeightedRouter
from dlb.core.estimator import ErrorTracker, EstimatorConfig, LatencyEstimator
from dlb.core.fallback import NO_FALLBACK, next_best
from dlb.core.fit import Censored
from dlb.core.latency_model import LatencyParams, latency
from dlb.core.router import NO_CELL, SHED, RootRouter
from dlb.core.server_pick import PrequalConfig, ProbePool
from dlb.core.shedding import ShedConfig
from dlb.core.topology import Topology
from dlb.sim.batched import BatchedServers
from dlb.sim.outcome import DEFAULT_REQUEST_TIMEOUT_S, TIMEOUT_MODES, with_failures
from dlb.sim.policies import ALL_POLICIES, MnlbController, build_roots, uses_latency_model
from dlb.sim.scenario import Scenario, Workload

_LEAF, _PREFILL_DONE, _DECODE_DONE, _SNAP, _REFIT, _MNLB, _PHASE, _BG, _STEP, _REPLY, _RETRY = range(11)


@dataclass(frozen=True)
class SimConfig:
    probe_period_s: float = 0.05
    snapshot_s: float = 0.01
    estimator: EstimatorConfig = field(default_factory=lambda: EstimatorConfig(window_s=30.0, refit_period_s=10.0, max_samples=200))
    error_tau_s: float = 5.0
    mnlb_period_s: float = 10.0
    #: After the last arrival, keep simulating at most this long for in-flight requests.
    drain_s: float = 300.0
    #: Fit latency models even for policies that do not read them (costs time, changes nothing).
    always_fit: bool = False
    #: Leaves' background probes (None: off). Only for policies that fit latency models.
    background: BackgroundProbeConfig | None = field(default_factory=BackgroundProbeConfig)
    #: How often each leaf asks its prober whether a probe is due (seconds).
    background_tick_s: float = 0.25

    #: Root replicas per cell (production runs many): requests round-robin over them; each has its
    #: own probes and state and probes every ``probe_period_s``, the replicas staggered over the period.
    root_replicas: int = 1
    #: What a client waits for one request (:mod:`dlb.sim.outcome`): failed, shed and timed-out requests
    #: count at it in the failure-counting latency figures. It bounds a batched server's waiting queue
    #: (:meth:`~dlb.sim.scenario.Workload.max_waiting_tokens`) and, with ``timeouts="cancel"``, ends
    #: every request not answered by then.
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    #: ``cancel``: at arrival + ``request_timeout_s`` an unanswered request is cancelled wherever it is
    #: (the root answers 504, the leaf releases it, the server frees its slot and KV); ``serve``: it
    #: keeps its place until served (:data:`~dlb.sim.outcome.TIMEOUT_MODES`).
    timeouts: str = "cancel"
    #: Leaves report their cells' buffer (:func:`buffer_per_server` × live servers) in probes, so DLB
    #: roots shed when every usable cell is saturated (:mod:`dlb.core.shedding`); False: like older
    #: leaves, which report none (no root ever sheds). The real leaf learns the figure from its servers'
    #: 429s; the simulated one knows it from the start.
    shed: bool = True
    #: The deadline DLB's roots and leaves judge by (the endpoints' ``timeout_s``); 0: ``request_timeout_s``.
    #: A twin of a deployment whose clients give up before its endpoints' timeout sets it apart.
    service_deadline_s: float = 0.0
    #: DLB roots also shed when every usable cell's fitted model puts a request past
    #: ``request_timeout_s`` (:mod:`dlb.core.shedding`); leaves then fit models for every DLB policy,
    #: as real leaves do whatever the roots' cost.
    deadline_shed: bool = ShedConfig.deadline
    #: DLB leaves refuse (429) a request whose picked server would, by Little's law, keep it past a share
    #: of ``request_timeout_s`` (:mod:`dlb.core.admission`); counted as a shed and a cell error.
    admission: bool = AdmissionConfig.enabled
    #: ... past this share of ``request_timeout_s`` (:attr:`AdmissionConfig.fraction`).
    admission_fraction: float = AdmissionConfig.fraction
    #: ... and this many times the server's uncongested stay (:attr:`AdmissionConfig.slowdown`; 0: off).
    admission_slowdown: float = AdmissionConfig.slowdown
    #: ... the floor at most this many times the leaf's model's unloaded latency (:attr:`AdmissionConfig.floor_cap`).
    admission_floor_cap: float = AdmissionConfig.floor_cap
    #: DLB roots retry once, on their fallback cell (:func:`dlb.core.fallback.next_best` of their costs
    #: when the refusal is back), a request a cell refused before serving it: a full server, the leaf's
    #: admission, or no live server. The real root Envoy's cross-cell retry (``dlb.envoy.bootstrap``).
    #: The operator baselines run Envoy without retries, as configured on the real path. On since its
    #: verdict on seed 97 (research/routing-stress/retry.md): at 95 % load DLB's failures 0.32–0.49 % →
    #: 0.20–0.22 % (bound 0.27 %), means up 1.8–3.3 %; in the outage and the burst fewer failures, means up 0.6–4.2 %.
    cross_cell_retry: bool = True

    def __post_init__(self) -> None:
        if self.root_replicas < 1:
            raise ValueError(f"root_replicas must be >= 1: {self.root_replicas}")
        if not self.request_timeout_s > 0:
            raise ValueError(f"request_timeout_s must be > 0: {self.request_timeout_s}")
        if not self.service_deadline_s >= 0:
            raise ValueError(f"service_deadline_s must be >= 0 (0: request_timeout_s): {self.service_deadline_s}")
        if self.timeouts not in TIMEOUT_MODES:
            raise ValueError(f"timeouts must be one of {', '.join(TIMEOUT_MODES)}: {self.timeouts!r}")


@dataclass
class RunResult:
    """Outcome of one run. ``latency`` holds the end-to-end seconds of every successful request.

    ``errors`` = ``overflow`` (refused by a full server) + ``refused`` (the root had no usable cell);
    ``shed`` requests (the root refused on purpose, :data:`~dlb.core.router.SHED`) are counted apart.
    """

    scenario: int
    policy: str
    trial: int
    arrivals: int
    completed: int
    errors: int
    in_flight: int
    latency: np.ndarray
    events: int
    sim_time_s: float
    per_cell_served: np.ndarray
    #: Mean network round trip (seconds) of the successful requests: the part routing pays in distance.
    net_mean: float = math.nan
    #: Time-average RIF of every cell (sampled on the snapshot grid while arrivals last).
    mean_rif: np.ndarray = field(default_factory=lambda: np.zeros(0))
    #: Destination cell of every arrival in arrival order (-1: refused), and the arrival times.
    routed: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    arrival_t: np.ndarray = field(default_factory=lambda: np.zeros(0))
    #: Background probe requests sent per cell, and those that ended in an overflow error.
    probes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    probe_errors: int = 0
    overflow: int = 0
    refused: int = 0
    shed: int = 0
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    server_model: str = "pipeline"
    #: Batched model: requests preempted because decode growth overflowed a KV cache (0 for pipeline).
    preemptions: int = 0
    #: Requests the client gave up on at the timeout and the simulator cancelled there (``timeouts``
    #: "cancel"; 0 with "serve", whose late answers count as timed out from their latency).
    cancelled: int = 0
    timeouts: str = "serve"
    #: Requests in flight each cell's leaf counts when the run stopped (zero once every request settled).
    rif_end: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    #: Of ``shed``, those a leaf refused at its picked server (:mod:`dlb.core.admission`), not the root.
    admission_refused: int = 0
    #: Requests a cell refused that the root sent again to its fallback cell (``cross_cell_retry``),
    #: whatever came of the retry.
    retried: int = 0

    def summary(self) -> dict:
        lat = self.latency
        ok = lat.size > 0
        q = np.quantile(lat, [0.5, 0.9, 0.99]) if ok else [math.nan] * 3
        t = self.request_timeout_s
        # Never finished: an error, shed, cancelled, or still in flight when the run stopped.
        mean_f, p90_f = with_failures(lat, self.arrivals - lat.size, t)
        per = 1.0 / max(self.arrivals, 1)
        timed_out = int(np.count_nonzero(lat > t)) + self.cancelled
        return {
            "mean_latency_with_failures": mean_f,
            "p90_latency_with_failures": p90_f,
            "shed_rate": self.shed * per,
            "overflow_rate": self.overflow * per,
            "refused_rate": self.refused * per,
            "timed_out_rate": timed_out * per,
            # What clients saw fail: errors, sheds and timeouts (cancelled or answered too late).
            "client_failure_rate": (self.errors + self.shed + timed_out) * per,
            "request_timeout_s": t,
            "server_model": self.server_model,
            "shed": self.shed,
            "admission_refused_rate": self.admission_refused * per,
            "retried_rate": self.retried * per,
            "preemptions": self.preemptions,
            "cancelled": self.cancelled,
            "cancelled_rate": self.cancelled * per,
            "timeouts": self.timeouts,
            "mean": float(lat.mean()) if ok else math.nan,
            "p50": float(q[0]),
            "p90": float(q[1]),
            "p99": float(q[2]),
            "error_rate": self.errors / max(self.arrivals, 1),
            "arrivals": self.arrivals,
            "completed": self.completed,
            "errors": self.errors,
            "in_flight": self.in_flight,
            "events": self.events,
            "net_mean": self.net_mean,
        }


def generate_arrivals(sc: Scenario, trial: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """All arrivals of a (scenario, trial): sorted times, source cells, prefill and decode tokens."""
    rng = np.random.default_rng([sc.seed, trial, 1])
    T = sc.duration_s
    times, srcs = [], []
    d = sc.disruption
    for i in range(sc.n):
        lam = float(sc.demand[i])
        extra = d.burst_extra if d is not None and d.kind == "burst" and d.burst_cell == i else 0.0
        lam_max = lam * (1.0 + sc.mod_amp) + extra
        if lam_max <= 0:
            continue
        k = int(rng.poisson(lam_max * T))
        t = np.sort(rng.uniform(0.0, T, k))
        rate = lam * (1.0 + sc.mod_amp * np.sin(2 * math.pi * t / sc.mod_period_s[i] + sc.mod_phase[i]))
        if extra > 0:
            assert d is not None  # extra > 0 only with a burst disruption
            rate = rate + np.where((t >= d.start_s) & (t < d.end_s), extra, 0.0)
        keep = rng.random(k) * lam_max < rate
        times.append(t[keep])
        srcs.append(np.full(int(keep.sum()), i, dtype=np.int64))
    t_all = np.concatenate(times) if times else np.zeros(0)
    s_all = np.concatenate(srcs) if srcs else np.zeros(0, dtype=np.int64)
    order = np.argsort(t_all, kind="stable")
    t_all, s_all = t_all[order], s_all[order]
    w = sc.workload
    m = t_all.size
    ptok = w.prefill_shift + rng.gamma(w.prefill_shape, w.prefill_scale, m)
    dtok = w.decode_shift + rng.gamma(w.decode_shape, w.decode_scale, m)
    return t_all, s_all, ptok, dtok


def buffer_per_server(w: Workload, waiting_tokens: float | None = None) -> float:
    """Requests one server holds before it rejects: pipeline, the one in prefill + its decode slots +
    ``queue_limit`` waiting; batched, a full batch + its waiting queue's bound (``waiting_tokens``,
    default a KV cache's worth) in mean prompts."""
    if w.server_model == "pipeline":
        return float(1 + w.slots + w.queue_limit)
    waiting = w.kv_cache_tokens if waiting_tokens is None else waiting_tokens
    return float(w.max_concurrency() + waiting // max(w.mean_prefill_tokens, 1.0))


def _scaled(p: LatencyParams, factor: float) -> LatencyParams:
    """The same curve on a time scale ``factor`` times longer (a prior wrong in scale)."""
    return p if factor == 1.0 else LatencyParams(p.a * factor, p.b * factor, p.c, p.s)


def _perturb(p: LatencyParams, factor: float) -> LatencyParams:
    a, b, c, s = p.a * factor, p.b * factor, p.c * factor, p.s * factor
    if c * b >= a:
        c = 0.99 * a / b
    return LatencyParams(a, b, c, s)


def simulate(sc: Scenario, policy: str, trial: int = 0, config: SimConfig | None = None,
             arrivals: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None) -> RunResult:
    """Run ``policy`` on scenario ``sc`` for one trial and return its outcome."""
    cfg = config or SimConfig()
    if policy not in ALL_POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(ALL_POLICIES)}")
    # A variant (``Flow-Grad[...]``, research/routing-stress/probe.py) draws its base policy's numbers.
    base = policy.split("[", 1)[0]
    pidx = ALL_POLICIES.index(base if base in ALL_POLICIES else policy)
    n = sc.n
    w = sc.workload
    topo = Topology.build(sc.names, sc.servers, sc.tau, sc.allowed)
    prior_root = sc.prior(float(np.mean(sc.servers)))
    R_roots = cfg.root_replicas
    # replicas[r][i]: replica r of cell i's root (replica 0 keeps the seeding of the one-root runs).
    def rng_for(r: int) -> Callable[[int], np.random.Generator]:
        return lambda i: np.random.default_rng([sc.seed, trial, 2, pidx, i] + ([r] if r else []))

    service_deadline = cfg.service_deadline_s or cfg.request_timeout_s
    shed_cfg = ShedConfig(deadline=cfg.deadline_shed, deadline_s=service_deadline)
    replicas = [build_roots(policy, topo, prior_root, rng_for(r), shed_cfg) for r in range(R_roots)]
    dlb_roots = any(isinstance(root, RootRouter) for root in replicas[0])
    pick_fns = [[rep[i].pick for rep in replicas] for i in range(n)]
    # Operator-baseline hooks (see the module docstring); every root of a policy has the same surface.
    names_server = hasattr(replicas[0][0], "pick_server")
    server_fns = ([[rep[i].pick_server for rep in replicas] for i in range(n)]  # type: ignore[attr-defined]  # lr-global's hook
                  if names_server else [])
    replies = hasattr(replicas[0][0], "on_reply")
    cell_replies = hasattr(replicas[0][0], "on_cell_reply")  # native-discrete: Envoy's active count per cell
    answered = replies or cell_replies
    signals = hasattr(replicas[0][0], "on_signals")
    next_replica = [0] * n
    # MNLB estimates capacities from the published latency models, so it needs them fitted too.
    fit_models = cfg.always_fit or uses_latency_model(policy) or policy == "MNLB" or (cfg.deadline_shed and dlb_roots)
    # MNLB's roots are WeightedRouters (REGISTRY["MNLB"], REGISTRY["MNLB-oracle"]), replica-major.
    mnlb = (MnlbController(topo, cast("list[WeightedRouter]", [root for rep in replicas for root in rep]),
                           period_s=cfg.mnlb_period_s)
            if policy in ("MNLB", "MNLB-oracle") else None)
    oracle = policy == "MNLB-oracle"
    server_rate = sc.server_rate()
    cancel = cfg.timeouts == "cancel"
    # Leaf admission (:mod:`dlb.core.admission`): DLB's leaves only, so Rand's and the operators' runs
    # are unchanged; lr-global names its server and bypasses the leaf anyway.
    adm_cfg = AdmissionConfig(enabled=cfg.admission and dlb_roots, deadline_s=service_deadline,
                              fraction=cfg.admission_fraction, slowdown=cfg.admission_slowdown,
                              floor_cap=cfg.admission_floor_cap)
    admission = adm_cfg.enabled
    retrying = cfg.cross_cell_retry and dlb_roots

    t_arr, src_arr, ptok, dtok = arrivals if arrivals is not None else generate_arrivals(sc, trial)
    R = int(t_arr.size)
    t_list = t_arr.tolist()
    src_list = src_arr.tolist()
    tau = sc.tau.tolist()
    tp = sc.prefill_token_s.tolist()
    td = sc.decode_token_s.tolist()
    prefill_s = ptok.tolist()
    decode_s = dtok.tolist()
    # Background probes are requests with indices R, R+1, ... appended to the per-request lists.
    probing = fit_models and cfg.background is not None
    # A probe is a request of the workload's *mean* size, always the same: its latency then measures
    # the mean request's latency at the probed load, without the size noise that a random draw
    # would add (a handful of random-size probes put an idle cell's estimate ±25 % off).
    probe_prefill, probe_decode = sc.workload.mean_prefill_tokens, sc.workload.mean_decode_tokens

    # Servers: global index; state in flat lists (no per-event allocation beyond heap tuples).
    cell_of: list[int] = []
    cell_servers: list[list[int]] = []
    for j in range(n):
        cell_servers.append(list(range(len(cell_of), len(cell_of) + sc.servers[j])))
        cell_of.extend([j] * sc.servers[j])
    S = len(cell_of)
    online = [list(s) for s in cell_servers]
    # Servers are numbered cell-major, as the roots that name them number them (core host_offsets).
    is_up = [True] * S
    pq: list[deque] = [deque() for _ in range(S)]
    in_prefill = [-1] * S  # the request in each server's prefill engine (pipeline; -1: idle)
    dq: list[deque] = [deque() for _ in range(S)]
    busy = [False] * S
    free = [w.slots] * S
    srif = [0] * S
    crif = [0] * n
    qlim = w.queue_limit
    served = [0] * n
    done_rate = [CompletionRate(0.0, adm_cfg.window_s) for _ in range(S)] if admission else []
    stay_floor = [StayFloor(adm_cfg.stay_window_s, adm_cfg.floor_rise_s) for _ in range(S)] if admission else []
    admission_refused = 0
    pools: list[ProbePool] | None = None
    if w.leaf_pick == "prequal":
        pools = [ProbePool(PrequalConfig(), random.Random(hash((sc.seed, trial, 5, j)) & 0xFFFFFFFF)) for j in range(n)]
        stok = [0.0] * S  # tokens waiting per server, as the leaf counts them
        tok_est = (ptok + w.mean_decode_tokens).tolist()

        def probe(s: int) -> tuple[float, float]:
            return float(srif[s]), stok[s]
    batched: BatchedServers | None = None
    if w.server_model == "batched":
        cell_prof = [w.cell_profile(tp[j], td[j]) for j in range(n)]
        cell_wait = [w.max_waiting_tokens(tp[j], td[j], cfg.request_timeout_s) for j in range(n)]
        batched = BatchedServers([cell_prof[c] for c in cell_of], w.max_batch, [cell_wait[c] for c in cell_of],
                                 lambda t, srv, ver: schedule(t, _STEP, srv, ver), abortable=cancel)
        ptok_i = [max(1, round(x)) for x in prefill_s]
        dtok_i = [max(1, round(x)) for x in decode_s]

    pf = sc.prior_factor or (1.0,) * n
    priors = [_scaled(sc.prior(float(k)), pf[j]) for j, k in enumerate(sc.servers)]

    def new_estimator(j: int, generation: int = 0) -> LatencyEstimator:
        return LatencyEstimator(priors[j], cfg.estimator, random.Random(f"{sc.seed}-{trial}-{j}-{generation}"))

    est = [new_estimator(j) for j in range(n)]
    # Requests at each cell's leaf and not finished (ids, in arrival order): the fit's censored samples.
    running: list[dict[int, None]] = [{} for _ in range(n)]

    def censored(j: int, now: float) -> Censored:
        ids = running[j]
        return Censored(np.fromiter((rif0[i] for i in ids), float, len(ids)),
                        now - np.fromiter((t_leaf[i] for i in ids), float, len(ids)))
    bg_cfg = cfg.background if cfg.background is not None else BackgroundProbeConfig()  # used only when probing
    probers = [BackgroundProber(bg_cfg) for _ in range(n)] if probing else []
    arrived_at = [0] * n  # requests (and probes) each leaf received: the prober counts silence from the last
    probes_sent = [0] * n
    probe_errors = 0
    errs = [ErrorTracker(cfg.error_tau_s) for _ in range(n)]
    noise_rng = np.random.default_rng([sc.seed, trial, 3])
    noise = (1.0 + sc.noise_eps * noise_rng.uniform(-1.0, 1.0, n)).tolist()
    reported = [_perturb(priors[j], noise[j]) if sc.noise_eps else priors[j] for j in range(n)]
    confidence = [0.0] * n
    k_live = [float(k) for k in sc.servers]
    per_server = [buffer_per_server(w, cell_wait[j] if batched is not None else None) for j in range(n)]

    dst = [-1] * R
    rep_of = [0] * R if retrying else []  # the root replica that picked each request
    tried = bytearray(R) if retrying else bytearray()  # 1: already retried once
    retried = 0
    fixed = [-1] * R if names_server else []  # the server a root named (lr-global)
    srv_of = [-1] * R if replies else []  # the server that answered (or refused)
    sender: list = [None] * R if answered else []  # the root object that sent the request
    t_leaf = [0.0] * R
    rif0 = [0] * R
    lat = np.full(R, math.nan)
    lrng = random.Random(hash((sc.seed, trial, 4)) & 0xFFFFFFFF)
    rnd = lrng.random

    # Client timeouts (``cfg.timeouts == "cancel"``). Deadlines are arrival + timeout, so they come in
    # arrival order: one cursor over the requests finds the next, with no heap entry per request.
    # fate: 0 the request is out there (in transit or at a server), 1 settled (answered, failed, shed
    # or cancelled), 2 the server answered but the answer reaches the root after the deadline.
    timeout = cfg.request_timeout_s
    fate = bytearray(R) if cancel else bytearray()
    at_srv = [-1] * R if cancel else []  # the server that queued the request
    dl = 0
    next_deadline = t_list[0] + timeout if cancel and R else math.inf
    cancelled = 0

    T = sc.duration_s
    heap: list = []
    seq = 0
    push = heapq.heappush
    pop = heapq.heappop

    def schedule(t: float, kind: int, a: int = 0, b: int = 0) -> None:
        nonlocal seq
        seq += 1
        push(heap, (t, seq, kind, a, b))

    snap_every = max(1, int(round(cfg.probe_period_s / cfg.snapshot_s)))
    # Snapshot-tick offset of each replica's probe within the period: the replicas probe in turn.
    probe_turn = [[r for r in range(R_roots) if (r * snap_every) // R_roots == k] for k in range(snap_every)]
    lag = [[int(round(tau[i][j] / cfg.snapshot_s)) for j in range(n)] for i in range(n)]
    max_lag = max(max(r) for r in lag)
    history: deque[list[int]] = deque(maxlen=max_lag + 1)
    sig_history: deque[list[tuple[float, float, bool]]] = deque(maxlen=max_lag + 1)

    def cell_signals() -> list[tuple[float, float, bool]]:
        """Each cell's mean waiting requests per live server, mean KV utilisation, and whether any is up."""
        out = []
        for j in range(n):
            on = online[j]
            if not on:
                out.append((0.0, 0.0, False))
                continue
            if batched is not None:
                engs = batched.engines
                qd = sum(len(engs[sv].waiting) for sv in on)
                kv = sum(engs[sv].kv_usage for sv in on)
            else:
                qd = sum(len(pq[sv]) + len(dq[sv]) for sv in on)
                kv = sum(w.slots - free[sv] for sv in on) / w.slots
            out.append((qd / len(on), kv / len(on), True))
        return out
    rif_sum = [0] * n
    n_snaps = 0
    arrivals_since = [0] * n

    schedule(0.0, _SNAP, 0)
    if fit_models:
        schedule(cfg.estimator.refit_period_s, _REFIT)
    if mnlb is not None:
        if oracle:  # the truth at t = 0; the estimating MNLB starts on Rand's weights instead
            mnlb.solve(np.asarray(sc.demand, float), np.asarray(sc.servers, float) * server_rate)
        schedule(cfg.mnlb_period_s, _MNLB)
    d = sc.disruption
    if d is not None and d.kind == "outage":
        schedule(d.start_s, _PHASE, 1)
        schedule(d.end_s, _PHASE, 0)
    elif d is not None and d.kind in ("slow", "restart"):
        schedule(d.start_s, _PHASE, 2 if d.kind == "slow" else 3)
        if d.kind == "slow" and d.end_s < sc.duration_s:
            schedule(d.end_s, _PHASE, 4)  # the slowdown ends: the cell is as fast as before
    if probing:
        schedule(cfg.background_tick_s, _BG)

    completed = errors = events = 0
    overflow = refused = shed = 0
    net_sum = 0.0
    in_flight = 0

    def refused_for_good(a: int, admission_refusal: bool, reply_at: float) -> None:
        """Request ``a`` failed at a cell that served nothing (no retry left): count it, settle it, and
        tell its root at ``reply_at`` if the root listens (an overflow or no live server is an error,
        the leaf's admission refusal a shed)."""
        nonlocal shed, admission_refused, errors, overflow, in_flight
        if cancel:
            fate[a] = 1
        if admission_refusal:
            shed += 1
            admission_refused += 1
        else:
            errors += 1
            overflow += 1
        in_flight -= 1
        if answered:
            schedule(reply_at, _REPLY, a, 0)
    r = 0
    now = 0.0
    end_time = T + cfg.drain_s
    # The first probe round must land before the first arrival (routers refuse with no state).
    next_arrival = t_list[0] if R else math.inf
    while True:
        if heap and heap[0][0] <= next_arrival and heap[0][0] <= next_deadline:
            now, _s, kind, a, b = pop(heap)
            if now > end_time:
                break
            events += 1
            if kind in (_DECODE_DONE, _STEP):
                srv = a
                if kind == _STEP:
                    assert batched is not None  # _STEP events come only from the batched server model
                    woke = batched.wake(srv, b, now)
                    if not woke:
                        continue
                    done: Sequence[int] = woke
                else:
                    if cancel and b < R and fate[b]:  # cancelled while it decoded: its slot is free already
                        continue
                    done = (b,)
                    free[srv] += 1
                    q = dq[srv]
                    if q:
                        nxt = q.popleft()
                        free[srv] -= 1
                        schedule(now + decode_s[nxt] * td[cell_of[srv]], _DECODE_DONE, srv, nxt)
                j = cell_of[srv]
                for b in done:
                    if pools is not None:
                        stok[srv] -= tok_est[b]
                    srif[srv] -= 1
                    crif[j] -= 1
                    serving = now - t_leaf[b]
                    errs[j].record(now, False)
                    if admission:
                        record_done(done_rate[srv], stay_floor[srv], now, srif[srv])
                    if fit_models:
                        del running[j][b]
                        e = est[j]
                        changed = False
                        if b >= R:  # a background probe: its surprise is judged against the model before it
                            pj = e.params
                            pr = probers[j]
                            pr.on_done(now, surprise(serving, float(latency(rif0[b], pj.a, pj.b, pj.c, pj.s)),
                                                     pr.config.tolerance))
                            t_probe = pr.take_change()
                            if t_probe is not None:
                                e.forget_before(t_probe, by_arrival=True)
                                changed = True
                        e.record(now, rif0[b], serving)
                        if e.take_change() is not None:  # the traffic's samples say it changed
                            changed = True
                        if changed:  # the cell changed: forget what it was (done), refit now
                            e.refit(now, censored(j, now))
                            reported[j] = _perturb(e.params, noise[j]) if sc.noise_eps else e.params
                            confidence[j] = e.confidence
                    if b >= R:  # a background probe: a sample, not a client request
                        continue
                    i = src_list[b]
                    back = tau[j][i]
                    if cancel:
                        if now + back > t_list[b] + timeout:  # the root's route timeout fires first: a 504
                            fate[b] = 2
                            continue
                        fate[b] = 1
                    in_flight -= 1
                    completed += 1
                    served[j] += 1
                    if answered:
                        schedule(now + back, _REPLY, b, 1)
                    lat[b] = now + back - t_list[b]
                    net_sum += back + tau[i][j]
            elif kind == _PREFILL_DONE:
                if cancel and b < R and fate[b]:  # cancelled in prefill: the engine moved on then
                    continue
                srv = a
                q = pq[srv]
                if q:
                    nxt = q.popleft()
                    in_prefill[srv] = nxt
                    schedule(now + prefill_s[nxt] * tp[cell_of[srv]], _PREFILL_DONE, srv, nxt)
                else:
                    busy[srv] = False
                    in_prefill[srv] = -1
                if free[srv] > 0:
                    free[srv] -= 1
                    schedule(now + decode_s[b] * td[cell_of[srv]], _DECODE_DONE, srv, b)
                else:
                    dq[srv].append(b)
            elif kind == _LEAF:
                if cancel and a < R and fate[a]:  # its client gave up on the way
                    continue
                j = dst[a] if a < R else b
                arrived_at[j] += 1
                cand = online[j]
                if names_server and a < R:  # the root named the server: no leaf pick
                    s1 = fixed[a]
                elif not cand:  # every server of the cell is down: its leaf Envoy answers 503
                    s1 = -1
                elif pools is not None:
                    s1 = pools[j].pick(now, cand, probe, tok_est[a])
                else:
                    m = len(cand)
                    s1 = cand[int(rnd() * m)]
                    if m > 1:
                        s2 = cand[int(rnd() * m)]
                        if srif[s2] < srif[s1]:
                            s1 = s2
                # The leaf refuses it (429) rather than let it slow its server past the deadline; the real
                # leaf's access log counts its own 429 against the cell, so the error EMA does too.
                refuse = admission and a < R and s1 >= 0 and not admits(srif[s1], done_rate[s1], now, adm_cfg,
                                                                               stay_floor[s1], est[j].params.a)
                if refuse or s1 < 0 or not is_up[s1]:  # or a root-named server down, or none up: it fails
                    rejected = True
                elif batched is not None:
                    rejected = not batched.arrive(s1, a, ptok_i[a], dtok_i[a], now)
                else:
                    rejected = len(pq[s1]) + len(dq[s1]) >= qlim
                if replies and a < R:
                    srv_of[a] = s1
                if rejected:
                    errs[j].record(now, True)
                    if a >= R:
                        probe_errors += 1
                        probers[j].on_done(now)
                        continue
                    if retrying and not tried[a]:  # back to its root, which sends it to its fallback cell
                        tried[a] = 1
                        schedule(now + tau[j][src_list[a]], _RETRY, a, 2 * j + refuse)
                        continue
                    refused_for_good(a, refuse, now + tau[j][src_list[a]])
                    continue
                srif[s1] += 1
                if pools is not None:
                    stok[s1] += tok_est[a]
                crif[j] += 1
                rif0[a] = crif[j]
                t_leaf[a] = now
                if fit_models:
                    running[j][a] = None
                if cancel and a < R:
                    at_srv[a] = s1
                if batched is None:  # the batched engine queued it already
                    if busy[s1]:
                        pq[s1].append(a)
                    else:
                        busy[s1] = True
                        in_prefill[s1] = a
                        schedule(now + prefill_s[a] * tp[j], _PREFILL_DONE, s1, a)
            elif kind == _SNAP:
                history.append(crif[:])
                if signals:
                    sig_history.append(cell_signals())
                if now < T:
                    n_snaps += 1
                    for j in range(n):
                        rif_sum[j] += crif[j]
                turn = probe_turn[a % snap_every]
                if turn:
                    hl = len(history)
                    er = [e.rate(now) for e in errs]
                    snap = cfg.snapshot_s
                    for i in range(n):
                        lg = lag[i]
                        ti = tau[i]
                        for rr in turn:
                            root = replicas[rr][i]
                            for j in range(n):
                                back = min(lg[j], hl - 1)
                                if signals:
                                    qd, kv, up = sig_history[hl - 1 - back][j]
                                    root.on_signals(j, qd, kv, up)  # type: ignore[attr-defined]  # hub-score's hook
                                # The answer's RIF is the snapshot ``back`` ticks old: it counts this
                                # root's requests sent up to τ_ij before that snapshot.
                                root.on_probe(j, now, history[hl - 1 - back][j], reported[j], er[j], confidence[j],
                                              k_live[j], now - back * snap - ti[j],
                                              k_live[j] * per_server[j] if cfg.shed else None)
                            root.tick(now)
                if now < T or in_flight > 0:
                    schedule(now + cfg.snapshot_s, _SNAP, a + 1)
            elif kind == _REFIT:
                for j in range(n):
                    e = est[j]
                    e.refit(now, censored(j, now))
                    reported[j] = _perturb(e.params, noise[j]) if sc.noise_eps else e.params
                    confidence[j] = e.confidence
                if now < T:
                    schedule(now + cfg.estimator.refit_period_s, _REFIT)
            elif kind == _MNLB:
                lam_hat = np.asarray(arrivals_since, float) / cfg.mnlb_period_s
                arrivals_since = [0] * n
                assert mnlb is not None  # _MNLB events are scheduled only for the MNLB policies
                if oracle:
                    cap = np.asarray(k_live, float) * server_rate
                else:  # as the control plane: the model's capacity × the leaf's healthy fraction
                    cap = np.array([reported[j].capacity * k_live[j] / sc.servers[j] for j in range(n)])
                mnlb.solve(lam_hat, cap)
                if now < T:
                    schedule(now + cfg.mnlb_period_s, _MNLB)
            elif kind == _PHASE:
                assert d is not None  # _PHASE events come from a disruption
                if a == 2:  # the cell silently becomes `factor` times slower
                    tp[d.cell] *= d.factor
                    td[d.cell] *= d.factor
                    if batched is not None:  # its engines' steps too, from the step in progress on
                        for sv in cell_servers[d.cell]:
                            batched.set_slowdown(sv, d.factor, now)
                elif a == 4:  # ... and silently recovers
                    tp[d.cell] /= d.factor
                    td[d.cell] /= d.factor
                    if batched is not None:
                        for sv in cell_servers[d.cell]:
                            batched.set_slowdown(sv, 1.0, now)
                elif a == 3:  # the cell's leaf restarts: its samples and measured prior are gone
                    j = d.cell
                    est[j] = new_estimator(j, 1)
                    errs[j] = ErrorTracker(cfg.error_tau_s)
                    reported[j], confidence[j] = priors[j], 0.0
                    if probing:
                        probers[j] = BackgroundProber(bg_cfg)
                else:
                    counts = d.outage_servers if a == 1 else sc.servers
                    for j in range(n):
                        online[j] = cell_servers[j][: counts[j]]
                        k_live[j] = float(counts[j])
                        for m, sv in enumerate(cell_servers[j]):
                            if admission and not is_up[sv] and m < counts[j]:  # back: its old rate says nothing
                                done_rate[sv].reset(now)
                            is_up[sv] = m < counts[j]
            elif kind == _RETRY:
                if cancel and fate[a]:  # its client gave up meanwhile (the deadline settled it)
                    continue
                j, refuse = divmod(b, 2)
                i = src_list[a]
                root = cast(RootRouter, replicas[rep_of[a]][i])
                usable = [int(c) for c in np.flatnonzero(root.usable(now))]
                k = next_best(root.costs(now).tolist(), usable, n, root.fallback_candidates())[j]
                if k != NO_FALLBACK:
                    retried += 1
                    dst[a] = k
                    schedule(now + tau[i][k], _LEAF, a)
                    continue
                refused_for_good(a, refuse, now)  # nowhere else to go: the refusal reaches the client
            elif kind == _REPLY:
                if cell_replies:
                    sender[a].on_cell_reply(now, dst[a], b == 1)  # native-discrete: Envoy's active count
                if replies and srv_of[a] >= 0:  # a cell with no server up answered itself: no server's outlier record
                    sender[a].on_reply(now, srv_of[a], b == 1)
            elif kind == _BG:
                for j in range(n):
                    pj = est[j].params
                    while probers[j].due(now, arrived_at[j], capacity_floor(len(online[j]), pj.a, pj.b), est[j].measured):
                        probers[j].on_sent(now)
                        probes_sent[j] += 1
                        prefill_s.append(probe_prefill)
                        decode_s.append(probe_decode)
                        if pools is not None:
                            tok_est.append(probe_prefill + probe_decode)
                        if batched is not None:
                            ptok_i.append(max(1, round(probe_prefill)))
                            dtok_i.append(max(1, round(probe_decode)))
                        t_leaf.append(0.0)
                        rif0.append(0)
                        schedule(now, _LEAF, len(prefill_s) - 1, j)
                if now < T:
                    schedule(now + cfg.background_tick_s, _BG)
        elif next_deadline <= next_arrival and next_deadline <= end_time:
            b = dl
            t_dl = next_deadline
            dl += 1
            next_deadline = t_list[dl] + timeout if dl < R else math.inf
            f = fate[b]
            if f == 1:
                continue
            now = t_dl
            events += 1
            fate[b] = 1
            cancelled += 1
            in_flight -= 1
            s1 = at_srv[b]
            if f == 0 and s1 >= 0:  # at a server: it aborts the request, freeing what it held
                j = cell_of[s1]
                if batched is not None:
                    batched.abort(b, now)
                elif in_prefill[s1] == b:
                    q = pq[s1]
                    if q:
                        nxt = q.popleft()
                        in_prefill[s1] = nxt
                        schedule(now + prefill_s[nxt] * tp[j], _PREFILL_DONE, s1, nxt)
                    else:
                        busy[s1] = False
                        in_prefill[s1] = -1
                elif b in pq[s1]:
                    pq[s1].remove(b)
                elif b in dq[s1]:
                    dq[s1].remove(b)
                else:  # decoding: its slot takes the next in line
                    q = dq[s1]
                    if q:
                        nxt = q.popleft()
                        schedule(now + decode_s[nxt] * td[j], _DECODE_DONE, s1, nxt)
                    else:
                        free[s1] += 1
                # The leaf sees a stream its client reset (the real agent: a client abort): it releases
                # the request's RIF and records neither an error nor a latency sample.
                if pools is not None:
                    stok[s1] -= tok_est[b]
                srif[s1] -= 1
                crif[j] -= 1
                if fit_models:
                    del running[j][b]
            if answered:  # the root's own 504 ends the request there now
                if replies and names_server and srv_of[b] < 0:  # never reached the leaf: the named server
                    srv_of[b] = fixed[b]
                schedule(now, _REPLY, b, 0)
        elif r < R:
            now = next_arrival
            i = src_list[r]
            k = next_replica[i]
            next_replica[i] = k + 1 if k + 1 < R_roots else 0
            if names_server:
                s_named = server_fns[i][k](now)
                j = NO_CELL if s_named == NO_CELL else cell_of[s_named]
                fixed[r] = s_named
            else:
                j = pick_fns[i][k](now)
            if answered:
                sender[r] = replicas[k][i]
            if retrying:
                rep_of[r] = k
            arrivals_since[i] += 1
            in_flight += 1
            if j == SHED:  # refused on purpose: not an error of the system, but not served either
                shed += 1
                in_flight -= 1
                if cancel:
                    fate[r] = 1
            elif j == NO_CELL:
                errors += 1
                refused += 1
                in_flight -= 1
                if cancel:
                    fate[r] = 1
            else:
                dst[r] = j
                schedule(now + tau[i][j], _LEAF, r)
            r += 1
            next_arrival = t_list[r] if r < R else math.inf
        else:
            break

    ok = ~np.isnan(lat)
    return RunResult(
        scenario=sc.seed,
        policy=policy,
        trial=trial,
        arrivals=R,
        completed=completed,
        errors=errors,
        in_flight=in_flight,
        latency=lat[ok],
        events=events + R,
        sim_time_s=now,
        per_cell_served=np.asarray(served),
        net_mean=net_sum / completed if completed else math.nan,
        mean_rif=np.asarray(rif_sum, float) / max(n_snaps, 1),
        routed=np.asarray(dst, dtype=np.int64),
        arrival_t=t_arr,
        probes=np.asarray(probes_sent, dtype=np.int64),
        probe_errors=probe_errors,
        overflow=overflow,
        refused=refused,
        shed=shed,
        request_timeout_s=cfg.request_timeout_s,
        server_model=w.server_model,
        preemptions=batched.preemptions if batched is not None else 0,
        cancelled=cancelled,
        timeouts=cfg.timeouts,
        rif_end=np.asarray(crif, dtype=np.int64),
        admission_refused=admission_refused,
        retried=retried,
    )
