"""``dlb bfio heldrun``: the data-path run (``dlb bfio dataplane --hold``) replayed in the study's step model.

Why: ``dlb bfio study`` predicts a large idle reduction for BF-IO (a long backlog, prefill done
elsewhere), while a bounded data-path run measured much less. This replays *that run* — the same
seeded prompts, decode lengths and Poisson arrival gaps as :func:`dlb.bench.bfio_dataplane.workload`,
the same lock-step model (:func:`dlb.emulator.dp.rank_step_time`, prefill on the rank that admits,
chunked at the profile's token budget) and the leaf's own release code (:meth:`DpBalancer.next_held`,
the ``window`` oldest held requests) — with exact state: no scrape staleness, no access-log lag, no
machine jitter. What it predicts for a run is what the method can give there; a gap between it and
the data path is the data path's own (time, staleness), a gap between it and the study is the workload's.

Arrivals are held or placed by the leaf's own rule (:meth:`DpBalancer.should_hold`); held requests are
released at step boundaries. Reported as the data path reports: idle fraction over
steps that start with requests held (``idle_frac_backlog``) and over the whole run. Pure: no I/O, seeded.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from dlb.bench import harness
from dlb.core.bfio import DpBalancer
from dlb.core.hold_queue import HoldQueue
from dlb.emulator.dp import rank_step_time
from dlb.emulator.profile import BUILTIN_PROFILES
from dlb.errors import UsageError


@dataclass(frozen=True)
class HeldRun:
    """One data-path run's settings (``dlb bfio dataplane``'s flags, same defaults where they exist)."""

    g: int
    b: int
    requests: int = 400
    rate: float = 70.0  # arrivals per wall second
    time_scale: float = 8.0  # wall seconds per profile second
    seed: int = 1
    window: int = 16
    prefill: bool = True  # False: prefill done elsewhere, as the study assumes
    horizon: int = 10
    mean_decode: float = 32.0
    prompt_median: float = 1500.0
    profile: str = "fast-test"


@dataclass
class HeldResult:
    policy: str
    G: int
    B: int
    seed: int
    window: int
    prefill: bool
    requests: int
    idle_frac_backlog: float
    idle_frac: float
    backlog_steps: int
    steps: int


def draw(run: HeldRun) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Prompt tokens, decode lengths and arrival times (profile seconds) of the data-path run's workload."""
    from dlb.bench.bfio_dataplane import workload  # the data path's own draw: the same requests

    reqs = workload(run.requests, run.seed, run.prompt_median, run.mean_decode)
    prompts = np.array([chars / 4 for chars, _ in reqs])
    decode = np.array([d for _, d in reqs], dtype=np.int64)
    gaps = np.random.default_rng(run.seed + 7).exponential(1.0 / run.rate, run.requests)  # as ``drive``
    return prompts, decode, np.cumsum(gaps) / run.time_scale


def simulate(policy: str, run: HeldRun) -> HeldResult:
    """One policy on one run (see the module docstring)."""
    prof = BUILTIN_PROFILES[run.profile]
    prompts, decode, arrive = draw(run)
    n, g = run.requests, run.g
    bal = DpBalancer(ranks=g, policy=policy, horizon=run.horizon, mean_decode_tokens=run.mean_decode,
                     step_s=1.0, slots=run.b, hold=HoldQueue(max(1, n), 1e9))  # fmt: skip
    q = bal.hold
    assert q is not None
    allowed = np.ones(g, dtype=bool)
    left = decode.copy()
    rank_of: dict[str, int] = {}
    prefill_left = np.zeros(g)  # prompt tokens still to prefill, per rank
    now = 0.0  # profile seconds
    step = nxt = backlog_steps = 0
    idle = busy = idle_b = busy_b = 0.0

    def place(key: str, r: int) -> None:
        bal.open(float(step), key, r, float(prompts[int(key)]))
        rank_of[key] = r
        prefill_left[r] += prompts[int(key)]

    while nxt < n or len(q) or bal.residents:
        while nxt < n and arrive[nxt] <= now:
            key = str(nxt)
            admit = bal.admitting(allowed)
            if bal.should_hold(allowed, admit):
                q.offer(float(step), key, float(prompts[nxt]), 0.0)
            else:
                place(key, bal.choose(float(step), float(prompts[nxt]), admit))
            nxt += 1
        while (released := bal.next_held(float(step), allowed, run.window)) is not None:
            place(released[0].key, released[1])
        nrun = bal.nrun
        if not nrun.any():  # nothing running: wait for the next arrival
            now = max(now, float(arrive[nxt])) if nxt < n else now
            continue
        kv = bal.kv(float(step))  # exact: step_s = 1 and time counted in steps
        chunk = np.minimum(prefill_left, np.maximum(0.0, prof.max_batch_tokens - nrun)) if run.prefill else np.zeros(g)
        prefill_left = prefill_left - chunk if run.prefill else np.zeros(g)
        times = np.array([rank_step_time(prof, int(nrun[r]), int(kv[r]), int(chunk[r])) for r in range(g)])
        st = float(times.max())
        idle += float((st - times).sum())
        busy += float(times.sum())
        if len(q):
            backlog_steps += 1
            idle_b += float((st - times).sum())
            busy_b += float(times.sum())
        now += st
        step += 1
        for key in [k for k, res in bal.residents.items() if res.running]:
            i = int(key)
            left[i] -= 1
            if left[i] <= 0:
                bal.finish(key, float(step))
    return HeldResult(policy, g, run.b, run.seed, run.window, run.prefill, n,
                      idle_b / (idle_b + busy_b) if busy_b else math.nan, idle / (idle + busy) if busy else 0.0,
                      backlog_steps, step)  # fmt: skip


