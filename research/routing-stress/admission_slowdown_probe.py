"""Tuning seed 31, one scenario: leaf admission's ``slowdown`` gate (0: the deadline alone, as before; 1.5, 2, 3)
where long requests meet the 60-s timeout (length y=1/10, y=1/4), at 95 % load, in the outage and burst,
and at length y=1 (the default workload), for Disc-RIF and Flow-Grad (retry on). Exploratory: picks the
default that the fresh-seed verdict then judges.

Usage: python research/routing-stress/admission_slowdown_probe.py OUT.jsonl [SLOWDOWNS]  (one line per run, as it finishes)
"""

from __future__ import annotations

import sys

from probe_pool import write_as_done  # this folder (the script's dir is on sys.path)

from dlb.sim.engine import SimConfig, simulate
from dlb.sim.experiments import Job, make_jobs
from dlb.sim.scenario import generate

SLOWDOWNS = tuple(float(x) for x in sys.argv[2].split(",")) if len(sys.argv) > 2 else (0.0, 1.5, 2.0, 3.0)
VARIANTS = {"length": {"y=1/10", "y=1/4", "y=1"}, "utilization": {"util=0.95"}, "outage": {"outage"}, "burst": {"burst"}}


def one(args: tuple[Job, float]) -> dict:
    job, slow = args
    sc = generate(job.scenario, duration_s=job.duration_s, **job.scenario_kwargs())
    s = simulate(sc, job.policy, job.trial, SimConfig(admission_slowdown=slow)).summary()
    return {"experiment": job.experiment, "variant": job.variant.label, "policy": job.policy, "scenario": job.scenario,
            "slowdown": slow, **{k: s[k] for k in ("mean_latency_with_failures", "client_failure_rate",
                                                   "admission_refused_rate", "retried_rate", "timed_out_rate", "p50")}}


def main() -> None:
    jobs = []
    for exp, variants in VARIANTS.items():
        for j in make_jobs([exp], 1, 1, 10.0, 31, ["Disc-RIF", "Flow-Grad"], server_model="batched"):
            if j.variant.label in variants:
                jobs += [(j, s) for s in SLOWDOWNS]
    write_as_done(one, jobs, sys.argv[1])


if __name__ == "__main__":
    main()
