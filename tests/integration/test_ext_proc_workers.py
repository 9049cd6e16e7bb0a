"""``dlb serve root --workers 2``: two processes share the ext_proc port (SO_REUSEPORT), both serve
streams, and stopping the first stops the other."""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

import grpc
import pytest
from bounded_wait import until
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from service_fixtures import CellPorts

from dlb.testbed.process import ServiceProcess, free_port
from dlb.testbed.stack import metric_value

pytestmark = pytest.mark.timeout(120)


def _one_cell_config(make_config) -> Path:
    """A one-cell config, no root, whose leaf never answers (the workers' replies are the documented 503)."""
    return make_config({"a": CellPorts()}, [{"name": "chat", "match": {"prefix": "/v1/"}}], roots={},
                       network={"default_one_way_ms": 0})


def _expect_gone(pid: int, why: str) -> None:
    """Wait (bounded) for ``pid`` to exit; if it does not, kill it (nothing left behind) and fail with ``why``."""
    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    try:
        until(gone, why, timeout=15)
    except AssertionError:
        os.kill(pid, 9)
        raise


def test_workers_share_the_port_and_stop_together(make_config):
    path = _one_cell_config(make_config)
    port, mport = free_port(), free_port()
    while mport + 100 > 65535:
        mport = free_port()
    root = ServiceProcess("root", "--config", str(path), "--cell", "a", "--listen", f"127.0.0.1:{port}",
                          "--metrics", f"127.0.0.1:{mport}", "--workers", "2")
    with root:
        worker = root.ready["worker_pids"][0]
        req = ep.ProcessingRequest(request_headers=ep.HttpHeaders(headers=base_pb2.HeaderMap(
            headers=[base_pb2.HeaderValue(key=":path", raw_value=b"/v1/chat")])))
        for _ in range(24):  # separate connections: the kernel spreads them over the two sockets
            with grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
                resp = next(ep_grpc.ExternalProcessorStub(ch).Process(iter([req]), timeout=10))
                # No leaf answers probes in this test: a decision by the static weights until the
                # leaf's probes have failed (warm start), the documented 503 after.
                assert resp.HasField("request_headers") or resp.immediate_response.status.code == 503, resp
        counts = []
        for mp in (mport, mport + 100):
            with urllib.request.urlopen(f"http://127.0.0.1:{mp}/metrics", timeout=5) as r:
                counts.append(metric_value(r.read().decode(), "dlb_root_streams_total"))
        assert sum(counts) == 24 and all(c > 0 for c in counts), counts
    _expect_gone(worker, "worker outlived the first process")


def test_a_worker_dies_with_a_killed_first_process(make_config):
    """SIGKILL of the first process (no chance to stop its workers): the worker arms PR_SET_PDEATHSIG itself
    at start (spawn_workers passes no preexec_fn — a fork() with gRPC threads running aborted the child), so
    it gets SIGTERM and exits instead of serving on alone."""
    path = _one_cell_config(make_config)
    root = ServiceProcess("root", "--config", str(path), "--cell", "a", "--listen", f"127.0.0.1:{free_port()}",
                          "--metrics", "", "--workers", "2")
    with root:
        worker = root.ready["worker_pids"][0]
        os.kill(root.pid, 9)
        _expect_gone(worker, "worker outlived a SIGKILLed first process")
