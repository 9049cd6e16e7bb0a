"""vLLM-compatible Prometheus metrics for one emulated server.

Names, types and the ``model_name`` label follow vLLM's ``/metrics`` so anything that scrapes a real
vLLM (the leaf agent, dashboards) works unchanged against the emulator. Each server owns its own
``CollectorRegistry``: several emulators in one test process must not share counters.
"""

from __future__ import annotations

from collections import Counter as Tally

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from dlb.emulator.engine import Engine

# vLLM's buckets, with finer ones added at the low end so fast test profiles still resolve.
E2E_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
               40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ModelSeries:
    """One model's labelled children of every per-model family."""

    def __init__(self, m: EmulatorMetrics, model: str) -> None:
        self.running = m.running.labels(model)
        self.waiting = m.waiting.labels(model)
        self.gpu_cache = m.gpu_cache.labels(model)
        self.kv_cache = m.kv_cache.labels(model)
        self.prompt_tokens = m.prompt_tokens.labels(model)
        self.generation_tokens = m.generation_tokens.labels(model)
        self.e2e = m.e2e.labels(model)
        self.ttft = m.ttft.labels(model)
        self.tpot = m.tpot.labels(model)
        self.queue_time = m.queue_time.labels(model)
        self.prefix_queries = m.prefix_queries.labels(model)
        self.prefix_hits = m.prefix_hits.labels(model)


class EmulatorMetrics:
    """The metric families and how engine state maps onto them."""

    def __init__(self, models: tuple[str, ...]) -> None:
        self.models = models
        self.registry = r = CollectorRegistry()
        lbl = ["model_name"]
        self.running = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", lbl, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", lbl, registry=r)
        self.gpu_cache = Gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.", lbl, registry=r)
        self.kv_cache = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage (vLLM v1 name). 1 means 100 percent.", lbl, registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", lbl, registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Number of generation tokens processed.", lbl, registry=r)
        self.success = Counter("vllm:request_success", "Count of successfully processed requests.",
                               [*lbl, "finished_reason"], registry=r)  # fmt: skip
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.",
                             lbl, buckets=E2E_BUCKETS, registry=r)  # fmt: skip
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              lbl, buckets=TTFT_BUCKETS, registry=r)  # fmt: skip
        self.tpot = Histogram("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.",
                              lbl, buckets=TPOT_BUCKETS, registry=r)  # fmt: skip
        self.queue_time = Histogram("vllm:request_queue_time_seconds", "Histogram of time spent waiting in queue.",
                                    lbl, buckets=TTFT_BUCKETS, registry=r)  # fmt: skip
        self.prefix_queries = Counter("vllm:prefix_cache_queries", "Prefix cache queries, in prompt tokens.", lbl,
                                      registry=r)  # fmt: skip
        self.prefix_hits = Counter("vllm:prefix_cache_hits", "Prefix cache hits, in prompt tokens.", lbl, registry=r)
        self.rejected = Counter("dlb_emulator_requests_rejected", "Requests answered with an error before running.",
                                [*lbl, "reason"], registry=r)  # fmt: skip
        # Creating every child exports zeros from the start, as vLLM does.

        # Label children resolved once: ``labels()`` costs ~6 us, paid several times per engine step.
        self.series = {m: ModelSeries(self, m) for m in models}

    def sync_engine(self, engine: Engine) -> None:
        """Copy the scheduler's queue and cache state into the gauges (called after every change)."""
        usage = engine.kv_usage
        if len(self.models) == 1:
            s = self.series[self.models[0]]
            s.running.set(len(engine.running))
            s.waiting.set(len(engine.waiting))
            s.gpu_cache.set(usage)
            s.kv_cache.set(usage)
            return
        running = Tally(r.model for r in engine.running)
        waiting = Tally(r.model for r in engine.waiting)
        for m, s in self.series.items():
            s.running.set(running.get(m, 0))
            s.waiting.set(waiting.get(m, 0))
            s.gpu_cache.set(usage)
            s.kv_cache.set(usage)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
