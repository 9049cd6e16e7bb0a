"""Interleaved A/B timing of bench.py's runs, for a shared box where load swings within minutes.

Usage: python ab.py TREE_A TREE_B MINUTES REPEAT OUT.json [NAME_FILTER] — one worker process per code tree
(PYTHONPATH=TREE); for each run, REPEAT times: A runs it, then B (only one computes at a time), and each
side keeps its smallest CPU time. Prints the comparison table (events per CPU-second) and checks that
both trees give the same result digest for every run."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = r'''
import sys, time, json
sys.path.insert(0, sys.argv[1])
from bench import runs, digest
from dlb.sim.engine import simulate
todo = [r for r in runs(float(sys.argv[2])) if sys.argv[3] in r[0]]
print(json.dumps([r[0] for r in todo]), flush=True)
for line in sys.stdin:
    name, sc, p, cfg = todo[int(line)]
    c0 = time.process_time()
    r = simulate(sc, p, 0, cfg)
    print(json.dumps({"cpu_s": time.process_time() - c0, "events": r.events, "digest": digest(r)}), flush=True)
'''


def main() -> None:
    tree_a, tree_b, minutes, repeat, out = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    flt = sys.argv[6] if len(sys.argv) > 6 else ""
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, HERE, minutes, flt], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=t)) for t in (tree_a, tree_b)]
    headers = [json.loads(p.stdout.readline()) for p in procs]  # read each worker's header line
    names = headers[0]  # both workers list the same runs
    res = {}
    for k, name in enumerate(names):
        best = [None, None]
        for _ in range(repeat):
            for side, p in enumerate(procs):
                p.stdin.write(f"{k}\n")
                p.stdin.flush()
                r = json.loads(p.stdout.readline())
                if best[side] is None or r["cpu_s"] < best[side]["cpu_s"]:
                    best[side] = r
        res[name] = {"a": best[0], "b": best[1]}
        print(f"{name:40s} {best[0]['cpu_s']:6.2f} {best[1]['cpu_s']:6.2f} {best[0]['cpu_s'] / best[1]['cpu_s']:5.2f}x "
              f"{'same' if best[0]['digest'] == best[1]['digest'] else 'DIFFERENT'}", flush=True)
    for p in procs:
        p.stdin.close()
        p.wait()
    with open(out, "w") as fh:
        json.dump(res, fh, indent=1)
    groups: dict[str, list[float]] = {}
    for name, r in res.items():
        g = groups.setdefault(name.rsplit("/", 1)[0], [0, 0.0, 0.0])
        g[0] += r["a"]["events"]
        g[1] += r["a"]["cpu_s"]
        g[2] += r["b"]["cpu_s"]
    same = sum(r["a"]["digest"] == r["b"]["digest"] for r in res.values())
    print(f"identical digests: {same} of {len(res)}")
    print("| runs | events | CPU-s A | CPU-s B | events/CPU-s A | B | B faster by |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    tot = [0, 0.0, 0.0]
    for g, (ev, ca, cb) in groups.items():
        tot = [tot[0] + ev, tot[1] + ca, tot[2] + cb]
        print(f"| {g} | {ev} | {ca:.2f} | {cb:.2f} | {ev / ca:.0f} | {ev / cb:.0f} | {ca / cb:.2f}x |")
    print(f"| all | {tot[0]} | {tot[1]:.2f} | {tot[2]:.2f} | {tot[0] / tot[1]:.0f} | {tot[0] / tot[2]:.0f} | {tot[1] / tot[2]:.2f}x |")


if __name__ == "__main__":
    main()
