"""Does the fill's rate estimate explain its cell-outage regression? The fill with the true offered rate.

research/native-discrete.md left a reading untested: during an outage the fill's Λ̂ (the fleet's rate from
probes by Little's law) falls with the lost cell's throughput while the offered rate does not, so the fill
under-spreads. Here the fill runs twice on the twin's shapes (tuning seeds, trial 0): with Λ̂ as shipped,
and with Λ̂ replaced by the scenario's true offered rate. Also printed: Λ̂ ÷ the offered rate (median,
10th percentile over the fill's refreshes). Means ÷ ext_proc Disc-Lat's, failures in %.

Usage: python research/compare-stress/native_fill_rate.py 101,102,103,104,105,106 steady,cell-outage,slow-cell
"""

from __future__ import annotations

import sys
from typing import Any

import native_tune  # this folder's variant registry (the script's dir is on sys.path)
import numpy as np

from dlb.bench.sim_twin import scenario_twin
from dlb.core import native_discrete
from dlb.sim import engine
from dlb.testbed.scenarios import REQUEST_TIMEOUT_S

_shipped = native_discrete.fleet_rate
STATE: dict[str, Any] = {"oracle": False, "rate": 0.0, "log": []}


def _rate(*args: Any, **kw: Any) -> float:
    lam = _shipped(*args, **kw)
    STATE["log"].append(lam)
    return float(STATE["rate"]) if STATE["oracle"] else float(lam)


native_discrete.fleet_rate = _rate  # type: ignore[assignment]
FILL = "Disc-Lat-native[g=32;lb=ROUND_ROBIN;f=0.5]"
RR = "Disc-Lat-native[g=32;lb=ROUND_ROBIN]"
ARMS = (("Disc-Lat", "Disc-Lat", False), ("round-robin", RR, False), ("fill", FILL, False), ("fill, true rate", FILL, True))


def main() -> None:
    for p in (FILL, RR):
        native_tune.register(p)
    cfg = engine.SimConfig(request_timeout_s=REQUEST_TIMEOUT_S)
    seeds = [int(x) for x in sys.argv[1].split(",")]
    for scn in sys.argv[2].split(","):
        res: dict[str, list[tuple[float, float]]] = {name: [] for name, _, _ in ARMS}
        ratio = []
        for sd in seeds:
            sc, arr = scenario_twin(scn, sd, 45.0)
            for name, pol, oracle in ARMS:
                STATE.update(oracle=oracle, rate=float(sc.demand.sum()), log=[])
                s = engine.simulate(sc, pol, 0, cfg, arrivals=arr).summary()
                res[name].append((s["mean_latency_with_failures"], s["error_rate"] + s["shed_rate"]))
                if name == "fill":
                    lam = np.asarray(STATE["log"]) / sc.demand.sum()
                    ratio.append((float(np.median(lam)), float(np.percentile(lam, 10))))
        base = float(np.mean([m for m, _ in res["Disc-Lat"]]))
        cols = "  ".join(f"{k} {np.mean([m for m, _ in v]) / base:.3f} ({100 * np.mean([e for _, e in v]):.2f} %)" for k, v in res.items())
        med, p10 = np.mean(ratio, axis=0)
        print(f"{scn}: {cols}  | fill's rate ÷ offered: median {med:.2f}, p10 {p10:.2f}")


if __name__ == "__main__":
    main()
