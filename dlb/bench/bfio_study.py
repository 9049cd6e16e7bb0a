"""``dlb bfio study`` and ``dlb bfio bench``: BF-IO against count- and KV-based rank policies.

The study is a step-exact simulation of one DP decode group (G ranks, B slots each) under the seed
paper's overloaded regime: a backlog of requests is always waiting, so every slot a finished request
frees is refilled in the next step, and the *placement* of each refill is the policy's only choice.
Prefill is disaggregated (the paper's Figure 3): a request arrives at a decode rank with its prompt's KV
already built and then decodes one token per step until its geometric length runs out. A step lasts as
long as the slowest rank, each rank's time coming from its batch and resident KV through the same
step-time model the emulator's DP mode uses (:func:`dlb.emulator.dp.rank_step_time`).

Metrics (per run): ``idle_frac`` = Σ barrier idle / (G · Σ step time) over the overloaded phase (while
the backlog lasts), ``throughput_tok_s`` over the same phase, ``mean_s``/``p90_s`` end-to-end latency of
every request (arrival at t = 0, FCFS backlog), ``energy_proxy`` = G · Σ step time to finish the whole
workload (GPU-seconds: the step-time integral), ``imbalance`` = mean over overloaded steps of
max − mean resident KV tokens. Everything is seeded; the same seed gives every policy the same requests.

``dlb bfio bench`` measures the request-path decision (:class:`dlb.core.bfio.GreedyPicker.pick`) for
G = 32 per horizon; the target is ≤ 20 µs at the default horizon. It is a benchmark, not a timed test.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dlb.core.bfio import GreedyPicker
from dlb.emulator.dp import rank_step_time
from dlb.emulator.profile import BUILTIN_PROFILES, Profile

STUDY_G = (8, 16, 32)
STUDY_B = (16, 64, 256)
STUDY_H = (0, 1, 10, 50, 200)
BASELINES = ("round-robin", "jsq", "least-kv")


def git_commit() -> str:
    """The commit that produced a result (``unknown`` outside a checkout); ``+dirty`` if files changed."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here, capture_output=True,
                               text=True, check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("+dirty" if dirty else "")


@dataclass(frozen=True)
class Workload:
    """Requests of one run: prompt KV tokens and geometric decode lengths, drawn from ``seed``."""

    prompts: np.ndarray
    decode: np.ndarray

    @classmethod
    def draw(cls, n: int, seed: int, mean_decode: float, prompt_median: float, prompt_sigma: float) -> Workload:
        rng = np.random.default_rng(seed)
        prompts = np.clip(np.round(rng.lognormal(math.log(prompt_median), prompt_sigma, n)), 16, 16_384).astype(np.int64)
        decode = rng.geometric(1.0 / mean_decode, n).astype(np.int64)
        return cls(prompts, decode)


@dataclass
class RunResult:
    G: int
    B: int
    H: int | None
    policy: str
    idle_frac: float
    throughput_tok_s: float
    mean_s: float
    p90_s: float
    energy_proxy: float
    imbalance: float
    steps: int
    requests: int


