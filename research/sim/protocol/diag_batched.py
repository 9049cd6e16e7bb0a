"""Issue 12 analysis: why Flow-Grad loses to Rand on the batched server (scenario 5000, trial 0).

Capacity and prior per cell, time-average routed share ÷ capacity and RIF per policy, and the share of one
cell per 20-s window (does the flow routing oscillate?). Run: python research/sim/protocol/diag_batched.py
(about 1 CPU-min)."""
import numpy as np

from dlb.sim.engine import SimConfig, simulate
from dlb.sim.scenario import generate

S = 5000
T = 0
sc = generate(S, duration_s=600.0, utilization=0.8, server_model="batched")
cap = sc.capacity()
print("cells", sc.n, "servers", sc.servers)
print("capacity r/s", np.round(cap,2), "sum", round(cap.sum(),2))
print("prior b (1/b r/s)", [round(1/sc.prior(k).b,2) for k in sc.servers])
runs = {pol: simulate(sc, pol, T, SimConfig()) for pol in ("Rand", "Disc-Lat", "Flow-Grad", "Flow-RIF")}
for pol, r in runs.items():
    routed = np.bincount(r.routed[r.routed>=0], minlength=sc.n)/600
    print(f"{pol:9s} mean {r.latency.mean():6.2f}  routed/cap {np.round(routed/cap,2)}  meanRIF {np.round(r.mean_rif,1)}")
print("share of cell 1 (13 servers, 33 % of capacity) per 20-s window, minutes 2-6:")
for pol in ("Disc-Lat","Flow-Grad"):
    r = runs[pol]
    b = (r.arrival_t // 20).astype(int)
    ok = r.routed >= 0
    sh = [float(np.mean(r.routed[(b == w) & ok] == 1)) for w in range(6, 18)]
    print(f"{pol:9s}", np.round(sh, 2))
