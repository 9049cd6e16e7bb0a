"""Simulator speed on the two experiments that did not fit 90 min (issue 12): ``length`` (y = 10 and y = 1/10,
the most and fewest requests) and ``leaf-pick`` (both variants, batched server), every policy, scenario 1000,
plus the 21 runs of ../speed-f2d3554/bench.py (pipeline, batched, 4 root replicas).

Usage: PYTHONPATH=<code tree> python bench.py MINUTES OUT.json [REPEAT] — per run: events, CPU seconds (the
smallest of REPEAT, default 1: the box is shared) and a digest of its results (latencies, routing, served, mean
RIF, probes), so two trees can be compared for speed and for bit-identical results
(``python bench.py compare A.json B.json``)."""
import hashlib
import json
import sys
import time

import numpy as np

from dlb.sim.engine import SimConfig, simulate
from dlb.sim.experiments import EXPERIMENTS
from dlb.sim.policies import POLICIES
from dlb.sim.scenario import generate


def digest(res) -> str:
    h = hashlib.sha256()
    for a in (res.latency, res.routed, res.per_cell_served, res.mean_rif, res.probes):
        h.update(np.ascontiguousarray(a).tobytes())
    h.update(repr((res.arrivals, res.completed, res.errors, res.in_flight, res.events, res.sim_time_s, res.net_mean,
                   res.probe_errors)).encode())
    return h.hexdigest()[:16]


def runs(minutes: float):
    out = []
    for exp, labels in (("length", ("y=10", "y=1/10")), ("leaf-pick", ("rif", "prequal"))):
        for v in EXPERIMENTS[exp]:
            if v.label in labels:
                sc = generate(1000, duration_s=minutes * 60, **v.kwargs())
                out += [(f"{exp}/{v.label}/{p}", sc, p, SimConfig()) for p in POLICIES]
    for seed, kw in ((1000, {}), (1001, {"server_model": "batched"})):
        sc = generate(seed, duration_s=minutes * 60, **kw)
        out += [(f"{seed}{kw}/{p}", sc, p, SimConfig()) for p in POLICIES]
    sc = generate(1000, duration_s=minutes * 60)
    out += [(f"1000/R4/{p}", sc, p, SimConfig(root_replicas=4)) for p in ("Flow-Grad", "Disc-Lat", "Rand")]
    return out


def compare(a_path: str, b_path: str) -> None:
    with open(a_path) as fa, open(b_path) as fb:
        a, b = json.load(fa), json.load(fb)
    groups: dict[str, list[float]] = {}
    same = 0
    for name in a:
        same += a[name]["digest"] == b[name]["digest"]
        g = name.rsplit("/", 1)[0]  # the run set: experiment/variant or scenario, without the policy
        s = groups.setdefault(g, [0, 0.0, 0.0])
        s[0] += a[name]["events"]
        s[1] += a[name]["cpu_s"]
        s[2] += b[name]["cpu_s"]
    print(f"identical digests: {same} of {len(a)}")
    print("| runs | events | CPU-s before | CPU-s after | events/CPU-s before | after | speed-up |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for g, (ev, ca, cb) in groups.items():
        print(f"| {g} | {ev} | {ca:.2f} | {cb:.2f} | {ev / ca:.0f} | {ev / cb:.0f} | {ca / cb:.2f}x |")


if __name__ == "__main__":
    if sys.argv[1] == "compare":
        compare(sys.argv[2], sys.argv[3])
        sys.exit(0)
    minutes = float(sys.argv[1])
    res = {}
    ev, cpu = 0, 0.0
    repeat = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    for name, sc, p, cfg in runs(minutes):
        c = float("inf")
        for _ in range(repeat):
            c0 = time.process_time()
            r = simulate(sc, p, 0, cfg)
            c = min(c, time.process_time() - c0)
        ev += r.events
        cpu += c
        res[name] = {"digest": digest(r), "events": r.events, "cpu_s": round(c, 3)}
        print(f"{name:40s} {r.events:9d} ev {c:6.2f} cpu-s {r.events / c:8.0f} ev/s {digest(r)}", flush=True)
    print(f"TOTAL {ev} events {cpu:.2f} cpu-s {ev / cpu:.0f} ev/cpu-s")
    with open(sys.argv[2], "w") as fh:
        json.dump(res, fh, indent=1)