def _mean_held(values: list[float]) -> float:
    """Mean over the seeds that held something (NaN: none did, below capacity)."""
    held = [v for v in values if math.isfinite(v)]
    return sum(held) / len(held) if held else math.nan


def summarise(rows: list[dict[str, Any]], base: str = "jsq") -> dict[str, dict[str, Any]]:
    """Per (G, window, prefill, policy): mean backlog idle, and its ratio to ``base`` per seed."""
    out: dict[str, dict[str, Any]] = {}
    keys = sorted({(r["G"], r["window"], r["prefill"], r["policy"]) for r in rows})
    for g, w, pf, pol in keys:
        mine = {r["seed"]: r for r in rows if (r["G"], r["window"], r["prefill"], r["policy"]) == (g, w, pf, pol)}
        ref = {r["seed"]: r for r in rows if (r["G"], r["window"], r["prefill"], r["policy"]) == (g, w, pf, base)}
        ratios = [mine[s]["idle_frac_backlog"] / ref[s]["idle_frac_backlog"] for s in mine if s in ref]
        out[f"G={g} window={w} prefill={pf} {pol}"] = {
            "idle_frac_backlog": _mean_held([r["idle_frac_backlog"] for r in mine.values()]),
            "idle_frac": float(np.mean([r["idle_frac"] for r in mine.values()])),
            f"ratio_to_{base}": [round(x, 3) for x in ratios],
            "at_most_0.85_in": sum(x <= 0.85 for x in ratios), "seeds": len(ratios)}  # fmt: skip
    return out


def run(args: argparse.Namespace) -> int:
    if len(args.gs) != len(args.bs):  # zip(strict=True) was a traceback after the parse
        raise UsageError(f"--G and --B: give one --B per --G (the lists must have equal length), got {len(args.gs)} and {len(args.bs)}")
    record = harness.start()
    rows = []
    for g, b in zip(args.gs, args.bs, strict=True):
        for window in args.windows:
            for seed in args.seeds:
                for policy in args.policies:
                    r = simulate(policy, HeldRun(g, b, args.requests, args.rate, args.time_scale, seed, window,
                                                 not args.no_prefill, args.horizon, args.mean_decode))  # fmt: skip
                    rows.append(asdict(r))
    summary = summarise(rows)
    for key, s in summary.items():
        if not math.isfinite(s["idle_frac_backlog"]):  # below capacity: the leaf never held a request
            print(f"{key:44} backlog idle: none (nothing was held; raise --rate or --requests) whole={s['idle_frac']:.4f}")
            continue
        print(f"{key:44} backlog idle={s['idle_frac_backlog']:.4f} whole={s['idle_frac']:.4f} "
              f"vs jsq={s['ratio_to_jsq']} (<= 0.85 in {s['at_most_0.85_in']}/{s['seeds']})")
    doc = {"command": "dlb bfio heldrun", "args": {k: v for k, v in vars(args).items() if k != "func"},
           "summary": summary, "records": rows}
    return harness.finish(record, doc, json_path=args.json)
