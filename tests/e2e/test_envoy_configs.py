"""Real-Envoy tests of the root and leaf bootstraps (templates in envoy_configs/ and rendered ones).

Upstreams are tiny ``http.server`` echo servers on 127.0.0.1 standing in for leaves and inference
servers; they answer with their own name and the headers they received, so a test can see which cell
a request reached and what Envoy forwarded. The ext_proc is either absent (nothing listens on its
port: fail-open) or a minimal grpc ExternalProcessor defined here that names one cell.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import socket
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from bounded_wait import until
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlb.config import Config, config_from_dict
from dlb.envoy.binary import EnvoyProcess, validate
from dlb.envoy.bootstrap import (
    HEADER_CELL,
    HEADER_ENDPOINT,
    HEADER_ROOT_TOKEN,
    HEADER_SERVER,
    HEADER_SRC_CELL,
    leaf_bootstrap,
    root_bootstrap,
    write_bootstrap,
)
from dlb.envoy.contract import GIE_DESTINATION
from dlb.envoy.root_token import root_token
from dlb.procutil import free_port
from dlb.service.health import SERVICE as HEALTH_SERVICE
from dlb.service.health import HealthState

pytestmark = pytest.mark.envoy

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO / "envoy_configs"


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


class _EchoHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in two writes; without this, Nagle + delayed ACK add ~40 ms each.
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        if length:
            self.rfile.read(length)
        body = json.dumps({"name": self.server.name, "path": self.path,  # type: ignore[attr-defined]
                           "headers": {k.lower(): v for k, v in self.headers.items()}}).encode()
        self.send_response(self.server.statuses.get(self.server.name, 200))  # type: ignore[attr-defined]
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = _answer
    do_POST = _answer

    def log_message(self, *args: Any) -> None:  # keep test output clean
        pass


@contextlib.contextmanager
def echo_servers(*names: str, statuses: dict[str, int] | None = None) -> Iterator[dict[str, int]]:
    """One echo server per name on 127.0.0.1:<free port> (answering 200, or its status in ``statuses``);
    yields name → port; always shut down."""
    servers: list[ThreadingHTTPServer] = []
    try:
        for name in names:
            srv = ThreadingHTTPServer(("127.0.0.1", 0), _EchoHandler)
            srv.daemon_threads = True
            srv.name = name  # type: ignore[attr-defined]
            srv.statuses = statuses or {}  # type: ignore[attr-defined]
            threading.Thread(target=srv.serve_forever, daemon=True).start()
            servers.append(srv)
        yield {s.name: s.server_address[1] for s in servers}  # type: ignore[attr-defined]
    finally:
        for srv in servers:
            srv.shutdown()
            srv.server_close()


def request(port: int, path: str = "/v1/chat/completions", headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        conn.request("POST", path, body=b'{"model":"m"}', headers={"content-type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        raw = resp.read()
        try:
            return resp.status, json.loads(raw)
        except ValueError:
            return resp.status, {"raw": raw.decode(errors="replace")}
    finally:
        conn.close()


@contextlib.contextmanager
def running_envoy(bootstrap: dict[str, Any], tmp_path: Path, name: str) -> Iterator[EnvoyProcess]:
    path = write_bootstrap(bootstrap, tmp_path / f"{name}.yaml")
    admin_port = bootstrap["admin"]["address"]["socket_address"]["port_value"]
    # A base id of our own: several Envoys run at once (this test and other suites on the machine).
    with EnvoyProcess(path, admin_port, base_id=random.randrange(1, 60000)) as envoy:
        yield envoy


def three_cell_config(leaf_ports: dict[str, int], *, one_way_ms: float = 20.0, allowed: dict[str, list[str]] | None = None) -> Config:
    """Cells a, b, c whose leaf addresses are the given ports; root listeners on free ports."""
    cells = []
    for name in ("a", "b", "c"):
        cells.append({
            "name": name,
            "leaf": {"address": f"127.0.0.1:{leaf_ports[name]}", "probe": f"127.0.0.1:{free_port()}"},
            "root": {"address": f"127.0.0.1:{free_port()}", "ext_proc": f"127.0.0.1:{free_port()}"},
            "servers": [f"127.0.0.1:{leaf_ports[name + '-srv']}"] if name + "-srv" in leaf_ports else [f"127.0.0.1:{free_port()}"],
        })
    data: dict[str, Any] = {
        "version": 1,
        "cells": cells,
        "network": {"default_one_way_ms": one_way_ms, **({"allowed": allowed} if allowed else {})},
        "endpoints": [{"name": "chat", "match": {"prefix": "/v1/"}}],
    }
    return config_from_dict(data, "test")


class _PickCell(ep_grpc.ExternalProcessorServicer):
    """Minimal root ext_proc: names one cell in x-dlb-cell and clears the route cache."""

    def __init__(self, cluster: str, header: str = HEADER_CELL):
        self.cluster = cluster
        self.header = header
        self.seen_headers: list[dict[str, str]] = []
        self.seen_metadata: list[dict[str, str]] = []

    def Process(self, request_iterator, context):
        self.seen_metadata.append({k: v for k, v in context.invocation_metadata()})
        for req in request_iterator:
            if req.HasField("request_headers"):
                hdrs = {h.key: (h.raw_value.decode() if h.raw_value else h.value) for h in req.request_headers.headers.headers}
                self.seen_headers.append(hdrs)
                header = base_pb2.HeaderValue(key=self.header, raw_value=self.cluster.encode())
                mutation = ep.HeaderMutation(set_headers=[base_pb2.HeaderValueOption(header=header)])
                yield ep.ProcessingResponse(request_headers=ep.HeadersResponse(response=ep.CommonResponse(header_mutation=mutation, clear_route_cache=True)))


@contextlib.contextmanager
def ext_proc_server(port: int, servicer: _PickCell) -> Iterator[_PickCell]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    ep_grpc.add_ExternalProcessorServicer_to_server(servicer, server)
    # grpc.health.v1 too, as the leaf agent's probe server has it: Envoy checks the leaf ext_proc there.
    check = grpc.unary_unary_rpc_method_handler(HealthState().check, request_deserializer=None, response_serializer=None)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(HEALTH_SERVICE, {"Check": check}),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:
        yield servicer
    finally:
        server.stop(grace=None)


# --------------------------------------------------------------------------------------------
# every YAML validates
# --------------------------------------------------------------------------------------------

TEMPLATES = sorted(p for p in CONFIG_DIR.glob("*.yaml") if not p.name.startswith("dlb."))


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_template_validates(path: Path) -> None:
    result = validate(path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_rendered_bootstraps_of_example_validate(tmp_path: Path) -> None:
    from dlb.config import load_config

    cfg = load_config(CONFIG_DIR / "dlb.example.yaml")
    for cell in cfg.cell_names:
        for kind, boot in (("root", root_bootstrap(cfg, cell, admin_port=free_port(), native_flow=True)),
                           ("leaf", leaf_bootstrap(cfg, cell, admin_port=free_port(), emulate_wan=True))):
            path = write_bootstrap(boot, tmp_path / f"{kind}-{cell}.yaml")
            result = validate(path)
            assert result.returncode == 0, f"{kind} {cell}: {result.stdout}{result.stderr}"


def test_rendered_leaf_with_ext_proc_validates(tmp_path: Path) -> None:
    cfg = three_cell_config({"a": free_port(), "b": free_port(), "c": free_port()})
    data = cfg.cells[0]
    import dataclasses

    from dlb.config import HostPort

    cells = (dataclasses.replace(data, leaf=dataclasses.replace(data.leaf, ext_proc=HostPort("127.0.0.1", free_port()))),) + cfg.cells[1:]
    boot = leaf_bootstrap(dataclasses.replace(cfg, cells=cells), "a", admin_port=free_port(), emulate_wan=False)
    result = validate(write_bootstrap(boot, tmp_path / "leaf.yaml"))
    assert result.returncode == 0, result.stdout + result.stderr


def _hcm(boot: dict[str, Any]) -> dict[str, Any]:
    return boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]


# --------------------------------------------------------------------------------------------
# root: fail-open by weights, spoofed headers ignored, ext_proc pick honoured
# --------------------------------------------------------------------------------------------


def test_root_fail_open_routes_by_weights_and_ignores_spoofed_cell(tmp_path: Path) -> None:
    with echo_servers("a", "b", "c") as ports:
        cfg = three_cell_config(ports)
        # Only a and b carry fallback weight; c is a valid cluster a spoofer might name.
        boot = root_bootstrap(cfg, "a", admin_port=free_port(), weights={"a": 1, "b": 1, "c": 0})
        listen = cfg.cell("a").root.address.port
        with running_envoy(boot, tmp_path, "root"):  # nothing listens on the ext_proc port: fail-open
            reached = []
            for k in range(30):
                spoof = {HEADER_CELL: "cell-c", HEADER_SRC_CELL: "c", HEADER_ENDPOINT: "evil",
                         "x-forwarded-for": "10.0.0.1", "x-envoy-internal": "true"} if k % 2 else {}
                status, body = request(listen, headers=spoof)
                assert status == 200, body
                reached.append(body["name"])
                hdrs = body["headers"]
                assert hdrs[HEADER_SRC_CELL] == "a"  # added by the root, the client's value is gone
                assert hdrs[HEADER_ENDPOINT] == "chat"
                assert HEADER_CELL not in hdrs
            assert "c" not in reached, reached  # the spoofed cell never wins
            assert set(reached) == {"a", "b"}, reached  # traffic flows by the weights (P[miss] = 2^-29)


@pytest.mark.parametrize("xff", [None, "10.0.0.1", "127.0.0.1"])
def test_root_strips_spoofed_headers_from_local_clients(tmp_path: Path, xff: str | None) -> None:
    """A client on loopback (internal by Envoy's legacy rules), with or without its own XFF."""
    with echo_servers("a", "b", "c") as ports:
        cfg = three_cell_config(ports)
        boot = root_bootstrap(cfg, "a", admin_port=free_port(), weights={"a": 1})
        with running_envoy(boot, tmp_path, "root"):
            spoof = {HEADER_CELL: "cell-c", **({"x-forwarded-for": xff} if xff else {})}
            status, body = request(cfg.cell("a").root.address.port, headers=spoof)
            assert status == 200 and body["name"] == "a", body
            assert HEADER_CELL not in body["headers"] and "x-envoy-internal" not in body["headers"]


def test_root_strips_gie_destination_endpoint_from_clients(tmp_path: Path) -> None:
    """A GIE gateway behind a root sends a request wherever x-gateway-destination-endpoint says: never a client's."""
    with echo_servers("a", "b", "c") as ports:
        cfg = three_cell_config(ports)
        boot = root_bootstrap(cfg, "a", admin_port=free_port(), weights={"a": 1})
        with running_envoy(boot, tmp_path, "root"):
            status, body = request(cfg.cell("a").root.address.port, headers={GIE_DESTINATION: "10.1.2.3:8000"})
            assert status == 200 and body["name"] == "a", body
            assert GIE_DESTINATION not in body["headers"]


def test_root_routes_by_ext_proc_pick(tmp_path: Path) -> None:
    with echo_servers("a", "b", "c") as ports:
        cfg = three_cell_config(ports)
        boot = root_bootstrap(cfg, "a", admin_port=free_port(), weights={"a": 1})
        me = cfg.cell("a")
        with ext_proc_server(me.root.ext_proc.port, _PickCell("cell-c")) as svc, running_envoy(boot, tmp_path, "root"):
            for _ in range(3):
                status, body = request(me.root.address.port, headers={HEADER_CELL: "cell-b"})
                assert status == 200 and body["name"] == "c", body
            assert svc.seen_headers and all(HEADER_CELL not in h for h in svc.seen_headers)  # stripped before the ext_proc
            assert all(m.get(HEADER_ENDPOINT) == "chat" for m in svc.seen_metadata)  # per-route gRPC metadata
            assert all(h[":path"] == "/v1/chat/completions" for h in svc.seen_headers)


class _PickSequence(_PickCell):
    """Names the next cluster of a list on each request."""

    def __init__(self, picks: list[str]):
        super().__init__(picks[0])
        self.picks = list(picks)

    def Process(self, request_iterator, context):
        self.cluster = self.picks.pop(0)
        yield from super().Process(request_iterator, context)


def test_root_bad_pick_falls_back_to_weights(tmp_path: Path) -> None:
    """A pick naming an unknown cell, a forbidden cell, or a non-cell cluster goes by the weights."""
    with echo_servers("a", "b", "c") as ports:
        cfg = three_cell_config(ports, allowed={"a": ["a", "b"]})
        boot = root_bootstrap(cfg, "a", admin_port=free_port(), weights={"a": 1})
        me = cfg.cell("a")
        picks = ["cell-zzz", "cell-c", "dlb_root_ext_proc", "b", "cell-b"]
        with ext_proc_server(me.root.ext_proc.port, _PickSequence(picks)), running_envoy(boot, tmp_path, "root"):
            reached = []
            for _ in picks:
                status, body = request(me.root.address.port)
                assert status == 200, body
                reached.append(body["name"])
            assert reached == ["a", "a", "a", "a", "b"]  # only a well-formed allowed pick steers


class _SlowPick(_PickCell):
    """Answers only after Envoy's message_timeout has passed: Envoy must fail open."""

    def Process(self, request_iterator, context):
        for resp in super().Process(request_iterator, context):
            time.sleep(1.0)
            yield resp


def test_root_fails_open_when_ext_proc_is_slow(tmp_path: Path) -> None:
    with echo_servers("a", "b", "c") as ports:
        cfg = three_cell_config(ports)
        boot = root_bootstrap(cfg, "a", admin_port=free_port(), weights={"a": 1}, message_timeout_ms=200)
        me = cfg.cell("a")
        with ext_proc_server(me.root.ext_proc.port, _SlowPick("cell-c")) as svc, running_envoy(boot, tmp_path, "root") as envoy:
            status, body = request(me.root.address.port)
            assert status == 200 and body["name"] == "a", body  # by the weights, not the late pick
            assert svc.seen_headers  # the service was asked
            assert int(envoy.stats("ext_proc")["http.dlb_root.ext_proc.dlb_root.message_timeouts"]) >= 1


@pytest.mark.parametrize("service", ["down", "starved"])
def test_root_fail_open_retries_a_dead_cell_on_its_fallback(tmp_path: Path, service: str) -> None:
    """Cell a's leaf Envoy is dead (nothing listens on its address) and the root service is down, or
    answers after the message timeout (a starved box): the fail-open route's weight for a names a's
    aggregate with its fallback b (the nearest other allowed cell), so every request refused by a is
    retried once on b instead of answering 503 (what the leaf Envoy kill lost under load)."""
    with echo_servers("b", "c") as ports:
        cfg = three_cell_config({**ports, "a": free_port()})
        boot = root_bootstrap(cfg, "a", admin_port=free_port(), weights={"a": 1}, message_timeout_ms=200)
        late = ext_proc_server(cfg.cell("a").root.ext_proc.port, _SlowPick("cell-a")) if service == "starved" else contextlib.nullcontext()
        with late, running_envoy(boot, tmp_path, "root") as envoy:
            reached = []
            for _ in range(10):
                status, body = request(cfg.cell("a").root.address.port)
                assert status == 200, body
                reached.append(body["name"])
            assert reached == ["b"] * 10, reached
            assert int(envoy.stats("upstream_rq_retry_success")["cluster.cell-a.or.b.upstream_rq_retry_success"]) == 10
            if service == "starved":  # each request waited for the pick, then went on without one
                assert int(envoy.stats("ext_proc")["http.dlb_root.ext_proc.dlb_root.message_timeouts"]) == 10


@pytest.mark.parametrize(("status", "retried"), [(429, True), (503, True), (500, False), (400, False)])
def test_root_retries_a_cells_refusal_on_its_fallback(tmp_path: Path, status: int, retried: bool) -> None:
    """A cell that answers 429 (its leaf's admission or a full server) or 503 (no live server) served
    nothing: the root Envoy sends the request once more, to the fallback cell. Any other answer reaches
    the client as it is (a 500 may come after the work was done; a 400 is the client's)."""
    with echo_servers("a", "b", "c", statuses={"a": status}) as ports:
        cfg = three_cell_config(ports)
        boot = root_bootstrap(cfg, "a", admin_port=free_port(), weights={"a": 1})
        with running_envoy(boot, tmp_path, "root"):  # no root service: the fail-open route, a's aggregate a.or.b
            answers = [request(cfg.cell("a").root.address.port) for _ in range(4)]
        want = (200, "b") if retried else (status, "a")
        assert [(st, body.get("name")) for st, body in answers] == [want] * 4, answers


def test_unmatched_path_is_not_routed(tmp_path: Path) -> None:
    with echo_servers("a", "b", "c") as ports:
        cfg = three_cell_config(ports)
        with running_envoy(root_bootstrap(cfg, "a", admin_port=free_port()), tmp_path, "root"):
            status, body = request(cfg.cell("a").root.address.port, path="/admin/secret")
            assert status == 404
            # An OpenAI SDK shows error.message and switches on error.code: neither may be empty.
            assert body["error"]["code"] == "dlb_no_endpoint" and body["error"]["type"] == "invalid_request_error"
            assert body["error"]["message"] == "dlb: no endpoint serves this path"


def test_root_respects_residency_in_fallback(tmp_path: Path) -> None:
    with echo_servers("a", "b", "c") as ports:
        cfg = three_cell_config(ports, allowed={"c": ["c"]})
        boot = root_bootstrap(cfg, "c", admin_port=free_port())
        clusters = {c["name"] for c in boot["static_resources"]["clusters"]}
        assert clusters == {"dlb_root_ext_proc", "cell-c"}  # no route to a disallowed cell even by spoofing
        with running_envoy(boot, tmp_path, "root"):
            for _ in range(5):
                status, body = request(cfg.cell("c").root.address.port, headers={HEADER_CELL: "cell-a"})
                assert status == 200 and body["name"] == "c"


# Controls: these show the protection above is real by removing it (and document Envoy's behaviour).


def test_control_without_internal_only_headers_spoof_wins(tmp_path: Path) -> None:
    with echo_servers("a", "b", "c") as ports:
        cfg = three_cell_config(ports)
        boot = root_bootstrap(cfg, "a", admin_port=free_port(), weights={"a": 1})
        hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        del hcm["route_config"]["internal_only_headers"]
        with running_envoy(boot, tmp_path, "root"):
            status, body = request(cfg.cell("a").root.address.port, headers={HEADER_CELL: "cell-c"})
            assert status == 200 and body["name"] == "c"


def test_control_empty_internal_address_config_lets_spoof_through(tmp_path: Path) -> None:
    """Why the renderer lists a never-matching CIDR: an explicitly empty list makes loopback internal."""
    with echo_servers("a", "b", "c") as ports:
        cfg = three_cell_config(ports)
        boot = root_bootstrap(cfg, "a", admin_port=free_port(), weights={"a": 1})
        hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        hcm["internal_address_config"] = {"cidr_ranges": []}
        with running_envoy(boot, tmp_path, "root"):
            status, body = request(cfg.cell("a").root.address.port, headers={HEADER_CELL: "cell-c"})
            assert status == 200 and body["name"] == "c", body


def test_control_header_mutation_filter_does_not_protect(tmp_path: Path) -> None:
    """docs/design.md §2: removing x-dlb-cell with a header_mutation filter before ext_proc is too late."""
    with echo_servers("a", "b", "c") as ports:
        cfg = three_cell_config(ports)
        boot = root_bootstrap(cfg, "a", admin_port=free_port(), weights={"a": 1})
        hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        del hcm["route_config"]["internal_only_headers"]
        strip = {"name": "envoy.filters.http.header_mutation", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
            "mutations": {"request_mutations": [{"remove": HEADER_CELL}]}}}
        hcm["http_filters"].insert(0, strip)
        with running_envoy(boot, tmp_path, "root"):
            status, body = request(cfg.cell("a").root.address.port, headers={HEADER_CELL: "cell-c"})
            assert status == 200 and body["name"] == "c", body
            assert HEADER_CELL not in body["headers"]  # the header was removed, yet its route stuck


