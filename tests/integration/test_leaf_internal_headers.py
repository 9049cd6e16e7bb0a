"""A client reaching a leaf Envoy directly cannot steer it with internal headers (issue 14 row 9).

``x-dlb-server`` is the leaf ext_proc's pick, read by an ORIGINAL_DST cluster: from a client it sent the
request to any host:port the client named (an open proxy). The leaf now strips it (and ``x-dlb-cell``)
from every downstream request before any filter runs; its own ext_proc sets it afterwards.
"""

from __future__ import annotations

from pathlib import Path

from test_envoy_configs import echo_servers, request, running_envoy

from dlb.config import config_from_dict
from dlb.envoy.bootstrap import LEAF_INTERNAL_HEADERS, leaf_bootstrap, leaf_prefixes, root_bootstrap
from dlb.envoy.contract import CELL, ROOT_TOKEN, SERVER, SRC_CELL
from dlb.envoy.root_token import root_token
from dlb.procutil import free_port


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


def test_leaf_trusts_the_source_cell_only_from_roots(tmp_path: Path) -> None:
    """A client at the leaf port claiming ``x-dlb-src-cell`` gets no emulated WAN delay and is counted as no cell.

    Roots send the deployment's token (``root_token_file``) next to the source cell; without it (or with a
    wrong one) the leaf drops the source cell before the servers and the access log see it, and its WAN
    fault filters do not match. The token itself never leaves the leaf.
    """
    token_file = tmp_path / "root-token"
    token_file.write_text("s3cret-root-token-0123456789\n")
    with echo_servers("a-srv", "b-srv") as ports:
        cfg = config_from_dict({
            "version": 1, "root_token_file": str(token_file),
            "cells": [{"name": n, "servers": [f"127.0.0.1:{ports[n + '-srv']}"],
                       "leaf": {"address": f"127.0.0.1:{free_port()}", "probe": f"127.0.0.1:{free_port()}"},
                       "root": {"address": f"127.0.0.1:{free_port()}"}} for n in ("a", "b")],
            "network": {"default_one_way_ms": 5.0},
            "endpoints": [{"name": "chat", "match": {"prefix": "/v1/"}}]})
        assert root_token(cfg) == "s3cret-root-token-0123456789"
        root = root_bootstrap(cfg, "a", admin_port=free_port())["static_resources"]
        root_adds = {h["header"]["key"]: h["header"]["value"]
                     for h in root["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]["request_headers_to_add"]}
        # The token is not in the route config (which xDS carries) but read from its file by the bootstrap's secret.
        assert root_adds == {SRC_CELL: "a"} and root["secrets"][0]["generic_secret"]["secret"] == {"filename": str(token_file)}
        boot = leaf_bootstrap(cfg, "b", admin_port=free_port(), emulate_wan=True)
        port = cfg.cell("b").leaf.address.port
        with running_envoy(boot, tmp_path, "leaf") as envoy:
            for forged in ({SRC_CELL: "a"}, {SRC_CELL: "a", ROOT_TOKEN: "guessed-token-0123456789"}):
                status, body = request(port, headers=forged)
                assert status == 200 and body["name"] == "b-srv", body
                assert SRC_CELL not in body["headers"] and ROOT_TOKEN not in body["headers"], body["headers"]
            assert int(envoy.stats("fault").get("http.dlb_leaf.fault.delays_injected", "0")) == 0
            status, body = request(port, headers={SRC_CELL: "a", ROOT_TOKEN: "s3cret-root-token-0123456789"})
            assert status == 200 and body["headers"][SRC_CELL] == "a" and ROOT_TOKEN not in body["headers"], body
            assert int(envoy.stats("fault")["http.dlb_leaf.fault.delays_injected"]) == 1


def test_a_forgeable_root_token_on_a_leaf_beyond_loopback_is_warned_about(tmp_path: Path) -> None:
    """No root_token_file while a leaf listens on every interface: `dlb config validate` (and `dlb up`, the control
    plane) warns that anyone who has read the config can claim a source cell; loopback leaves or a token file: quiet."""
    import subprocess
    import sys

    import yaml

    def validate(leaf: str, token: bool) -> str:
        raw = {"version": 1, "cells": [{"name": "a", "servers": ["127.0.0.1:1"], "leaf": {"address": leaf, "probe": "127.0.0.1:3"}}],
               "endpoints": [{"name": "chat", "match": {"prefix": "/v1/"}}]}
        if token:
            (tmp_path / "token").write_text("s3cret-token-0123456789")
            raw["root_token_file"] = "token"
        path = tmp_path / "dlb.yaml"
        path.write_text(yaml.safe_dump(raw))
        out = subprocess.run([sys.executable, "-m", "dlb.cli", "config", "validate", str(path)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stderr

    warned = validate("10.1.2.3:8080", token=False)
    assert "warning:" in warned and "root_token_file is not set" in warned and "leaf Envoy of a" in warned, warned
    assert "warning" not in validate("10.1.2.3:8080", token=True)
    assert "warning" not in validate("127.0.0.1:8080", token=False)
