"""Where one simulated run's time goes without a profiler: perf_counter accumulators around the engine, the roots and
the fit. Usage: PYTHONPATH=TREE python split.py EXPERIMENT VARIANT POLICY MINUTES (scenario 1000, batched server)."""
import sys
from time import perf_counter

from dlb.core import baselines, estimator, router
from dlb.sim import batched
from dlb.sim.engine import SimConfig, simulate
from dlb.sim.experiments import EXPERIMENTS, Job
from dlb.sim.scenario import generate

acc = {}
def wrap(cls, name, label):
    f = getattr(cls, name)
    def g(*a, **k):
        t = perf_counter()
        try:
            return f(*a, **k)
        finally:
            acc[label] = acc.get(label, 0.0) + perf_counter() - t
    setattr(cls, name, g)
wrap(batched.BatchedServers, "wake", "engine.wake")
wrap(batched.BatchedServers, "arrive", "engine.arrive")
wrap(router.RootRouter, "pick", "root.pick")
wrap(router.RootRouter, "on_probe", "root.on_probe")
wrap(router.RootRouter, "tick", "root.tick")
wrap(baselines.WeightedRouter, "pick", "weighted.pick")
wrap(estimator.LatencyEstimator, "refit", "est.refit")
wrap(estimator.LatencyEstimator, "record", "est.record")
exp, label, pol, minutes = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
var = next(v for v in EXPERIMENTS[exp] if v.label == label)
job = Job(exp, var, 1000, 0, pol, minutes * 60.0, server_model="batched")
sc = generate(job.scenario, duration_s=job.duration_s, **job.scenario_kwargs())
t0 = perf_counter()
res = simulate(sc, pol, 0, SimConfig())
tot = perf_counter() - t0
print(f"{label} {pol} total {tot:.2f}s " + " ".join(f"{k} {v/tot:.0%}" for k, v in sorted(acc.items(), key=lambda x: -x[1])))
