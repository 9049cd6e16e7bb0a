"""A cell DLB does not run, probed through the metrics its own software exports, as a ``dlb.v1`` answer.

Two sources (``cells[].leaf.source``):

- ``vllm``: the cell's servers' ``/metrics`` scraped directly. RIF = Σ running + waiting over the
  servers that answered; healthy replicas = the servers that answered; the error rate = the fraction
  that did not (a request the root Envoy sends there may hit one).
- ``gie``: a Gateway API Inference Extension (or llm-d) gateway's endpoint picker's ``/metrics``: the
  pool averages llm-d's multi-cluster hub ranks clusters by. RIF = the EPP's running requests (summed
  over models), or average queue × ready pods when it exports none; replicas = ready pods; the error
  rate = an EMA of the request and error counters' growth between scrapes. The gateway itself (the
  cell's ``leaf.address``, the data path) must accept a TCP connection at each scrape, or the scrape
  fails: the EPP's metrics say nothing of it, and a dead gateway stayed usable while every request the
  root sent there failed to connect and took the cross-cell retry.

Why answers in the leaf's message: the root's router, aversion and shedding then treat a foreign cell
exactly as a DLB cell, with no second code path.

The latency model: the same estimator a leaf runs, fed one sample per scrape interval from the cell's
own whole-request latency histogram (vLLM's ``vllm:e2e_request_latency_seconds``, the EPP's
``…request_duration_seconds``; :mod:`dlb.core.foreign_latency` says what such a model means). Until
:data:`~dlb.core.fit.MIN_PRIOR_SAMPLES` intervals had completions it answers with confidence 0, and the
root keeps its own curve for the cell (the endpoint's prior, ``latency_prior_by_cell``), as for a fresh
leaf; a source that exports no such histogram keeps it so.

Capacity: none is reported, so a root never sheds on a foreign cell's account. Neither source exports a
bound on what it admits: vLLM queues without limit (``max_num_seqs`` bounds the running batch and is not
exported; ``cache_config_info`` bounds KV blocks, not requests), and GIE's EPP refuses
(``InferencePoolResourceExhausted``, 429) only sheddable requests when its saturation detector trips,
still admitting critical ones. Its 429s count in the cell's error rate, which aversion acts on.

The metric names differ by release (``inference_pool_*`` and ``inference_model_*`` in GIE's EPP,
``inference_objective_*`` later, ``llm_d_epp_*`` / ``llm_d_router_epp_*`` in llm-d's): every known
prefix is accepted.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from dlb.core.estimator import EstimatorConfig, LatencyEstimator
from dlb.core.foreign_latency import IntervalLatency, outlived
from dlb.core.latency_model import LatencyParams
from dlb.probe.codec import model_message
from dlb.probe.scrape import Scrape, ScrapeSlow, http_get, scrape_vllm, tcp_accepts
from dlb.probe.target import ProbeTarget
from dlb.proto import probe_pb2

#: Prefixes the EPP metric names carry, by release (GIE, llm-d); a name is matched on what follows.
EPP_PREFIXES = ("llm_d_router_epp_", "llm_d_epp_", "inference_objective_", "inference_model_", "inference_")
#: Weight of one scrape's error fraction in a GIE cell's error-rate EMA.
ERROR_EMA_ALPHA = 0.3
#: A foreign cell is scraped at most this often: ``/metrics`` is rendered per request, unlike a probe answer.
MIN_PERIOD_S = 0.1


@dataclass(frozen=True)
class PoolSample:
    """What a GIE/llm-d endpoint picker's ``/metrics`` says of its pool (None: not exported)."""

    queue_avg: float | None = None
    kv_avg: float | None = None
    ready_pods: float | None = None
    running: float | None = None
    requests: float | None = None
    errors: float | None = None
    #: The request-duration histogram: series labels → (sum, count), every model's.
    latency: Mapping[str, tuple[float, float]] = field(default_factory=dict)


def _canonical(name: str) -> str:
    for prefix in EPP_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


_POOL_FIELDS = {"pool_average_queue_size": "queue_avg", "pool_average_kv_cache_utilization": "kv_avg",
                "pool_ready_pods": "ready_pods", "running_requests": "running", "request_total": "requests",
                "request_error_total": "errors"}
#: The EPP's whole-request latency histogram's sum and count (index into a (sum, count) pair).
_DURATION = {"request_duration_seconds_sum": 0, "request_duration_seconds_count": 1}