# --------------------------------------------------------------------------------------------
# leaf: WAN emulation by source cell
# --------------------------------------------------------------------------------------------


def test_leaf_delays_by_source_cell_rtt(tmp_path: Path) -> None:
    with echo_servers("a-srv", "b-srv", "c-srv") as srv:
        ports = {"a": free_port(), "b": free_port(), "c": free_port(), **srv}
        cfg = three_cell_config(ports, one_way_ms=150.0)  # RTT 300 ms between any two cells
        boot = leaf_bootstrap(cfg, "b", admin_port=free_port(), emulate_wan=True)
        with running_envoy(boot, tmp_path, "leaf") as envoy:
            leaf = cfg.cell("b").leaf.address.port
            status, body = request(leaf, headers={HEADER_SRC_CELL: "b"})  # local: no delay
            assert status == 200 and body["name"] == "b-srv"
            stats = envoy.stats("fault")
            assert int(stats.get("http.dlb_leaf.fault.delays_injected", "0")) == 0
            t0 = time.monotonic()
            status, body = request(leaf, headers={HEADER_SRC_CELL: "a", HEADER_ROOT_TOKEN: root_token(cfg)})  # as a root sends it
            elapsed = time.monotonic() - t0
            assert status == 200 and body["name"] == "b-srv"
            assert elapsed >= 0.9 * 0.300  # generous lower bound only (the delay cannot be skipped)
            assert int(envoy.stats("fault")["http.dlb_leaf.fault.delays_injected"]) == 1


