"""The ``priors`` experiment: does the router find the right cell when its models start, or become, wrong?

Issue 12 measured routing that locked onto a wrong cell and never found out: a cell without traffic
keeps whatever model it has (a prior off by ×50, a curve from before a restart), and a router that
believes it sends it nothing to correct it. This experiment times how long the production router,
fed by the production estimator, takes to find the right cell in four situations, with the learning
of issue 12 (``learn``: measured prior, recency-weighted fit, dithering, background probes) and
without it (``static``: the estimator as it was before — the same code with those parts off).

The scenario is built, not drawn, so "the right cell" is known by construction: three cells of six
identical servers, ``local`` (the root's own cell, 1 ms away), ``near`` (50 ms one way) and ``far``
(100 ms); all demand (15 % of one cell's capacity) enters at ``local``; requests are short (≈ 0.45 s
unloaded), so the 100–200 ms of extra round trip makes ``local`` the right cell by a clear margin
(its own queueing at 15 % adds ≈ 0.02 s).

| scenario | what goes wrong, at ``t_event`` | right cell after |
| --- | --- | --- |
| ``prior-x50`` | ``local``'s configured prior is 50× too slow (from t = 0) | local |
| ``prior-x0.02`` | ``far``'s configured prior is 50× too fast (from t = 0) | local |
| ``restart`` | ``local``'s configured prior is 50× too slow; its leaf restarts at 30 % of the run, losing its samples | local |
| ``slow-3x`` | ``local`` silently becomes 3× slower at 30 % of the run (utilisation 15 % → 45 %) | near |
| ``recover`` | ``local`` is 3× slower from 30 % to 60 % of the run, then as fast as before; ``t_event`` = 60 % | local |

``recover`` is the starvation loop of paper §6 after a fault: the traffic left ``local`` while it was
slow, so only its background probes can show that it is fast again.

Verdict rule, fixed before running: ``converge_s`` is the time from ``t_event`` to the start of the
first 2-s bin from which on *every* bin (to the end of arrivals) sends ≥ 80 % of requests to the
right cell; ``null`` if there is no such bin. The target is ``converge_s ≤ 30`` for every ``learn``
run, and ``probe_share`` ≤ 1 %: background probe requests ÷ (Σ cell capacity in requests/s × run
length) — probes are full-sized requests from the workload, so this is the fraction of the fleet's
request capacity they used (``probe_share_max_cell``: the same for the most-probed cell).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

import numpy as np

from dlb.core.estimator import EstimatorConfig
from dlb.sim.engine import RunResult, SimConfig, simulate
from dlb.sim.outcome import FIELDS
from dlb.sim.scenario import Disruption, Scenario, Workload

SCENARIOS: tuple[str, ...] = ("prior-x50", "prior-x0.02", "restart", "slow-3x", "recover")
MODES: tuple[str, ...] = ("learn", "static")
POLICIES: tuple[str, ...] = ("Disc-Lat", "Disc-Grad", "Flow-Lat", "Flow-Grad")
LOCAL, NEAR, FAR = 0, 1, 2
#: Width of the bins the routing share is measured in, and the share that counts as "found".
BIN_S = 2.0
FOUND_SHARE = 0.8
#: The fault of ``restart``, ``slow-3x`` and ``recover`` happens at this fraction of the run.
EVENT_AT = 0.3
#: ``recover``'s slowdown ends at this fraction of the run (its ``t_event``).
RECOVER_AT = 0.6


def sim_config(mode: str) -> SimConfig:
    """The simulator's defaults with the estimator of ``mode`` (``learn`` = today's defaults)."""
    base = SimConfig()
    if mode == "learn":
        return base
    if mode == "static":
        e = base.estimator
        return replace(base, background=None,
                       estimator=EstimatorConfig.static(window_s=e.window_s, refit_period_s=e.refit_period_s,
                                                        max_samples=e.max_samples))
    raise ValueError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")


def build_scenario(kind: str, seed: int, duration_s: float) -> tuple[Scenario, float, int]:
    """(scenario, t_event, right cell after t_event) of one of :data:`SCENARIOS`."""
    if kind not in SCENARIOS:
        raise ValueError(f"unknown priors scenario {kind!r}; choose from {', '.join(SCENARIOS)}")
    w = Workload(decode_shape=1.5, decode_scale=20.0)
    one_way = np.array([[0.001, 0.050, 0.100], [0.050, 0.001, 0.080], [0.100, 0.080, 0.001]])
    sc = Scenario(
        seed=seed, names=("local", "near", "far"), tau=one_way, servers=(6, 6, 6),
        prefill_token_s=np.full(3, w.prefill_token_s), decode_token_s=np.full(3, w.decode_token_s),
        demand=np.zeros(3), workload=w, utilization=0.0, duration_s=duration_s, mod_amp=0.0,
        mod_period_s=np.full(3, 120.0), mod_phase=np.zeros(3),
    )
    demand = 0.15 * float(sc.capacity()[LOCAL])
    sc = replace(sc, demand=np.array([demand, 0.0, 0.0]), utilization=demand / float(sc.capacity().sum()))
    t_event = EVENT_AT * duration_s
    if kind == "prior-x50":
        return replace(sc, prior_factor=(50.0, 1.0, 1.0)), 0.0, LOCAL
    if kind == "prior-x0.02":
        return replace(sc, prior_factor=(1.0, 1.0, 0.02)), 0.0, LOCAL
    if kind == "restart":
        return replace(sc, prior_factor=(50.0, 1.0, 1.0),
                       disruption=Disruption("restart", t_event, duration_s, cell=LOCAL)), t_event, LOCAL
    if kind == "recover":
        t_end = RECOVER_AT * duration_s
        return replace(sc, disruption=Disruption("slow", t_event, t_end, cell=LOCAL, factor=3.0)), t_end, LOCAL
    return replace(sc, disruption=Disruption("slow", t_event, duration_s, cell=LOCAL, factor=3.0)), t_event, NEAR


def converge_time(res: RunResult, t_event: float, right: int, end_s: float) -> float | None:
    """Seconds from ``t_event`` until every later bin sends ≥ FOUND_SHARE to ``right`` (None: never)."""
    t, dst = res.arrival_t, res.routed
    edges = np.arange(t_event, end_s + 1e-9, BIN_S)
    if edges.size < 2:
        return None
    k = np.searchsorted(edges, t, side="right") - 1
    ok = (k >= 0) & (k < edges.size - 1)
    total = np.bincount(k[ok], minlength=edges.size - 1)
    hits = np.bincount(k[ok], weights=(dst[ok] == right).astype(float), minlength=edges.size - 1)
    good = (total == 0) | (hits >= FOUND_SHARE * np.maximum(total, 1))
    if not good[-1]:
        return None
    bad = np.flatnonzero(~good)
    first = 0 if bad.size == 0 else int(bad[-1]) + 1
    return float(edges[first] - t_event)


def run_one(kind: str, mode: str, policy: str, seed: int, trial: int, duration_s: float) -> dict:
    """One run of the experiment, as its results.json record."""
    t0, c0 = time.perf_counter(), time.process_time()
    sc, t_event, right = build_scenario(kind, seed, duration_s)
    res = simulate(sc, policy, trial, sim_config(mode))
    cap = sc.capacity()
    probes = res.probes if res.probes.size else np.zeros(sc.n)
    s = res.summary()
    return {
        "experiment": "priors", "variant": f"{kind}/{mode}", "scenario_kind": kind, "mode": mode,
        "policy": policy, "scenario": seed, "trial": trial, "duration_s": duration_s,
        "t_event_s": t_event, "right_cell": sc.names[right],
        "converge_s": converge_time(res, t_event, right, duration_s),
        "probe_share": float(probes.sum() / (cap.sum() * duration_s)),
        "probe_share_max_cell": float(np.max(probes / (cap * duration_s))),
        "probes": int(probes.sum()), "probe_errors": res.probe_errors,
        "share_right_last_bin": _last_share(res, right, duration_s),
        "mean": s["mean"], "p90": s["p90"], "error_rate": s["error_rate"], "arrivals": s["arrivals"],
        **{f: s[f] for f in FIELDS},
        "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
    }


def _last_share(res: RunResult, right: int, end_s: float) -> float:
    m = res.arrival_t >= end_s - 10.0
    return float(np.mean(res.routed[m] == right)) if m.any() else math.nan


def run_experiment(scenarios: int, trials: int, duration_s: float, seed: int, policies: tuple[str, ...] = POLICIES,
                   kinds: tuple[str, ...] = SCENARIOS, modes: tuple[str, ...] = MODES) -> list[dict]:
    """Every (kind, mode, policy, scenario seed, trial) run, in order."""
    return [run_one(kind, mode, pol, seed * 1000 + k, t, duration_s)
            for kind in kinds for mode in modes for pol in policies for k in range(scenarios) for t in range(trials)]


def markdown(records: list[dict]) -> str:
    """One row per (variant, policy): median and worst converge_s, runs converged, max probe share."""
    rows: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        rows.setdefault((r["variant"], r["policy"]), []).append(r)
    out = ["| variant | policy | runs | converged | converge_s median | converge_s max | probe share max "
           "| mean latency s (failures at the timeout) | error rate |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (var, pol), rs in rows.items():
        cs = [r["converge_s"] for r in rs if r["converge_s"] is not None]
        med = f"{np.median(cs):.0f}" if cs else "never"
        worst = f"{max(cs):.0f}" if len(cs) == len(rs) else "never"
        share = max(r["probe_share"] for r in rs)
        lat = np.nanmean([r.get("mean_latency_with_failures", math.nan) for r in rs])
        err = np.nanmean([r["error_rate"] for r in rs])
        out.append(f"| {var} | {pol} | {len(rs)} | {len(cs)} | {med} | {worst} | {100 * share:.2f} % | {lat:.3f} "
                   f"| {100 * err:.2f} % |")
    return "\n".join(out)
