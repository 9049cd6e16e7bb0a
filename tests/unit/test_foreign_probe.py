"""Cells DLB does not run: their metrics become the probe answer a DLB leaf would give, and the config
says where they are.

Rules: a GIE/llm-d endpoint picker's pool figures are read under every release's metric names; RIF is
its running requests (else average queue × ready pods), replicas its ready pods, 0 ready pods means
"do not send"; a vLLM cell's RIF is Σ running + waiting over the servers that answered; a cell whose
metrics say nothing is a failed probe (ValueError), never an idle cell; the whole-request latency
histograms are read per series and fitted into a model that stays at confidence 0 until it has samples.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from test_config import minimal

from dlb.config import ConfigError, config_from_dict
from dlb.core.estimator import EstimatorConfig, LatencyEstimator
from dlb.core.fit import MIN_PRIOR_SAMPLES, MIN_SAMPLES
from dlb.core.foreign_latency import IntervalLatency
from dlb.core.latency_model import LatencyParams, latency
from dlb.envoy.bootstrap import root_bootstrap
from dlb.probe import foreign
from dlb.probe.foreign import FOREIGN_ESTIMATOR, ForeignModel, gie_answer, parse_pool, vllm_answer
from dlb.probe.scrape import Scrape, parse_vllm
from dlb.probe.target import ProbeTarget

#: Written from GIE's metrics guide (site-src/guides/metrics.md): one pool, two models.
GIE_TEXT = """\
# HELP inference_pool_average_kv_cache_utilization The average kv cache utilization for an inference server pool.
# TYPE inference_pool_average_kv_cache_utilization gauge
inference_pool_average_kv_cache_utilization{name="pool-a"} 0.42
# TYPE inference_pool_average_queue_size gauge
inference_pool_average_queue_size{name="pool-a"} 2.5
# TYPE inference_pool_ready_pods gauge
inference_pool_ready_pods{name="pool-a"} 4
# TYPE inference_model_running_requests gauge
inference_model_running_requests{model_name="llama"} 11
inference_model_running_requests{model_name="qwen"} 3
# TYPE inference_model_request_total counter
inference_model_request_total{model_name="llama",target_model_name="llama"} 100
inference_model_request_total{model_name="qwen",target_model_name="qwen"} 20
# TYPE inference_model_request_error_total counter
inference_model_request_error_total{model_name="llama",target_model_name="llama"} 6
"""


def test_gie_pool_metrics_become_rif_replicas_and_counters() -> None:
    pool = parse_pool(GIE_TEXT)
    assert (pool.queue_avg, pool.kv_avg, pool.ready_pods, pool.running) == (2.5, 0.42, 4.0, 14.0)
    assert (pool.requests, pool.errors) == (120.0, 6.0)
    resp = gie_answer("far", pool, 0.05)
    assert (resp.cell, resp.rif, resp.replicas, resp.healthy_replicas, resp.waiting) == ("far", 14.0, 4, 4, 10.0)
    assert (resp.completed, resp.errors, resp.error_rate) == (120, 6, pytest.approx(0.05))
    assert not resp.HasField("model") and not resp.HasField("capacity")  # the root keeps its prior, never sheds on it


@pytest.mark.parametrize("prefix", ["inference_objective_", "llm_d_epp_", "llm_d_router_epp_"])
def test_later_releases_names_are_read_too(prefix: str) -> None:
    text = (f"# TYPE {prefix}pool_ready_pods gauge\n{prefix}pool_ready_pods 2\n"
            f"# TYPE {prefix}pool_average_queue_size gauge\n{prefix}pool_average_queue_size 3\n")
    resp = gie_answer("far", parse_pool(text), 0.0)
    assert (resp.rif, resp.replicas, resp.waiting) == (6.0, 2, 6.0)  # no running gauge: the queues are the load known


def test_a_pool_with_no_ready_pod_is_reported_unusable_and_one_with_no_pool_metrics_is_a_failed_probe() -> None:
    assert gie_answer("far", parse_pool("inference_pool_ready_pods 0\n"), 0.0).healthy_replicas == 0
    with pytest.raises(ValueError, match="no pool metrics"):
        gie_answer("far", parse_pool("# TYPE up gauge\nup 1\n"), 0.0)


def test_vllm_cell_sums_the_servers_that_answered() -> None:
    resp = vllm_answer("far", [Scrape(5.0, 2.0, 0.3), None, Scrape(1.0, 0.0, 0.1)], failed_scrapes=7)
    assert (resp.rif, resp.waiting, resp.replicas, resp.healthy_replicas, resp.errors) == (8.0, 2.0, 3, 2, 7)
    assert resp.error_rate == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="none of the 2 vLLM servers"):
        vllm_answer("far", [None, Scrape(None, None, None)], 0)


def test_the_whole_request_latency_histograms_are_read_per_series() -> None:
    """vLLM's ``vllm:e2e_request_latency_seconds`` per model; the EPP's ``…request_duration_seconds`` under
    GIE's model and objective names (written from GIE's metrics testdata and vLLM's metrics design doc)."""
    vllm = ('vllm:num_requests_running{model_name="m"} 2\n'
            'vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 4.0\n'
            'vllm:e2e_request_latency_seconds_count{model_name="m"} 4.0\n'
            'vllm:e2e_request_latency_seconds_sum{model_name="m"} 10.5\n'
            'vllm:e2e_request_latency_seconds_created{model_name="m"} 1.7e9\n')
    assert parse_vllm(vllm).latency == {"model_name=m": (10.5, 4.0)}
    assert parse_vllm("vllm:num_requests_running 1\n").latency is None
    for prefix in ("inference_model_", "inference_objective_"):
        text = GIE_TEXT + "".join(
            f"# TYPE {prefix}request_duration_seconds histogram\n"
            f'{prefix}request_duration_seconds_bucket{{model_name="{m}",target_model_name="{m}",le="+Inf"}} {n}\n'
            f'{prefix}request_duration_seconds_sum{{model_name="{m}",target_model_name="{m}"}} {total}\n'
            f'{prefix}request_duration_seconds_count{{model_name="{m}",target_model_name="{m}"}} {n}\n'
            for m, total, n in (("llama", 1.61, 2), ("qwen", 0.12, 1)))
        pool = parse_pool(text)
        assert sorted(pool.latency.values()) == [(0.12, 1.0), (1.61, 2.0)] and pool.running == 14.0