def test_cli_render_writes_a_valid_bootstrap(tmp_path: Path) -> None:
    from dlb.cli import main

    out = tmp_path / "leaf.yaml"
    assert main(["config", "render", str(CONFIG_DIR / "dlb.example.yaml"), "leaf", "eu-west1", "--admin-port", "9903",
                 "--emulate-wan", "--access-log", "-o", str(out)]) == 0
    boot = yaml.safe_load(out.read_text())
    delays = {f["name"]: f["typed_config"]["delay"]["fixed_delay"] for f in _hcm(boot)["http_filters"] if f["name"].startswith("dlb.wan_delay")}
    assert delays == {"dlb.wan_delay.us-east1": "0.076s", "dlb.wan_delay.us-west1": "0.132s"}
    assert _hcm(boot)["access_log"][0]["name"] == "envoy.access_loggers.http_grpc"  # to the leaf agent
    result = validate(out)
    assert result.returncode == 0, result.stdout + result.stderr
    assert main(["config", "render", str(CONFIG_DIR / "dlb.example.yaml"), "root", "mars", "--admin-port", "1"]) == 1


class _StreamHandler(_EchoHandler):
    """Streams two chunks; the second only after the test says it has read the first."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.server.seen_headers.append({k.lower(): v for k, v in self.headers.items()})  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        for part in (b"data: first\n\n", b"data: second\n\n"):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.flush()
            if part.endswith(b"first\n\n"):
                # If anything on the way buffered the response, the client never sees "first" and
                # never releases us: we time out and record it.
                self.server.released.append(self.server.go.wait(10.0))  # type: ignore[attr-defined]
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def log_message(self, *args: Any) -> None:
        pass


def test_streaming_passes_through(tmp_path: Path) -> None:
    """Root (ext_proc up, picks b) → leaf b (WAN emulation) → streaming server: chunks flow as produced."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _StreamHandler)
    srv.daemon_threads = True
    srv.go, srv.released, srv.seen_headers = threading.Event(), [], []  # type: ignore[attr-defined]
    srv.name = "b-srv"  # type: ignore[attr-defined]  # GET /health (the leaf's active health check) echoes it
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with echo_servers("a-srv", "c-srv") as echo:
            ports = {"a": free_port(), "b": free_port(), "c": free_port(), "b-srv": srv.server_address[1], **echo}
            cfg = three_cell_config(ports, one_way_ms=50.0)
            root = root_bootstrap(cfg, "a", admin_port=free_port(), weights={"a": 1})
            leaf = leaf_bootstrap(cfg, "b", admin_port=free_port(), emulate_wan=True)
            me = cfg.cell("a")
            with ext_proc_server(me.root.ext_proc.port, _PickCell("cell-b")), running_envoy(root, tmp_path, "root"), \
                    running_envoy(leaf, tmp_path, "leaf") as leaf_envoy:
                conn = http.client.HTTPConnection("127.0.0.1", me.root.address.port, timeout=30)
                try:
                    conn.request("POST", "/v1/chat/completions", body=b"{}", headers={"content-type": "application/json"})
                    resp = conn.getresponse()
                    assert resp.status == 200
                    first = resp.read(len(b"data: first\n\n"))
                    srv.go.set()  # type: ignore[attr-defined]
                    rest = resp.read()
                finally:
                    conn.close()
                assert first == b"data: first\n\n" and rest == b"data: second\n\n"
                assert srv.released == [True]  # type: ignore[attr-defined]
                (hdrs,) = srv.seen_headers  # type: ignore[attr-defined]
                assert hdrs[HEADER_SRC_CELL] == "a" and hdrs[HEADER_ENDPOINT] == "chat"
                assert int(leaf_envoy.stats("fault")["http.dlb_leaf.fault.delays_injected"]) == 1
    finally:
        srv.go.set()  # type: ignore[attr-defined]
        srv.shutdown()
        srv.server_close()


