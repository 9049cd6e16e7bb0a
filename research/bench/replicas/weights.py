"""How far apart the flow weights of two active-active control-plane replicas are, under load.

Each replica probes every leaf on its own schedule and steps its own flow loop, so their weights are
not bit-identical; what a node sees when it re-homes is the other replica's weights. Starts the test
stack (:func:`dlb.testbed.stack.start_data_plane`, cells a/b/c with 3/2/2 fast-test servers, ``a`` the
root's, 20/40 ms away) with two replicas and a Flow-Grad endpoint, sends chat requests at ``--rate``
for ``--seconds``, reads both replicas' ``/fleet`` every 0.25 s and reports, per sample, the largest
absolute difference between their weights of the same (source, destination) pair.

Usage: ``python research/bench/replicas/weights.py --json FILE``
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import urllib.request

from dlb.bench import harness
from dlb.testbed.stack import CellSpec, request, start_data_plane


def fleet(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/fleet", timeout=2) as r:
        return dict(json.loads(r.read()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    record = harness.start(command=f"python research/bench/replicas/weights.py --rate {args.rate:g} --seconds {args.seconds:g}")
    endpoint = {"name": "chat", "match": {"prefix": "/v1/"}, "policy": {"mechanism": "flow", "cost": "gradient"},
                "latency_prior": {"a_s": 0.2, "b_s": 0.02, "c": 8, "s": 2}}
    cells = [CellSpec("a", 3), CellSpec("b", 2), CellSpec("c", 2)]
    plane = start_data_plane(cells, "a", endpoint, one_way_ms={"a": {"b": 20.0, "c": 40.0}}, control_plane=True, control_planes=2,
                             probe={"period_ms": 20, "timeout_ms": 200, "stale_after_ms": 1000, "backoff_max_ms": 500})
    try:
        assert plane.control_plane is not None
        urls = [f"http://{plane.cfg.services.control_plane.status}"]
        more = plane.more_control_planes[0].args
        urls.append(f"http://{more[more.index('--status') + 1]}")
        stop = threading.Event()
        sent: dict[str, int] = {}

        def send() -> None:
            host, port = plane.root_url
            while not stop.is_set():
                t0 = time.monotonic()
                try:
                    status, _, body = request(host, port, timeout=20)
                    why = str(status) if status == 200 else f"{status} {body[:60].decode(errors='replace')}"
                except OSError as e:
                    why = type(e).__name__
                sent[why] = sent.get(why, 0) + 1
                time.sleep(max(0.0, 4 / args.rate - (time.monotonic() - t0)))

        workers = [threading.Thread(target=send, daemon=True) for _ in range(4)]
        for w in workers:
            w.start()
        time.sleep(5.0)  # warm-up: probes fresh, first flow steps
        diffs, spans = [], []
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            a, b = (fleet(u)["flow_weights"].get("chat", {}) for u in urls)
            pairs = [(a[s][d], b[s][d]) for s in a if s in b for d in a[s] if d in b[s]]
            if pairs:
                diffs.append(max(abs(x - y) for x, y in pairs))
                spans.append(max(x for x, _ in pairs))
            time.sleep(0.25)
        stop.set()
        for w in workers:
            w.join(30)
    finally:
        plane.close()
    diffs.sort()
    out = {"rate_rps": args.rate, "seconds": args.seconds, "samples": len(diffs), "requests": sent,
           "max_abs_weight_diff": {"median": statistics.median(diffs), "p95": diffs[int(0.95 * (len(diffs) - 1))], "max": diffs[-1]}
           if diffs else None}
    print(json.dumps(out, indent=1))
    return harness.finish(record, out, [], json_path=args.json)


if __name__ == "__main__":
    raise SystemExit(main())
