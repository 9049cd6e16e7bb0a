"""A client reaching a leaf Envoy directly cannot steer it with internal headers (issue 14 row 9).

``x-dlb-server`` is the leaf ext_proc's pick, read by an ORIGINAL_DST cluster: from a client it sent the
request to any host:port the client named (an open proxy). The leaf now strips it (and ``x-dlb-cell``)
from every downstream request before any filter runs; its own ext_proc sets it afterwards.
"""

from __future__ import annotations

from pathlib import Path

from dlb.config import config_from_dict
from dlb.envoy.bootstrap import LEAF_INTERNAL_HEADERS, leaf_bootstrap, leaf_prefixes
from dlb.envoy.headers import CELL, SERVER
from dlb.procutil import free_port
from tests.test_envoy_configs import echo_servers, request, running_envoy


def test_leaf_ignores_a_client_supplied_server_pick(tmp_path: Path) -> None:
    with echo_servers("cell-server", "elsewhere") as ports:
        cfg = config_from_dict({
            "version": 1,
            "cells": [{"name": "a", "servers": [f"127.0.0.1:{ports['cell-server']}"],
                       # a leaf ext_proc that is down: Envoy fails open, so only the header could pick
                       "leaf": {"address": f"127.0.0.1:{free_port()}", "probe": f"127.0.0.1:{free_port()}",
                                "ext_proc": f"127.0.0.1:{free_port()}"}}],
            "endpoints": [{"name": "chat", "match": {"prefix": "/v1/"}}]})
        boot = leaf_bootstrap(cfg, "a", admin_port=free_port(), emulate_wan=False)
        with running_envoy(boot, tmp_path, "leaf"):
            for _ in range(3):
                status, body = request(cfg.cells[0].leaf.address.port,
                                       headers={SERVER: f"127.0.0.1:{ports['elsewhere']}", CELL: "cell-x"})
                assert status == 200 and body["name"] == "cell-server", body
                assert SERVER not in body["headers"] and CELL not in body["headers"]
    assert set(LEAF_INTERNAL_HEADERS) == {SERVER, CELL}


def test_leaf_forwards_only_the_configured_api_paths(tmp_path: Path) -> None:
    """An emulator's /admin/faults (or a vLLM's own admin paths) behind a leaf is never reachable through it."""
    with echo_servers("cell-server") as ports:
        cfg = config_from_dict({
            "version": 1,
            "cells": [{"name": "a", "servers": [f"127.0.0.1:{ports['cell-server']}"],
                       "leaf": {"address": f"127.0.0.1:{free_port()}", "probe": f"127.0.0.1:{free_port()}"}}],
            "endpoints": [{"name": "chat", "match": {"prefix": "/v1/chat/"}}, {"name": "all-v1", "match": {"prefix": "/v1/"}}]})
        assert leaf_prefixes(cfg) == ["/v1/"]
        boot = leaf_bootstrap(cfg, "a", admin_port=free_port(), emulate_wan=False)
        port = cfg.cells[0].leaf.address.port
        with running_envoy(boot, tmp_path, "leaf"):
            assert request(port, "/v1/chat/completions")[0] == 200
            for path in ("/admin/faults", "/admin/state", "/reset_prefix_cache", "/metrics"):
                status, body = request(port, path)
                assert status == 404 and "name" not in body, (path, body)