def test_leaf_ext_proc_pick_and_fail_open(tmp_path: Path) -> None:
    """Leaf ext_proc names a server in x-dlb-server (ORIGINAL_DST); when it is down, LEAST_REQUEST picks."""
    import dataclasses

    from dlb.config import HostPort, Server

    with echo_servers("s0", "s1") as srv:
        cfg = three_cell_config({"a": free_port(), "b": free_port(), "c": free_port()})
        ext = HostPort("127.0.0.1", free_port())
        a = cfg.cells[0]
        a = dataclasses.replace(a, servers=(Server(HostPort("127.0.0.1", srv["s0"])), Server(HostPort("127.0.0.1", srv["s1"]))),
                                leaf=dataclasses.replace(a.leaf, ext_proc=ext, probe=ext))  # its health is checked at the probe
        cfg = dataclasses.replace(cfg, cells=(a,) + cfg.cells[1:])
        boot = leaf_bootstrap(cfg, "a", admin_port=free_port(), emulate_wan=False)
        leaf_port = a.leaf.address.port
        with running_envoy(boot, tmp_path, "leaf") as envoy:
            down = [request(leaf_port)[1]["name"] for _ in range(16)]  # nothing on the ext_proc port
            assert set(down) == {"s0", "s1"}, down  # LEAST_REQUEST spreads (P[one server] = 2^-15)
            with ext_proc_server(ext.port, _PickCell(f"127.0.0.1:{srv['s1']}", header=HEADER_SERVER)):
                # Envoy health-checks the ext_proc (every 0.5 s): until a check passes it fails open.
                healthy = "cluster.dlb_leaf_ext_proc.membership_healthy"
                until(lambda: envoy.stats(healthy).get(healthy) == "1", "the ext_proc cluster healthy", timeout=20)
                up = [request(leaf_port)[1]["name"] for _ in range(6)]
            assert up == ["s1"] * 6, up


