"""The simulator's twin of ``dlb demo``'s steady scenario, for docs/real-vs-sim.md.

Maps the demo fleet (:data:`dlb.testbed.fleet.DEFAULT_FLEET`) and workload onto a simulator
:class:`dlb.sim.scenario.Scenario` as closely as the simulator's model allows, runs every policy
the real comparison ran, and prints the simulator's numbers next to ``research/bench/compare.json``.

Mapping (each line is a difference docs/real-vs-sim.md explains):
- cells, servers, one-way latencies: the same (regions table);
- a server: the simulator's two-stage pipeline (prefill, then ``slots`` decode slots) with
  ``slots`` = the emulator's max batch (8), seconds per decode token = the profile's step time at a
  full batch × the demo's time scale, seconds per prompt token = the profile's prefill cost × the
  time scale; the emulator instead runs one continuous-batching engine per server;
- lengths: Gamma (shift + shape·scale) with the demo's means (prompt ≈ 450 tokens with the
  multi-turn growth, output ≈ 96), not log-normal, and no sessions;
- demand: the demo's rate at the two source cells (4:1), Poisson, no modulation;
- residency: the simulator's topology is complete — traffic entering in europe-west4 may leave Europe.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from dlb.bench import harness
from dlb.emulator.profile import load_profile
from dlb.sim.engine import simulate
from dlb.sim.scenario import Scenario, Workload
from dlb.testbed.fleet import DEFAULT_FLEET, Fleet, fleet_capacity_rps, one_way_ms

MEAN_PROMPT = 450.0
MEAN_OUTPUT = 96.0


def twin(fleet: Fleet = DEFAULT_FLEET, load: float = 0.75, duration_s: float = 40.0, seed: int = 1) -> Scenario:
    names = [c.name for c in fleet.cells]
    ow = one_way_ms(names)
    n = len(names)
    tau = np.zeros((n, n))
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            if i != j:
                tau[i, j] = (ow.get(a, {}).get(b) or ow.get(b, {}).get(a) or 0.0) / 1000.0
    tp, td = [], []
    for c in fleet.cells:
        prof = load_profile(c.profile)
        prefill_per_step = fleet.max_batch * MEAN_PROMPT / MEAN_OUTPUT
        td.append(prof.step_time(fleet.max_batch, int(prefill_per_step)) * fleet.time_scale)
        tp.append(prof.prefill_us_per_token * 1e-6 * fleet.time_scale)
    w = Workload(prefill_shift=32.0, prefill_shape=2.0, prefill_scale=(MEAN_PROMPT - 32.0) / 2.0,
                 decode_shift=8.0, decode_shape=1.5, decode_scale=(MEAN_OUTPUT - 8.0) / 1.5,
                 decode_engines=1, slots_per_engine=fleet.max_batch, queue_limit=64 + fleet.max_batch)
    rate = load * sum(fleet_capacity_rps(fleet, MEAN_PROMPT, MEAN_OUTPUT).values())
    sources = [c.name for c in fleet.cells if c.root]
    demand = np.zeros(n)
    for k, s in enumerate(sources):
        demand[names.index(s)] = rate * (4.0 if k == 0 else 1.0) / (4.0 + (len(sources) - 1))
    sc = Scenario(seed=seed, names=tuple(names), tau=tau, servers=tuple(c.servers for c in fleet.cells),
                  prefill_token_s=np.array(tp), decode_token_s=np.array(td), demand=demand, workload=w,
                  utilization=load, duration_s=duration_s, mod_amp=0.0, mod_period_s=np.full(n, 100.0),
                  mod_phase=np.zeros(n))
    return replace(sc)


def run(args: argparse.Namespace) -> int:
    """``dlb bench sim-twin``: the simulator on the twin of the demo fleet next to a real comparison run."""
    from dlb.testbed.report import git_commit

    record = harness.start()
    commit = git_commit()
    real = {r["policy"]: r for r in json.loads(Path(args.real).read_text())["records"] if r["scenario"] == "steady"}
    sc = twin(duration_s=args.duration)
    print(f"sim capacity {sc.capacity().sum():.1f} req/s (demo: {sum(fleet_capacity_rps(DEFAULT_FLEET, MEAN_PROMPT, MEAN_OUTPUT).values()):.1f}); "
          f"demand {sc.demand.sum():.1f} req/s")
    out: list[dict[str, Any]] = []
    for policy in real:
        means, p90s, errs = [], [], []
        for t in range(args.trials):
            s = simulate(sc, policy, trial=t).summary()
            means.append(s["mean"])
            p90s.append(s["p90"])
            errs.append(s["error_rate"])
        rec = {"policy": policy, "sim_mean_s": float(np.mean(means)), "sim_p90_s": float(np.mean(p90s)),
               "sim_error_rate": float(np.mean(errs)), "real_mean_s": real[policy]["mean_s"], "real_p90_s": real[policy]["p90_s"]}
        out.append(rec)
    base_s = next(r for r in out if r["policy"] == "Rand")
    for r in out:
        r["sim_norm_mean"] = r["sim_mean_s"] / base_s["sim_mean_s"]
        r["real_norm_mean"] = r["real_mean_s"] / base_s["real_mean_s"]
        print(f"{r['policy']:9s} sim mean {r['sim_mean_s']:.2f}s p90 {r['sim_p90_s']:.2f}s (÷Rand {r['sim_norm_mean']:.2f}, "
              f"errors {100 * r['sim_error_rate']:.1f}%) | real mean {r['real_mean_s']:.2f}s p90 {r['real_p90_s']:.2f}s "
              f"(÷Rand {r['real_norm_mean']:.2f})")
    return harness.finish(record, {**commit, "trials": args.trials, "duration_s": args.duration, "records": out},
                          json_path=args.json)
