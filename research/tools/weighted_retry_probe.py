"""Does a retry inside ``weighted_clusters`` stay on the cluster first picked? (Envoy 1.40: yes.)

Why: the native flow route retries a failed request once on another cell. If Envoy re-sampled the
weights on a retry, bare cell clusters would do; it does not, so each weight names an aggregate
(cell, fallback) and ``previous_priorities`` moves the retry to the fallback. One Envoy, three weighted
clusters (one a closed port), 300 requests, ``retry_on: connect-failure``, ``num_retries: 1``:

    .venv/bin/python research/tools/weighted_retry_probe.py bare   # the dead cluster's requests: 503
    .venv/bin/python research/tools/weighted_retry_probe.py agg    # retried on its fallback: 200
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

from dlb.envoy.binary import envoy_binary


def _free() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cluster(name: str, port: int) -> dict[str, Any]:
    return {"name": name, "type": "STATIC", "connect_timeout": "0.25s", "load_assignment": {"cluster_name": name, "endpoints": [
        {"lb_endpoints": [{"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}]}}


def _aggregate(name: str, clusters: list[str]) -> dict[str, Any]:
    return {"name": name, "connect_timeout": "1s", "lb_policy": "CLUSTER_PROVIDED", "cluster_type": {
        "name": "envoy.clusters.aggregate",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.clusters.aggregate.v3.ClusterConfig", "clusters": clusters}}}


def _listener(name: str, port: int, route: dict[str, Any]) -> dict[str, Any]:
    hcm = {"@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
           "stat_prefix": name,
           "route_config": {"virtual_hosts": [{"name": "x", "domains": ["*"], "routes": [dict(route, match={"prefix": "/"})]}]},
           "http_filters": [{"name": "envoy.filters.http.router",
                             "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}
    return {"name": name, "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
            "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}]}


def main(mode: str) -> dict[str, int]:
    front, up_a, up_b, dead, admin = (_free() for _ in range(5))
    clusters = [_cluster("cell-dead", dead), _cluster("cell-a", up_a), _cluster("cell-b", up_b)]
    retry: dict[str, Any] = {"retry_on": "connect-failure,refused-stream,reset", "num_retries": 1}
    names = ["cell-dead", "cell-a", "cell-b"]
    if mode == "agg":
        pairs = {"cell-dead": "cell-b", "cell-a": "cell-b", "cell-b": "cell-a"}
        clusters += [_aggregate(f"{c}.or.{fb}", [c, fb]) for c, fb in pairs.items()]
        names = [f"{c}.or.{fb}" for c, fb in pairs.items()]
        retry["retry_priority"] = {"name": "envoy.retry_priorities.previous_priorities", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.retry.priority.previous_priorities.v3.PreviousPrioritiesConfig",
            "update_frequency": 1}}
    route = {"route": {"weighted_clusters": {"clusters": [{"name": n, "weight": 1} for n in names]}, "retry_policy": retry}}
    answer = {name: {"direct_response": {"status": 200, "body": {"inline_string": name}}} for name in ("a", "b")}
    boot = {"admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
            "static_resources": {"listeners": [_listener("front", front, route), _listener("a", up_a, answer["a"]),
                                               _listener("b", up_b, answer["b"])], "clusters": clusters}}
    with tempfile.NamedTemporaryFile("w", suffix=".json") as fh:
        json.dump(boot, fh)
        fh.flush()
        proc = subprocess.Popen([envoy_binary(), "-c", fh.name, "--concurrency", "1", "-l", "error"])
        try:
            for _ in range(100):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{admin}/ready", timeout=1).read()
                    break
                except OSError:
                    time.sleep(0.1)
            got: dict[str, int] = {}
            for _ in range(300):
                try:
                    body = urllib.request.urlopen(f"http://127.0.0.1:{front}/x", timeout=5).read().decode()
                except OSError as e:
                    body = f"error {getattr(e, 'code', e)}"
                got[body] = got.get(body, 0) + 1
            return got
        finally:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    print(main(sys.argv[1] if len(sys.argv) > 1 else "agg"))