# --------------------------------------------------------------------------------------------
# property: whatever valid config, the rendered bootstraps are ones Envoy accepts
# --------------------------------------------------------------------------------------------

@st.composite
def valid_configs(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 4))
    names = draw(st.lists(st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True), min_size=n, max_size=n, unique=True))
    port = iter(range(20000, 30000))
    cells = []
    for name in names:
        cell: dict[str, Any] = {
            "name": name,
            "leaf": {"address": f"127.0.0.1:{next(port)}", "probe": f"127.0.0.1:{next(port)}"},
            "root": {"address": f"127.0.0.1:{next(port)}"},
            "servers": [{"address": f"127.0.0.1:{next(port)}", "weight": draw(st.integers(1, 5))} for _ in range(draw(st.integers(1, 3)))],
        }
        if draw(st.booleans()):
            cell["leaf"]["ext_proc"] = f"127.0.0.1:{next(port)}"
        cells.append(cell)
    ms = st.floats(0, 500, allow_nan=False).map(lambda x: round(x, draw(st.integers(0, 4))))
    one_way = {a: {b: draw(ms) for b in names if b != a} for a in names}
    allowed = {a: draw(st.lists(st.sampled_from(names), min_size=1, unique=True)) for a in names if draw(st.booleans())}
    endpoints = []
    for k in range(draw(st.integers(1, 3))):
        endpoints.append({
            "name": draw(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,8}", fullmatch=True)) + f"-{k}",
            "match": {"prefix": f"/e{k}/" + draw(st.from_regex(r"[a-z0-9/._~-]{0,6}", fullmatch=True))},
            "policy": {"mechanism": draw(st.sampled_from(["discrete", "flow"])), "cost": draw(st.sampled_from(["latency", "gradient"])),
                       "affinity": {"enabled": draw(st.booleans())}},
            "timeout_s": draw(st.sampled_from([0, 30, 600.5])),
            "idle_timeout_s": draw(st.sampled_from([0, 1.25, 300])),
        })
    return {"version": 1, "cells": cells, "network": {"symmetric": False, "one_way_ms": one_way, "allowed": allowed}, "endpoints": endpoints}


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=valid_configs(), pick=st.integers(0, 3), native_flow=st.booleans())
def test_any_valid_config_renders_envoy_valid_bootstraps(tmp_path: Path, data: dict[str, Any], pick: int, native_flow: bool) -> None:
    cfg = config_from_dict(data, "generated")
    cell = cfg.cell_names[pick % len(cfg.cells)]
    for role, boot in (("root", root_bootstrap(cfg, cell, admin_port=9901, native_flow=native_flow)),
                       ("leaf", leaf_bootstrap(cfg, cell, admin_port=9902, emulate_wan=True, access_log=True))):
        result = validate(write_bootstrap(boot, tmp_path / f"{role}.yaml"))
        assert result.returncode == 0, f"{role} {cell}: {result.stdout}{result.stderr}\n{yaml.safe_dump(data)}"


