"""Service lifecycle: the gRPC health service, draining on SIGTERM, a clean exit (issue 13, item 4).

Here: the tests that run a real Envoy, the demo, network namespaces or the container;
the others: ``tests/integration/test_lifecycle.py``.
The rules and what the tests stand for: that file's docstring.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
from pathlib import Path

import pytest
from bounded_wait import until

from dlb.procutil import free_port
from dlb.testbed.process import ServiceProcess

pytestmark = pytest.mark.timeout(60)


def _accepts(hp) -> bool:
    import socket

    try:
        with socket.create_connection((hp.host, hp.port), timeout=2):
            return True
    except OSError:
        return False


@pytest.mark.envoy
@pytest.mark.timeout(120)
def test_real_envoy_stops_sending_to_a_draining_leaf_agent_and_no_request_fails() -> None:
    """A leaf agent picking servers (ext_proc on its own address, DLB's HTTP/2 transport) gets SIGTERM under
    traffic through a real leaf Envoy: Envoy's gRPC health check (at the agent's probe address) sees
    NOT_SERVING while the agent still runs, stops opening ext_proc streams to it (requests then take
    LEAST_REQUEST), and not one request fails (issue 13, item 5). With a TCP check of the ext_proc port,
    Envoy found out only when the agent closed it, after the drain."""
    import random

    from dlb.config import config_from_dict
    from dlb.emulator.server import ThreadedEmulator
    from dlb.envoy.binary import EnvoyProcess
    from dlb.envoy.bootstrap import LEAF_EXT_PROC_CLUSTER, leaf_bootstrap, write_bootstrap
    from dlb.testbed.stack import request

    with tempfile.TemporaryDirectory(prefix="dlb-lifecycle-") as tmp, \
            ThreadedEmulator(server_id="a-0", profile="fast-test") as e0, ThreadedEmulator(server_id="a-1", profile="fast-test") as e1:
        probe = f"127.0.0.1:{free_port()}"
        raw = {"version": 1, "cells": [{"name": "a", "servers": [e0.address, e1.address],
                                        "leaf": {"address": f"127.0.0.1:{free_port()}", "probe": probe,
                                                 "ext_proc": f"127.0.0.1:{free_port()}"}}],
               "endpoints": [{"name": "chat", "match": {"prefix": "/v1/"}, "policy": {"mechanism": "discrete", "cost": "rif"}}]}
        path = Path(tmp) / "dlb.yaml"
        path.write_text(json.dumps(raw))
        cfg = config_from_dict(raw, source=str(path))
        admin = free_port()
        boot = write_bootstrap(leaf_bootstrap(cfg, "a", admin_port=admin, emulate_wan=False, access_log=True), Path(tmp) / "leaf.yaml")
        leaf = ServiceProcess("leaf", "--config", str(path), "--cell", "a", "--metrics", "", "--drain-s", "3")
        with leaf, EnvoyProcess(boot, admin, base_id=random.randrange(1, 60000)) as envoy:
            hp = cfg.cell("a").leaf.address

            def stat(name: str) -> int:
                return int(envoy.stats(name).get(f"cluster.{LEAF_EXT_PROC_CLUSTER}.{name}", "0"))

            until(lambda: stat("membership_healthy") == 1, "the leaf ext_proc healthy in Envoy")
            statuses: list[int] = []
            stop = threading.Event()

            def traffic() -> None:
                while not stop.is_set():
                    try:
                        statuses.append(request(hp.host, hp.port, timeout=10)[0])
                    except OSError:
                        statuses.append(0)

            sender = threading.Thread(target=traffic)
            sender.start()
            try:
                until(lambda: len(statuses) >= 20, "20 requests answered", period=0.02)
                os.kill(leaf.pid, signal.SIGTERM)
                until(lambda: stat("membership_healthy") == 0, "Envoy sees the draining leaf unhealthy", timeout=10, period=0.02)
                alive_when_unhealthy = leaf.proc.poll() is None
                ext_proc_open_when_unhealthy = _accepts(cfg.cell("a").leaf.ext_proc)
                streams = stat("upstream_rq_total")
                sent = len(statuses)
                assert leaf.proc.wait(15) == 0
                until(lambda: len(statuses) >= sent + 20, "traffic goes on with the agent gone", period=0.02)
            finally:
                stop.set()
                sender.join(15)
            assert alive_when_unhealthy  # Envoy saw the drain, not the exit...
            assert ext_proc_open_when_unhealthy  # ...while the ext_proc still listened (a TCP check sees only its close)
            assert stat("upstream_rq_total") == streams  # no ext_proc stream opened to a draining agent
            assert len(statuses) > sent >= 20 and set(statuses) == {200}, statuses
