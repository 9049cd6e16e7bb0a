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
import itertools
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dlb.bench import harness
from dlb.core.bfio import PICK_POINTS, FloatArray, GreedyPicker, assign_batch_milp, predicted_workload, survival
from dlb.emulator.dp import rank_step_time
from dlb.emulator.profile import BUILTIN_PROFILES, Profile

STUDY_G = (8, 16, 32)
STUDY_B = (16, 64, 256)
STUDY_H = (0, 1, 10, 50, 200)
BASELINES = ("round-robin", "jsq", "least-kv")
MILP_CHUNK = 16  # requests per programme in the study's MILP variant
MILP_MAX_SLOTS = 256  # G·B up to which --milp also runs the batch MILP (one programme per step: minutes per run beyond)


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
    seed: int
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
             mean_decode: float, seed: int = 0) -> RunResult:  # fmt: skip
    """Run one policy on one workload until every request finished (see the module docstring)."""
    n_req = len(work.prompts)
    kv = np.zeros((g, b), dtype=np.int64)
    rem = np.zeros((g, b), dtype=np.int64)
    rid = np.full((g, b), -1, dtype=np.int64)
    finish = np.zeros(n_req)
    picker = GreedyPicker(horizon or 0, mean_decode, points=None) if policy == "bf-io" else None  # the exact sum
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
                if policy == "bf-io-milp":
                    # The refill batch jointly (the paper's integer programme), in chunks of MILP_CHUNK
                    # requests, largest first, so the one-off initial fill of G·B slots stays solvable.
                    batch = batch[np.argsort(-work.prompts[batch], kind="stable")]
                    for lo in range(0, len(batch), MILP_CHUNK):
                        chunk = batch[lo:lo + MILP_CHUNK]
                        ranks = assign_batch_milp(kv_rank, nf, work.prompts[chunk].astype(np.float64), horizon or 0,
                                                  mean_decode, capacity=free.astype(np.int64), time_limit_s=5.0)  # fmt: skip
                        for i, r in zip(chunk, ranks, strict=False):
                            slot = int(np.argmin(rid[r]))
                            rid[r, slot], kv[r, slot], rem[r, slot] = i, int(work.prompts[i]), work.decode[i]
                            free[r] -= 1
                            nf[r] += 1
                            kv_rank[r] += work.prompts[i]
                    batch = batch[:0]
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
        seed=seed, G=g, B=b, H=horizon, policy=policy,
        idle_frac=busy_phase_idle / (g * busy_phase_step) if busy_phase_step else 0.0,
        throughput_tok_s=busy_phase_tokens / busy_phase_step if busy_phase_step else 0.0,
        mean_s=float(lat.mean()), p90_s=float(np.percentile(lat, 90)), energy_proxy=energy,
        imbalance=imb_sum / imb_steps if imb_steps else 0.0, steps=steps, requests=n_req,
    )  # fmt: skip


@dataclass(frozen=True)
class StudyGrid:
    """What ``dlb bfio study`` runs: the (G, B, H) grid, the seeds and the workload's shape."""

    gs: tuple[int, ...]
    bs: tuple[int, ...]
    hs: tuple[int, ...]
    seeds: tuple[int, ...]
    generations: float
    mean_decode: float
    prompt_median: float
    prompt_sigma: float
    profile: Profile
    milp: bool = False


def run_study(grid: StudyGrid, progress: Any = None) -> list[RunResult]:
    """Every policy on every (seed, G, B) workload of the grid; ``progress(result, seconds)`` after each run."""
    gs, bs, hs, seeds, generations = grid.gs, grid.bs, grid.hs, grid.seeds, grid.generations
    mean_decode, prompt_median, prompt_sigma, profile, milp = (
        grid.mean_decode, grid.prompt_median, grid.prompt_sigma, grid.profile, grid.milp)
    out: list[RunResult] = []
    for seed, g, b in itertools.product(seeds, gs, bs):
            n = int(g * b * generations)
            work = Workload.draw(n, seed * 1_000_003 + 1000 * g + b, mean_decode, prompt_median, prompt_sigma)
            runs: list[tuple[str, int | None]] = [(p, None) for p in BASELINES] + [("bf-io", h) for h in hs]
            if milp and g * b <= MILP_MAX_SLOTS and REF_H in hs:
                runs.append(("bf-io-milp", REF_H))
            for policy, h in runs:
                t0 = time.perf_counter()
                res = simulate(g, b, policy, h, work, profile, mean_decode, seed)
                out.append(res)
                if progress:
                    progress(res, time.perf_counter() - t0)
    return out


