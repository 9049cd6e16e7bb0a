"""Does a native-discrete root's one retry leave a cell that just went down? (research/native-discrete.md)

Two cells of one emulated server each under ``dlb up``, endpoint ``native-discrete`` with ``pick:
round-robin`` (γ = 32): us-east1 (the root's cell) runs ``--slowdown`` × slower, so the control plane's
weights put nearly everything on us-west1. After a warm-up, us-west1's server starts answering 503
(``down``) and clients send at once, before the next weight push. Counts what reached the clients, and
(``--watch``) how the root Envoy's view of us-west1 changed after the fault: its health flags, weight and
requests sent there (``rq_total``, retries included), polled from the admin ``/clusters`` every 50 ms.
Run it from the tree under test (``PYTHONPATH`` = that tree; ``dlb up`` is started from it too)::

    PYTHONPATH=TREE .venv/bin/python research/tools/native_outage_retry.py --trials 3 --json FILE
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from dlb.emulator.faults import Faults
from dlb.emulator.server import ThreadedEmulator
from dlb.testbed.fleet import CellPlan, Fleet, demo_config
from dlb.testbed.stack import closed_loops

BODY = {"model": "dlb-emulated", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def weights(admin: str) -> dict[str, int]:
    with urllib.request.urlopen(f"http://{admin}/clusters", timeout=5) as r:
        text = r.read().decode()
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^dlb-native\.chat::([\d.:]+)::weight::(\d+)$", text, re.M)}


def host_view(admin: str, host: str) -> tuple[str, int, int]:
    """(health flags, weight, rq_total) of ``host`` in the root Envoy's native cluster."""
    with urllib.request.urlopen(f"http://{admin}/clusters", timeout=5) as r:
        text = r.read().decode()
    got = dict(re.findall(rf"^dlb-native\.chat::{re.escape(host)}::(health_flags|weight|rq_total)::(\S+)$", text, re.M))
    return got.get("health_flags", "?"), int(got.get("weight", -1)), int(got.get("rq_total", -1))


def watch(admin: str, host: str, seconds: float, out: list[tuple[float, str, int, int]]) -> None:
    """Append (time since the fault, flags, weight, rq_total) of ``host`` every 50 ms for ``seconds``."""
    import time

    start = time.monotonic()
    while (t := time.monotonic() - start) < seconds:
        out.append((round(t, 3), *host_view(admin, host)))
        time.sleep(0.05)


def trial(slowdown: float, warmup_s: float, burst_clients: int, burst_s: float, watch_s: float = 0.0) -> dict[str, object]:
    with (ThreadedEmulator(server_id="a/0", profile="fast-test", faults=Faults(slowdown=slowdown)) as ea,
          ThreadedEmulator(server_id="b/0", profile="fast-test") as eb, tempfile.TemporaryDirectory() as tmp):
        fleet = Fleet(cells=(CellPlan("us-east1", 1, "fast-test", root=True), CellPlan("us-west1", 1, "fast-test")))
        cfg = demo_config(fleet, {"us-east1": [ea.address], "us-west1": [eb.address]})
        for ep in cfg["endpoints"]:
            ep["policy"] = {"plugins": [{"type": "native-discrete", "parameters": {"cost": "latency", "pick": "round-robin"}}]}
        path = Path(tmp) / "dlb.yaml"
        path.write_text(json.dumps(cfg))
        proc = subprocess.Popen([sys.executable, "-m", "dlb.cli", "up", "--config", str(path), "--run-dir", str(Path(tmp) / "run")],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            assert proc.stdout is not None
            out = ""
            for line in proc.stdout:
                out += line
                if "Ctrl-C stops everything" in line:
                    break
            m = re.search(r"root us-east1: base_url http://([\d.]+):(\d+)/v1", out)
            admin_m = re.search(r"root us-east1: base_url \S+  metrics \S+  admin http://([\d.]+:\d+)/", out)
            assert m and admin_m, out
            host, port, admin = m.group(1), int(m.group(2)), admin_m.group(1)
            warm = closed_loops(host, port, 4, warmup_s, BODY)
            before = weights(admin)
            down_leaf = cfg["cells"][1]["leaf"]["address"]
            seen: list[tuple[float, str, int, int]] = []
            import threading

            watcher = threading.Thread(target=watch, args=(admin, down_leaf, watch_s, seen))
            eb.set_faults(down=True)
            watcher.start()
            burst = closed_loops(host, port, burst_clients, burst_s, BODY)
            watcher.join()
            flagged = next((t for t, flags, _, _ in seen if flags != "healthy"), None)
            return {"warmup": warm, "weights_before_down": before, "burst": burst,
                    "burst_failed": sum(v for k, v in burst.items() if k.startswith("status")), "burst_requests": sum(burst.values()),
                    "down_host": down_leaf, "watch": seen, "unhealthy_after_s": flagged,
                    "sent_after_down": seen[-1][3] - seen[0][3] if seen else None}
        finally:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(60)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--slowdown", type=float, default=4.0)
    p.add_argument("--warmup", type=float, default=15.0)
    p.add_argument("--burst-clients", type=int, default=8)
    p.add_argument("--burst", type=float, default=1.5)
    p.add_argument("--watch", type=float, default=0.0, help="seconds to poll the down cell's view in the root Envoy")
    p.add_argument("--json", required=True)
    a = p.parse_args()
    import dlb

    runs = []
    for k in range(a.trials):
        r = trial(a.slowdown, a.warmup, a.burst_clients, a.burst, a.watch)
        print(f"trial {k}: weights {r['weights_before_down']} burst {r['burst']} unhealthy after {r['unhealthy_after_s']} s, "
              f"sent there after the fault {r['sent_after_down']}", flush=True)
        runs.append(r)
    Path(a.json).write_text(json.dumps({"dlb": str(Path(dlb.__file__).parent), "loadavg": os.getloadavg(),
                                        "args": vars(a), "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
