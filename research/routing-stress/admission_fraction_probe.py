"""Tuning seed 31, one scenario: leaf admission off / fraction 0.33 / 0.5 / 0.75 (retry on) where long requests
meet the 60-s timeout (length y=1/10, y=1/4) and at 95 % load. Exploratory, for the next rule.

Usage: python research/routing-stress/admission_fraction_probe.py OUT.jsonl  (one line per run, as it finishes)
"""

from __future__ import annotations

import sys

from probe_pool import write_as_done  # this folder (the script's dir is on sys.path)

from dlb.sim.engine import SimConfig, simulate
from dlb.sim.experiments import Job, make_jobs
from dlb.sim.scenario import generate


def one(args: tuple[Job, float]) -> dict:
    job, frac = args
    sc = generate(job.scenario, duration_s=job.duration_s, **job.scenario_kwargs())
    cfg = SimConfig(admission=frac > 0, admission_fraction=frac if frac > 0 else 0.33)
    s = simulate(sc, job.policy, job.trial, cfg).summary()
    return {"experiment": job.experiment, "variant": job.variant.label, "policy": job.policy, "scenario": job.scenario,
            "fraction": frac, **{k: s[k] for k in ("mean_latency_with_failures", "client_failure_rate", "admission_refused_rate",
                                                   "retried_rate", "timed_out_rate", "p50")}}


def main() -> None:
    jobs = []
    for exp, variants in (("length", {"y=1/10", "y=1/4"}), ("utilization", {"util=0.95"})):
        for j in make_jobs([exp], 1, 1, 10.0, 31, ["Disc-RIF"], server_model="batched"):
            if j.variant.label in variants:
                jobs += [(j, f) for f in (0.0, 0.33, 0.5, 0.75)]
    write_as_done(one, jobs, sys.argv[1])


if __name__ == "__main__":
    main()
