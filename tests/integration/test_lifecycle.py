"""Service lifecycle: the gRPC health service, draining on SIGTERM, a clean exit (issue 13, item 4).

A real ``dlb serve leaf`` child process: its health service answers SERVING; on SIGTERM it turns
NOT_SERVING for the drain period while probes and an open access-log stream are still served, then
exits 0 without a traceback (a CancelledError in ``StreamAccessLogs`` used to be logged on stop).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path

import grpc
import pytest
from bounded_wait import until
from envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc

from dlb.procutil import free_port
from dlb.proto import probe_pb2, probe_pb2_grpc
from dlb.service.health import NOT_SERVING, SERVING, decode_status
from dlb.testbed.process import ServiceProcess

pytestmark = pytest.mark.timeout(60)


def _check(channel: grpc.Channel) -> int:
    call = channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=None, response_deserializer=None)
    return decode_status(call(b"", timeout=5))


def test_leaf_drains_on_sigterm_then_exits_cleanly() -> None:
    with tempfile.TemporaryDirectory(prefix="dlb-lifecycle-") as tmp:
        probe = f"127.0.0.1:{free_port()}"
        raw = {"version": 1, "cells": [{"name": "a", "servers": [f"127.0.0.1:{free_port()}"],
                                        "leaf": {"address": f"127.0.0.1:{free_port()}", "probe": probe},
                                        "root": {"address": f"127.0.0.1:{free_port()}", "ext_proc": f"127.0.0.1:{free_port()}"}}],
               "endpoints": [{"name": "chat", "match": {"prefix": "/v1/"}, "policy": {"mechanism": "discrete", "cost": "rif"}}]}
        path = Path(tmp) / "dlb.yaml"
        path.write_text(json.dumps(raw))
        leaf = ServiceProcess("leaf", "--config", str(path), "--cell", "a", "--metrics", "", "--envoy-check-period-ms", "0",
                              "--scrape-period-ms", "0", "--drain-s", "2")
        from dlb.config import config_from_dict

        channel = config_from_dict(raw).cells[0].leaf.access_log_address()
        with leaf, grpc.insecure_channel(probe) as ch, grpc.insecure_channel(channel) as als_ch:
            assert _check(ch) == SERVING
            # An access-log stream held open as Envoy holds it, through the shutdown.
            stream_done = threading.Event()

            def logs():
                yield als_pb2.StreamAccessLogsMessage(identifier=als_pb2.StreamAccessLogsMessage.Identifier(log_name="dlb-leaf"))
                stream_done.wait(30)

            als = als_pb2_grpc.AccessLogServiceStub(als_ch)  # its own channel, not the probe port
            fut = als.StreamAccessLogs.future(logs(), timeout=30)
            time.sleep(0.3)
            os.kill(leaf.pid, signal.SIGTERM)
            until(lambda: _check(ch) == NOT_SERVING, "NOT_SERVING: draining, Envoy's health check now fails", timeout=5)
            # ...while the service still answers: probes and the access log are not cut yet.
            assert probe_pb2_grpc.ProbeStub(ch).Probe(probe_pb2.ProbeRequest(), timeout=5).cell == "a"
            assert leaf.proc.poll() is None
            assert leaf.proc.wait(15) == 0
            stream_done.set()
            try:
                fut.result(5)
            except grpc.RpcError:
                pass  # the stream ends with the server either way
            text = leaf.log_path.read_text()
        assert "draining" in text and "Traceback" not in text and "CancelledError" not in text, text


def test_every_grpc_aio_server_serves_grpc_health() -> None:
    """The control plane's xDS server and the grpc.aio ext_proc transport answer Health/Check too."""
    import asyncio

    from dlb.config import config_from_dict
    from dlb.control_plane.service import ControlPlane
    from dlb.ext_proc.protocol import ExtProcServer

    async def check(port: int) -> int:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            call = ch.unary_unary("/grpc.health.v1.Health/Check", request_serializer=None, response_deserializer=None)
            return decode_status(await call(b"", timeout=5))

    async def main() -> tuple[int, int, int]:
        cfg = config_from_dict({"version": 1, "cells": [{"name": "a", "servers": ["127.0.0.1:1"],
                                                          "leaf": {"address": "127.0.0.1:2", "probe": "127.0.0.1:3"}}],
                                "endpoints": [{"name": "chat", "match": {"prefix": "/"}, "policy": {"mechanism": "discrete", "cost": "rif"}}]})
        cp = ControlPlane(cfg, probe=False, flow_loop=False)
        xds_port, _ = await cp.start("127.0.0.1:0", "127.0.0.1:0")
        ext = ExtProcServer("grpc", lambda b: (b, True))
        ext_port = await ext.bind("127.0.0.1:0")
        try:
            got = await check(xds_port), await check(ext_port)
            ext.health.serving = False
            return (*got, await check(ext_port))
        finally:
            await ext.stop(0)
            await cp.stop()

    assert asyncio.run(main()) == (SERVING, SERVING, NOT_SERVING)


