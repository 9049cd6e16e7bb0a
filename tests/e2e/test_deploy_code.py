"""What running DLB on several hosts (Kubernetes pods) needs from the code (issue 17, part A).

Each test stands for one assumption of a single host that the code no longer makes, checked on a
real Envoy where Envoy is the judge:

- a DNS name for the control plane (a Service) makes ``dlb_xds`` a ``STRICT_DNS`` cluster, and Envoy's
  ``--service-node/--service-cluster/--service-zone`` name the node, so one bootstrap serves a tier;
- a listener binds ``listen`` (default ``0.0.0.0:<port>``), not the address others reach it at;
- every bootstrap can carry a ``dlb_ready`` listener answering ``/ready`` off loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import random
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from bounded_wait import until
from bounded_wait import until_async as _until

from dlb.cli import main
from dlb.config import config_from_dict, load_config
from dlb.config.model import HostPort
from dlb.config.policy import set_plugins
from dlb.control_plane.service import ControlPlane
from dlb.envoy.ads_bootstrap import ads_bootstrap
from dlb.envoy.binary import EnvoyProcess, validate
from dlb.envoy.bootstrap import leaf_bootstrap, root_bootstrap, write_bootstrap
from dlb.envoy.drain import drain
from dlb.ext_proc.leaf_setup import state_from_config
from dlb.ext_proc.leaf_xds import LeafXdsSync
from dlb.procutil import free_port
from dlb.proto import probe_pb2, probe_pb2_grpc
from dlb.service.metrics import serve_metrics
from dlb.testbed.process import ServiceProcess

pytestmark = pytest.mark.envoy


def _config(leaf: dict[str, Any], root: dict[str, Any] | None = None, cells: tuple[str, ...] = ("a",)) -> dict[str, Any]:
    out = []
    for k, name in enumerate(cells):
        c: dict[str, Any] = {"name": name, "leaf": dict(leaf) if k == 0 else {"address": f"127.0.0.1:{free_port()}",
                                                                              "probe": f"127.0.0.1:{free_port()}"},
                             "servers": [f"127.0.0.1:{free_port()}"]}
        if root is not None and k == 0:
            c["root"] = root
        out.append(c)
    return {"version": 1, "cells": out, "network": {"default_one_way_ms": 5},
            "endpoints": [{"name": "chat", "match": {"prefix": "/"}}]}


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@contextlib.contextmanager
def _envoy(boot: dict[str, Any], tmp_path: Path, name: str, extra_args: list[str] | None = None):
    path = write_bootstrap(boot, tmp_path / f"{name}.yaml")
    admin = boot["admin"]["address"]["socket_address"]["port_value"]
    with EnvoyProcess(path, admin, base_id=random.randrange(1, 60000), extra_args=extra_args or []) as envoy:
        yield envoy


# --------------------------------------------------------------------------------------------
# 1. xds-bootstrap: DNS control plane, node identity from Envoy's flags
# --------------------------------------------------------------------------------------------


def test_xds_bootstrap_with_a_dns_name_is_strict_dns_and_envoy_accepts_it(tmp_path: Path) -> None:
    out = tmp_path / "leaf.yaml"
    assert main(["config", "xds-bootstrap", "--role", "leaf", "--cell", "a", "--xds", "dlb-control-plane.dlb-system.svc:18000",
                 "--admin-port", "9901", "-o", str(out)]) == 0
    boot = yaml.safe_load(out.read_text())
    xds = next(c for c in boot["static_resources"]["clusters"] if c["name"] == "dlb_xds")  # beside the admin stats cluster
    assert xds["type"] == "STRICT_DNS"
    result = validate(out)
    assert result.returncode == 0, result.stdout + result.stderr
    # An IP stays STATIC (no resolver in the path).
    assert main(["config", "xds-bootstrap", "--role", "leaf", "--cell", "a", "--xds", "10.0.0.5:18000",
                 "--admin-port", "9901", "-o", str(out)]) == 0
    assert yaml.safe_load(out.read_text())["static_resources"]["clusters"][0]["type"] == "STATIC"


def test_envoy_service_flags_name_the_node_and_select_the_snapshot(tmp_path: Path) -> None:
    """One bootstrap per tier: the pod's name and cell come from --service-node/--service-zone."""
    asyncio.run(_service_flags(tmp_path))