def test_yaml_ambiguous_names_stay_strings(tmp_path: Path) -> None:
    """Regression (found by the property test): cells named y and nan, endpoints named 1e3 and true."""
    data = {
        "version": 1,
        "cells": [{"name": n, "leaf": {"address": f"127.0.0.1:{20000 + 3 * k}", "probe": f"127.0.0.1:{20001 + 3 * k}"},
                   "root": {"address": f"127.0.0.1:{20002 + 3 * k}"}, "servers": [f"127.0.0.1:{21000 + k}"]}
                  for k, n in enumerate(["y", "nan"])],
        "network": {"default_one_way_ms": 5},
        "endpoints": [{"name": "1e3", "match": {"prefix": "/v1/"}}, {"name": "true", "match": {"prefix": "/x/"}}],
    }
    cfg = config_from_dict(data)
    for cell in cfg.cell_names:
        for role, boot in (("root", root_bootstrap(cfg, cell, admin_port=9901)), ("leaf", leaf_bootstrap(cfg, cell, admin_port=9902, emulate_wan=True))):
            path = write_bootstrap(boot, tmp_path / f"{role}-{cell}.yaml")
            assert yaml.safe_load(Path(path).read_text()) == boot  # the dump round-trips exactly
            result = validate(path)
            assert result.returncode == 0, f"{role} {cell}: {result.stderr[-600:]}"


