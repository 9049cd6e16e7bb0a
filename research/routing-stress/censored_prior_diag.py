"""Per cell of one simulated run: its share of requests, mean RIF, and the latency model its leaf published.

Wraps the simulator's :class:`~dlb.core.estimator.LatencyEstimator` to log every refit (the published model,
its confidence, the samples in the window, the requests still running and their mean age, and the median
of measured ÷ predicted latency over the window). Prints one line per cell (medians over refits after the
first 2 minutes), then the chosen cell's refits every 30 s: what found the 4-server cell of scenario 113000
published 0.23× the prior's time scale with no sample behind it (censored-prior-rule.md).

Usage: python research/routing-stress/censored_prior_diag.py SCENARIO POLICY [LENGTH_FACTOR [CELL [SLOWDOWN]]]
(batched server, 10 simulated minutes, trial 0; defaults 0.1, 5, 3).
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

import dlb.sim.engine as sim_engine
from dlb.core.fit import Censored, FitResult
from dlb.core.latency_model import latency
from dlb.sim.engine import SimConfig, simulate
from dlb.sim.scenario import generate

LOG: list[tuple[Any, ...]] = []


class LoggedEstimator(sim_engine.LatencyEstimator):
    """The simulator creates one per cell in cell order (generation 0 first)."""

    created = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cell = LoggedEstimator.created
        LoggedEstimator.created += 1

    def refit(self, now: float, in_flight: Censored | None = None) -> FitResult:
        res = super().refit(now, in_flight)
        running = 0 if in_flight is None else int(np.asarray(in_flight.rif).size)
        ratio = math.nan
        if len(self._lat):
            pred = latency(np.fromiter(self._rif, float), *self.params.as_array())
            ratio = float(np.median(np.fromiter(self._lat, float) / pred))
        age = float(np.mean(np.asarray(in_flight.age))) if in_flight is not None and running else 0.0
        LOG.append((self.cell, now, *self.params.as_array(), self.confidence, len(self._lat), running, ratio, age))
        return res


def main() -> None:
    scenario, policy = int(sys.argv[1]), sys.argv[2]
    y = float(sys.argv[3]) if len(sys.argv) > 3 else 0.1
    watch = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    slowdown = float(sys.argv[5]) if len(sys.argv) > 5 else 3.0
    sim_engine.LatencyEstimator = LoggedEstimator  # type: ignore[misc]
    sc = generate(scenario, duration_s=600.0, length_factor=y, server_model="batched")
    res = simulate(sc, policy, 0, SimConfig(admission_slowdown=slowdown))
    s = res.summary()
    print(f"{policy}: failures {100 * s['client_failure_rate']:.2f} %, mean {s['mean_latency_with_failures']:.2f} s")
    share = np.bincount(res.routed[res.routed >= 0], minlength=sc.n) / max(len(res.routed), 1)
    total = sum(sc.servers)
    for j in range(sc.n):
        rows = np.array([r[2:] for r in LOG if r[0] == j and r[1] > 120.0])
        head = (f"{j} {sc.names[j]} k={sc.servers[j]} share {share[j]:.3f} (servers {sc.servers[j] / total:.3f}) "
                f"rif {res.mean_rif[j]:.0f}")
        if rows.size == 0:
            print(head)
            continue
        med = [float(np.median(rows[~np.isnan(rows[:, i]), i])) if np.any(~np.isnan(rows[:, i])) else math.nan
               for i in range(rows.shape[1])]
        print(f"{head} a {med[0]:.1f} b {med[1]:.3f} c {med[2]:.1f} conf {med[4]:.2f} samples {med[5]:.0f} "
              f"running {med[6]:.0f} measured/predicted {med[7]:.2f} running age {med[8]:.1f}")
    print(f"prior of a {sc.servers[watch]}-server cell: {sc.prior(float(sc.servers[watch]))}")
    for r in LOG:
        if r[0] == watch and int(r[1]) % 30 < 5:
            t, a, b, c, s, conf, n, run, ratio, age = r[1:]
            print(f"t {t:.0f} a {a:.2f} b {b:.3f} c {c:.1f} s {s:.1f} conf {conf:.2f} samples {n} running {run} "
                  f"ratio {ratio:.2f} age {age:.1f}")


if __name__ == "__main__":
    main()
