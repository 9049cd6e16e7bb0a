"""DLB's HTTP/2 gRPC transport (:mod:`dlb.ext_proc.transport.h2`) against independent peers.

The ``h2`` library (python-hyper) plays the client for protocol corners a well-behaved gRPC client
never produces (CONTINUATION, padding, tiny flow-control windows, byte-by-byte delivery, bad
input); grpc's C-core client is the conformance check (``test_ext_proc_root.py``), and Envoy itself
is the peer in ``test_envoy_forwards_only_the_headers_the_root_reads`` and every end-to-end test.
"""

from __future__ import annotations

import asyncio
import threading
import urllib.request
from collections.abc import Iterator

import pytest

from dlb.ext_proc.health import HealthState, h2_health_routes
from dlb.ext_proc.protocol import PROCESS_METHOD
from dlb.ext_proc.transport.server import H2GrpcServer

METHOD = PROCESS_METHOD


class ServerThread:
    """An H2GrpcServer on its own event loop thread (the tests talk to it with blocking sockets)."""

    def __init__(self, handler, loop_factory=asyncio.new_event_loop) -> None:
        # With the health service, as ExtProcServer serves it: the rendered bootstraps health-check ext_proc.
        self.server = H2GrpcServer(METHOD, handler, routes=h2_health_routes(HealthState()))
        self.loop = loop_factory()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self.server.start("127.0.0.1", 0), self.loop).result(10)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(0.5), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def echo_upper(message: bytes) -> tuple[bytes, bool]:
    """Replies the message upper-cased; ``b"keep..."`` keeps the call open, ``b"boom"`` raises."""
    if message == b"boom":
        raise RuntimeError("handler bug")
    return message.upper(), not message.startswith(b"keep")


@pytest.fixture
def server() -> Iterator[ServerThread]:
    s = ServerThread(echo_upper)
    try:
        yield s
    finally:
        s.close()


# -- the HPACK cache is exact --------------------------------------------------------------------


# -- Envoy as the peer ------------------------------------------------------------------------------
@pytest.mark.envoy
def test_envoy_forwards_only_the_headers_the_root_reads(tmp_path):
    """The rendered root bootstrap sends ``:path`` and the session header, never credentials."""
    from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

    from dlb.config import config_from_dict
    from dlb.envoy.binary import EnvoyProcess
    from dlb.envoy.bootstrap import root_bootstrap, write_bootstrap
    from dlb.ext_proc.protocol import CONTINUE
    from dlb.procutil import free_port

    seen: list[list[str]] = []

    def record(message: bytes) -> tuple[bytes, bool]:
        req = ep.ProcessingRequest.FromString(message)
        seen.append(sorted(h.key for h in req.request_headers.headers.headers))
        return CONTINUE["request_headers"], True

    srv = ServerThread(record)
    try:
        upstream = free_port()
        raw = {
            "version": 1,
            "cells": [{"name": "x", "leaf": {"address": f"127.0.0.1:{upstream}", "probe": f"127.0.0.1:{free_port()}"},
                       "root": {"address": f"127.0.0.1:{free_port()}", "ext_proc": f"127.0.0.1:{srv.port}"},
                       "servers": ["127.0.0.1:9"]}],
            "endpoints": [{"name": "chat", "match": {"prefix": "/v1/"},
                           "policy": {"mechanism": "discrete", "cost": "rif", "affinity": {"enabled": True, "header": "x-user"}}}],
        }
        cfg = config_from_dict(raw, source="test")
        admin = free_port()
        boot = root_bootstrap(cfg, "x", admin_port=admin)
        port = cfg.cell("x").root.address.port
        with EnvoyProcess(write_bootstrap(boot, tmp_path / "root.yaml"), admin).start():
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=b"{}", method="POST", headers={
                "authorization": "Bearer secret", "cookie": "a=b", "x-user": "u1", "x-session-id": "s1", "x-other": "1"})
            try:
                urllib.request.urlopen(req, timeout=10).read()
            except urllib.error.HTTPError:
                pass  # nothing listens upstream (503): only what reached the processor matters here
    finally:
        srv.close()
    assert seen == [[":path", "x-session-id", "x-user"]]