async def _service_flags(tmp_path: Path) -> None:
    cfg = config_from_dict(_config({"address": f"127.0.0.1:{free_port()}", "probe": f"127.0.0.1:{free_port()}"}, cells=("a", "b")))
    cp = ControlPlane(cfg, probe=False, flow_loop=False)
    xds_port, _ = await cp.start("127.0.0.1:0", "127.0.0.1:0")
    out, admin = tmp_path / "leaf.yaml", free_port()
    # Rendered for cell a with a meaningless node id, reaching the control plane by name (STRICT_DNS):
    # the flags decide who this Envoy is.
    token = tmp_path / "root-token"
    token.write_text("s3cret-root-token-0123456789\n")
    assert main(["config", "xds-bootstrap", "--role", "root", "--cell", "a", "--node-id", "rendered", "--xds",
                 f"localhost:{xds_port}", "--admin-port", str(admin), "--ready-port", "0", "--root-token-file", str(token),
                 "-o", str(out)]) == 0
    envoy = EnvoyProcess(str(out), admin, base_id=random.randrange(1, 60000),
                         extra_args=["--service-node", "dlb-leaf-b-7f9c", "--service-cluster", "dlb-leaf", "--service-zone", "b"])
    try:
        await asyncio.to_thread(envoy.start)
        node = json.loads(envoy.admin_get("/server_info"))["node"]
        assert (node["id"], node["cluster"], node["locality"]["zone"]) == ("dlb-leaf-b-7f9c", "dlb-leaf", "b")
        dump = json.loads(envoy.admin_get("/config_dump?resource=dynamic_listeners"))
        ports = {c["active_state"]["listener"]["address"]["socket_address"]["port_value"] for c in dump["configs"]}
        assert ports == {cfg.cell("b").leaf.address.port}  # cell b's leaf listener: the dlb-leaf/b snapshot
        assert cp.server.status.nodes["dlb-leaf-b-7f9c"].cluster == "dlb-leaf"
    finally:
        await asyncio.to_thread(envoy.stop)
        await cp.stop()


# --------------------------------------------------------------------------------------------
# 2. listen vs address
# --------------------------------------------------------------------------------------------


def test_listener_binds_all_interfaces_not_the_advertised_address(tmp_path: Path) -> None:
    """A LoadBalancer IP is on no interface of the pod: binding it fails; 0.0.0.0:<port> works."""
    port = free_port()
    # 192.0.2.0/24 (TEST-NET-1) is on no interface here, like a load balancer's IP inside a pod.
    cfg = config_from_dict(_config({"address": f"192.0.2.10:{port}", "probe": f"127.0.0.1:{free_port()}"},
                                   root={"address": f"192.0.2.11:{free_port()}"}))
    assert cfg.cell("a").leaf.bind.host == "0.0.0.0"
    boot = leaf_bootstrap(cfg, "a", admin_port=free_port(), emulate_wan=False)
    with _envoy(boot, tmp_path, "leaf") as envoy:
        (lis,) = [c for c in json.loads(envoy.admin_get("/listeners?format=json"))["listener_statuses"]]
        assert lis["local_address"]["socket_address"] == {"address": "0.0.0.0", "port_value": port}
    root = root_bootstrap(cfg, "a", admin_port=free_port())
    assert root["static_resources"]["listeners"][0]["address"]["socket_address"]["address"] == "0.0.0.0"
    named = config_from_dict(_config({"address": f"leaf-a.example.net:{port}", "probe": f"127.0.0.1:{free_port()}"}))
    assert str(named.cell("a").leaf.bind) == f"0.0.0.0:{port}"


