"""Where Flow-Grad's extra latency at 80 % comes from, beside Disc-Lat (tuning seeds only).

Per policy and seed (batched server, one trial): the failure-counting mean, its network part (mean
round trip of the served requests) and the rest (server time: queue + batch); the load-weighted
excess of each cell's mean latency; per-cell RIF over time as the leaves report it (std over time,
mean over cells, after the first 40 s); the dispersion of each cell's arrivals in 1-s windows
(variance ÷ mean of the count minus its 20-s moving average: Poisson thinning gives ≈ 1, a policy
that reads the state gives less); and, for flow roots, how far each root's 1-s split strays from
its own ``x`` (RMS over cells of ``count_j − Σ x_j`` at pick time, ÷ √picks).

Usage: python research/routing-stress/flowpick_diag.py --seeds 101,102,103 --minutes 4 --util 0.8
       --policies "Disc-Lat;Flow-Grad;Flow-Grad[pick=two-choice]" [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import probe

from dlb.core.router import Mechanism, RootRouter
from dlb.sim.engine import SimConfig, generate_arrivals, simulate
from dlb.sim.scenario import generate

WARM = 40.0


def run(seed: int, policy: str, util: float, minutes: float, model: str) -> dict:
    probe.register_variant(policy)
    sc = generate(seed, duration_s=minutes * 60.0, utilization=util, server_model=model)
    arr = generate_arrivals(sc, 0)
    t_arr = arr[0]
    probes: list[tuple[float, int, float]] = []
    picks: list[tuple[int, float, int, np.ndarray]] = []
    orig_probe, orig_pick = RootRouter.on_probe, RootRouter.pick

    def on_probe(self, cell, now, rif, *a, **k):  # type: ignore[no-untyped-def]
        if self.source == 0:
            probes.append((now, cell, rif))
        return orig_probe(self, cell, now, rif, *a, **k)

    def pick(self, now, session=None):  # type: ignore[no-untyped-def]
        cell = orig_pick(self, now, session)
        if self.policy.mechanism is Mechanism.FLOW and not self.warming(now):
            picks.append((self.source, now, cell, self._x.copy()))
        return cell

    RootRouter.on_probe, RootRouter.pick = on_probe, pick  # type: ignore[method-assign]
    try:
        res = simulate(sc, policy, 0, SimConfig(), arrivals=arr)
    finally:
        RootRouter.on_probe, RootRouter.pick = orig_probe, orig_pick  # type: ignore[method-assign]
    s = res.summary()
    n = sc.n
    routed = res.routed
    out = {"seed": seed, "policy": policy, "mf": s["mean_latency_with_failures"], "err": s["error_rate"],
           "net": res.net_mean, "server": s["mean"] - res.net_mean}
    if res.latency.size == int((routed >= 0).sum()):
        lat = np.full(routed.size, np.nan)
        lat[routed >= 0] = res.latency
        m = (t_arr >= WARM) & (routed >= 0)
        cell_lat = np.array([np.nanmean(lat[m & (routed == j)]) if (m & (routed == j)).any() else np.nan for j in range(n)])
        share = np.bincount(routed[m], minlength=n) / max(int(m.sum()), 1)
        out["cell_lat"] = cell_lat.round(2).tolist()
        out["share"] = share.round(3).tolist()
        out["lat_spread"] = float(np.nansum(share * np.abs(cell_lat - np.nansum(share * cell_lat))))
    # RIF over time as reported to source 0's root.
    pr = np.array(probes) if probes else np.zeros((0, 3))
    sd = []
    for j in range(n):
        v = pr[(pr[:, 1] == j) & (pr[:, 0] >= WARM), 2]
        if v.size:
            sd.append(v.std() / max(v.mean(), 1e-9))
    out["rif_cv"] = float(np.mean(sd)) if sd else float("nan")
    # Arrival dispersion per cell in 1-s windows (count minus its 20-s moving average).
    T = float(t_arr.max())
    bins = np.arange(WARM, T, 1.0)
    disp = []
    for j in range(n):
        c, _ = np.histogram(t_arr[routed == j], bins)
        if c.mean() < 2:
            continue
        trend = np.convolve(c, np.ones(21) / 21, mode="same")
        r = (c - trend)[10:-10]
        disp.append(r.var() / c.mean())
    out["dispersion"] = float(np.mean(disp)) if disp else float("nan")
    if picks:
        dev = []
        by_src: dict[int, list] = {}
        for sidx, t, cell, x in picks:
            if t >= WARM:
                by_src.setdefault(sidx, []).append((t, cell, x))
        for rows in by_src.values():
            ts = np.array([r[0] for r in rows])
            cells = np.array([r[1] for r in rows])
            xs = np.stack([r[2] for r in rows])
            w = np.floor(ts).astype(int)
            for k in np.unique(w):
                mk = w == k
                cnt = mk.sum()
                if cnt < 5:
                    continue
                got = np.bincount(cells[mk], minlength=n)
                want = xs[mk].sum(axis=0)
                dev.append(np.sqrt(np.mean((got - want) ** 2)) / np.sqrt(cnt))
        out["split_dev"] = float(np.mean(dev)) if dev else float("nan")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="101,102,103")
    ap.add_argument("--util", type=float, default=0.8)
    ap.add_argument("--minutes", type=float, default=4.0)
    ap.add_argument("--model", default="batched")
    ap.add_argument("--policies", default="Disc-Lat;Flow-Grad")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    recs = []
    for seed in (int(s) for s in a.seeds.split(",")):
        for p in a.policies.split(";"):
            r = run(seed, p, a.util, a.minutes, a.model)
            recs.append(r)
            print(json.dumps({k: v for k, v in r.items() if k not in ("cell_lat", "share")}), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(recs, indent=1))


if __name__ == "__main__":
    main()