def test_a_foreign_model_reports_the_prior_at_confidence_0_until_intervals_with_completions_arrive() -> None:
    """Confidence 0 makes the root keep its own curve for the cell (RootRouter.on_probe); from
    MIN_PRIOR_SAMPLES intervals on, the model is measured from them, as a leaf's is: a 3-s cell, 1-s prior."""
    prior = LatencyParams(1.0, 0.05, 8.0, 1.0)
    model = ForeignModel(LatencyEstimator(prior, rng=random.Random(0)))

    async def feed(t0: int, n: int) -> None:
        for t in range(t0, t0 + n):
            await model.update(float(t), 4.0, {"srv": {"": (3.0 * t, float(t))}})

    asyncio.run(feed(0, MIN_PRIOR_SAMPLES))  # the first reading is a baseline: one interval short
    assert model.message().confidence == 0.0 and model.message().a_s == pytest.approx(1.0, rel=0.06)
    asyncio.run(feed(MIN_PRIOR_SAMPLES, 20))
    m = model.message()
    assert m.confidence > 0 and m.samples >= MIN_SAMPLES and 2.6 < float(latency(4.0, m.a_s, m.b_s, m.c, m.s)) < 3.4


def _foreign(**leaf: object) -> dict:
    data = minimal()
    data["cells"][0]["root"] = {"address": "127.0.0.1:10000", "ext_proc": "127.0.0.1:18080"}
    data["cells"][1]["leaf"] = leaf
    return data


