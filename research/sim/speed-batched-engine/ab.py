"""Interleaved A/B timing of batched-server runs of two code trees, for a shared box.

Usage (repository root): python research/sim/speed-batched-engine/ab.py TREE_A TREE_B ROUNDS OUT.json
One worker process per tree (the tree first on sys.path, checked); every run is executed ROUNDS times, alternately by A
then B (only one computes at a time), so both trees see the same load. Records each execution's wall
and CPU seconds, the load average, and a digest of the result (latencies, destinations, counts) that
must be equal for both trees. Runs: scenario 101 drawn with the batched server, 4 simulated minutes,
utilisation 0.8 and 0.95, policies Rand, Disc-Lat, Flow-Grad.
"""

import json
import os
import statistics
import subprocess
import sys

WORKER = r'''
import hashlib, json, sys, time
sys.path.insert(0, sys.argv[1])  # before '' (the working directory, which python -c puts first)
import numpy as np
import dlb
from dlb.sim.engine import simulate
from dlb.sim.scenario import generate
RUNS = [(u, p) for u in (0.8, 0.95) for p in ("Rand", "Disc-Lat", "Flow-Grad")]
print(json.dumps({"dlb": dlb.__file__, "runs": [f"util={u}/{p}" for u, p in RUNS]}), flush=True)
for line in sys.stdin:
    u, p = RUNS[int(line)]
    sc = generate(101, duration_s=240, utilization=u, server_model="batched")
    w, c = time.perf_counter(), time.process_time()
    r = simulate(sc, p)
    cpu, wall = time.process_time() - c, time.perf_counter() - w
    h = hashlib.sha256(np.ascontiguousarray(r.latency).tobytes() + np.ascontiguousarray(r.routed).tobytes())
    h.update(repr((r.arrivals, r.completed, r.errors, r.shed, r.events, r.preemptions)).encode())
    print(json.dumps({"cpu_s": cpu, "wall_s": wall, "events": r.events, "arrivals": r.arrivals,
                      "digest": h.hexdigest()[:16]}), flush=True)
'''


def commit(tree: str, side: str) -> str:
    """The tree's commit: $AB_COMMIT_A / $AB_COMMIT_B (for a tree exported with git archive), else git's."""
    if os.environ.get(f"AB_COMMIT_{side}"):
        return os.environ[f"AB_COMMIT_{side}"]
    try:
        return subprocess.run(["git", "-C", tree, "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    tree_a, tree_b, rounds, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    trees = [os.path.abspath(t) for t in (tree_a, tree_b)]
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, t], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              cwd=t) for t in trees]
    headers = [json.loads(p.stdout.readline()) for p in procs]  # read both workers' header lines
    for t, h in zip(trees, headers, strict=True):  # each side really imports its own tree
        assert h["dlb"].startswith(t + os.sep), f"{t}: imported {h['dlb']}"
    names = headers[0]["runs"]
    res: dict = {}
    for k, name in enumerate(names):
        sides: list[list[dict]] = [[], []]
        for _ in range(rounds):
            for side, p in enumerate(procs):
                assert p.stdin is not None and p.stdout is not None
                p.stdin.write(f"{k}\n")
                p.stdin.flush()
                rec = json.loads(p.stdout.readline())
                rec["load"] = os.getloadavg()[0]
                sides[side].append(rec)
        a, b = sides
        assert len({r["digest"] for r in a + b}) == 1, f"{name}: the trees' results differ"
        med = [statistics.median(r["cpu_s"] for r in s) for s in sides]
        res[name] = {"a": a, "b": b, "cpu_median_a": med[0], "cpu_median_b": med[1],
                     "cpu_min_a": min(r["cpu_s"] for r in a), "cpu_min_b": min(r["cpu_s"] for r in b),
                     "wall_median_a": statistics.median(r["wall_s"] for r in a),
                     "wall_median_b": statistics.median(r["wall_s"] for r in b)}
        print(f"{name:22} CPU-s median A {med[0]:.2f} B {med[1]:.2f} ({med[0] / med[1]:.2f}×), min A "
              f"{res[name]['cpu_min_a']:.2f} B {res[name]['cpu_min_b']:.2f}; wall median A "
              f"{res[name]['wall_median_a']:.2f} B {res[name]['wall_median_b']:.2f}; load {a[-1]['load']:.1f}", flush=True)
    for p in procs:
        assert p.stdin is not None
        p.stdin.close()
        p.wait()
    doc = {"a_commit": commit(tree_a, "A"), "b_commit": commit(tree_b, "B"),
           "command": f"python research/sim/speed-batched-engine/ab.py TREE_A TREE_B {rounds} OUT.json",
           "rounds": rounds, "runs": res}
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
