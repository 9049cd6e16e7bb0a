"""Tuning seeds 31 and 107, one scenario each: leaf admission at slowdown 2 with the floor capped at ``floor_cap`` × the
leaf model's unloaded latency (0: no cap, the rule judged on seed 107), where long requests meet the 60-s
timeout (length y=1/10, y=1/4) and at 95 % load (where the uncapped floor lifted Disc-RIF's mean on seed 107),
for Disc-RIF and Flow-Grad (retry on). Exploratory; admission-floorcap-tuning/records.jsonl holds
``OUT CAPS`` run with the default caps, then with ``4,5``; records-slowdown.jsonl ``OUT 4 0,2,3,4 outage`` (after
fresh seed 109 failed y = 1/4's F at slowdown 2, by 0.02 and 0.07 point: whether, with the cap holding the
95 %-load case, a larger slowdown refuses fewer long generations and keeps the outage's gain).

Usage: python research/routing-stress/admission_floorcap_probe.py OUT.jsonl [CAPS [SLOWDOWNS [outage]]]
(one line per run, as it finishes)
"""

from __future__ import annotations

import sys

from probe_pool import write_as_done  # this folder (the script's dir is on sys.path)

from dlb.sim.engine import SimConfig, simulate
from dlb.sim.experiments import Job, make_jobs
from dlb.sim.scenario import generate

CAPS = tuple(float(x) for x in sys.argv[2].split(",")) if len(sys.argv) > 2 else (0.0, 1.5, 2.0, 3.0)
SLOWDOWNS = tuple(float(x) for x in sys.argv[3].split(",")) if len(sys.argv) > 3 else (2.0,)
VARIANTS = {"length": {"y=1/10", "y=1/4"}, "utilization": {"util=0.95"}}
if len(sys.argv) > 4 and sys.argv[4] == "outage":
    VARIANTS["outage"] = {"outage"}


def one(args: tuple[Job, float, float]) -> dict:
    job, cap, slowdown = args
    sc = generate(job.scenario, duration_s=job.duration_s, **job.scenario_kwargs())
    s = simulate(sc, job.policy, job.trial, SimConfig(admission_slowdown=slowdown, admission_floor_cap=cap)).summary()
    return {"experiment": job.experiment, "variant": job.variant.label, "policy": job.policy, "scenario": job.scenario,
            "floor_cap": cap, "admission_slowdown": slowdown, **{k: s[k] for k in ("mean_latency_with_failures", "client_failure_rate",
                                                   "admission_refused_rate", "retried_rate", "timed_out_rate", "p50")}}


def main() -> None:
    jobs = []
    for exp, variants in VARIANTS.items():
        for seed in (31, 107):  # 107: where the uncapped floor missed; both are tuning seeds from here on
            for j in make_jobs([exp], 1, 1, 10.0, seed, ["Disc-RIF", "Flow-Grad"], server_model="batched"):
                if j.variant.label in variants:
                    jobs += [(j, c, sd) for c in CAPS for sd in SLOWDOWNS]
    write_as_done(one, jobs, sys.argv[1])


if __name__ == "__main__":
    main()