def simulate(g: int, b: int, policy: str, horizon: int | None, work: Workload, profile: Profile,
             mean_decode: float) -> RunResult:  # fmt: skip
    """Run one policy on one workload until every request finished (see the module docstring)."""
    n_req = len(work.prompts)
    kv = np.zeros((g, b), dtype=np.int64)
    rem = np.zeros((g, b), dtype=np.int64)
    rid = np.full((g, b), -1, dtype=np.int64)
    finish = np.zeros(n_req)
    picker = GreedyPicker(horizon or 0, mean_decode) if policy == "bf-io" else None
    nxt = 0
    now = 0.0
    steps = 0
    busy_phase_step = busy_phase_idle = busy_phase_tokens = 0.0
    imb_sum, imb_steps = 0.0, 0
    energy = 0.0
    rr = 0
    while True:
        active = rid >= 0
        # -- refill free slots from the backlog (the policy's decision) --------------------------------
        if nxt < n_req:
            n_rank = active.sum(axis=1)
            free = b - n_rank
            m = int(min(free.sum(), n_req - nxt))
            if m:
                batch = np.arange(nxt, nxt + m)
                nxt += m
                kv_rank = kv.sum(axis=1).astype(np.float64)
                nf = n_rank.astype(np.float64)
                if policy == "bf-io":
                    batch = batch[np.argsort(-work.prompts[batch], kind="stable")]  # largest first (LPT order)
                for i in batch:
                    p = int(work.prompts[i])
                    allowed = free > 0
                    if policy == "round-robin":
                        while not allowed[rr]:
                            rr = (rr + 1) % g
                        r = rr
                        rr = (rr + 1) % g
                    elif policy == "jsq":
                        r = int(np.argmin(np.where(allowed, nf, np.inf)))
                    elif policy == "least-kv":
                        r = int(np.argmin(np.where(allowed, kv_rank, np.inf)))
                    else:
                        assert picker is not None
                        r = picker.pick(kv_rank, nf, float(p), allowed)
                    slot = int(np.argmin(rid[r]))  # a free slot holds -1, the minimum
                    rid[r, slot], kv[r, slot], rem[r, slot] = i, p, work.decode[i]
                    free[r] -= 1
                    nf[r] += 1
                    kv_rank[r] += p
                active = rid >= 0
        if not active.any():
            break
        # -- one lock step -------------------------------------------------------------------------------
        n_rank = active.sum(axis=1)
        kv_rank_i = kv.sum(axis=1)
        times = np.array([rank_step_time(profile, int(n_rank[r]), int(kv_rank_i[r])) for r in range(g)])
        step = float(times.max())
        now += step
        steps += 1
        energy += g * step
        tokens = int(n_rank.sum())
        if nxt < n_req:  # overloaded phase: the backlog is not empty
            busy_phase_step += step
            busy_phase_idle += float((step - times).sum())
            busy_phase_tokens += tokens
            imb_sum += float(kv_rank_i.max() - kv_rank_i.mean())
            imb_steps += 1
        kv[active] += 1
        rem[active] -= 1
        done = active & (rem <= 0)
        if done.any():
            finish[rid[done]] = now
            rid[done] = -1
            kv[done] = 0
    lat = finish  # every request arrived at t = 0
    return RunResult(
        G=g, B=b, H=horizon, policy=policy,
        idle_frac=busy_phase_idle / (g * busy_phase_step) if busy_phase_step else 0.0,
        throughput_tok_s=busy_phase_tokens / busy_phase_step if busy_phase_step else 0.0,
        mean_s=float(lat.mean()), p90_s=float(np.percentile(lat, 90)), energy_proxy=energy,
        imbalance=imb_sum / imb_steps if imb_steps else 0.0, steps=steps, requests=n_req,
    )  # fmt: skip


def run_study(gs: tuple[int, ...], bs: tuple[int, ...], hs: tuple[int, ...], *, seed: int, generations: float,
              mean_decode: float, prompt_median: float, prompt_sigma: float, profile: Profile,
              progress: Any = None) -> list[RunResult]:  # fmt: skip
    out: list[RunResult] = []
    for g in gs:
        for b in bs:
            n = int(g * b * generations)
            work = Workload.draw(n, seed + 1000 * g + b, mean_decode, prompt_median, prompt_sigma)
            runs: list[tuple[str, int | None]] = [(p, None) for p in BASELINES] + [("bf-io", h) for h in hs]
            for policy, h in runs:
                t0 = time.perf_counter()
                res = simulate(g, b, policy, h, work, profile, mean_decode)
                out.append(res)
                if progress:
                    progress(res, time.perf_counter() - t0)
    return out


