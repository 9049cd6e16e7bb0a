"""Early shedding through a real root Envoy and ``dlb serve root`` (dlb.core.shedding).

Rule: when every cell the root may use reports a full buffer (probe ``rif`` at its ``capacity``), a
client gets, from the root Envoy, a 429 with ``retry-after`` and an OpenAI-shaped body coded
``dlb_no_capacity``, and the root's ``dlb_root_shed`` counter rises; when one cell has room, the
request is routed there. The leaves are stand-ins: a gRPC probe server per cell whose answer the test
sets, and an HTTP echo server per cell as the leaf Envoy.
"""

from __future__ import annotations

import http.client
import json
import threading
import urllib.request
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from bounded_wait import until
from test_envoy_configs import echo_servers, running_envoy

from dlb.config import config_from_dict
from dlb.envoy.bootstrap import root_bootstrap
from dlb.procutil import free_port
from dlb.proto import probe_pb2, probe_pb2_grpc
from dlb.testbed.process import ServiceProcess

pytestmark = [pytest.mark.envoy, pytest.mark.timeout(120)]


class _Leaf(probe_pb2_grpc.ProbeServicer):
    """A leaf's probe answer, set by the test: RIF and the capacity of a cell with one healthy server."""

    def __init__(self, cell: str) -> None:
        self.cell = cell
        self.rif = 0.0
        self.capacity: float | None = None
        self.lock = threading.Lock()

    def Probe(self, request: probe_pb2.ProbeRequest, context: Any) -> probe_pb2.ProbeResponse:
        with self.lock:
            return probe_pb2.ProbeResponse(cell=self.cell, rif=self.rif, replicas=1, healthy_replicas=1, capacity=self.capacity,
                                           model=probe_pb2.LatencyModel(a_s=0.5, b_s=0.1, c=2, s=1, confidence=1))

    def set(self, rif: float, capacity: float | None) -> None:
        with self.lock:
            self.rif, self.capacity = rif, capacity


def _post(port: int) -> tuple[int, dict[str, str], dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        conn.request("POST", "/v1/chat/completions", body=b'{"model":"m"}', headers={"content-type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, json.loads(raw) if raw else {}
    finally:
        conn.close()


def _shed_count(metrics_port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith('dlb_root_shed_total{') and 'endpoint="chat"' in line and 'source_cell="a"' in line)


def test_all_cells_saturated_gives_429_with_retry_after_and_one_with_room_is_used(tmp_path: Path) -> None:
    with echo_servers("a", "b") as ports:
        probes = {n: free_port() for n in ports}
        doc = {"version": 1, "network": {"default_one_way_ms": 5},
               "cells": [{"name": n, "leaf": {"address": f"127.0.0.1:{ports[n]}", "probe": f"127.0.0.1:{probes[n]}"},
                          "servers": [f"127.0.0.1:{free_port()}"],
                          **({"root": {"address": f"127.0.0.1:{free_port()}", "ext_proc": f"127.0.0.1:{free_port()}"}} if n == "a" else {})}
                         for n in ports],
               "endpoints": [{"name": "chat", "match": {"prefix": "/v1/"}, "policy": {"plugins": [{"type": "discrete", "parameters": {"cost": "rif"}}]}}]}
        path = tmp_path / "dlb.yaml"
        path.write_text(yaml.safe_dump(doc))
        cfg = config_from_dict(doc, str(path))
        leaves = {n: _Leaf(n) for n in ports}
        for leaf in leaves.values():
            leaf.set(10, 10)  # every buffer full
        server = grpc.server(futures.ThreadPoolExecutor(4))
        for n, leaf in leaves.items():
            probe_pb2_grpc.add_ProbeServicer_to_server(leaf, server)
            server.add_insecure_port(f"127.0.0.1:{probes[n]}")
        server.start()
        metrics_port = free_port()
        root_port = cfg.cell("a").root.address.port
        try:
            with ServiceProcess("root", "--config", str(path), "--cell", "a", "--metrics", f"127.0.0.1:{metrics_port}"), \
                    running_envoy(root_bootstrap(cfg, "a", admin_port=free_port()), tmp_path, "root"):
                _, headers, body = until(lambda: (r := _post(root_port))[0] == 429 and r, "a shed reply", timeout=30)
                assert 1 <= int(headers["retry-after"]) <= 30 and headers["content-type"] == "application/json"
                err = body["error"]
                assert err["code"] == "dlb_no_capacity" and err["type"] == "service_unavailable" and err["message"].startswith("dlb: ")
                assert _shed_count(metrics_port) >= 1
                # Room in cell b: routed there, not shed.
                leaves["b"].set(3, 10)
                _, _, body = until(lambda: (r := _post(root_port))[0] == 200 and r, "a routed reply", timeout=30)
                assert body["name"] == "b", body
                # An older leaf (no capacity): never shed on, whatever its RIF.
                leaves["b"].set(1000, None)
                shed = _shed_count(metrics_port)
                assert until(lambda: _post(root_port)[0] == 200 and _post(root_port)[0] == 200, "no shed on unknown capacity", timeout=30)
                assert _shed_count(metrics_port) <= shed + 2  # at most the requests before the new probe landed
        finally:
            server.stop(0)
