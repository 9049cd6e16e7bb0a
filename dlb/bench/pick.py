"""``dlb bench pick``: per-request decision cost of :class:`RootRouter` against a vectorised baseline.

The baseline, measured in the same run on the same state, is what the decision was before the fast
path: the numpy cost vector (:func:`cost_vector`) masked by :meth:`RootRouter.usable` and an argmin
(discrete), or a numpy CDF and ``searchsorted`` (flow; both flow picks, :attr:`FlowConfig.pick`, against
it). Reported as µs per decision and the ratio.
Probe answers arrive every 50 decisions for one cell, as they would at ~1k requests/s per root.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from dlb.bench import harness
from dlb.core.costs import Cost, cost_vector
from dlb.core.flow import PICKS, FlowConfig
from dlb.core.latency_model import LatencyParams
from dlb.core.router import Mechanism, PolicyConfig, RootRouter
from dlb.core.topology import Topology

PRIOR = LatencyParams(1.0, 0.05, 8.0, 1.0)


def _router(n: int, mech: Mechanism, cost: Cost, pick: str = "sample") -> RootRouter:
    tau = np.full((n, n), 0.02) * (1 - np.eye(n))
    t = Topology.build([f"c{i}" for i in range(n)], [4] * n, tau)
    # No cold start: a flow row measures the flow pick, not the discrete picks of its first seconds.
    flow = FlowConfig(warmup_s=0.0, pick=pick)
    r = RootRouter(t, 0, PolicyConfig(mech, cost, flow=flow), PRIOR, np.random.default_rng(0))
    for j in range(n):
        r.on_probe(j, 0.0, 5.0 + j, PRIOR)
    r.tick(0.0)
    return r


def _baseline_pick(r: RootRouter, now: float, rng: np.random.Generator) -> int:
    usable = r.usable(now)
    if r.policy.mechanism is Mechanism.DISCRETE:
        c = np.where(usable, cost_vector(r.policy.cost, r.view.rif + r.view.sent, r.replicas, r.models, r.rtt), np.inf)
        j = int(np.argmin(c))
    else:
        cum = np.cumsum(np.where(usable, r.x, 0.0))
        j = min(int(np.searchsorted(cum, rng.random() * cum[-1], side="right")), r.topology.n - 1)
    r.view.sent[j] += 1.0
    return j


def _time(fn, r: RootRouter, decisions: int) -> float:
    n = r.topology.n
    t0 = time.perf_counter()
    for k in range(decisions):
        fn(0.5)
        if k % 50 == 0:
            r.on_probe(k % n, 0.5, 5.0 + k % 7, None)
    return (time.perf_counter() - t0) / decisions * 1e6


def measure(decisions: int = 20_000, cells: tuple[int, ...] = (3, 10)) -> list[dict]:
    out = []
    for n in cells:
        for mech, pick in ((Mechanism.DISCRETE, "sample"), *((Mechanism.FLOW, p) for p in PICKS)):
            for cost in Cost:
                fast = _router(n, mech, cost, pick)
                base = _router(n, mech, cost)
                rng = np.random.default_rng(1)
                us_base = _time(lambda now: _baseline_pick(base, now, rng), base, decisions)  # noqa: B023 - called within this iteration
                us_fast = _time(lambda now: fast.pick(now), fast, decisions)  # noqa: B023 - called within this iteration
                name = PolicyConfig(mech, cost).name + ("" if pick == "sample" else f" {pick}")
                out.append({"cells": n, "policy": name, "baseline_us": round(us_base, 2),
                            "pick_us": round(us_fast, 2), "speedup": round(us_base / us_fast, 2)})
    return out


def run(args: argparse.Namespace) -> int:
    record = harness.start()
    records = measure(args.decisions)
    print(f"{'cells':>5} {'policy':20} {'baseline µs':>12} {'pick µs':>8} {'speedup':>8}")
    for r in records:
        print(f"{r['cells']:>5} {r['policy']:20} {r['baseline_us']:>12.2f} {r['pick_us']:>8.2f} {r['speedup']:>7.2f}x")
    return harness.finish(record, records, json_path=args.json)
