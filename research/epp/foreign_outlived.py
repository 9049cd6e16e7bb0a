"""A foreign cell's model in steady state, with and without the outlived-request raise (``dlb.probe.foreign``).

Why: the raise fires when a cell completes far fewer requests than its model and load imply. A cell
whose latencies spread (one or two long requests in flight) must not be raised by chance, or the root
moves traffic off a healthy cell. Simulated here: Poisson arrivals at RIF ÷ 1 s, each request its own
latency (exponential or lognormal, mean 1 s), the RIF the requests in the system (M/G/∞), read every
0.5 s for 10 min through :class:`~dlb.probe.foreign.ForeignModel`. Reported: how many times it raised,
and |log(model ÷ truth)| at the cell's RIF after the first 30 s (median, p99, mean), with the raise off
(``OUTLIVED_ALPHA`` 0) and on.

Run: ``.venv/bin/python research/epp/foreign_outlived.py --json research/epp/foreign-outlived.json``
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import random
import subprocess
from dataclasses import dataclass, field

import numpy as np

from dlb.core.estimator import LatencyEstimator
from dlb.core.latency_model import LatencyParams, latency
from dlb.probe import foreign
from dlb.probe.foreign import FOREIGN_ESTIMATOR, ForeignModel

PRIOR = LatencyParams(1.0, 0.05, 8.0, 1.0)
#: The shipped test level, read before any run sets ``foreign.OUTLIVED_ALPHA`` to the level it simulates.
SHIPPED_ALPHA = foreign.OUTLIVED_ALPHA


@dataclass
class Run:
    raises: int = 0
    errors: list[float] = field(default_factory=list)


def run(alpha: float, rif: float, seed: int, dist: str, dt: float = 0.5, seconds: float = 600.0) -> Run:
    foreign.OUTLIVED_ALPHA = alpha
    rng = np.random.default_rng(seed)
    model = ForeignModel(LatencyEstimator(PRIOR, FOREIGN_ESTIMATOR, random.Random(0)))
    out = Run()
    raise_by = model.estimator.raise_by

    def counted(now: float, factor: float, since: float, evidence: float) -> None:
        out.raises += 1
        raise_by(now, factor, since, evidence)

    model.estimator.raise_by = counted  # type: ignore[method-assign]
    ends: list[tuple[float, float]] = []  # (completion time, latency) of the requests in the system
    total = count = 0.0

    def draw() -> float:
        return float(rng.exponential(1.0) if dist == "exp" else rng.lognormal(-0.5, 1.0))

    async def go() -> None:
        nonlocal total, count
        t, arrival = 0.0, float(rng.exponential(1.0 / rif))
        while t < seconds:
            while arrival < t + dt:
                lat = draw()
                heapq.heappush(ends, (arrival + lat, lat))
                arrival += float(rng.exponential(1.0 / rif))
            t += dt
            while ends and ends[0][0] <= t:  # the histogram counts a request when it completes
                total += heapq.heappop(ends)[1]
                count += 1
            held = float(len(ends))
            await model.update(t, held, {"s": {"": (total, count)}})
            p = model.estimator.params
            if t > 30.0 and held >= 1:
                out.errors.append(abs(float(np.log(float(latency(held, p.a, p.b, p.c, p.s))))))

    try:
        asyncio.run(go())
    finally:
        foreign.OUTLIVED_ALPHA = SHIPPED_ALPHA
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for dist in ("exp", "lognormal"):
        for rif in (1.0, 2.0, 4.0, 8.0):
            for alpha in (0.0, SHIPPED_ALPHA):
                for seed in range(args.seeds):
                    r = run(alpha, rif, seed, dist)
                    e = np.asarray(r.errors)
                    row = {"dist": dist, "rif": rif, "alpha": alpha, "seed": seed, "raises": r.raises,
                           "median": round(float(np.median(e)), 4), "p99": round(float(np.percentile(e, 99)), 4),
                           "mean": round(float(e.mean()), 4)}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False).stdout.strip()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"commit": commit, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
