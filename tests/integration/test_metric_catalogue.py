"""Each service's /metrics against the one catalogue of dlb_* families (dlb/metric_catalogue.py).

Every service is scraped over HTTP through the exporter it runs in production (root and leaf:
``serve_metrics``; control plane: ``StatusServer``; emulator: its registry's exposition), then
parsed with prometheus_client's own parser.
"""

from __future__ import annotations

import asyncio
import itertools
import urllib.request

import numpy as np
from test_metric_catalogue_unit import compare

from dlb.config import config_from_dict
from dlb.core.latency_model import LatencyParams
from dlb.ext_proc.leaf import LeafAgent
from dlb.ext_proc.leaf_state import LeafState, ServerState
from dlb.ext_proc.root import RootService
from dlb.service.loop_lag import LoopLag
from dlb.service.metrics import CallbackCollector, serve_metrics
from dlb.transport.limits import TransportStats
from dlb.xds import SnapshotCache, StatusRegistry, StatusServer, types


def scrape(collect, prefix: str | None = None) -> str:
    _, port = serve_metrics(collect, "127.0.0.1", 0, prefix=prefix)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return resp.read().decode()


def test_root_metrics_match_the_catalogue() -> None:
    """The root service exports exactly the catalogued dlb_root_* families, types and labels."""
    cells = [{"name": n, "leaf": {"address": f"127.0.0.1:{1000 + i}", "probe": f"127.0.0.1:{2000 + i}"},
              "servers": [f"127.0.0.1:{3000 + i}"]} for i, n in enumerate(["a", "b"])]
    cfg = config_from_dict({
        "version": 1, "cells": cells, "network": {"one_way_ms": {"a": {"b": 20}}},
        "endpoints": [{"name": "chat", "match": {"prefix": "/v1/"}, "policy": {"mechanism": "flow", "cost": "latency"},
                       "latency_prior": {"a_s": 0.1, "b_s": 0.01, "c": 4, "s": 1}}]})
    svc = RootService.from_config(cfg, "a", seed=1)
    svc.transport_stats = TransportStats()
    lag = LoopLag("dlb_root")  # registered beside the service's own collector, as dlb serve root does
    compare("root", scrape(lambda: itertools.chain(svc.collect(), lag.families()), "dlb_root"))


def test_leaf_metrics_match_the_catalogue() -> None:
    """The leaf agent exports exactly the catalogued dlb_leaf_* families, types and labels."""
    st = LeafState(cell="a", servers=[ServerState("127.0.0.1:9")], replicas=1, prior=LatencyParams(0.1, 0.01, 4, 1),
                   rng=np.random.default_rng(0))
    st.pick(0.0, "x")
    agent = LeafAgent(st)
    agent.transport_stats = TransportStats()
    lag = LoopLag("dlb_leaf")
    compare("leaf", scrape(lambda: itertools.chain(agent.collect(), lag.families()), "dlb_leaf"))


def test_epp_metrics_match_the_catalogue() -> None:
    """The EPP exports exactly the catalogued dlb_epp_* families, the InferencePool watch's included."""
    from kubernetes import client

    from dlb.epp.inferencepool import PoolSpec, PoolState
    from dlb.epp.k8s import PoolRef, PoolWatcher
    from dlb.epp.limits import GrpcLimits, StreamGate
    from dlb.epp.metrics import epp_families
    from dlb.epp.picker import EndpointPicker

    st = LeafState(cell="a", servers=[ServerState("127.0.0.1:9")], replicas=1, prior=LatencyParams(0.1, 0.01, 4, 1),
                   rng=np.random.default_rng(0))
    watcher = PoolWatcher(PoolRef("p", "ns"), client.ApiClient(), publish=lambda eps: None)
    watcher.pool = PoolState("p", PoolSpec((("app", "x"),), (8000,)))
    epp = EndpointPicker(st)
    lag = LoopLag("dlb_epp")
    compare("epp", scrape(lambda: itertools.chain(epp_families(epp, GrpcLimits(), StreamGate(1), watcher), lag.families()), "dlb_epp"))


def test_xds_status_metrics_match_the_catalogue() -> None:
    """The control plane's status server exports exactly the catalogued dlb_xds_* families."""
    status = StatusRegistry()
    status.stream_opened("n1", "c")
    status.sent("n1", types.CLUSTER, "v1", "1")
    status.acked("n1", types.CLUSTER, "v1")
    status.nacked("n1", types.CLUSTER, "v1", "bad")
    cache = SnapshotCache()

    async def main() -> str:
        server = StatusServer(status, snapshot_count=lambda: len(cache.keys()))
        server.registry.register(CallbackCollector(LoopLag("dlb_xds").families))  # as dlb serve control-plane does
        port = await server.start()
        try:
            return await asyncio.to_thread(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode())
        finally:
            await server.stop()

    compare("xds", asyncio.run(main()))
