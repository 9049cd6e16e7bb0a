"""DLB's HTTP/2 gRPC transport (:mod:`dlb.transport.h2`) against independent peers.

Here: the tests that run a real Envoy, the demo, network namespaces or the container;
the others: ``tests/integration/test_ext_proc_h2.py``.
The rules and what the tests stand for: that file's docstring.
"""

from __future__ import annotations

import urllib.request

import pytest
from test_ext_proc_h2 import ServerThread

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