def test_listen_sets_the_bind_address(tmp_path: Path) -> None:
    listen = free_port()
    cfg = config_from_dict(_config({"address": f"leaf-a.example.net:{free_port()}", "probe": f"127.0.0.1:{free_port()}",
                                    "listen": f"127.0.0.1:{listen}"}))
    boot = leaf_bootstrap(cfg, "a", admin_port=free_port(), emulate_wan=False)
    with _envoy(boot, tmp_path, "leaf") as envoy:
        (lis,) = json.loads(envoy.admin_get("/listeners?format=json"))["listener_statuses"]
        assert lis["local_address"]["socket_address"] == {"address": "127.0.0.1", "port_value": listen}


# --------------------------------------------------------------------------------------------
# 5. the dlb_ready listener
# --------------------------------------------------------------------------------------------


def test_ready_listener_answers_ready_beside_the_traffic_listener_and_fails_with_health_checks(tmp_path: Path) -> None:
    """On the traffic listener's address (a loopback root keeps its stats off the network; a pod's listener
    binds every interface, so the kubelet reaches it), and unready once Envoy fails its health checks."""
    ready = free_port()
    cfg = config_from_dict(_config({"address": f"127.0.0.1:{free_port()}", "probe": f"127.0.0.1:{free_port()}"},
                                   root={"address": f"127.0.0.1:{free_port()}"}))
    boot = root_bootstrap(cfg, "a", admin_port=free_port(), ready_port=ready)
    with _envoy(boot, tmp_path, "root") as envoy:
        lis = {s["name"]: s["local_address"]["socket_address"]
               for s in json.loads(envoy.admin_get("/listeners?format=json"))["listener_statuses"]}
        assert lis["dlb_ready"] == {"address": lis["dlb_root"]["address"], "port_value": ready} and lis["dlb_ready"]["address"] == "127.0.0.1"
        assert _get(f"http://127.0.0.1:{ready}/ready")[0] == 200
        assert _get(f"http://127.0.0.1:{ready}/anything")[0] == 404
        envoy.admin_post("/healthcheck/fail")  # what `dlb envoy drain` does first
        assert _get(f"http://127.0.0.1:{ready}/ready")[0] == 503


def test_every_bootstrap_with_a_ready_port_passes_envoy_validate(tmp_path: Path) -> None:
    cfg = load_config(Path(__file__).resolve().parents[2] / "envoy_configs" / "dlb.example.yaml")
    cell = cfg.cells[0].name
    for role in ("root", "leaf"):
        out = tmp_path / f"{role}.yaml"
        assert main(["config", "render", os.fspath(cfg.source), role, cell, "--admin-port", "9901", "-o", str(out)]) == 0
        assert "dlb_ready" in out.read_text()
        result = validate(out)
        assert result.returncode == 0, result.stdout + result.stderr
        assert main(["config", "xds-bootstrap", "--role", role, "--cell", cell, "--xds", "dlb-control-plane:18000",
                     "--admin-port", "9901", "--config", os.fspath(cfg.source), "-o", str(out)]) == 0
        assert "dlb_ready" in out.read_text()
        result = validate(out)
        assert result.returncode == 0, result.stdout + result.stderr


# --------------------------------------------------------------------------------------------
# 3 + 5. the leaf agent checks its own Envoy; /healthz and /readyz on the services' HTTP listeners
# --------------------------------------------------------------------------------------------


BACKGROUND_OFF = {"type": "background-probe", "parameters": {"min_interval_ms": 0}}


def _leaf_config(tmp: Path, leaf_address: str) -> tuple[Path, str]:
    probe = f"127.0.0.1:{free_port()}"
    path = tmp / "dlb.yaml"
    path.write_text(json.dumps(_config({"address": leaf_address, "probe": probe},
                                       root={"address": f"127.0.0.1:{free_port()}", "ext_proc": f"127.0.0.1:{free_port()}"})))
    return path, probe


