"""``dlb bench envoy-push``: time from a flow-weight change in the control plane to Envoy applying it.

A real root Envoy bootstrapped from :mod:`dlb.envoy.ads_bootstrap` follows a real :class:`ControlPlane`.
Each round changes the flow weights and calls ``rebuild()`` (what the flow loop does every period),
then polls Envoy's admin ``/stats`` until the route's ``update_success`` counter moves: that is the
moment Envoy has the new RouteConfiguration in effect. Polling costs ~0.3 ms a request on loopback,
which bounds the resolution; the numbers include it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time

import numpy as np
import yaml

from dlb.bench import harness
from dlb.config import load_config
from dlb.config.model import HostPort
from dlb.control_plane.service import ControlPlane
from dlb.envoy.ads_bootstrap import ads_bootstrap
from dlb.envoy.binary import EnvoyProcess
from dlb.envoy.root_token import token_secret
from dlb.procutil import free_port


def _config(path: str, n_cells: int) -> None:
    names = [f"c{i}" for i in range(n_cells)]
    doc = {
        "version": 1,
        "cells": [{
            "name": n,
            "leaf": {"address": f"127.0.0.1:{free_port()}", "probe": f"127.0.0.1:{free_port()}"},
            **({"root": {"address": f"127.0.0.1:{free_port()}"}} if i == 0 else {}),
            "servers": [f"127.0.0.1:{free_port()}"],
        } for i, n in enumerate(names)],
        "network": {"default_one_way_ms": 10},
        "endpoints": [{"name": "gen", "match": {"prefix": "/"}, "policy": {"mechanism": "flow", "cost": "gradient"}}],
    }
    with open(path, "w") as fh:
        yaml.safe_dump(doc, fh)


def _successes(envoy: EnvoyProcess) -> int:
    return sum(int(v) for k, v in envoy.stats("rds").items() if k.endswith("update_success"))


async def measure(rounds: int = 50, cells: int = 4, delta: bool = False) -> dict:
    tmp_dir = tempfile.TemporaryDirectory(prefix="dlb-bench-push-")  # removed when the scenario ends
    tmp = tmp_dir.name
    cfg_path = os.path.join(tmp, "dlb.yaml")
    _config(cfg_path, cells)
    cfg = load_config(cfg_path)
    cp = ControlPlane(cfg, probe=False, flow_loop=False)
    xds_port, _ = await cp.start("127.0.0.1:0", "127.0.0.1:0")
    admin = free_port()
    boot = os.path.join(tmp, "root.yaml")
    with open(boot, "w") as fh:
        yaml.safe_dump(ads_bootstrap("root", "c0", HostPort("127.0.0.1", xds_port), admin, node_id="bench-root", delta=delta,
                                     token=token_secret(cfg)), fh)
    envoy = EnvoyProcess(boot, admin)
    samples: list[float] = []
    rng = np.random.default_rng(0)
    try:
        await asyncio.to_thread(envoy.start)
        assert cp.flow is not None
        router = cp.flow.routers[("gen", 0)]
        for _ in range(rounds):
            before = await asyncio.to_thread(_successes, envoy)
            x = rng.dirichlet(np.ones(cells))
            router.x = x
            t0 = time.perf_counter()
            cp.rebuild()
            deadline = t0 + 10.0
            while await asyncio.to_thread(_successes, envoy) == before:
                if time.perf_counter() > deadline:
                    raise TimeoutError("Envoy did not apply a weight change within 10 s")
            samples.append((time.perf_counter() - t0) * 1000)
    finally:
        await asyncio.to_thread(envoy.stop)
        await cp.stop()
        tmp_dir.cleanup()
    arr = np.array(samples)
    return {"protocol": "delta" if delta else "sotw", "cells": cells, "rounds": rounds,
            "p50_ms": float(np.percentile(arr, 50)), "p99_ms": float(np.percentile(arr, 99)), "max_ms": float(arr.max())}


def run(args: argparse.Namespace) -> int:
    record = harness.start()
    records = [asyncio.run(measure(args.rounds, args.cells, delta)) for delta in (False, True)]
    for r in records:
        print(f"{r['protocol']:5s} cells={r['cells']} rounds={r['rounds']}: p50 {r['p50_ms']:.2f} ms  p99 {r['p99_ms']:.2f} ms  max {r['max_ms']:.2f} ms")
    return harness.finish(record, records, json_path=args.json)