def bench_pick(g: int, hs: tuple[int, ...], picks: int, seed: int = 0) -> list[dict[str, Any]]:
    """Median-of-5 µs per :meth:`GreedyPicker.pick` for G ranks at each horizon (random loaded state)."""
    rng = np.random.default_rng(seed)
    out = []
    for h in hs:
        picker = GreedyPicker(h, 256.0)
        kv = rng.uniform(10_000, 60_000, g)
        n = rng.integers(32, 64, g).astype(np.float64)
        allowed = n < 64
        prompts = rng.uniform(16, 4000, picks)
        reps = []
        for _ in range(5):
            t0 = time.perf_counter()
            for p in prompts:
                picker.pick(kv, n, float(p), allowed)
            reps.append((time.perf_counter() - t0) / picks * 1e6)
        out.append({"G": g, "H": h, "pick_us": float(np.median(reps)), "picks": picks})
    return out


def _ints(s: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in s.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("study", help="BF-IO vs round robin / JSQ / least-KV on a simulated DP decode group")
    p.add_argument("--G", dest="gs", type=_ints, default=STUDY_G, help="ranks per group (default 8,16,32)")
    p.add_argument("--B", dest="bs", type=_ints, default=STUDY_B, help="slots per rank (default 16,64,256)")
    p.add_argument("--H", dest="hs", type=_ints, default=STUDY_H, help="BF-IO horizons (default 0,1,10,50,200)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--generations", type=float, default=3.0, help="requests = G·B·this (default 3)")
    p.add_argument("--mean-decode", type=float, default=256.0, help="mean of the geometric decode length")
    p.add_argument("--prompt-median", type=float, default=600.0, help="median prompt tokens (lognormal)")
    p.add_argument("--prompt-sigma", type=float, default=1.0, help="sigma of the lognormal prompt length")
    p.add_argument("--profile", default="llama-8b-h100", choices=sorted(BUILTIN_PROFILES))
    p.add_argument("--json", default=None, help="write the records here")
    p.set_defaults(func=run_study_cmd)
    q = subparsers.add_parser("bench", help="request-path decision cost of the BF-IO pick (target <= 20 µs, G=32)")
    q.add_argument("--G", dest="g", type=int, default=32)
    q.add_argument("--H", dest="hs", type=_ints, default=STUDY_H)
    q.add_argument("--picks", type=int, default=5000)
    q.add_argument("--json", default=None)
    q.set_defaults(func=run_bench_cmd)


def run_study_cmd(args: argparse.Namespace) -> int:
    def progress(r: RunResult, secs: float) -> None:
        print(f"G={r.G:<3} B={r.B:<4} {r.policy:12} H={'-' if r.H is None else r.H!s:<4} idle={r.idle_frac:.4f} "
              f"thr={r.throughput_tok_s:9.0f} tok/s mean={r.mean_s:7.2f}s p90={r.p90_s:7.2f}s "
              f"energy={r.energy_proxy:8.1f} imb={r.imbalance:9.0f} ({secs:.1f}s)", flush=True)  # fmt: skip

    t0 = time.time()
    results = run_study(args.gs, args.bs, args.hs, seed=args.seed, generations=args.generations,
                        mean_decode=args.mean_decode, prompt_median=args.prompt_median,
                        prompt_sigma=args.prompt_sigma, profile=BUILTIN_PROFILES[args.profile],
                        progress=progress)  # fmt: skip
    if args.json:
        doc = {
            "commit": git_commit(),
            "command": "dlb bfio study",
            "args": {k: v for k, v in vars(args).items() if k != "func"},
            "wall_s": time.time() - t0,
            "records": [asdict(r) for r in results],
        }
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


def run_bench_cmd(args: argparse.Namespace) -> int:
    rows = bench_pick(args.g, args.hs, args.picks)
    for r in rows:
        print(f"G={r['G']} H={r['H']:<4} {r['pick_us']:7.2f} µs per pick")
    if args.json:
        Path(args.json).write_text(json.dumps({"commit": git_commit(), "command": "dlb bfio bench", "records": rows},
                                              indent=1) + "\n")  # fmt: skip
    return 0
