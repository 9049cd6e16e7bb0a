"""Quick stress probe: a few scenarios × policies × server models, printed as ratio to Rand and error rate.

Development tool for the routing-under-stress work (tuning seeds only; the report uses `dlb sim`).
Usage: python research/routing-stress/probe.py --seeds 101,102 --util 0.95 --minutes 3 --model batched
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

import dlb.sim.engine as sim_engine
import dlb.sim.policies as sim_policies
from dlb.core import latency_model
from dlb.core import router as core_router
from dlb.core.flow import FlowConfig
from dlb.core.grad_floor import GradFloorConfig
from dlb.core.router import PolicyConfig
from dlb.sim.engine import SimConfig, simulate
from dlb.sim.scenario import generate


def register_variant(name: str) -> None:
    """``Flow-Grad[adaptive_gain=False,lead_s=5]``: a policy with FlowConfig fields changed, for this run only
    (``floor.z=3``, ``floor.enabled=False``: GradFloorConfig fields)."""
    if "[" not in name or name in sim_policies.REGISTRY:
        return
    base, fields = name.rstrip("]").split("[", 1)
    kw = {k: _value(v) for k, v in (f.split("=") for f in fields.split(","))}
    floor = {k.removeprefix("floor."): (int(v) if k == "floor.models" else v) for k, v in kw.items() if k.startswith("floor.")}
    flow = {k: v for k, v in kw.items() if not k.startswith("floor.")}
    cfg = PolicyConfig.from_name(base)
    sim_policies.REGISTRY[name] = sim_policies._dlb(PolicyConfig(mechanism=cfg.mechanism, cost=cfg.cost, flow=FlowConfig(**flow),
                                                                 grad_floor=GradFloorConfig(**floor)))
    sim_engine.ALL_POLICIES = tuple(sim_policies.REGISTRY)


def _value(v: str) -> bool | float | str:
    """A variant's field value: True/False, a number, else the string itself (``pick=two-choice``)."""
    if v in ("True", "False"):
        return v == "True"
    try:
        return float(v)
    except ValueError:
        return v


def set_grad_max_rho(rho: float) -> None:
    """Worker initialiser: the gradient cost's utilisation cap for this run only (0: the code's own)."""
    if rho:
        latency_model.GRAD_MAX_RHO = rho
        core_router.GRAD_MAX_RHO = rho  # imported by name there (the per-request scalar cost)


def run(args: tuple) -> dict:
    seed, util, policy, model, minutes, replicas, disruption, noise = args
    register_variant(policy)
    kw = {"utilization": util, "server_model": model}
    if disruption:
        kw["disruption"] = disruption
    if noise:
        kw["noise_eps"] = noise
    t0 = time.perf_counter()
    sc = generate(seed, duration_s=minutes * 60.0, **kw)
    res = simulate(sc, policy, 0, SimConfig(root_replicas=replicas))
    s = res.summary()
    return {"seed": seed, "policy": policy, "model": model, "mf": s["mean_latency_with_failures"],
            "err": s["error_rate"], "shed": s["shed_rate"], "mean": s["mean"], "swing": share_swing(res.routed, res.arrival_t, sc.n),
            "wall": time.perf_counter() - t0}


def share_swing(routed: np.ndarray, t: np.ndarray, n: int, window_s: float = 20.0, warmup_s: float = 40.0) -> float:
    """Largest change of any cell's share of the routed requests between consecutive ``window_s``
    windows, after ``warmup_s`` and without the last (partial) window: the issue's steadiness figure."""
    edges = np.arange(warmup_s, float(t.max()) - window_s + 1e-9, window_s) if t.size else np.zeros(0)
    shares = []
    for lo in edges:
        m = (t >= lo) & (t < lo + window_s) & (routed >= 0)
        shares.append(np.bincount(routed[m], minlength=n) / max(int(m.sum()), 1))
    return float(np.abs(np.diff(np.array(shares), axis=0)).max()) if len(shares) > 1 else 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="101,102")
    ap.add_argument("--util", type=float, default=0.95)
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--model", default="batched")
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--disruption", default="")
    ap.add_argument("--noise", type=float, default=0.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--policies", help="comma-separated, or ';'-separated when a variant like "
                    "'Flow-Grad[adaptive_gain=False]' has commas", default="Rand,Disc-RIF,Disc-Lat,Disc-Grad,Flow-RIF,Flow-Lat,Flow-Grad,lr-global,hub-score")
    ap.add_argument("--grad-max-rho", type=float, default=0.0, help="override GRAD_MAX_RHO (0: the code's)")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    pols = a.policies.split(";") if ";" in a.policies else a.policies.split(",")
    jobs = [(s, a.util, p, a.model, a.minutes, a.replicas, a.disruption, a.noise) for s in seeds for p in pols]
    recs = []
    with ProcessPoolExecutor(a.workers, initializer=set_grad_max_rho, initargs=(a.grad_max_rho,)) as ex:
        for rec in ex.map(run, jobs):
            recs.append(rec)
            print(f"  done {rec['seed']} {rec['policy']}: mf {rec['mf']:.2f} err {100 * rec['err']:.1f}% "
                  f"wall {rec['wall']:.0f}s", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(recs, f)
    rand = {r["seed"]: r["mf"] for r in recs if r["policy"] == "Rand"}
    print(f"grad_max_rho={a.grad_max_rho or latency_model.GRAD_MAX_RHO} util={a.util} model={a.model} R={a.replicas} "
          f"dis={a.disruption} eps={a.noise} seeds={seeds}")
    for p in pols:
        rs = [r for r in recs if r["policy"] == p]
        ratio = np.mean([r["mf"] / rand[r["seed"]] for r in rs]) if rand else float("nan")
        per = " ".join(f"{r['mf'] / rand[r['seed']]:.3f}/{100 * r['err']:.1f}%" for r in rs)
        swing = max((r.get("swing", float("nan")) for r in rs), default=float("nan"))
        print(f"{p:18s} {ratio:6.3f}  err {100 * np.mean([r['err'] for r in rs]):5.2f}%  swing {swing:.3f}  "
              f"shed {100 * np.mean([r['shed'] for r in rs]):4.1f}%  [{per}]  wall {np.mean([r['wall'] for r in rs]):.0f}s")


if __name__ == "__main__":
    main()