def test_leaf_checks_its_own_envoy_at_envoy_check_address_and_serves_health(tmp_path: Path) -> None:
    """The cell's address is a load balancer that is down (nothing listens); the pod's own Envoy is up."""
    path, probe = _leaf_config(tmp_path, f"127.0.0.1:{free_port()}")
    path.write_text(json.dumps(set_plugins(json.loads(path.read_text()), BACKGROUND_OFF)))  # no probe requests to count
    metrics = free_port()
    with socket.create_server(("127.0.0.1", 0)) as own_envoy:  # accepts connections: the check's TCP connect
        own = f"127.0.0.1:{own_envoy.getsockname()[1]}"
        leaf = ServiceProcess("leaf", "--config", str(path), "--cell", "a", "--metrics", f"127.0.0.1:{metrics}",
                              "--envoy-check-address", own, "--envoy-check-period-ms", "50", "--scrape-period-ms", "0",
                              "--drain-s", "5")
        with leaf, grpc.insecure_channel(probe) as ch:
            assert _get(f"http://127.0.0.1:{metrics}/healthz")[0] == 200
            assert _get(f"http://127.0.0.1:{metrics}/readyz")[0] == 200
            stub = probe_pb2_grpc.ProbeStub(ch)

            def answered() -> probe_pb2.ProbeResponse | None:
                try:
                    return stub.Probe(probe_pb2.ProbeRequest(), timeout=5)
                except grpc.RpcError as e:
                    assert e.code() == grpc.StatusCode.UNAVAILABLE
                    return None

            reply = until(answered, "a probe answered (the first check runs within a period of start)")
            assert isinstance(reply, probe_pb2.ProbeResponse) and reply.cell == "a"  # its own Envoy is up: probes are answered
            leaf.proc.send_signal(signal.SIGTERM)
            until(lambda: _get(f"http://127.0.0.1:{metrics}/readyz")[0] == 503, "readyz 503")  # draining: not ready, still alive
            assert _get(f"http://127.0.0.1:{metrics}/healthz")[0] == 200


def test_root_metrics_listener_serves_healthz_and_readyz(tmp_path: Path) -> None:
    """The root is ready only once it can route: alive but 503 while no cell has a fresh probe, 200 once
    its leaf answers probes (a root ready at bind time took traffic it could only refuse)."""
    path, _ = _leaf_config(tmp_path, f"127.0.0.1:{free_port()}")
    metrics = free_port()
    with ServiceProcess("root", "--config", str(path), "--cell", "a", "--metrics", f"127.0.0.1:{metrics}"):
        assert _get(f"http://127.0.0.1:{metrics}/healthz") == (200, "ok\n")
        assert _get(f"http://127.0.0.1:{metrics}/readyz")[0] == 503
        status, text = _get(f"http://127.0.0.1:{metrics}/metrics")
        assert status == 200 and "dlb_" in text
        with socket.create_server(("127.0.0.1", 0)) as own_envoy:  # the leaf's Envoy check connects here
            leaf = ServiceProcess("leaf", "--config", str(path), "--cell", "a", "--metrics", "", "--envoy-check-period-ms", "50",
                                  "--envoy-check-address", f"127.0.0.1:{own_envoy.getsockname()[1]}", "--scrape-period-ms", "0")
            with leaf:
                until(lambda: _get(f"http://127.0.0.1:{metrics}/readyz") == (200, "ready\n"), "the root ready once its leaf answers")


def test_readyz_is_503_until_ready() -> None:
    ready = [False]
    _, port = serve_metrics(list, "127.0.0.1", 0, lambda: ready[0])
    assert _get(f"http://127.0.0.1:{port}/readyz")[0] == 503
    assert _get(f"http://127.0.0.1:{port}/healthz")[0] == 200
    ready[0] = True
    assert _get(f"http://127.0.0.1:{port}/readyz")[0] == 200