def test_port_clash_fails_loudly(tmp_path: Path) -> None:
    """Two Envoys on one listen port: with Envoy's default SO_REUSEPORT both start and split traffic."""
    with echo_servers("a", "b", "c") as ports:
        cfg = three_cell_config(ports)
        first = root_bootstrap(cfg, "a", admin_port=free_port())
        second = root_bootstrap(cfg, "a", admin_port=free_port())
        with running_envoy(first, tmp_path, "first"), pytest.raises(RuntimeError, match="Address already in use"):
            with running_envoy(second, tmp_path, "second"):
                pass


def test_native_flow_endpoint_skips_the_ext_proc(tmp_path: Path) -> None:
    """native_flow: a flow endpoint without affinity is routed by Envoy's weights, never by Python."""
    with echo_servers("a", "b", "c") as ports:
        data = {
            "version": 1,
            "cells": [{"name": n, "leaf": {"address": f"127.0.0.1:{ports[n]}", "probe": f"127.0.0.1:{free_port()}"},
                       "root": {"address": f"127.0.0.1:{free_port()}", "ext_proc": f"127.0.0.1:{free_port()}"},
                       "servers": [f"127.0.0.1:{free_port()}"]} for n in ("a", "b", "c")],
            "network": {"default_one_way_ms": 10},
            "endpoints": [{"name": "chat", "match": {"prefix": "/v1/chat/"}},
                          {"name": "embed", "match": {"prefix": "/v1/"}, "policy": {"mechanism": "flow"}}],
        }
        cfg = config_from_dict(data)
        me = cfg.cell("a")
        boot = root_bootstrap(cfg, "a", admin_port=free_port(), weights={"a": 1}, native_flow=True)
        with ext_proc_server(me.root.ext_proc.port, _PickCell("cell-c")) as svc, running_envoy(boot, tmp_path, "root"):
            status, body = request(me.root.address.port, path="/v1/embeddings")
            assert status == 200 and body["name"] == "a" and body["headers"][HEADER_ENDPOINT] == "embed"
            assert svc.seen_headers == []  # the service was never asked
            status, body = request(me.root.address.port, path="/v1/chat/completions")
            assert status == 200 and body["name"] == "c" and len(svc.seen_headers) == 1  # discrete: asked
