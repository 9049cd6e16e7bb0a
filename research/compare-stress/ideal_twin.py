"""How far can any router get on the demo fleet? An ideal dispatcher on the twin of steady and slow-cell.

Rule: research/compare-stress/ideal-rule.md (written before the runs). The ideal is
``research/routing-stress/oracle.py``'s (global speed-weighted join-the-shortest-queue on exact shared
in-flight counts, round trip added), run on :func:`dlb.bench.sim_twin.scenario_twin` — the demo's
fleet and the real run's requests — and told the slowed cell's true rate during a ``slow`` window.

Usage: python research/compare-stress/ideal_twin.py --trials 6 --json research/compare-stress/ideal/ideal-COMMIT.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from dlb.bench.sim_twin import scenario_twin, twin_config
from dlb.sim import policies as sim_policies
from dlb.sim.engine import simulate
from dlb.testbed.report import git_commit
from dlb.testbed.scenarios import SCENARIOS, trial_seed

_spec = importlib.util.spec_from_file_location("oracle", Path(__file__).parents[1] / "routing-stress" / "oracle.py")
assert _spec is not None and _spec.loader is not None
oracle = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(oracle)  # registers "ideal" (static rates) in the simulator's policies

OPERATORS = ("lr-global", "locality-failover", "hub-score")
POLICIES = (*OPERATORS, "Disc-Lat", "Flow-Grad", "ideal", "bound")
FACTOR = 0.85
#: The slow window of the scenario being run: (cell, start s, end s, factor); one run per process at a time.
_SLOW: dict[str, tuple[int, float, float, float]] = {}


class TimedIdeal(oracle.IdealDispatcher):  # type: ignore[name-defined,misc]
    """The ideal, also knowing when the slowed cell is slow (its servers' rate ÷ the factor)."""

    def pick_server(self, now: float) -> int:
        slow = _SLOW.get("slow")
        if slow is None:
            return int(super().pick_server(now))
        cell, start, end, factor = slow
        rate = self.rate.copy()
        if start <= now < end:
            rate[self._cells == cell] /= factor
        active = np.fromiter((self.active[h] for h in self.hosts), float, len(self.hosts))
        h = int(self.hosts[int(np.argmin((active + 1.0) / rate + self.rtt))])
        self.active[h] += 1
        return h

    def __init__(self, topology, source, rng) -> None:  # type: ignore[no-untyped-def]
        super().__init__(topology, source, rng)
        self._cells = np.array(self.health.cell_of)[self.hosts]


sim_policies.REGISTRY["ideal"] = sim_policies.PolicySpec(
    lambda topology, source, prior, rng: TimedIdeal(topology, source, rng), needs_model=False)


def no_queue_bound(sc, arrivals) -> float:  # type: ignore[no-untyped-def]
    """Mean over requests of the fastest any router could serve each alone: the round trip to the nearest
    allowed cell plus its prompt and decode at the step-time floor (no queue, no batch, no slowdown)."""
    _, src, ptok, dtok = arrivals
    rtt = 2.0 * sc.tau[src]  # (requests, cells)
    t = rtt + ptok[:, None] * sc.prefill_token_s[None, :] + dtok[:, None] * sc.decode_token_s[None, :]
    t[~sc.allowed[src]] = np.inf
    return float(t.min(axis=1).mean())


def run(job: tuple[str, int, str, float]) -> dict:
    scenario, trial, policy, duration = job
    t0 = time.perf_counter()
    seed = trial_seed(SCENARIOS[scenario], trial)
    sc, arrivals = scenario_twin(scenario, seed, duration)
    oracle._RATE["server"] = sc.server_rate()
    oracle._SHARED.clear()
    _SLOW.clear()
    d = sc.disruption
    if d is not None and d.kind == "slow":
        _SLOW["slow"] = (d.cell, d.start_s, d.end_s, d.factor)
    if policy == "bound":
        return {"scenario": scenario, "trial": trial, "seed": seed, "policy": policy, "mean_s": no_queue_bound(sc, arrivals),
                "failed": 0.0, "wall_s": time.perf_counter() - t0}
    s = simulate(sc, policy, trial=trial, config=twin_config(), arrivals=arrivals).summary()
    return {"scenario": scenario, "trial": trial, "seed": seed, "policy": policy,
            "mean_s": s["mean_latency_with_failures"], "failed": s["error_rate"] + s["shed_rate"],
            "wall_s": time.perf_counter() - t0}


def verdict(recs: list[dict], scenario: str) -> dict:
    mine = [r for r in recs if r["scenario"] == scenario]
    mean = {p: float(np.mean([r["mean_s"] for r in mine if r["policy"] == p])) for p in {r["policy"] for r in mine}}
    best_op = min(OPERATORS, key=lambda p: mean[p])
    ratios = {p: mean[p] / mean[best_op] for p in sorted(mean)}
    r = ratios["bound"] if ratios["bound"] > FACTOR else ratios["ideal"]
    return {"scenario": scenario, "best_operator": best_op, "mean_s": mean, "vs_best_operator": ratios,
            "failed": {p: float(np.mean([x["failed"] for x in mine if x["policy"] == p])) for p in sorted(mean)},
            "verdict": ("out of reach (no-queue bound)" if ratios["bound"] > FACTOR else "out of reach (ideal)") if r > FACTOR
            else "reachable in principle"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenarios", default="steady,slow-cell")
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--duration", type=float, default=45.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    scenarios = a.scenarios.split(",")
    jobs = [(s, t, p, a.duration) for s in scenarios for t in range(a.trials) for p in POLICIES]
    load0 = os.getloadavg()
    with ProcessPoolExecutor(a.workers) as ex:
        recs = list(ex.map(run, jobs))
    out = {"commit": git_commit(), "command_line": "python research/compare-stress/ideal_twin.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items() if v != ""), "loadavg_start": load0,
        "loadavg_end": os.getloadavg(), "verdicts": [verdict(recs, s) for s in scenarios], "records": recs}
    for v in out["verdicts"]:
        print(f"{v['scenario']}: best operator {v['best_operator']} {v['mean_s'][v['best_operator']]:.2f} s")
        for p, x in v["vs_best_operator"].items():
            print(f"  {p:18s} {v['mean_s'][p]:6.2f} s  {x:6.3f} ×  failed {100 * v['failed'][p]:.2f} %")
        print(f"  verdict (ideal and no-queue bound ÷ best operator vs {FACTOR}): {v['verdict']}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