def test_control_plane_status_serves_readyz_once_xds_listens() -> None:
    async def scenario() -> None:
        cfg = config_from_dict(_config({"address": f"127.0.0.1:{free_port()}", "probe": f"127.0.0.1:{free_port()}"}))
        cp = ControlPlane(cfg, probe=False, flow_loop=False)
        status_port = await cp.status_server.start("127.0.0.1", 0)  # status up, xDS not yet
        try:
            assert (await asyncio.to_thread(_get, f"http://127.0.0.1:{status_port}/readyz"))[0] == 503
            assert (await asyncio.to_thread(_get, f"http://127.0.0.1:{status_port}/healthz"))[0] == 200
            await cp.status_server.stop()
            _, status_port = await cp.start("127.0.0.1:0", "127.0.0.1:0")
            assert (await asyncio.to_thread(_get, f"http://127.0.0.1:{status_port}/readyz"))[0] == 200
        finally:
            await cp.stop()

    asyncio.run(scenario())


# --------------------------------------------------------------------------------------------
# 6. dlb envoy drain
# --------------------------------------------------------------------------------------------


class _SlowHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    delay_s = 1.5

    def do_GET(self) -> None:  # /health of Envoy's active health check: at once
        self._reply(b"ok")

    def do_POST(self) -> None:  # a "generation": takes delay_s
        self.rfile.read(int(self.headers.get("content-length") or 0))
        time.sleep(self.delay_s)
        self._reply(b"done")

    def _reply(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_envoy_drain_lets_requests_in_flight_finish(tmp_path: Path) -> None:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _SlowHandler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    leaf_port, admin, ready = free_port(), free_port(), free_port()
    data = _config({"address": f"127.0.0.1:{leaf_port}", "probe": f"127.0.0.1:{free_port()}", "listen": f"127.0.0.1:{leaf_port}"})
    data["cells"][0]["servers"] = [f"127.0.0.1:{srv.server_address[1]}"]
    cfg = config_from_dict(data)
    boot = leaf_bootstrap(cfg, "a", admin_port=admin, emulate_wan=False, ready_port=ready)
    statuses: list[int] = []

    def one() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", leaf_port, timeout=30)
        conn.request("POST", "/v1/completions", body=b"{}")
        resp = conn.getresponse()
        resp.read()
        statuses.append(resp.status)
        conn.close()

    try:
        with _envoy(boot, tmp_path, "leaf") as envoy:
            until(lambda: "health_flags::healthy" in envoy.admin_get("/clusters"), "the server passes its first health check")
            threads = [threading.Thread(target=one) for _ in range(4)]
            for t in threads:
                t.start()
            until(lambda: envoy.stats("downstream_rq_active").get("http.dlb_leaf.downstream_rq_active") == "4", "4 requests active",
                  period=0.02)
            result = drain(admin, 30.0)
            assert result.drained and result.active_at_start == 4 and result.active_at_end == 0
            for t in threads:
                t.join(30)
            assert statuses == [200] * 4  # none cut
            assert _get(f"http://127.0.0.1:{ready}/ready")[0] == 503  # out of its Service first
            assert envoy.stats("downstream_rq_active")["http.dlb_leaf.downstream_rq_active"] == "0"
    finally:
        srv.shutdown()
        srv.server_close()


def test_envoy_drain_command_reports_an_unreachable_admin(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["envoy", "drain", "--admin-port", str(free_port()), "--deadline", "1"]) == 1
    assert "unreachable" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# 7. control plane: --serve-cells, --watch-config
# --------------------------------------------------------------------------------------------


def _cp_config(cells: tuple[str, ...]) -> dict[str, Any]:
    data = _config({"address": f"127.0.0.1:{free_port()}", "probe": f"127.0.0.1:{free_port()}"},
                   root={"address": f"127.0.0.1:{free_port()}"}, cells=cells)
    for c in data["cells"]:
        c.setdefault("root", {"address": f"127.0.0.1:{free_port()}"})
    data["endpoints"][0]["policy"] = {"mechanism": "flow"}
    return data


def _configmap(folder: Path, data: dict[str, Any], version: int) -> None:
    """Write ``data`` as the kubelet updates a mounted ConfigMap: a new ..<ts> folder, ``..data`` swapped by rename."""
    ts = folder / f"..2026_11_30_0{version}"
    ts.mkdir()
    (ts / "dlb.yaml").write_text(json.dumps(data))
    tmp_link = folder / "..data_tmp"
    tmp_link.symlink_to(ts.name)
    os.replace(tmp_link, folder / "..data")
    if not (folder / "dlb.yaml").is_symlink():
        (folder / "dlb.yaml").symlink_to("..data/dlb.yaml")


def test_watch_config_reloads_when_the_configmap_symlink_swaps(tmp_path: Path) -> None:
    import subprocess
    import sys

    first = _cp_config(("a",))
    second = {**first, "cells": [*first["cells"], _cp_config(("b",))["cells"][0]]}
    _configmap(tmp_path, first, 1)
    status = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "dlb.cli", "serve", "control-plane", "--config", str(tmp_path / "dlb.yaml"),
                             "--xds", f"127.0.0.1:{free_port()}", "--status", f"127.0.0.1:{status}", "--no-probe",
                             "--watch-config", "--watch-period-s", "0.1"],
                            stdout=subprocess.DEVNULL, stderr=(tmp_path / "cp.log").open("w"), start_new_session=True)

    def cells() -> set[str]:
        code, text = _get(f"http://127.0.0.1:{status}/fleet")
        return set(json.loads(text)["cells"]) if code == 200 else set()

    try:
        def ready_or_exited() -> bool:
            with contextlib.suppress(OSError):
                return proc.poll() is not None or _get(f"http://127.0.0.1:{status}/readyz")[0] == 200
            return False

        until(ready_or_exited, "the control plane ready", timeout=90)  # imports alone took > 15 s on the shared 2-core box
        assert proc.poll() is None, (tmp_path / "cp.log").read_text()
        assert cells() == {"a"}
        _configmap(tmp_path, second, 2)
        until(lambda: cells() == {"a", "b"}, "cell b served: reloaded without a SIGHUP", timeout=60)
    finally:
        proc.terminate()
        proc.wait(15)


