"""The flow cold start (``FlowConfig.warmup_s``) off vs on, on the twin scenarios and two protocol experiments.

Why a script and not ``dlb bench sim-twin``: the verdict (coldstart-rule.md) compares the warm-up off and
on at one commit on the same requests, and on workload seeds of our choosing (sim-twin runs the real
comparison's). Each run is the twin's (:func:`dlb.bench.sim_twin.scenario_twin`, batched server, 60-s
timeout for a failed or shed request) or the protocol's (:func:`dlb.sim.scenario.generate`, normalised by
Rand on the same scenario and trial). Only the flow policies' ``warmup_s`` differs between "off" and "on";
``--warmup default`` runs them as configured by default (``warmup_s`` None: the cost's default, the
gradient-cost-only verdict of coldstart-grad-rule.md).

Usage (from the repository root)::

    python research/compare-stress/coldstart.py --seeds 301-306 --warmup 10 --json FILE
    python research/compare-stress/coldstart.py --seeds 101-103 --warmup 5,10,20 --twin-only   # tuning
    python research/compare-stress/coldstart.py --seeds 401-406 --warmup default --json FILE
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from dlb.bench.sim_twin import scenario_twin
from dlb.core.costs import Cost
from dlb.core.flow import FlowConfig
from dlb.core.router import Mechanism, PolicyConfig
from dlb.sim import policies as sim_policies
from dlb.sim.engine import SimConfig, simulate
from dlb.sim.scenario import generate
from dlb.testbed.report import git_commit
from dlb.testbed.scenarios import REQUEST_TIMEOUT_S

TWIN = (("steady", 40.0), ("steady", 180.0), ("overload", 45.0), ("slow-cell", 45.0), ("cell-outage", 45.0), ("burst", 45.0))
TWIN_POLICIES = ("hub-score", "Disc-Lat", "Flow-Lat", "Flow-Grad")
PROTOCOL = (("utilization", {"utilization": 0.95}), ("burst", {"utilization": 0.8, "disruption": "burst"}))
PROTOCOL_POLICIES = ("Rand", "Disc-Lat", "Flow-Lat", "Flow-Grad")
FLOW = {"Flow-Lat": Cost.LATENCY, "Flow-Grad": Cost.GRADIENT}


def set_warmup(warmup_s: float | None) -> None:
    """Make the simulator's Flow-Lat and Flow-Grad run with ``warmup_s`` (None: the cost's default; same
    names: same random streams)."""
    for name, cost in FLOW.items():
        cfg = PolicyConfig(mechanism=Mechanism.FLOW, cost=cost, flow=FlowConfig(warmup_s=warmup_s))
        sim_policies.REGISTRY[name] = sim_policies._dlb(cfg)


def summary(res: object) -> tuple[float, float]:
    s = res.summary()  # type: ignore[attr-defined]
    return float(s["mean_latency_with_failures"]), float(s["error_rate"] + s["shed_rate"])


def label(w: float | None) -> float | str:
    return "default" if w is None else w


def run_twin(seeds: list[int], warmups: list[float | None]) -> list[dict]:
    rows = []
    cfg = SimConfig(request_timeout_s=REQUEST_TIMEOUT_S)
    for scenario, duration in TWIN:
        runs = {}
        for trial, seed in enumerate(seeds):
            sc, arrivals = scenario_twin(scenario, seed, duration)
            for w in warmups:
                set_warmup(w)
                for p in TWIN_POLICIES:
                    if p not in FLOW and w != warmups[0]:
                        continue  # the warm-up changes only the flow policies
                    runs.setdefault((p, label(w) if p in FLOW else None), []).append(summary(simulate(sc, p, trial, cfg, arrivals=arrivals)))
        hub = float(np.mean([m for m, _ in runs[("hub-score", None)]]))
        for (p, w), v in runs.items():
            rows.append({"kind": "twin", "scenario": scenario, "duration_s": duration, "policy": p, "warmup_s": w,
                         "mean_s": float(np.mean([m for m, _ in v])), "fail": float(np.mean([e for _, e in v])),
                         "ratio": float(np.mean([m for m, _ in v])) / hub, "per_seed_mean_s": [m for m, _ in v]})
    return rows


def run_protocol(seed: int, scenarios: int, minutes: float, warmups: list[float | None]) -> list[dict]:
    rows = []
    cfg = SimConfig(request_timeout_s=REQUEST_TIMEOUT_S)
    for exp, kw in PROTOCOL:
        runs: dict[tuple[str, float | str | None], list[tuple[float, float]]] = {}
        for k in range(scenarios):
            sc = generate(seed * 1000 + k, duration_s=minutes * 60.0, **kw)
            rand, _ = summary(simulate(sc, "Rand", 0, cfg))
            for w in warmups:
                set_warmup(w)
                for p in PROTOCOL_POLICIES[1:]:
                    if p not in FLOW and w != warmups[0]:
                        continue
                    m, e = summary(simulate(sc, p, 0, cfg))
                    runs.setdefault((p, label(w) if p in FLOW else None), []).append((m / rand, e))
        for (p, w), v in runs.items():
            rows.append({"kind": "protocol", "experiment": exp, "variant": kw, "policy": p, "warmup_s": w,
                         "norm_mean": float(np.mean([m for m, _ in v])), "fail": float(np.mean([e for _, e in v]))})
    return rows


def seeds_arg(text: str) -> list[int]:
    if "-" in text:
        a, b = text.split("-")
        return list(range(int(a), int(b) + 1))
    return [int(s) for s in text.split(",")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=seeds_arg, required=True, help="workload seeds, e.g. 301-306 or 101,102")
    ap.add_argument("--warmup", default="10", help="comma-separated warmup_s values (or 'default') compared with 0 (off)")
    ap.add_argument("--protocol-seed", type=int, default=None, help="dlb sim --seed of the protocol runs (default: first seed)")
    ap.add_argument("--protocol-scenarios", type=int, default=3)
    ap.add_argument("--protocol-minutes", type=float, default=2.0)
    ap.add_argument("--twin-only", action="store_true")
    ap.add_argument("--protocol-only", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    warmups: list[float | None] = [0.0] + [None if w == "default" else float(w) for w in args.warmup.split(",")]
    load0 = os.getloadavg()
    commit = git_commit()
    rows = [] if args.protocol_only else run_twin(args.seeds, warmups)
    if not args.twin_only:
        rows += run_protocol(args.protocol_seed or args.seeds[0], args.protocol_scenarios, args.protocol_minutes, warmups)
    for r in rows:
        where = f"{r['scenario']}/{r['duration_s']:g}s" if r["kind"] == "twin" else r["experiment"]
        value = r["ratio"] if r["kind"] == "twin" else r["norm_mean"]
        print(f"{where:<16} {r['policy']:<10} warmup={r['warmup_s']!s:<5} {value:6.3f}  fail {r['fail']:.2%}")
    if args.json:
        args.json.write_text(json.dumps({**commit, "command": " ".join(sys.argv),
                                         "loadavg": [load0, os.getloadavg()], "records": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
