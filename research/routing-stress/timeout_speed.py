"""CPU seconds of one simulator run, old code or new: the outage experiment's scenario 31000 (tuning seed
31), trial 0, 10 simulated minutes, batched server. Prints one JSON line with the CPU time, the events
and the headline figures.

Usage: python research/routing-stress/timeout_speed.py POLICY [cancel|serve]
(no mode: the code on PYTHONPATH predates ``SimConfig.timeouts``; run it from outside the worktree with
PYTHONPATH pointing at an export of the old dlb/, e.g. ``git archive a71bdb9 dlb | tar -x -C /tmp/old``).
"""

import json
import sys
import time

from dlb.sim.engine import SimConfig, simulate
from dlb.sim.scenario import generate

pol = sys.argv[1]
kw = {"timeouts": sys.argv[2]} if len(sys.argv) > 2 else {}
sc = generate(31000, disruption="outage", duration_s=600.0, server_model="batched")
c0 = time.process_time()
res = simulate(sc, pol, 0, SimConfig(**kw))
cpu = time.process_time() - c0
s = res.summary()
print(json.dumps({"policy": pol, "kw": kw, "cpu_s": round(cpu, 2), "events": s["events"], "arrivals": s["arrivals"],
                  "mean_f": s["mean_latency_with_failures"], "timed_out_rate": s["timed_out_rate"],
                  "error_rate": s["error_rate"], "server_model": s["server_model"]}))