def test_a_vllm_cell_is_its_servers_on_the_root_envoy() -> None:
    cfg = config_from_dict(_foreign(source="vllm"))
    b = cfg.cell("b")
    assert b.leaf.foreign and b.scrape_addresses() == ("127.0.0.1:8020", "127.0.0.1:8021")
    boot = root_bootstrap(cfg, "a", admin_port=0)
    cluster = next(c for c in boot["static_resources"]["clusters"] if c["name"] == "cell-b")
    ports = [e["endpoint"]["address"]["socket_address"]["port_value"] for e in cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]]
    assert (ports, cluster["lb_policy"]) == ([8020, 8021], "LEAST_REQUEST")


def test_a_gie_cell_is_probed_at_its_endpoint_picker_and_reached_at_its_gateway() -> None:
    data = _foreign(source="gie", address="127.0.0.1:10020", probe="127.0.0.1:9090")
    del data["cells"][1]["servers"]  # its pool's pods are the EPP's business
    cfg = config_from_dict(data)
    assert cfg.cell("b").scrape_addresses() == ("127.0.0.1:9090", "127.0.0.1:10020") and cfg.cell("b").upstreams()[0][0].port == 10020


@pytest.mark.parametrize(("leaf", "path", "says"), [
    ({"source": "slurm"}, "cells[1].leaf.source", "is not one of: dlb, vllm, gie"),
    ({"source": "gie", "address": "127.0.0.1:10020"}, "cells[1].leaf.probe", "required"),
    ({"source": "vllm", "ext_proc": "127.0.0.1:9999"}, "cells[1].leaf.ext_proc", "has no DLB leaf"),
])
def test_foreign_cell_mistakes_name_the_field(leaf: dict, path: str, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict(_foreign(**leaf))
    assert any(p.path == path and says in p.reason for p in info.value.problems), info.value.problems


@pytest.mark.parametrize(("leaf", "path", "says"), [
    ({"sourse": "vllm"}, "cells[1].leaf.sourse", "did you mean 'source'"),
    ({"source": "GIE", "address": "127.0.0.1:10020", "probe": "127.0.0.1:9090"}, "cells[1].leaf.source", "is not one of"),
])
def test_a_mistyped_source_is_the_one_problem_said(leaf: dict, path: str, says: str) -> None:
    """Not also "address: required" and "servers: required": those follow from a source other than the one meant."""
    data = _foreign(**leaf)
    del data["cells"][1]["servers"]
    with pytest.raises(ConfigError) as info:
        config_from_dict(data)
    assert [(p.path, says in p.reason) for p in info.value.problems] == [(path, True)], info.value.problems


def _slowed_unloaded_latency(config: EstimatorConfig) -> float:
    """ℓ(1) fitted 30 s after a cell read every 0.1 s went from 4 completions a second at 1 s to 0.2 a
    second at up to 20 s (the root moved away; its own users' requests finish slowly)."""
    rng = random.Random(0)
    est, il = LatencyEstimator(LatencyParams(1.0, 0.05, 8.0, 1.0), config, random.Random(0)), IntervalLatency()
    total = count = 0.0
    for k in range(900):
        t = k / 10
        done = (rng.random() < 0.4) if t < 60 else (rng.random() < 0.02)
        total, count = total + done * (rng.uniform(0.9, 1.1) if t < 60 else min(20.0, t - 59)), count + done
        if (s := il.observe(t, 4.0, {"srv": {"": (total, count)}})) is not None:
            est.record(s.t, s.rif, s.latency_s)
        if est.refit_due(t):
            est.refit(t, il.in_flight(t, 4.0))
    return float(latency(1.0, est.params.a, est.params.b, est.params.c, est.params.s))


def test_a_foreign_cells_model_follows_a_slowdown_its_completions_dwindled_in() -> None:
    """Why FOREIGN_ESTIMATOR's shorter memory: the leaf's keeps the fast curve 30 s into a 20× slowdown."""
    assert _slowed_unloaded_latency(FOREIGN_ESTIMATOR) > 10.0
    assert _slowed_unloaded_latency(EstimatorConfig()) < 2.0


def test_a_vllm_cells_knee_is_measured_as_a_leaf_measures_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Σ over servers of the most each ran while requests waited, once every server has shown one."""
    answers = {"s1": [Scrape(2.0, 1.0, 0.1), Scrape(2.0, 1.0, 0.1)], "s2": [Scrape(3.0, 0.0, 0.1), Scrape(3.0, 2.0, 0.1)]}

    async def scrape(address: str, timeout_s: float) -> Scrape:
        return answers[address].pop(0)

    monkeypatch.setattr(foreign, "scrape_vllm", scrape)
    prober = foreign.ForeignProber(ProbeTarget(1, "far", "s1", source="vllm", scrape=("s1", "s2")), LatencyParams(1.0, 0.05, 8.0, 1.0))
    asyncio.run(prober(1.0))
    assert prober._model is not None and prober._model.estimator.knee is None
    resp = asyncio.run(prober(1.0))
    assert prober._model.estimator.knee == 5.0 and resp.rif == 8.0 and resp.HasField("model")


def test_a_sample_with_a_timestamp_or_a_malformed_line_is_read_as_the_exposition_format_says() -> None:
    """A timestamp after the value is not the value (a hand split read RIF 1.7e12 from one), escaped label
    values stay one series, and a malformed line is skipped without losing the scrape's other figures."""
    lines = (
        'vllm:num_requests_running{model_name="m"} 3 1700000000000',
        "vllm:num_requests_waiting not-a-number",
        "vllm:num_requests_waiting 2",
        'vllm:e2e_request_latency_seconds_sum{model_name="a \\"b\\" }"} 12.5 1700000000000',
        'vllm:e2e_request_latency_seconds_count{model_name="a \\"b\\" }"} 5',
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="1000"} 1',
        "vllm:kv_cache_usage_perc 0.5",
    )
    s = parse_vllm("\n".join(lines))
    assert (s.running, s.waiting, s.kv_usage, s.kv_tokens) == (3.0, 2.0, 0.5, 8000.0)
    assert list(s.latency.values()) == [(12.5, 5.0)]