def test_the_control_planes_xds_port_serves_health_watch() -> None:
    """On its xDS port the control plane answers Health/Watch too (Envoy's and orchestrators' streaming
    health check): the status at once, then each change (grpc.aio served only Check there)."""
    import asyncio

    from dlb.config import config_from_dict
    from dlb.control_plane.service import ControlPlane

    async def main() -> list[int]:
        cfg = config_from_dict({"version": 1, "cells": [{"name": "a", "servers": ["127.0.0.1:1"],
                                                          "leaf": {"address": "127.0.0.1:2", "probe": "127.0.0.1:3"}}],
                                "endpoints": [{"name": "chat", "match": {"prefix": "/"}, "policy": {"mechanism": "discrete", "cost": "rif"}}]})
        cp = ControlPlane(cfg, probe=False, flow_loop=False)
        xds_port, _ = await cp.start("127.0.0.1:0", "127.0.0.1:0")
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{xds_port}") as ch:
                call = ch.unary_stream("/grpc.health.v1.Health/Watch", request_serializer=None, response_deserializer=None)(b"", timeout=10)
                seen = [decode_status(await call.read())]
                cp.health.serving = False
                seen.append(decode_status(await call.read()))
                call.cancel()
                return seen
        finally:
            await cp.stop()

    assert asyncio.run(main()) == [SERVING, NOT_SERVING]


def _one_root_config(folder: Path) -> tuple[Path, str]:
    """A one-cell config whose root has an ext_proc address of its own: (its path, that address)."""
    ext_proc = f"127.0.0.1:{free_port()}"
    raw = {"version": 1, "cells": [{"name": "a", "servers": [f"127.0.0.1:{free_port()}"],
                                    "leaf": {"address": f"127.0.0.1:{free_port()}", "probe": f"127.0.0.1:{free_port()}"},
                                    "root": {"address": f"127.0.0.1:{free_port()}", "ext_proc": ext_proc}}],
           "endpoints": [{"name": "chat", "match": {"prefix": "/v1/"}, "policy": {"mechanism": "discrete", "cost": "rif"}}]}
    path = folder / "dlb.yaml"
    path.write_text(json.dumps(raw))
    return path, ext_proc


def test_root_on_the_h2_transport_drains_on_sigterm_then_exits_cleanly() -> None:
    """``dlb serve root`` (h2 transport, the default): health SERVING on its ext_proc port; SIGTERM turns
    it NOT_SERVING for the drain while ext_proc calls are still answered; then a clean exit 0."""
    with tempfile.TemporaryDirectory(prefix="dlb-lifecycle-") as tmp:
        path, ext_proc = _one_root_config(Path(tmp))
        root = ServiceProcess("root", "--config", str(path), "--cell", "a", "--metrics", "", "--drain-s", "2")
        with root, grpc.insecure_channel(ext_proc) as ch:
            assert _check(ch) == SERVING
            os.kill(root.pid, signal.SIGTERM)
            until(lambda: _check(ch) == NOT_SERVING, "NOT_SERVING after SIGTERM", timeout=5)
            process = ch.stream_stream("/envoy.service.ext_proc.v3.ExternalProcessor/Process",
                                       request_serializer=None, response_deserializer=None)
            assert list(process(iter([b""]), timeout=5)) != []  # still answering while draining
            assert root.proc.poll() is None
            assert root.proc.wait(15) == 0
            text = root.log_path.read_text()
        assert "draining" in text and "Traceback" not in text, text


