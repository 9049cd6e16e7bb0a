"""Tune native-discrete on seeds the evaluation does not use (research/native-discrete-rule.md).

Runs the twin's scenario shapes (dlb.bench.sim_twin.scenario_twin) with workload seeds given here
(the evaluation uses the real runs' seeds 11–16 + 1000·trial) and prints each policy's mean
(failures at the 60-s timeout) ÷ the first policy's. Variants of a native policy take parameters in
brackets, ``;``-separated: ``Disc-Lat-native[g=32;lb=ROUND_ROBIN;p=0.2;b=1]`` (g sharpness γ,
lb the root Envoy's lb_policy, p the refresh period in s, b LEAST_REQUEST's active_request_bias,
f the water-filling horizon fill_s in s).

    .venv/bin/python research/compare-stress/native_tune.py 101,102,103 Disc-Lat,Disc-Lat-native steady,slow-cell

``twin POLICIES FILE``: the evaluation instead, ``dlb bench sim-twin --policies POLICIES --json FILE``
with the variants registered (every scenario, trials 0–2 on the real runs' seeds).
"""

from __future__ import annotations

import sys

import numpy as np

from dlb.bench.sim_twin import scenario_twin
from dlb.core.costs import Cost
from dlb.core.native_discrete import NativeDiscreteRoot
from dlb.core.router import PolicyConfig, RootRouter
from dlb.sim import engine, policies
from dlb.testbed.scenarios import REQUEST_TIMEOUT_S


def register(name: str) -> None:
    """Add ``Base-native[k=v;...]`` to the simulator's registry (same random streams as its base)."""
    if name in policies.REGISTRY:
        return
    base, arg = name.split("[", 1)
    kv = dict(x.split("=") for x in arg.rstrip("]").split(";"))
    cfg = PolicyConfig.from_name(base.removesuffix("-native"))

    def build(topology, source, prior, rng):  # type: ignore[no-untyped-def]
        kw = {"sharpness": float(kv["g"])} if "g" in kv else {}
        kw |= {"period_s": float(kv["p"])} if "p" in kv else {}
        kw |= {"active_request_bias": float(kv["b"])} if "b" in kv else {}
        kw |= {"lb_policy": kv["lb"]} if "lb" in kv else {}
        kw |= {"fill_s": float(kv["f"])} if "f" in kv else {}
        return NativeDiscreteRoot(RootRouter(topology, source, cfg, prior, rng), rng, **kw)  # type: ignore[arg-type]

    policies.REGISTRY[name] = policies.PolicySpec(build, needs_model=cfg.cost is not Cost.RIF)
    policies.ALL_POLICIES = engine.ALL_POLICIES = tuple(policies.REGISTRY)


def twin(pols: list[str], out: str) -> None:
    """The evaluation: ``dlb bench sim-twin``'s run with variants registered."""
    import argparse

    from dlb.bench import sim_twin
    from dlb.testbed.scenarios import SCENARIOS

    for p in pols:
        if "[" in p:
            register(p)
    sim_twin.run(argparse.Namespace(real=None, scenarios=list(SCENARIOS), policies=pols, trials=3, duration=45.0, json=out))


def main() -> None:
    if sys.argv[1] == "twin":
        twin(sys.argv[2].split(","), sys.argv[3])
        return
    seeds = [int(x) for x in sys.argv[1].split(",")]
    pols, scenarios = sys.argv[2].split(","), sys.argv[3].split(",")
    for p in pols:
        if "[" in p:
            register(p)
    cfg = engine.SimConfig(request_timeout_s=REQUEST_TIMEOUT_S)
    for scn in scenarios:
        res: dict[str, list[tuple[float, float]]] = {p: [] for p in pols}
        for sd in seeds:
            sc, arr = scenario_twin(scn, sd, 45.0)
            for p in pols:
                s = engine.simulate(sc, p, 0, cfg, arrivals=arr).summary()
                res[p].append((s["mean_latency_with_failures"], s["error_rate"] + s["shed_rate"]))
        base = float(np.mean([m for m, _ in res[pols[0]]]))
        for p in pols:
            m = float(np.mean([m for m, _ in res[p]]))
            e = float(np.mean([e for _, e in res[p]]))
            print(f"{scn:12s} {p:40s} mean {m:6.3f}  ÷ {pols[0]} {m / base:.3f}  failed {e:.2%}", flush=True)


if __name__ == "__main__":
    main()
