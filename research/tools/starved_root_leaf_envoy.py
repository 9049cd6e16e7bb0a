"""The leaf Envoy kill row as the e2e test runs it, with a root Envoy access log and, optionally, the
root service stopped (SIGSTOP) for ``--stall-s`` 1 s into the outage: a starved root service.

Usage (the code under test is whichever ``dlb`` is imported: ``PYTHONPATH=<checkout>``)::

    python research/tools/starved_root_leaf_envoy.py --tag T --seed 21 --stall-s 0.5 --out DIR

Prints one JSON line (sent, the failure codes, those lost before their answer started, the verdict);
writes DIR/access-T.log (route, cluster, attempt count, response flags of every request) and
DIR/stats-T.json (the root Envoy's ext_proc and retry counters). research/operations.md uses it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
from typing import Any

from dlb.bench import faults
from dlb.envoy import bootstrap
from dlb.testbed import stack

FMT = ("[%START_TIME%] %ROUTE_NAME% cl=%UPSTREAM_CLUSTER% host=%UPSTREAM_HOST% code=%RESPONSE_CODE% flags=%RESPONSE_FLAGS% "
       "att=%UPSTREAM_REQUEST_ATTEMPT_COUNT% cell=%REQ(x-dlb-cell)% det=%RESPONSE_CODE_DETAILS% "
       "tfr=%UPSTREAM_TRANSPORT_FAILURE_REASON% dur=%DURATION% path=%REQ(:path)%\n")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tag", required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--stall-s", type=float, default=0.0)
    p.add_argument("--out", default=".")
    a = p.parse_args()
    log, stats = os.path.join(a.out, f"access-{a.tag}.log"), os.path.join(a.out, f"stats-{a.tag}.json")
    root_bootstrap, start_data_plane, fault_actions = bootstrap.root_bootstrap, stack.start_data_plane, faults._fault_actions

    def logged_root(*args: Any, **kw: Any) -> dict[str, Any]:
        boot = root_bootstrap(*args, **kw)
        for lis in boot["static_resources"]["listeners"]:
            for chain in lis["filter_chains"]:
                for f in chain["filters"]:
                    tc = f.get("typed_config", {})
                    if "route_config" in tc and tc.get("stat_prefix") == "dlb_root":
                        tc["access_log"] = [{"name": "envoy.access_loggers.file", "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                            "path": log, "log_format": {"text_format_source": {"inline_string": FMT}}}}]
        return boot

    def counted_plane(*args: Any, **kw: Any) -> Any:
        plane = start_data_plane(*args, **kw)
        close = plane.close

        def dump_then_close() -> None:
            with open(stats, "w") as fh:
                json.dump(plane.root_envoy.stats(r"ext_proc|retry|upstream_rq_(5|pending_fail|rx_reset|tx_reset)|cx_connect_fail"), fh,
                          indent=1, sort_keys=True)
            close()
        plane.close = dump_then_close
        return plane

    def starving(plane: Any, fault: str) -> tuple[Any, Any]:
        inject, restore = fault_actions(plane, fault)

        def stall() -> None:
            time.sleep(1.0)
            os.kill(plane.root.pid, signal.SIGSTOP)
            time.sleep(a.stall_s)
            os.kill(plane.root.pid, signal.SIGCONT)

        def inject_then_stall() -> None:
            inject()
            threading.Thread(target=stall, daemon=True).start()
        return (inject_then_stall if a.stall_s > 0 else inject), restore

    bootstrap.root_bootstrap, stack.start_data_plane, faults._fault_actions = logged_root, counted_plane, starving
    load = os.getloadavg()[0]
    row = faults.run_one("leaf_envoy", "ext_proc", faults.FaultLoad(rate=20.0, fault_at_s=3.0, outage_s=3.0, after_s=6.0, cells=(2, 2),
                                                                     seed=a.seed))
    lost = {c: n for c, n in row["failure_codes"].items() if c not in faults.ANSWERING}
    print(json.dumps({"tag": a.tag, "seed": a.seed, "stall_s": a.stall_s, "loadavg_1m": [round(load, 2), round(os.getloadavg()[0], 2)],
                      "sent": row["sent"], "lost": lost, "failure_codes": row["failure_codes"], "verdict": row["verdict"]}))


if __name__ == "__main__":
    main()