def _leaf_with_an_envoy(tmp: str, drain_s: float) -> tuple[ServiceProcess, socket.socket]:
    """A leaf agent started as ``dlb up`` starts it (xDS, server scrapes, the check of its own Envoy), and
    a TCP listener standing in for that Envoy."""

    envoy = socket.create_server(("127.0.0.1", 0))
    envoy_address = f"127.0.0.1:{envoy.getsockname()[1]}"
    raw = {"version": 1, "cells": [{"name": "a", "servers": [f"127.0.0.1:{free_port()}"],
                                    "leaf": {"address": envoy_address, "probe": f"127.0.0.1:{free_port()}"},
                                    "root": {"address": f"127.0.0.1:{free_port()}", "ext_proc": f"127.0.0.1:{free_port()}"}}],
           "endpoints": [{"name": "chat", "match": {"prefix": "/v1/"}, "policy": {"mechanism": "discrete", "cost": "rif"}}]}
    path = Path(tmp) / "dlb.yaml"
    path.write_text(json.dumps(raw))
    leaf = ServiceProcess("leaf", "--config", str(path), "--cell", "a", "--metrics", "", "--xds", f"127.0.0.1:{free_port()}",
                          "--envoy-check-period-ms", "200", "--drain-s", str(drain_s))
    return leaf, envoy


def test_a_leaf_stopped_with_its_envoy_exits_within_the_supervisors_budget() -> None:
    """``dlb up``/``dlb demo`` SIGTERM a leaf agent and its Envoy together; the agent's drain is for that
    Envoy, so it ends when the Envoy is gone and the agent exits 0 within its share of the stop budget
    (every leaf used to be SIGKILLed). A 5-s drain makes the old behaviour fail here on any box."""
    from dlb.launch.supervisor import STOP_BUDGET_S

    budget = STOP_BUDGET_S / 4  # dlb demo: servers, control plane, leaves, roots
    with tempfile.TemporaryDirectory(prefix="dlb-lifecycle-") as tmp:
        leaf, envoy = _leaf_with_an_envoy(tmp, drain_s=5.0)
        with leaf:
            until(lambda: "leaf_envoy_reachable" in leaf.log_path.read_text(), "the agent to see its Envoy", timeout=15)
            envoy.close()  # the supervisor stops the whole tier at once
            t0 = time.monotonic()
            os.kill(leaf.pid, signal.SIGTERM)
            code = leaf.proc.wait(15)
            took = time.monotonic() - t0
            text = leaf.log_path.read_text()
        assert code == 0 and took < budget, (code, took, text[-2000:])
        assert "draining" in text and "Traceback" not in text


def test_a_leaf_whose_envoy_stays_up_drains_in_full_then_exits() -> None:
    """The drain still holds while its Envoy is there to see NOT_SERVING (a pod whose Envoy outlives it)."""
    with tempfile.TemporaryDirectory(prefix="dlb-lifecycle-") as tmp:
        leaf, envoy = _leaf_with_an_envoy(tmp, drain_s=1.5)
        with leaf, envoy:
            until(lambda: "leaf_envoy_reachable" in leaf.log_path.read_text(), "the agent to see its Envoy", timeout=15)
            t0 = time.monotonic()
            os.kill(leaf.pid, signal.SIGTERM)
            code = leaf.proc.wait(15)
            took = time.monotonic() - t0
        assert code == 0 and 1.5 <= took < 1.5 + 2.25, (code, took)


def test_a_root_whose_envoy_is_gone_ends_its_drain_and_exits_within_the_budget() -> None:
    """The root's drain (h2 transport) is for the Envoys connected to it: when the last one has gone
    (stopped with it, as ``dlb up`` does), a 5-s drain ends at once and the root exits 0 in its share."""
    from dlb.launch.supervisor import STOP_BUDGET_S

    with tempfile.TemporaryDirectory(prefix="dlb-lifecycle-") as tmp:
        path, ext_proc = _one_root_config(Path(tmp))
        root = ServiceProcess("root", "--config", str(path), "--cell", "a", "--metrics", "", "--drain-s", "5")
        with root:
            with grpc.insecure_channel(ext_proc) as ch:  # an Envoy connected to it...
                assert _check(ch) == SERVING
                os.kill(root.pid, signal.SIGTERM)
                until(lambda: _check(ch) == NOT_SERVING, "NOT_SERVING after SIGTERM", timeout=5)
                t0 = time.monotonic()
            code = root.proc.wait(15)  # ...and gone
            took = time.monotonic() - t0
            text = root.log_path.read_text()
        assert code == 0 and took < STOP_BUDGET_S / 4, (code, took)
        assert "draining" in text and "Traceback" not in text, text