# --------------------------------------------------------------------------------------------
# 4. server discovery: a DNS name is every address it has, re-resolved and pushed over EDS
# --------------------------------------------------------------------------------------------

HEADLESS = "vllm.cell-a.svc.cluster.local"


def _discovery_config(period_s: float, replicas: int | None = None) -> dict[str, Any]:
    data = _config({"address": f"127.0.0.1:{free_port()}", "probe": f"127.0.0.1:{free_port()}"})
    data["cells"][0]["servers"] = [f"{HEADLESS}:8000"]
    if replicas is not None:
        data["cells"][0]["replicas"] = replicas
    data["discovery"] = {"dns_period_s": period_s}
    return data


def test_resized_headless_service_reaches_the_leaf_envoy_and_agent_over_eds(tmp_path: Path) -> None:
    """Acceptance criterion 6: 2 → 3 addresses reach the leaf Envoy's EDS (the resolver is a stub)."""
    asyncio.run(_resize(tmp_path))


def _envoy_servers(envoy: EnvoyProcess) -> set[str]:
    """Hosts of the leaf Envoy's ``servers`` cluster, from admin ``/clusters`` (``servers::ip:port::cx_active::0``)."""
    return {line.split("::")[1] for line in envoy.admin_get("/clusters").splitlines()
            if line.startswith("servers::") and "::cx_active::" in line}