REF_H = 10  # BF-IO's reference horizon in the verdicts (the shipped default)


def cell_means(records: list[dict[str, Any]]) -> dict[tuple[int, int, str, int | None], dict[str, float]]:
    """Per (G, B, policy, H) mean of every metric over seeds."""
    acc: dict[tuple[int, int, str, int | None], list[dict[str, Any]]] = {}
    for r in records:
        acc.setdefault((r["G"], r["B"], r["policy"], r["H"]), []).append(r)
    keys = ("idle_frac", "throughput_tok_s", "mean_s", "p90_s", "energy_proxy", "imbalance")
    return {k: {m: float(np.mean([r[m] for r in rs])) for m in keys} for k, rs in acc.items()}


def _spearman(x: list[float], y: list[float]) -> float:
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    return float(np.corrcoef(rx, ry)[0, 1])


def verdicts(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Apply the verdict rules of docs/bfio.md (written before the recorded run) to per-cell means."""
    mean = cell_means(records)
    cells = sorted({(g, b) for g, b, _, _ in mean})
    hs = sorted({h for _, _, p, h in mean if p == "bf-io" and h is not None})
    n = len(cells)

    def grade(count: int, need_partly: int) -> str:
        return "holds" if count == n else ("partly" if count >= need_partly else "not reproduced")

    bf = {c: mean[(*c, "bf-io", REF_H)] for c in cells}
    jsq = {c: mean[(*c, "jsq", None)] for c in cells}
    out: dict[str, dict[str, Any]] = {}
    c1 = sum(bf[c]["idle_frac"] < jsq[c]["idle_frac"] for c in cells)
    out["C1"] = {"verdict": grade(c1, 6), "cells": f"{c1}/{n}"}
    ratio = [jsq[c]["imbalance"] / bf[c]["imbalance"] for c in cells]
    shape = [math.sqrt(b * math.log(g)) for g, b in cells]
    slope = float(np.polyfit(np.log(shape), np.log(ratio), 1)[0])
    rho = _spearman(shape, ratio)
    out["C2"] = {"verdict": "holds" if slope > 0 and rho >= 0.7 else ("partly" if slope > 0 else "not reproduced"),
                 "slope": slope, "spearman": rho,
                 "reduction": {f"G={g},B={b}": r for (g, b), r in zip(cells, ratio, strict=False)}}  # fmt: skip
    longer = [h for h in hs if h > 0]
    if 0 in hs and longer:
        c3 = sum(min(mean[(*c, "bf-io", h)]["idle_frac"] for h in longer) <= 0.95 * mean[(*c, "bf-io", 0)]["idle_frac"]
                 for c in cells)  # fmt: skip
        out["C3"] = {"verdict": "holds" if c3 >= 6 else ("partly" if c3 >= 3 else "not reproduced"), "cells": f"{c3}/{n}"}
    wins = {
        "throughput": sum(bf[c]["throughput_tok_s"] > jsq[c]["throughput_tok_s"] for c in cells),
        "mean_latency": sum(bf[c]["mean_s"] < jsq[c]["mean_s"] for c in cells),
        "energy": sum(bf[c]["energy_proxy"] < jsq[c]["energy_proxy"] for c in cells),
    }
    milp_cells = [c for c in cells if (*c, "bf-io-milp", REF_H) in mean]
    if milp_cells:
        c6 = sum(bf[c]["idle_frac"] <= 1.1 * mean[(*c, "bf-io-milp", REF_H)]["idle_frac"] for c in milp_cells)
        k = len(milp_cells)
        out["C6"] = {"verdict": "holds" if c6 == k else ("partly" if 2 * c6 >= k else "not reproduced"),
                     "cells": f"{c6}/{k}",
                     "idle_greedy_vs_milp": {f"G={g},B={b}": [bf[(g, b)]["idle_frac"],
                                                              mean[(g, b, "bf-io-milp", REF_H)]["idle_frac"]]
                                             for g, b in milp_cells}}  # fmt: skip
    all_n = all(v == n for v in wins.values())
    out["C4"] = {"verdict": "holds" if all_n else ("partly" if all(v >= 6 for v in wins.values()) else "not reproduced"),
                 **{k: f"{v}/{n}" for k, v in wins.items()}}  # fmt: skip
    return out


def table(records: list[dict[str, Any]]) -> str:
    """Markdown table of per-cell means (one row per G, B, policy, H)."""
    mean = cell_means(records)
    lines = ["| G | B | policy | H | idle frac | throughput tok/s | mean s | p90 s | energy GPU·s | imbalance KV |",
             "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    order = {p: i for i, p in enumerate((*BASELINES, "bf-io", "bf-io-milp"))}
    for (g, b, p, h), m in sorted(mean.items(), key=lambda kv: (kv[0][0], kv[0][1], order[kv[0][2]], kv[0][3] or 0)):
        lines.append(f"| {g} | {b} | {p} | {'' if h is None else h} | {m['idle_frac']:.4f} | {m['throughput_tok_s']:.0f} | "
                     f"{m['mean_s']:.2f} | {m['p90_s']:.2f} | {m['energy_proxy']:.0f} | {m['imbalance']:.0f} |")  # fmt: skip
    return "\n".join(lines)


def plots(records: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """idle fraction vs B per G and policy; reduction factor vs √(B ln G); idle fraction vs H."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mean = cell_means(records)
    gs = sorted({k[0] for k in mean})
    bs = sorted({k[1] for k in mean})
    hs = sorted({k[3] for k in mean if k[2] == "bf-io" and k[3] is not None})
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    fig, axes = plt.subplots(1, len(gs), figsize=(4 * len(gs), 3.4), sharey=True)
    for ax, g in zip(np.atleast_1d(axes), gs, strict=True):
        for p, h in [(p, None) for p in BASELINES] + [("bf-io", REF_H)]:
            ax.plot(bs, [mean[(g, b, p, h)]["idle_frac"] for b in bs], marker="o", label=p if h is None else f"{p} H={h}")
        ax.set_xscale("log", base=2)
        ax.set_title(f"G = {g}")
        ax.set_xlabel("B (slots per rank)")
    np.atleast_1d(axes)[0].set_ylabel("barrier idle fraction")
    np.atleast_1d(axes)[0].legend(fontsize=8)
    fig.tight_layout()
    paths.append(out_dir / "bfio_idle.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(4.6, 3.6))
    for g in gs:
        xs = [math.sqrt(b * math.log(g)) for b in bs]
        ys = [mean[(g, b, "jsq", None)]["imbalance"] / mean[(g, b, "bf-io", REF_H)]["imbalance"] for b in bs]
        ax.plot(xs, ys, marker="o", label=f"G = {g}")
    ax.set_xlabel("√(B ln G)")
    ax.set_ylabel(f"imbalance JSQ / BF-IO (H={REF_H})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(out_dir / "bfio_reduction.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(4.6, 3.6))
    for g in gs:
        for b in bs:
            ax.plot([max(h, 0.5) for h in hs], [mean[(g, b, "bf-io", h)]["idle_frac"] for h in hs], marker=".",
                    label=f"G={g} B={b}")  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("horizon H (H=0 drawn at 0.5)")
    ax.set_ylabel("BF-IO barrier idle fraction")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    paths.append(out_dir / "bfio_horizon.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def _time_picks(picker: GreedyPicker, kv: FloatArray, n: FloatArray, allowed: np.ndarray, prompts: np.ndarray) -> tuple[float, float]:
    """Best-of-5 (CPU, wall) µs per pick."""
    cpu, wall = [], []
    for _ in range(5):
        t0, c0 = time.perf_counter(), time.process_time()
        for p in prompts:
            picker.pick(kv, n, float(p), allowed)
        cpu.append((time.process_time() - c0) / len(prompts) * 1e6)
        wall.append((time.perf_counter() - t0) / len(prompts) * 1e6)
    return float(min(cpu)), float(min(wall))


def pick_agreement(g: int, h: int, states: int, seed: int = 0, mean_decode: float = 256.0) -> dict[str, float]:
    """How the request-path picker (:data:`PICK_POINTS` horizon points) decides against the exact sum.

    Random loaded states as in :func:`bench_pick`, plus a light one in four (ranks of very different
    load, where the horizon matters most). ``same``: fraction of identical picks; ``excess_*``: the
    exact objective of the quadrature's pick over the exact optimum, relative to the optimum's
    imbalance (0 = as good).
    """
    rng = np.random.default_rng(seed)
    exact, quad = GreedyPicker(h, mean_decode, points=None), GreedyPicker(h, mean_decode)
    same, excess = 0, []
    for i in range(states):
        if i % 4 == 3:
            kv, n = rng.uniform(0, 20_000, g), rng.integers(0, 16, g).astype(np.float64)
        else:
            kv, n = rng.uniform(10_000, 60_000, g), rng.integers(32, 64, g).astype(np.float64)
        p = float(rng.uniform(16, 4000))
        ke, kq = exact.pick(kv, n, p), quad.pick(kv, n, p)
        same += ke == kq
        prim, _ = exact.costs(kv, n, p)  # Σ_h q^h · max over ranks after placing on each rank
        # Imbalance of the optimum: its max term minus the mean term (the same wherever the request goes).
        steps = np.arange(h + 1, dtype=np.float64)
        mean_term = float(predicted_workload(kv, n, h, mean_decode).mean(axis=0).sum()
                          + (survival(mean_decode) ** steps * (p + steps)).sum() / g)
        excess.append((float(prim[kq]) - float(prim[ke])) / max(float(prim[ke]) - mean_term, 1e-9))
    ex = np.array(excess)
    return {"same": same / states, "excess_mean": float(ex.mean()), "excess_p99": float(np.quantile(ex, 0.99)),
            "excess_max": float(ex.max())}


def bench_pick(g: int, hs: tuple[int, ...], picks: int, seed: int = 0, states: int = 2000) -> list[dict[str, Any]]:
    """Per horizon: best-of-5 µs (CPU and wall) per :meth:`GreedyPicker.pick` for G ranks on a random
    loaded state, for the request-path picker and for the exact O(G·H) sum, and how often they agree."""
    rng = np.random.default_rng(seed)
    out = []
    for h in hs:
        kv = rng.uniform(10_000, 60_000, g)
        n = rng.integers(32, 64, g).astype(np.float64)
        allowed = n < 64
        prompts = rng.uniform(16, 4000, picks)
        cpu, wall = _time_picks(GreedyPicker(h, 256.0), kv, n, allowed, prompts)
        exact_cpu, _ = _time_picks(GreedyPicker(h, 256.0, points=None), kv, n, allowed, prompts)
        # CPU time is the decision's cost; wall time on a shared box also counts time descheduled.
        out.append({"G": g, "H": h, "points": min(h + 1, PICK_POINTS), "pick_cpu_us": cpu, "pick_wall_us": wall,
                    "exact_cpu_us": exact_cpu, "picks": picks, "target_us": 20.0, "meets_target": bool(cpu <= 20.0),
                    **pick_agreement(g, h, states, seed)})  # fmt: skip
    return out


def run_study_cmd(args: argparse.Namespace) -> int:
    def progress(r: RunResult, secs: float) -> None:
        print(f"G={r.G:<3} B={r.B:<4} {r.policy:12} H={'-' if r.H is None else r.H!s:<4} idle={r.idle_frac:.4f} "
              f"thr={r.throughput_tok_s:9.0f} tok/s mean={r.mean_s:7.2f}s p90={r.p90_s:7.2f}s "
              f"energy={r.energy_proxy:8.1f} imb={r.imbalance:9.0f} ({secs:.1f}s)", flush=True)  # fmt: skip

    t0 = time.time()
    record = harness.start()  # the code that runs is the code at start
    grid = StudyGrid(args.gs, args.bs, args.hs, seeds=args.seeds, generations=args.generations, mean_decode=args.mean_decode,
                     prompt_median=args.prompt_median, prompt_sigma=args.prompt_sigma, profile=BUILTIN_PROFILES[args.profile],
                     milp=args.milp)
    results = run_study(grid, progress=progress)
    records = [asdict(r) for r in results]
    print(table(records))
    verdict = verdicts(records) if len(args.gs) * len(args.bs) == 9 and REF_H in args.hs else {}
    for claim, v in verdict.items():
        print(claim, json.dumps(v))
    doc = {
        "command": "dlb bfio study",
        "args": {k: v for k, v in vars(args).items() if k != "func"},
        "wall_s": time.time() - t0,
        "verdicts": verdict,
        "records": records,
    }
    if args.plots:
        for path in plots(records, Path(args.plots)):
            print("wrote", path)
    # The claims' grades ("holds", "partly", ...) are findings of a study, not targets: each is in
    # target_verdicts as reported, not gated (pass null), so the exit stays 0.
    findings = [harness.Target(f"{claim}: {v['verdict']}", None, json.dumps({k: x for k, x in v.items() if k != "verdict"}))
                for claim, v in verdict.items()]
    return harness.finish(record, doc, findings, json_path=args.json)


def run_bench_cmd(args: argparse.Namespace) -> int:
    from dlb.bench.bfio_leaf_pick import leaf_pick, release_cost, stream_chunk_cost

    record = harness.start()
    rows = bench_pick(args.g, args.hs, args.picks)
    for r in rows:
        print(f"G={r['G']} H={r['H']:<4} {r['pick_cpu_us']:7.2f} µs CPU per pick ({r['pick_wall_us']:.2f} µs wall; "
              f"exact sum {r['exact_cpu_us']:.2f} µs) same pick {r['same']:.3f}, excess mean {r['excess_mean']:.2e} "
              f"max {r['excess_max']:.2e}{'' if r['meets_target'] else '  (over the 20 µs target)'}")
    targets = [harness.Target(f"BF-IO pick at G={r['G']} H={r['H']}: CPU per pick <= {r['target_us']:g} µs",
                              None, f"{r['pick_cpu_us']:.2f} µs") for r in rows]  # reported, not gated: the exit stays 0
    leaf = [leaf_pick(args.g, args.picks, policy) for policy in ("bf-io", "jsq")]
    for r in leaf:
        print(f"leaf pick G={r['G']} {r['policy']:6} (parse, rank pick, records, reply): "
              f"p50 {r['wall_us_p50']:.1f} µs, p90 {r['wall_us_p90']:.1f} µs wall; "
              f"{r['cpu_us_mean_with_completion']:.1f} µs CPU mean with one completion")
    rel = release_cost(args.g, min(args.picks, 2000))
    print(f"held-request release G={rel['G']} (BF-IO over the {rel['window']} oldest): p50 {rel['wall_us_p50']:.1f} µs, "
          f"p90 {rel['wall_us_p90']:.1f} µs wall")
    chunk = stream_chunk_cost(args.g, args.picks)
    print(f"stream token count G={chunk['G']} ({chunk['streams']} open responses, {chunk['chunk_bytes']}-byte chunks): "
          f"p50 {chunk['wall_us_p50']:.1f} µs, p90 {chunk['wall_us_p90']:.1f} µs wall, {chunk['cpu_us_mean']:.1f} µs CPU per chunk; "
          f"with the HTTP/2 transport p50 {chunk['h2_wall_us_p50']:.1f} µs, {chunk['h2_cpu_us_mean']:.1f} µs CPU")
    targets += [harness.Target(f"whole leaf pick ({r['policy']}) at G={r['G']}: p50 <= {r['target_us']:g} µs", None,
                               f"{r['wall_us_p50']:.1f} µs") for r in leaf]
    return harness.finish(record, {"command": "dlb bfio bench", "records": rows, "leaf_pick": leaf, "release": rel,
                                   "stream_chunk": chunk}, targets,
                          json_path=args.json)
