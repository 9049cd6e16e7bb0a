"""A root probing a cell whose leaf replicas are found in DNS (``leaf.replicas: dns``), over real gRPC on
127.0.0.1 and 127.0.0.2 (the same port: two pods behind one headless Service).

- Each address the name resolves to is probed, and the root's router sees one cell: RIF the sum, the
  merged model (both replicas report the same curve at equal shares of a two-replica cell, so the
  cell's is that curve with twice the knee).
- When a pod is gone from DNS, the next resolution drops it: RIF is the survivor's; the cell stays usable.
- When every replica fails, the cell is unusable.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from bounded_wait import until_in_loop
from leaf_stub import StaticProbe, serve_probe

from dlb.config import config_from_dict
from dlb.ext_proc.root import RootService
from dlb.ext_proc.root_xds import ProbeManager, config_probes, probe_targets
from dlb.probe.client import ProbeTiming
from dlb.procutil import free_port


class SteadyProbe(StaticProbe):
    """A pod serving 100 requests a second, however often it is probed (the stub counts per probe)."""

    def __init__(self, cell: str, rif: float) -> None:
        super().__init__(cell, rif)
        self.t0 = time.monotonic()

    async def Probe(self, request, context):
        resp = await super().Probe(request, context)
        resp.completed = int(100 * (time.monotonic() - self.t0))
        return resp


def _config(port: int) -> dict:
    return {
        "version": 1,
        "cells": [{"name": "a", "leaf": {"address": "leaf-a.test:10010", "probe": f"leaf-a.test:{port}", "replicas": "dns"},
                   "root": {"address": f"127.0.0.1:{free_port()}"}, "servers": ["127.0.0.1:8010"]}],
        "endpoints": [{"name": "m", "match": {"prefix": "/v1/"}, "policy": {"mechanism": "discrete", "cost": "rif"}}],
        "probe": {"period_ms": 20, "timeout_ms": 200, "stale_after_ms": 600, "backoff_max_ms": 200},
    }


def test_a_root_probes_every_pod_of_a_dns_named_leaf_and_sums_them() -> None:
    asyncio.run(_scenario())


async def _scenario() -> None:
    port = free_port()
    cfg = config_from_dict(_config(port))
    answers = {"leaf-a.test": ["127.0.0.1", "127.0.0.2"]}

    async def resolver(host: str, _port: int) -> list[str]:
        return list(answers[host])

    pods = [SteadyProbe("a", rif=2.0), SteadyProbe("a", rif=3.0)]
    servers = [await serve_probe(p, f"127.0.0.{k + 1}:{port}") for k, p in enumerate(pods)]
    service = RootService.from_config(cfg, "a", seed=1)
    manager = ProbeManager(service, ProbeTiming(0.02, 0.2, 0.2), "a", resolver=resolver, dns_period_s=0.1)
    router = service.endpoints[0].router
    try:
        await manager.retarget(probe_targets(cfg.topology(), "a", config_probes(cfg), emulate_wan=False))
        assert [t.address for t in manager.targets] == [f"127.0.0.1:{port}", f"127.0.0.2:{port}"]
        await until_in_loop(lambda: router.view.rif[0] == 5.0 and all(p.probes for p in pods), "RIF of cell a = 2 + 3", timeout=10)
        # Two replicas at equal shares (their completion rates), each c = 4 on its half: the cell's knee at 8.
        assert router.models.c[0] == pytest.approx(8.0, rel=0.15) and router.models.b[0] == pytest.approx(0.025)
        answers["leaf-a.test"] = ["127.0.0.1"]  # the second pod is gone (a rolling update replaced it)
        await until_in_loop(lambda: len(manager.targets) == 1 and router.view.rif[0] == 2.0, "RIF = the survivor's", timeout=10)
        assert router.usable(service.clock())[0]
        await servers[0].stop(None)  # the last pod fails too: now the cell is unusable
        await until_in_loop(lambda: not router.usable(service.clock())[0], "cell a unusable", timeout=10)
    finally:
        await manager.stop()
        for s in servers:
            await s.stop(None)
