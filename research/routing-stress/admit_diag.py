"""Where a batched fleet's work goes under an outage with cancelling timeouts: one JSON line per run.

For one (outage scenario, trial, policy) of ``dlb sim --experiment outage`` (batched, 10 min,
``--timeouts cancel``), it wraps the simulator's :class:`~dlb.sim.batched.BatchedServers` to see each
engine run (its time is shared equally by the sequences in it) and each abort, and prints:

- ``wasted``: the share of the servers' busy time spent on requests that were then cancelled (in
  service at their deadline, or answered too late to reach the client), over the run and in the outage;
- where the timed-out requests were at their deadline: in transit, waiting in a server's queue, in
  service, or answered too late; and per cell (the cells the outage cut vs the others);
- the queue wait (submit → admitted) of the requests a server admitted, and the waiting queue's fill
  (prompt tokens waiting ÷ the server's bound) each request met at its server;
- overflow rejections, root sheds, timed-out and client-visible failures (the run's own summary).

Usage: python research/routing-stress/admit_diag.py SCENARIO POLICY [TRIAL] [key=value SimConfig fields]
(``outage=false``: the baseline experiment's scenario, 80 % load and no outage, with the same window).
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import numpy as np

import dlb.sim.engine as sim_engine
from dlb.sim.batched import BatchedServers
from dlb.sim.engine import SimConfig, generate_arrivals, simulate
from dlb.sim.scenario import Disruption, generate


class Watch:
    """What the wrapped servers saw, by request id (probes included; the caller separates them)."""

    def __init__(self) -> None:
        self.busy: dict[int, float] = {}  # engine-seconds attributed to each request
        self.busy_outage: dict[int, float] = {}
        self.submit: dict[int, tuple[float, int, float]] = {}  # rid → (time, server, queue fill met)
        self.admitted: dict[int, float] = {}  # rid → first admission (engine's admitted_at)
        self.aborted: dict[int, tuple[float, bool]] = {}  # rid → (time, was it running)
        self.done: dict[int, float] = {}
        self.rejected: list[tuple[float, int]] = []
        self.window = (math.inf, math.inf)


def wrapped(watch: Watch) -> type[BatchedServers]:
    class Watched(BatchedServers):
        def arrive(self, srv: int, rid: int, prompt_tokens: int, output_tokens: int, now: float) -> bool:
            eng = self.engines[srv]
            bound = eng.max_waiting_tokens or 1
            fill = eng.waiting_tokens / bound
            ok = super().arrive(srv, rid, prompt_tokens, output_tokens, now)
            if ok:
                watch.submit[rid] = (now, srv, fill)
            else:
                watch.rejected.append((now, srv))
            return ok

        def wake(self, srv: int, version: int, now: float) -> list[int] | None:
            if version == self.version[srv] and self.plan[srv] is not None:
                plan = self.plan[srv]
                assert plan is not None
                t = plan.run_time(self.k[srv]) * self.slowdown_of_run[srv]
                members = list(plan.decode) + [r for r, _ in plan.prefill]
                share = t / max(len(members), 1)
                lo, hi = watch.window
                in_outage = lo <= now <= hi
                for r in members:
                    watch.busy[r.rid] = watch.busy.get(r.rid, 0.0) + share
                    if in_outage:
                        watch.busy_outage[r.rid] = watch.busy_outage.get(r.rid, 0.0) + share
                    if r.admitted_at is not None and r.rid not in watch.admitted:
                        watch.admitted[r.rid] = r.admitted_at
            done = super().wake(srv, version, now)
            for rid in done or ():
                watch.done[rid] = now
            return done

        def abort(self, rid: int, now: float) -> None:
            assert self.live is not None
            _srv, req = self.live[rid]
            running = req.admitted_at is not None and not req.aborted and req in self.engines[_srv].running
            if req.admitted_at is not None and rid not in watch.admitted:
                watch.admitted[rid] = req.admitted_at
            watch.aborted[rid] = (now, running)
            super().abort(rid, now)

    return Watched


def q(xs: list[float], p: float) -> float:
    return float(np.quantile(xs, p)) if xs else math.nan


def diagnose(scenario: int, policy: str, trial: int = 0, outage: bool = True, **cfg: Any) -> dict[str, Any]:
    sc = generate(scenario, utilization=0.8, disruption="outage" if outage else None, duration_s=600.0, server_model="batched")
    d = sc.disruption or Disruption("outage", 180.0, 420.0, outage_servers=sc.servers)  # no outage: the same window
    watch = Watch()
    watch.window = (d.start_s, d.end_s)
    saved = sim_engine.BatchedServers
    sim_engine.BatchedServers = wrapped(watch)  # type: ignore[misc]  # the simulator builds its servers by this name
    try:
        res = simulate(sc, policy, trial, SimConfig(**cfg))
    finally:
        sim_engine.BatchedServers = saved  # type: ignore[misc]
    s = res.summary()
    R = res.arrivals
    cell_of = [j for j, k in enumerate(sc.servers) for _ in range(k)]
    cut = {j for j, (a, b) in enumerate(zip(sc.servers, d.outage_servers, strict=True)) if b < a}
    t_arr = res.arrival_t
    # Answered at the server, but the answer reaches the root after the deadline (a 504 all the same).
    src = generate_arrivals(sc, trial)[1]
    tau = sc.tau
    late_ids = {rid for rid, t in watch.done.items()
                if rid < R and t + tau[res.routed[rid]][src[rid]] > t_arr[rid] + res.request_timeout_s}
    late_answers = len(late_ids)
    ab_queue = [rid for rid, (_t, run) in watch.aborted.items() if not run]
    ab_run = [rid for rid, (_t, run) in watch.aborted.items() if run]
    transit = res.cancelled - len(watch.aborted) - late_answers
    cancelled_ids = set(watch.aborted)
    total_busy = sum(watch.busy.values())
    req_busy = sum(v for rid, v in watch.busy.items() if rid < R)
    wasted = sum(watch.busy.get(rid, 0.0) for rid in cancelled_ids | late_ids)
    wasted_run = sum(watch.busy.get(rid, 0.0) for rid in ab_run)
    tot_out = sum(watch.busy_outage.values())
    wasted_out = sum(watch.busy_outage.get(rid, 0.0) for rid in cancelled_ids | late_ids)
    lo, hi = watch.window
    waits = [watch.admitted[rid] - watch.submit[rid][0] for rid in watch.submit if rid < R and rid in watch.admitted]
    waits_out = [watch.admitted[rid] - watch.submit[rid][0] for rid in watch.submit
                 if rid < R and rid in watch.admitted and lo <= watch.submit[rid][0] <= hi]
    fills_out = [watch.submit[rid][2] for rid in watch.submit if rid < R and lo <= watch.submit[rid][0] <= hi]
    # Age at submit: how much of the client's 60 s had passed when the server queued it.
    ages_out = [watch.submit[rid][0] - t_arr[rid] for rid in watch.submit if rid < R and lo <= watch.submit[rid][0] <= hi]

    def cells(ids: list[int]) -> dict[str, int]:
        c = {"cut": 0, "other": 0}
        for rid in ids:
            c["cut" if cell_of[watch.submit[rid][1]] in cut else "other"] += 1
        return c

    rej_cells = {"cut": 0, "other": 0}
    for _t, srv in watch.rejected:
        rej_cells["cut" if cell_of[srv] in cut else "other"] += 1
    per = 1.0 / max(R, 1)
    return {
        "scenario": scenario, "policy": policy, "trial": trial, "cfg": cfg, "arrivals": R,
        "mean_f": s["mean_latency_with_failures"], "client_fail": s["client_failure_rate"],
        "timed_out": s["timed_out_rate"], "overflow": s["overflow_rate"], "shed": s["shed_rate"],
        "wasted_busy": wasted / total_busy if total_busy else math.nan,
        "wasted_busy_in_service_aborts": wasted_run / total_busy if total_busy else math.nan,
        "wasted_busy_outage": wasted_out / tot_out if tot_out else math.nan,
        "probe_busy": (total_busy - req_busy) / total_busy if total_busy else math.nan,
        "cancel_where": {"transit": transit * per, "queue": len(ab_queue) * per, "service": len(ab_run) * per,
                         "late_answer": late_answers * per},
        "cancel_queue_cells": cells(ab_queue), "cancel_service_cells": cells(ab_run),
        "overflow_cells": rej_cells, "cut_cells": sorted(cut),
        "wait_admit_s": {"mean": float(np.mean(waits)) if waits else math.nan, "p50": q(waits, 0.5), "p90": q(waits, 0.9)},
        "wait_admit_outage_s": {"mean": float(np.mean(waits_out)) if waits_out else math.nan,
                                "p50": q(waits_out, 0.5), "p90": q(waits_out, 0.9)},
        "queue_fill_met_outage": {"mean": float(np.mean(fills_out)) if fills_out else math.nan,
                                  "p50": q(fills_out, 0.5), "p90": q(fills_out, 0.9)},
        "age_at_submit_outage_s": {"p50": q(ages_out, 0.5), "p90": q(ages_out, 0.9)},
    }


def main() -> None:
    args = sys.argv[1:]
    scenario, policy = int(args[0]), args[1]
    trial = int(args[2]) if len(args) > 2 and "=" not in args[2] else 0
    kw: dict[str, Any] = {}
    for a in args[2:]:
        if "=" in a:
            k, v = a.split("=", 1)
            kw[k] = json.loads(v) if v not in ("cancel", "serve") else v
    print(json.dumps({**diagnose(scenario, policy, trial, **kw), "outage": kw.get("outage", True)}), flush=True)


if __name__ == "__main__":
    main()