def parse_pool(text: str) -> PoolSample:
    """The pool's figures from an EPP's Prometheus text: each summed over its label sets (one pool per EPP;
    the per-model running requests and counters add up to the pool's). ValueError for text that is not
    Prometheus exposition."""
    sums: dict[str, float] = {}
    hist: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = _canonical(sample.name)
            key = _POOL_FIELDS.get(name)
            if key is not None and math.isfinite(sample.value):
                sums[key] = sums.get(key, 0.0) + float(sample.value)
            elif name in _DURATION:
                series = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                hist.setdefault(series, [math.nan, math.nan])[_DURATION[name]] = float(sample.value)
    return PoolSample(**sums, latency={k: (v[0], v[1]) for k, v in hist.items() if not math.isnan(v[0] + v[1])})


def vllm_answer(cell: str, scrapes: Sequence[Scrape | None], failed_scrapes: int) -> probe_pb2.ProbeResponse:
    """The probe answer of a cell of vLLM servers from one scrape each (None: unreachable).

    ValueError when no server answered: the prober counts it as a failed probe, so the root marks the
    cell unavailable after ``fail_threshold`` of them, as it does for a dead leaf."""
    up = [s for s in scrapes if s is not None and (s.running is not None or s.waiting is not None)]
    if not up:
        raise ValueError(f"none of the {len(scrapes)} vLLM servers of cell {cell} answered /metrics")
    running = sum(s.running or 0.0 for s in up)
    waiting = sum(s.waiting or 0.0 for s in up)
    return probe_pb2.ProbeResponse(cell=cell, rif=running + waiting, replicas=len(scrapes), healthy_replicas=len(up),
                                   waiting=waiting, error_rate=1.0 - len(up) / len(scrapes), errors=failed_scrapes,
                                   timestamp_unix_ns=time.time_ns())


def gie_answer(cell: str, pool: PoolSample, error_rate: float) -> probe_pb2.ProbeResponse:
    """The probe answer of a GIE/llm-d cell from its EPP's pool figures (ValueError: no pool figures at all)."""
    if pool.ready_pods is None and pool.queue_avg is None and pool.running is None:
        raise ValueError(f"the endpoint picker of cell {cell} exports no pool metrics (…pool_ready_pods, …pool_average_queue_size)")
    pods = max(0, round(pool.ready_pods)) if pool.ready_pods is not None else 0
    waiting = (pool.queue_avg or 0.0) * pods
    rif = pool.running if pool.running is not None else waiting
    resp = probe_pb2.ProbeResponse(cell=cell, rif=max(0.0, rif), replicas=pods, waiting=waiting,
                                   error_rate=min(1.0, max(0.0, error_rate)), errors=int(pool.errors or 0),
                                   completed=int(pool.requests or 0), timestamp_unix_ns=time.time_ns())
    if pool.ready_pods is not None:
        resp.healthy_replicas = pods  # 0 ready pods: "do not send here", as a leaf with every server down
    return resp


#: A foreign cell's estimator: the leaf's, with a shorter memory. A slowed cell completes fewer requests,
#: so its new samples are outnumbered by the old ones, and a leaf's remedy (every running request's own
#: age as a lower bound, background probes) is not available here. Simulated (20× slower, 0.2 completions
#: a second after 4 a second): with the leaf's 15-s half-life ℓ(1) was still 1.0 s 30 s later; with 5 s
#: and a 30-s window, 6.5 s after 22 s and 20 s after 30 s. Each sample averages an interval's
#: completions, so fewer suffice.
FOREIGN_ESTIMATOR = EstimatorConfig(window_s=30.0, half_life_s=5.0)

#: How improbable the few completions of a cell that holds requests must be, under its model, for the
#: model to be raised to the age of those still running (:func:`~dlb.core.foreign_latency.outlived`). On
#: real Envoys a cell slowed 20× completed almost nothing for 22 s, and its model stayed at the fast
#: curve all that time; with this test it was 2.4× up after 3 s and 15× after 17 s. In a simulated steady
#: cell (Poisson arrivals, exponential or lognormal latencies, 1–8 in flight, 10 min, read every 0.5 s;
#: research/epp.md) it fired 0–9 times, mostly when the fit was below the truth, and the model's error at
#: the cell's RIF was unchanged (median 3–7 %, mean within −0.02…+0.04 in log).
OUTLIVED_ALPHA = 1e-4


@dataclass
class ForeignModel:
    """A foreign cell's latency model: interval samples (:mod:`dlb.core.foreign_latency`) fitted by the
    leaf's :class:`~dlb.core.estimator.LatencyEstimator` (:data:`FOREIGN_ESTIMATOR`), refitted when a leaf's would be."""

    estimator: LatencyEstimator
    intervals: IntervalLatency = field(default_factory=IntervalLatency)

    async def update(self, now: float, rif: float, readings: Mapping[str, Mapping[str, tuple[float, float]]]) -> None:
        """One scrape's figures in; the refit (milliseconds of scipy) in a worker thread, off the root's loop.
        Nothing records meanwhile: the prober awaits this before its next scrape."""
        sample = self.intervals.observe(now, rif, readings)
        est = self.estimator
        if sample is not None:
            est.record(sample.t, sample.rif, sample.latency_s)
        bounds = self.intervals.in_flight(now, rif)
        if est.refit_due(now):
            await asyncio.get_running_loop().run_in_executor(None, est.refit, now, bounds)
        if bounds is not None and (late := outlived(now, bounds, est.params, OUTLIVED_ALPHA)) is not None and late.factor > 1.0:
            est.raise_by(now, late.factor, late.since, late.survivors)

    def message(self) -> probe_pb2.LatencyModel:
        est = self.estimator
        return model_message(est.params, est.confidence, len(est))