async def _resize(tmp_path: Path) -> None:

    period = 0.5
    records = ["127.0.0.21", "127.0.0.22"]
    calls = [0]

    async def stub(host: str, port: int) -> list[str]:
        assert host == HEADLESS
        calls[0] += 1
        return list(records)

    cfg = config_from_dict(_discovery_config(period))
    cp = ControlPlane(cfg, probe=False, flow_loop=False, resolver=stub)
    xds_port, _ = await cp.start("127.0.0.1:0", "127.0.0.1:0")
    admin = free_port()
    boot = tmp_path / "leaf.yaml"
    boot.write_text(yaml.safe_dump(ads_bootstrap("leaf", "a", HostPort("127.0.0.1", xds_port), admin, node_id="leaf-a")))
    envoy = EnvoyProcess(str(boot), admin, base_id=random.randrange(1, 60000))
    state = state_from_config(cfg, "a", resolve=lambda host, port: ["127.0.0.21"])
    sync = LeafXdsSync(state, f"127.0.0.1:{xds_port}", "a")
    try:
        await asyncio.to_thread(envoy.start)
        await sync.start()
        want2 = {"127.0.0.21:8000", "127.0.0.22:8000"}
        await _until(lambda: _envoy_servers(envoy) == want2, "2 servers in the leaf Envoy")
        assert cp.config.cell("a").replicas == 2
        records.append("127.0.0.23")
        t0, calls_before = time.monotonic(), calls[0]
        want3 = want2 | {"127.0.0.23:8000"}
        await _until(lambda: _envoy_servers(envoy) == want3, "3 servers in the leaf Envoy")
        took = time.monotonic() - t0
        # The next resolution found the third address and pushed it: no further round was needed.
        assert calls[0] - calls_before <= 2, calls
        await _until(lambda: {s.address for s in state.servers} == want3, "3 servers in the leaf agent")
        assert cp.config.cell("a").replicas == 3 and state.replicas == 3
        print(f"2 -> 3 addresses reached the leaf Envoy's EDS {took:.2f} s after the change (dns_period_s {period})")
    finally:
        await sync.stop()
        await asyncio.to_thread(envoy.stop)
        await cp.stop()


def test_discovery_bounds_addresses_per_name_keeps_last_on_failure_and_counts_both() -> None:
    from dlb.control_plane.dns import MAX_ADDRESSES_PER_NAME

    answers: list[Any] = [[f"10.{k // 65536}.{k // 256 % 256}.{k % 256}" for k in range(MAX_ADDRESSES_PER_NAME + 500)]]

    async def stub(host: str, port: int) -> list[str]:
        a = answers[0]
        if isinstance(a, Exception):
            raise a
        return a

    async def scenario() -> str:
        cp = ControlPlane(config_from_dict(_discovery_config(5.0)), probe=False, flow_loop=False, resolver=stub)
        assert await cp.refresh_dns()
        assert len(cp.config.cell("a").servers) == MAX_ADDRESSES_PER_NAME == cp.config.cell("a").replicas
        answers[0] = OSError("NXDOMAIN")
        assert not await cp.refresh_dns()  # a failed resolution keeps the last addresses
        assert len(cp.config.cell("a").servers) == MAX_ADDRESSES_PER_NAME
        port = await cp.status_server.start("127.0.0.1", 0)
        try:
            return (await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/metrics"))[1]
        finally:
            await cp.status_server.stop()

    text = asyncio.run(scenario())
    assert "dlb_xds_dns_truncated_total 1.0" in text and "dlb_xds_dns_failures_total 1.0" in text
    assert "dlb_xds_dns_resolutions_total 2.0" in text


def test_dlb_up_checks_the_bind_address_too() -> None:
    """`dlb up` refuses an address it cannot listen on before starting anything: the Envoy binds `listen`."""
    from dlb.launch.up import listen_problems

    data = _config({"address": f"127.0.0.1:{free_port()}", "probe": f"127.0.0.1:{free_port()}", "listen": "192.0.2.5:9000"})
    problems = listen_problems(config_from_dict(data), "dlb.yaml", root_services=False)
    assert [p.split(": ")[1] for p in problems] == ["cells[0].leaf.listen"], problems
