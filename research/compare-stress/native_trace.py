"""Trace a root's per-cell split per 200-ms window and the native root's pushed weights (tuning seeds only).

    .venv/bin/python research/compare-stress/native_trace.py SEED SCENARIO POLICY[,POLICY...] [SOURCE]

Registers ``POLICY[trace]`` (its base's random streams) whose roots record every pick and, for a
native root, every refresh's weights; prints, for the root of cell SOURCE (default 0), the mean split,
the mean absolute change of the split between consecutive 200-ms windows (the swing), and for a
native root the same of its normalised weights; and the run's mean latency.
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

TRACE: dict[int, dict[str, list]] = {}  # source → picks [(t, cell)], weights [(t, w)]


def register(name: str, native_kw: dict) -> str:
    base = name
    cfg = PolicyConfig.from_name(base.removesuffix("-native"))
    native = base.endswith("-native")

    def build(topology, source, prior, rng):  # type: ignore[no-untyped-def]
        rec = TRACE.setdefault(source, {"picks": [], "weights": []})
        router = RootRouter(topology, source, cfg, prior, rng)
        root = NativeDiscreteRoot(router, rng, **native_kw) if native else router
        pick = root.pick

        def traced_pick(now, session=None):  # type: ignore[no-untyped-def]
            c = pick(now, session)
            rec["picks"].append((now, c))
            return c

        root.pick = traced_pick  # type: ignore[method-assign]
        if native:
            refresh = root._refresh

            def traced_refresh(now):  # type: ignore[no-untyped-def]
                refresh(now)
                rec["weights"].append((now, np.asarray(root.weights, float).copy()))

            root._refresh = traced_refresh  # type: ignore[method-assign]
        return root

    key = f"{base}[trace]"
    policies.REGISTRY[key] = policies.PolicySpec(build, needs_model=cfg.cost is not Cost.RIF)
    policies.ALL_POLICIES = engine.ALL_POLICIES = tuple(policies.REGISTRY)
    return key


def windows(picks: list, n: int, dt: float = 0.2, start: float = 5.0) -> np.ndarray:
    t = np.array([p[0] for p in picks])
    c = np.array([p[1] for p in picks])
    ok = (c >= 0) & (t >= start)
    t, c = t[ok], c[ok]
    k = ((t - start) // dt).astype(int)
    m = np.zeros((k.max() + 1, n))
    np.add.at(m, (k, c), 1)
    return m


def main() -> None:
    seed, scn = int(sys.argv[1]), sys.argv[2]
    src = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    sc, arr = scenario_twin(scn, seed, 45.0)
    cfg = engine.SimConfig(request_timeout_s=REQUEST_TIMEOUT_S)
    for spec in sys.argv[3].split(","):
        base, _, arg = spec.partition("[")
        kw: dict = {}
        for x in filter(None, arg.rstrip("]").split(";")):
            k, v = x.split("=")
            kw[{"g": "sharpness", "pick": "pick", "wf": "fill_s"}.get(k, k)] = v if k == "pick" else float(v)
        TRACE.clear()
        key = register(base, kw)
        s = engine.simulate(sc, key, 0, cfg, arrivals=arr).summary()
        rec = TRACE[src]
        m = windows(rec["picks"], sc.n)
        tot = m.sum(1, keepdims=True)
        sh = m[tot[:, 0] > 0] / tot[tot[:, 0] > 0]
        swing = np.abs(np.diff(sh, axis=0)).sum(1).mean() / 2
        line = f"{spec:40s} mean {s['mean_latency_with_failures']:.3f} fail {s['error_rate'] + s['shed_rate']:.2%} "
        line += f"split {np.round(sh.mean(0), 3)} window-swing {swing:.3f}"
        if rec["weights"]:
            w = np.array([x[1] for x in rec["weights"] if x[0] >= 5.0])
            wn = w / w.sum(1, keepdims=True)
            line += f" | weights {np.round(wn.mean(0), 3)} weight-swing {np.abs(np.diff(wn, axis=0)).sum(1).mean() / 2:.3f}"
            line += f" top-cell changes {np.mean(np.diff(wn.argmax(1)) != 0):.2f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
