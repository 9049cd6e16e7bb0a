"""``dlb serve epp`` as a process: gRPC health by GIE's service names, the probe a DLB root reads, the drain.

The health rules (GIE ``004-endpoint-picker-protocol``, "Health Checking"): ``liveness`` SERVING while the
process answers; ``readiness`` and ``envoy.service.ext_proc.v3.ExternalProcessor`` SERVING only while it
can take requests; an unknown name SERVICE_UNKNOWN.
"""

from __future__ import annotations

import signal
from pathlib import Path

import grpc
import pytest
import yaml
from bounded_wait import until

from dlb.epp import health
from dlb.procutil import free_port
from dlb.proto import probe_pb2, probe_pb2_grpc
from dlb.testbed.process import ServiceProcess

pytestmark = pytest.mark.timeout(120)


def check(channel: grpc.Channel, service: str) -> bytes:
    call = channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=None, response_deserializer=None)
    return call(b"\x0a" + bytes([len(service)]) + service.encode() if service else b"", timeout=5)


def test_health_names_probe_and_drain(tmp_path: Path) -> None:
    port = free_port()
    cfg = {"version": 1, "cells": [{"name": "pool", "leaf": {"address": f"127.0.0.1:{free_port()}", "probe": f"127.0.0.1:{port}"},
                                    "servers": ["127.0.0.1:1", "127.0.0.1:2"]}],
           "endpoints": [{"name": "chat", "match": {"prefix": "/v1/"}}]}
    (tmp_path / "dlb.yaml").write_text(yaml.safe_dump(cfg))
    with ServiceProcess("epp", "--config", str(tmp_path / "dlb.yaml"), "--cell", "pool", "--drain-s", "30",
                        "--scrape-period-ms", "0") as epp, grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        names = ("liveness", "readiness", health.EXT_PROC_SERVICE, "", "inference-extension")
        assert [check(ch, n) for n in names] == [health.SERVING] * 4 + [health.SERVICE_UNKNOWN]
        p = probe_pb2_grpc.ProbeStub(ch).Probe(probe_pb2.ProbeRequest(source_cell="root"), timeout=5)
        assert p.cell == "pool" and p.replicas == 2 and p.rif == 0 and p.HasField("model")
        assert epp.proc is not None
        epp.proc.send_signal(signal.SIGTERM)  # draining: not ready for new requests, still alive
        until(lambda: check(ch, "readiness") == health.NOT_SERVING, "readiness turns NOT_SERVING on SIGTERM")
        assert check(ch, health.EXT_PROC_SERVICE) == health.NOT_SERVING and check(ch, "liveness") == health.SERVING
