"""Issue 12 analysis: why the flow policies lose their gain at noise eps = 0.1 (scenario 5002, trial 0).

Per-cell arrivals, losses and time-average RIF for Flow-Grad and Disc-Grad, with and without the noise.
Run: python research/sim/protocol/diag_noise.py (about 15 CPU-s)."""
import numpy as np

from dlb.sim.engine import SimConfig, simulate
from dlb.sim.scenario import generate

S = 5002
T = 0
for eps in (0.0, 0.1):
    sc = generate(S, duration_s=600.0, utilization=0.8, noise_eps=eps)
    n = sc.n
    # the per-cell factors the engine draws (dlb/sim/engine.py, simulate(): stream [seed, trial, 3])
    noise = 1.0 + eps*np.random.default_rng([sc.seed, T, 3]).uniform(-1,1,n)
    for pol in ("Flow-Grad","Disc-Grad"):
        r = simulate(sc, pol, T, SimConfig())
        routed = np.bincount(r.routed[r.routed>=0], minlength=n)
        served = r.per_cell_served
        print(f"eps={eps} {pol}: mean {r.latency.mean():.3f} err {r.errors/r.arrivals*100:.2f}%")
        print("  factor ", np.round(noise,3))
        print("  routed ", routed)
        print("  lost   ", routed - served)
        print("  meanRIF", np.round(r.mean_rif,1))
