"""The simulator's twin of ``dlb demo --compare``'s scenarios, for docs/real-vs-sim.md.

Maps the demo fleet (:data:`dlb.testbed.fleet.DEFAULT_FLEET`) and each scenario onto a simulator
:class:`dlb.sim.scenario.Scenario` as closely as the simulator's model allows, runs every policy of
a real comparison on the same seeds, and sets each policy's mean ÷ the best operator baseline's next
to the real run's.

Mapping (each line is a difference docs/real-vs-sim.md explains):
- requests: exactly the real run's (:func:`dlb.testbed.scenarios.plan_workload` with the run's seed:
  arrival times, source cells, prompt and output tokens, the overload and burst phases), fed to the
  simulator as its arrivals; sessions are ignored (no affinity in the simulator);
- faults: ``slow`` = the degraded cell's servers ``degrade_slowdown`` × slower in the same window,
  ``down`` = the cell has no server up for the same 25 s (its requests fail until the roots stop
  sending there);
- cells, servers, one-way latencies: the same (regions table);
- a server: the simulator's batched model (the emulator's engine: ``max_batch`` = 8 sequences on the
  measured step-time curve, its floor and prompt cost × the demo's time scale); one curve's shape
  (the first cell's profile) scaled to each cell's floor, where the emulator runs each cell's own;
- residency: the demo's (europe-west4 keeps its traffic in Europe);
- the leaves' latency fit: the demo's window and refit period (:attr:`Fleet.fit_window_s`), not the
  simulator's default 30 s and 10 s (:func:`twin_config`);
- a failed request counts as the 60-s timeout in both.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import t as t_dist

from dlb.bench import harness
from dlb.emulator.profile import load_profile
from dlb.errors import DlbError
from dlb.finite_json import number
from dlb.load.workload import generate, with_phases
from dlb.sim.engine import SimConfig, simulate
from dlb.sim.policies import OPERATOR_BASELINES
from dlb.sim.scenario import Disruption, Scenario, Workload
from dlb.testbed.fleet import DEFAULT_FLEET, ENDPOINT_TIMEOUT_S, Fleet, one_way_ms
from dlb.testbed.scenarios import REQUEST_TIMEOUT_S, SCENARIOS, plan_workload, trial_seed

Arrivals = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def scenario_twin(name: str, seed: int, duration_s: float, fleet: Fleet = DEFAULT_FLEET) -> tuple[Scenario, Arrivals]:
    """The simulator's scenario and arrivals for one real run of ``name`` with workload ``seed``."""
    real = SCENARIOS[name]
    real.check(duration_s)
    spec, phases, _ = plan_workload(fleet, real, duration_s, seed, real.load)
    reqs = with_phases(generate(spec), phases)
    names = [c.name for c in fleet.cells]
    n = len(names)
    ow = one_way_ms(names)
    tau = np.array([[(ow.get(a, {}).get(b) or ow.get(b, {}).get(a) or 0.0) / 1000.0 if a != b else 0.0 for b in names] for a in names])
    servers = tuple(c.servers for c in fleet.cells)
    t = np.array([r.t for r in reqs], float)
    src = np.array([names.index(r.source) for r in reqs], np.int64)
    ptok = np.array([r.prompt_tokens for r in reqs], float)
    dtok = np.array([r.max_tokens for r in reqs], float)  # the emulator generates exactly max_tokens
    # The emulator's engine: continuous batching of ``max_batch`` sequences on the profile's step-time
    # curve (the floor and prompt cost × the time scale). The lengths' mean and spread as the workload's
    # Gamma: what the priors and capacity are computed from.
    w = Workload(prefill_shift=0.0, prefill_shape=ptok.mean() ** 2 / ptok.var(), prefill_scale=ptok.var() / ptok.mean(),
                 decode_shift=0.0, decode_shape=dtok.mean() ** 2 / dtok.var(), decode_scale=dtok.var() / dtok.mean(),
                 decode_engines=1, slots_per_engine=fleet.max_batch, queue_limit=64 + fleet.max_batch,
                 server_model="batched", max_batch=fleet.max_batch, step_profile=fleet.cells[0].profile)
    profiles = [load_profile(c.profile) for c in fleet.cells]
    td = np.array([p.base_ms * 1e-3 * fleet.time_scale for p in profiles])
    tp = np.array([p.prefill_us_per_token * 1e-6 * fleet.time_scale for p in profiles])
    disruption = None
    window = real.fault_window(duration_s)
    if window is not None:
        j = names.index(fleet.degrade_cell)
        if real.fault == "slow":
            disruption = Disruption("slow", window[0], window[1], cell=j, factor=fleet.degrade_slowdown)
        else:
            disruption = Disruption("outage", window[0], window[1], outage_servers=tuple(0 if k == j else s for k, s in enumerate(servers)))
    allowed = np.array([[b in fleet.allowed.get(a, names) for b in names] for a in names])
    sc = Scenario(seed=seed, names=tuple(names), tau=tau, servers=servers, prefill_token_s=tp, decode_token_s=td,
                  demand=np.bincount(src, minlength=n) / duration_s, workload=w, utilization=real.load, duration_s=duration_s,
                  mod_amp=0.0, mod_period_s=np.full(n, 100.0), mod_phase=np.zeros(n), disruption=disruption, allowed=allowed)
    return sc, (t, src, ptok, dtok)