@dataclass
class ForeignProber:
    """Scrapes one foreign cell per call and answers as its leaf would (keeps what the next answer needs:
    each server's last good scrape, the EPP's last counters, the error EMA, the latency model).

    ``prior``: what the cell's model is shrunk toward (the endpoint's prior for it); None: no model."""

    target: ProbeTarget
    prior: LatencyParams | None = None
    clock: Callable[[], float] = time.monotonic
    _last: list[Scrape | None] | None = None
    _failed: int = 0
    _counters: tuple[float, float] | None = None
    _error_ema: float = 0.0
    _model: ForeignModel | None = None
    #: Each vLLM server's batch limit, measured as the leaf measures it: the most it ran while requests waited.
    _batch: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.prior is not None:
            self._model = ForeignModel(LatencyEstimator(self.prior, FOREIGN_ESTIMATOR, random.Random(self.target.name)))

    async def __call__(self, timeout_s: float) -> probe_pb2.ProbeResponse:
        if self.target.source == "vllm":
            resp, readings = await self._vllm(timeout_s)
        elif self.target.source == "gie":
            resp, readings = await self._gie(timeout_s)
        else:
            raise ValueError(f"cell {self.target.name}: unknown probe source {self.target.source!r} (vllm or gie)")
        if self._model is not None:
            await self._model.update(self.clock(), resp.rif, readings)
            resp.model.CopyFrom(self._model.message())
        return resp

    async def _vllm(self, timeout_s: float) -> tuple[probe_pb2.ProbeResponse, dict[str, Mapping[str, tuple[float, float]]]]:
        addresses = self.target.scrape
        if self._last is None:
            self._last = [None] * len(addresses)
            self._batch = [0.0] * len(addresses)
        results = await asyncio.gather(*(scrape_vllm(a, timeout_s) for a in addresses), return_exceptions=True)
        readings = {}
        for i, r in enumerate(results):
            if isinstance(r, ScrapeSlow):
                continue  # busy, not dead: keep its last figures (dlb.probe.scrape.scrape_vllm)
            if isinstance(r, BaseException):
                raise r
            if r.running is None and r.waiting is None:
                self._failed += 1
                self._last[i] = None
            else:
                self._last[i] = r
                if r.latency is not None:
                    readings[addresses[i]] = r.latency
                if r.running is not None and (r.waiting or 0.0) > 0 and r.running > self._batch[i]:
                    self._batch[i] = r.running
        if self._model is not None and min(self._batch) > 0:
            self._model.estimator.set_knee(sum(self._batch))  # the knee the fit shrinks toward, as a leaf's
        return vllm_answer(self.target.name, self._last, self._failed), readings

    async def _gie(self, timeout_s: float) -> tuple[probe_pb2.ProbeResponse, dict[str, Mapping[str, tuple[float, float]]]]:
        try:
            body = await http_get(self.target.scrape[0], "/metrics", timeout_s)
        except (TimeoutError, OSError) as e:
            raise ValueError(f"endpoint picker metrics of cell {self.target.name} at {self.target.scrape[0]}: {e or type(e).__name__}") from None
        if len(self.target.scrape) > 1:  # the gateway: where the root's requests go (Config.scrape_addresses)
            try:
                await tcp_accepts(self.target.scrape[1], timeout_s)
            except (TimeoutError, OSError) as e:
                raise ValueError(f"gateway of cell {self.target.name} at {self.target.scrape[1]}: {e or type(e).__name__}") from None
        pool = parse_pool(body.decode("utf-8", "replace"))
        if pool.requests is not None and pool.errors is not None:
            if self._counters is not None:
                d_req, d_err = pool.requests - self._counters[0], pool.errors - self._counters[1]
                if d_req > 0 and d_err >= 0:  # a counter going down is a restarted EPP: a new baseline
                    self._error_ema += ERROR_EMA_ALPHA * (min(1.0, d_err / d_req) - self._error_ema)
            self._counters = (pool.requests, pool.errors)
        return gie_answer(self.target.name, pool, self._error_ema), {self.target.scrape[0]: pool.latency}