def test_a_foreign_model_follows_a_cell_that_slowed_and_completes_nothing() -> None:
    """What real Envoys showed: a cell read every 0.5 s holding 4 at 1 s each, slowed 20×, completes
    nothing for 20 s. Its model rises ≥ 3× within 10 s (the requests it still holds are far older than
    the model allows), and a root takes it (confidence > 0); before the slowdown it does not move."""
    prior = LatencyParams(1.0, 0.05, 8.0, 1.0)
    model = ForeignModel(LatencyEstimator(prior, FOREIGN_ESTIMATOR, random.Random(0)))
    rng = random.Random(3)
    total = count = 0.0

    def unloaded() -> float:
        p = model.estimator.params
        return float(latency(1.0, p.a, p.b, p.c, p.s))

    async def feed(t0: float, t1: float, slowed: bool) -> list[float]:
        nonlocal total, count
        seen, t = [], t0
        while t < t1:
            if not slowed:
                n = sum(rng.random() < 0.5 for _ in range(4))  # ~4 a second at ~1 s each
                total, count = total + sum(rng.uniform(0.8, 1.2) for _ in range(n)), count + n
            await model.update(t, 4.0, {"srv": {"": (total, count)}})
            seen.append(unloaded())
            t += 0.5
        return seen

    fast = asyncio.run(feed(0.0, 60.0, False))
    assert max(fast[40:]) < 1.5 * min(fast[40:]), fast  # steady: never raised
    slow = asyncio.run(feed(60.0, 70.0, True))
    assert slow[-1] > 3.0 * fast[-1] and model.message().confidence > 0, (fast[-1], slow)