def twin_config(fleet: Fleet = DEFAULT_FLEET) -> SimConfig:
    """The simulator settings of a twin: the comparison's request timeout and the demo leaves' fit window.

    Why the fit: a latency-cost root follows its cells' fitted models, so a twin whose leaves fit over 30 s
    every 10 s (the simulator's default) sees a slowdown and a recovery on another time scale than the
    real leaves, which fit over ``fleet.fit_window_s`` every ``fleet.refit_period_s``.
    """
    # The demo's leaves and roots judge by its endpoints' timeout_s (600 s), not the clients' 60 s: a twin
    # refusing at a third of 60 s failed 5 % of the burst's requests by leaf admission, which the real
    # leaves (a third of 600 s) never refused.
    base = SimConfig(request_timeout_s=REQUEST_TIMEOUT_S, service_deadline_s=ENDPOINT_TIMEOUT_S)
    return replace(base, estimator=replace(base.estimator, window_s=fleet.fit_window_s, refit_period_s=fleet.refit_period_s))


@dataclass(frozen=True)
class RealRun:
    """One real run to twin (or, with no real data, one simulated run): its scenario, policy, trial and seed."""

    scenario: str
    policy: str
    trial: int
    seed: int
    duration_s: float
    mean_s: float = math.nan
    error_rate: float = math.nan


def read_real(path: str | Path) -> list[RealRun]:
    """``dlb demo --compare``'s records: a ``records.jsonl`` (one run per line) or a JSON with ``records``
    (an older single-run file: seed and duration at the top). Runs of an unknown scenario are refused."""
    text = Path(path).read_text()
    top: dict[str, Any] = {}
    try:
        if str(path).endswith(".jsonl"):
            rows: Any = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            doc = json.loads(text)
            top = doc if isinstance(doc, dict) else {}
            rows = top.get("records")
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON: {e}") from None
    if not isinstance(rows, list):
        raise ValueError(f"{path}: needs a 'records' list of runs (or a records.jsonl)")
    out = []
    for k, r in enumerate(rows, 1):
        where = f"{path}: record {k}"
        if not isinstance(r, dict):
            raise ValueError(f"{where}: not an object")
        missing = [f for f in ("scenario", "policy", "mean_s") if f not in r]
        if missing:
            raise ValueError(f"{where}: missing {', '.join(missing)} (a dlb demo --compare record has them)")
        if r["scenario"] not in SCENARIOS:
            raise ValueError(f"{where}: scenario {r['scenario']!r} has no twin (known: {', '.join(SCENARIOS)})")
        try:
            req = max(int(r.get("requests", 0)), 1)
            out.append(RealRun(r["scenario"], str(r["policy"]), int(r.get("trial", 0)), int(r.get("seed", top.get("seed", 1))),
                               float(r.get("duration_s", top.get("duration_s", 40.0))), number(r["mean_s"]),
                               (int(r.get("errors", 0)) + int(r.get("shed", 0))) / req))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from None
    return out


def planned_runs(scenarios: list[str], policies: list[str], trials: int, duration_s: float) -> list[RealRun]:
    """Simulated runs only: every (scenario, policy, trial) on the real comparison's seeds."""
    return [RealRun(s, p, t, trial_seed(SCENARIOS[s], t), duration_s) for s in scenarios for p in policies for t in range(trials)]


