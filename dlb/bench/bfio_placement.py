"""``dlb bfio placement``: does *when* a rank is chosen decide whether BF-IO beats JSQ? (issue 15, C5)

On the real data path BF-IO beat JSQ below capacity but not above it (docs/bfio.md). The explanation
offered there: a leaf in front of vLLM's external DP load balancing must choose a rank when the request
*arrives*, and above capacity every rank is full, so the request waits in that rank's FCFS queue and
starts seconds later; the study's scheduler (the paper's) instead holds arrivals centrally and places
each one when a slot frees. This module tests that explanation in one controlled simulation: the same
requests arriving at the same steps, the same lock-step group and step-time model as ``dlb bfio study``
(:func:`dlb.emulator.dp.rank_step_time`), and only the placement differs:

- ``central``: arrivals wait in one FIFO; whenever ranks have free slots the policy fills them
  (BF-IO's exact pick over ranks with a free slot, JSQ over running counts);
- ``arrival``: each arrival is placed at once by the leaf's own :class:`DpBalancer` (``slots = B``,
  per-rank FCFS queues, the count slack that lets BF-IO choose among nearly-least-loaded full ranks).

Arrivals are deterministic at ``load`` × the group's decode capacity ``G·B/mean_decode`` requests per
step (above 1 = overloaded), for ``generations`` × G·B requests. Pure: no I/O, seeded.

Verdict rule, written before the recorded run: the explanation *holds* if, on the mean over seeds, for
every B, BF-IO's idle fraction is below JSQ's with ``central`` placement, and its relative reduction
with ``arrival`` placement is less than half the ``central`` one; *fails* if the arrival reduction is at
least as large as the central one for some B; otherwise *partly*.

Why it could be so under the geometric model: with every rank full, a queued request starts
when one of its rank's B running requests finishes, and remaining decode lengths are memoryless, so
the expected start delay depends on the queue length only — the count JSQ balances. What BF-IO predicts
about a rank's workload *now* is mostly gone by the time the request runs.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from dlb.bench import harness
from dlb.core.bfio import DpBalancer, GreedyPicker
from dlb.emulator.dp import rank_step_time
from dlb.emulator.profile import BUILTIN_PROFILES, Profile

PLACEMENTS = ("central", "arrival")


@dataclass
class PlacementResult:
    placement: str
    policy: str
    G: int
    B: int
    load: float
    seed: int
    idle_frac: float  # while every rank is busy (the group has a backlog)
    mean_steps: float  # arrival → finish, in steps
    requests: int


@dataclass(frozen=True)
class PlacementRun:
    """One group and workload: G ranks of B slots, ``n`` requests at ``load`` × the decode capacity."""

    g: int
    b: int
    load: float
    n: int
    seed: int
    profile: Profile
    mean_decode: float = 256.0
    horizon: int = 10
    prompt_median: float = 600.0


def simulate(placement: str, policy: str, run: PlacementRun) -> PlacementResult:
    """One run; see the module docstring."""
    g, b, load, n, seed, profile = run.g, run.b, run.load, run.n, run.seed, run.profile
    mean_decode, horizon, prompt_median = run.mean_decode, run.horizon, run.prompt_median
    if placement not in PLACEMENTS:
        raise ValueError(f"placement: one of {', '.join(PLACEMENTS)}, got {placement!r}")
    if policy not in ("bf-io", "jsq"):
        raise ValueError(f"policy: bf-io or jsq, got {policy!r}")
    rng = np.random.default_rng(seed)
    prompts = np.clip(np.round(rng.lognormal(np.log(prompt_median), 1.0, n)), 16, 16_384)
    decode = rng.geometric(1.0 / mean_decode, n)
    per_step = load * g * b / mean_decode
    arrive = np.floor(np.arange(n) / per_step).astype(np.int64)  # step at which request i arrives
    bal = DpBalancer(ranks=g, policy=policy, horizon=horizon, mean_decode_tokens=mean_decode, step_s=1.0, slots=b)
    picker = GreedyPicker(horizon, mean_decode, points=None)
    left = decode.astype(np.int64).copy()  # tokens still to decode, for running requests
    running: dict[int, int] = {}  # request → rank (central placement's own bookkeeping)
    central: list[int] = []
    finish = np.zeros(n)
    nxt, step = 0, 0
    idle = busy = 0.0
    while nxt < n or running or bal.residents or central:
        while nxt < n and arrive[nxt] <= step:
            if placement == "arrival":
                bal.assign(float(step), str(nxt), float(prompts[nxt]))
            else:
                central.append(nxt)
            nxt += 1
        if placement == "central":
            nrun = np.bincount(list(running.values()), minlength=g).astype(np.float64) if running else np.zeros(g)
            kv = bal.kv(float(step))
            while central and (nrun < b).any():
                i = central.pop(0)
                r = picker.pick(kv, nrun, float(prompts[i]), nrun < b) if policy == "bf-io" else int(np.argmin(np.where(nrun < b, nrun, np.inf)))
                bal.open(float(step), str(i), r, float(prompts[i]))
                running[i] = r
                nrun[r] += 1
                kv[r] += prompts[i]
        # One lock step over the ranks' running requests (the balancer's KV is exact here: step_s = 1).
        nr = bal.nrun.astype(np.int64)
        kv_now = bal.kv(float(step))
        times = np.array([rank_step_time(profile, int(nr[r]), int(kv_now[r])) for r in range(g)])
        if (nr > 0).any():
            st = float(times.max())
            if bal.n.sum() > g * b or central:  # a backlog: every rank could be busy
                busy += g * st
                idle += float((st - times).sum())
        step += 1
        for key in [k for k, res in bal.residents.items() if res.running]:
            i = int(key)
            left[i] -= 1
            if left[i] <= 0:
                bal.finish(key, float(step))  # promotes the rank's queue (arrival placement)
                running.pop(i, None)
                finish[i] = step
    lat = finish - arrive
    return PlacementResult(placement, policy, g, b, load, seed, idle / busy if busy else 0.0, float(lat.mean()), n)


def run(args: argparse.Namespace) -> int:
    profile = BUILTIN_PROFILES[args.profile]
    record = harness.start()
    rows = []
    for b in args.bs:
        for seed in args.seeds:
            for placement in PLACEMENTS:
                for policy in ("jsq", "bf-io"):
                    t0 = time.perf_counter()
                    r = simulate(placement, policy, PlacementRun(args.g, b, args.load, int(args.generations * args.g * b), seed,
                                                                 profile, args.mean_decode, args.horizon))
                    rows.append(asdict(r))
                    print(f"B={b} seed={seed} {placement:8} {policy:6} idle={r.idle_frac:.4f} mean={r.mean_steps:8.1f} steps "
                          f"({time.perf_counter() - t0:.1f}s)", flush=True)
    summary: dict[str, Any] = {}
    for b in args.bs:
        for placement in PLACEMENTS:
            def idle(seed: int, policy: str, b: int = b, placement: str = placement) -> float:
                return float(next(r["idle_frac"] for r in rows if (r["B"], r["seed"], r["placement"], r["policy"]) == (b, seed, placement, policy)))

            key = f"B={b} {placement}"
            summary[key] = {"idle_jsq": float(np.mean([idle(s, "jsq") for s in args.seeds])),
                            "idle_bfio": float(np.mean([idle(s, "bf-io") for s in args.seeds])),
                            "bfio_lower_in_seeds": sum(idle(s, "bf-io") < idle(s, "jsq") for s in args.seeds), "seeds": len(args.seeds)}
            print(key, json.dumps(summary[key]))
    doc = {"command": "dlb bfio placement", "args": {k: v for k, v in vars(args).items() if k != "func"},
           "summary": summary, "records": rows}
    return harness.finish(record, doc, json_path=args.json)