def twin_rows(runs: list[RealRun]) -> list[dict[str, Any]]:
    """Per (scenario, policy): real and simulated mean (60-s timeout for a failure), errors, and each
    mean ÷ the best operator baseline's in its own world (NaN: no operator baseline among the runs)."""
    sims: dict[tuple[str, str], list[tuple[float, float]]] = {}
    cache: dict[tuple[str, int, float], tuple[Scenario, Arrivals]] = {}
    cfg = twin_config()
    for r in runs:
        key = (r.scenario, r.seed, r.duration_s)
        if key not in cache:
            cache[key] = scenario_twin(r.scenario, r.seed, r.duration_s)
        sc, arrivals = cache[key]
        res = simulate(sc, r.policy, trial=r.trial, config=cfg, arrivals=arrivals)
        summ = res.summary()
        sims.setdefault((r.scenario, r.policy), []).append((summ["mean_latency_with_failures"], summ["error_rate"] + summ["shed_rate"]))
    rows: list[dict[str, Any]] = []
    for (scenario, policy), sim in sims.items():
        real = [r for r in runs if (r.scenario, r.policy) == (scenario, policy)]
        means = [r.mean_s for r in real]
        half = float(t_dist.ppf(0.975, len(means) - 1) * np.std(means, ddof=1) / math.sqrt(len(means))) if len(means) > 1 else math.nan
        rows.append({"scenario": scenario, "policy": policy, "trials": len(real),
                     "real_mean_s": float(np.mean(means)), "real_ci95_s": half, "real_failed": float(np.mean([r.error_rate for r in real])),
                     "sim_mean_s": float(np.mean([m for m, _ in sim])), "sim_failed": float(np.mean([e for _, e in sim]))})
    for scenario in {row["scenario"] for row in rows}:
        mine = [row for row in rows if row["scenario"] == scenario]
        ops = [row for row in mine if row["policy"] in OPERATOR_BASELINES]
        for world in ("real", "sim"):
            best = min((row[f"{world}_mean_s"] for row in ops), default=math.nan)
            for row in mine:
                row[f"{world}_vs_best_operator"] = row[f"{world}_mean_s"] / best if ops else math.nan
        best_real = min((row["real_mean_s"] for row in ops), default=math.nan)
        for row in mine:
            row["agree_0_10"] = bool(abs(row["real_vs_best_operator"] - row["sim_vs_best_operator"]) <= 0.10)
            # The real ratio's own uncertainty (its mean's 95 % CI over the best operator's mean): a twin
            # outside it differs by more than the real runs can tell.
            row["real_ratio_ci95"] = row["real_ci95_s"] / best_real if ops else math.nan
            row["sim_within_real_ci"] = bool(abs(row["real_vs_best_operator"] - row["sim_vs_best_operator"]) <= row["real_ratio_ci95"])
    return sorted(rows, key=lambda r: (list(SCENARIOS).index(r["scenario"]), r["sim_mean_s"]))


def table(rows: list[dict[str, Any]], with_real: bool) -> str:
    """The rows as text: real and simulated side by side, or the simulator's alone."""
    if not with_real:
        lines = [f"{'scenario':<13} {'policy':<18} {'trials':>6} {'sim s':>7} {'sim fail':>8} {'sim/best op':>11}"]
        lines += [f"{r['scenario']:<13} {r['policy']:<18} {r['trials']:>6} {r['sim_mean_s']:>7.2f} {r['sim_failed']:>8.1%} "
                  f"{r['sim_vs_best_operator']:>11.2f}" for r in rows]
        return "\n".join(lines)
    lines = [f"{'scenario':<13} {'policy':<18} {'trials':>6} {'real s':>7} {'sim s':>7} {'real fail':>9} {'sim fail':>8} "
             f"{'real/best op (CI)':>17} {'sim/best op':>11}"]
    lines += [f"{r['scenario']:<13} {r['policy']:<18} {r['trials']:>6} {r['real_mean_s']:>7.2f} {r['sim_mean_s']:>7.2f} "
              f"{r['real_failed']:>9.1%} {r['sim_failed']:>8.1%} {r['real_vs_best_operator']:>8.2f} ±{r['real_ratio_ci95']:<7.2f} "
              f"{r['sim_vs_best_operator']:>11.2f}" for r in rows]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """``dlb bench sim-twin``: the simulator on the twin of each scenario next to a real comparison run."""
    from dlb.testbed.report import git_commit

    record = harness.start()
    if args.real:
        try:
            runs = read_real(args.real)
        except (OSError, ValueError) as e:
            raise DlbError(f"dlb bench sim-twin --real: {e}") from None
    else:
        unknown = [s for s in args.scenarios if s not in SCENARIOS]
        if unknown:
            raise DlbError(f"dlb bench sim-twin --scenarios: unknown {', '.join(unknown)} (known: {', '.join(SCENARIOS)})")
        from dlb.sim.policies import ALL_POLICIES

        bad = [q for q in args.policies if q not in ALL_POLICIES]
        if bad:
            raise DlbError(f"dlb bench sim-twin --policies: unknown {', '.join(bad)} (known: {', '.join(ALL_POLICIES)})")
        runs = planned_runs(args.scenarios, args.policies, args.trials, args.duration)
    rows = twin_rows(runs)
    print(table(rows, with_real=bool(args.real)))
    targets = []
    if args.real:
        far = [f"{r['scenario']}/{r['policy']}" for r in rows if not r["agree_0_10"]]
        targets.append(harness.Target("real and simulated ratios to the best operator agree within 0.10 for every (scenario, policy)",
                                      not far if any(math.isfinite(r["real_vs_best_operator"]) for r in rows) else None,
                                      "all agree" if not far else "differ: " + ", ".join(far)))
    return harness.finish(record, {**git_commit(), "real": args.real, "records": rows}, targets, json_path=args.json)
