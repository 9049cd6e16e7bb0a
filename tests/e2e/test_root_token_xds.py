"""The root token never travels in xDS, and a forged one still does not buy a source cell.

A real control plane serves a root Envoy (cell ``a``) and a leaf Envoy (cell ``b``) over ADS, with the
token ``dlb up`` generates by default. Every resource the control plane holds for either node, and every
dynamic resource either Envoy received, is searched for the token: the root's route config names only
its own cell, its credential_injector names a secret its bootstrap reads from the file, and the leaf's
Lua check names the file. Then traffic: through the root, the leaf's server sees ``x-dlb-src-cell: a``;
straight at the leaf with a guessed token (or none), it sees no source cell.
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest
import yaml
from bounded_wait import until_in_loop
from test_envoy_configs import echo_servers, request

from dlb.config import config_from_dict
from dlb.config.model import HostPort
from dlb.control_plane.service import ControlPlane
from dlb.envoy.ads_bootstrap import ads_bootstrap
from dlb.envoy.binary import EnvoyProcess
from dlb.envoy.contract import ROOT_TOKEN, SRC_CELL
from dlb.envoy.root_token import token_secret
from dlb.launch.run_secrets import generate_root_token
from dlb.procutil import free_port

pytestmark = [pytest.mark.envoy, pytest.mark.timeout(180)]


def test_the_root_token_is_in_no_xds_resource_and_still_guards_the_source_cell(tmp_path: Path) -> None:
    with echo_servers("a-srv", "b-srv") as ports:
        asyncio.run(_scenario(tmp_path, ports))


async def _scenario(tmp_path: Path, ports: dict[str, int]) -> None:
    token_file = generate_root_token(tmp_path / "run")  # what `dlb up` makes when the config names none
    token = token_file.read_text().strip()
    cfg = config_from_dict({
        "version": 1, "root_token_file": str(token_file),
        "cells": [{"name": n, "servers": [f"127.0.0.1:{ports[n + '-srv']}"],
                   "leaf": {"address": f"127.0.0.1:{free_port()}", "probe": f"127.0.0.1:{free_port()}"},
                   "root": {"address": f"127.0.0.1:{free_port()}"}} for n in ("a", "b")],
        "network": {"default_one_way_ms": 1.0, "allowed": {"a": ["b"], "b": ["b"]}},  # root a sends every request to b
        "endpoints": [{"name": "gen", "match": {"prefix": "/v1/"}, "policy": {"mechanism": "flow", "cost": "latency"}}]})
    assert cfg.root_token == token and cfg.root_token_file == str(token_file)
    cp = ControlPlane(cfg, probe=False, flow_loop=False)
    xds_port, _ = await cp.start("127.0.0.1:0", "127.0.0.1:0")
    envoys: list[EnvoyProcess] = []
    try:
        snaps = [cp.cache.get_snapshot(k) for k in cp.cache.keys()]  # noqa: SIM118  (a method, not a dict)
        assert len(snaps) >= 2  # every root and leaf node of the config
        sent = b"".join(r.sotw_field + r.delta_field for snap in snaps if snap for by_name in snap.resources.values() for r in by_name.values())
        assert b"x-dlb-root-token" in sent and cfg.root_token_file.encode() in sent  # the leaf's check and the root's filter are there
        assert token.encode() not in sent
        for role, cell in (("root", "a"), ("leaf", "b")):
            admin = free_port()
            boot = tmp_path / f"{role}.yaml"
            boot.write_text(yaml.safe_dump(ads_bootstrap(role, cell, HostPort("127.0.0.1", xds_port), admin, node_id=f"{role}-{cell}",
                                                         token=token_secret(cfg) if role == "root" else None)))
            assert token not in boot.read_text()  # the bootstrap names the file, too
            envoy = EnvoyProcess(str(boot), admin, base_id=random.randrange(1, 60000))
            await asyncio.to_thread(envoy.start)
            envoys.append(envoy)
        root, leaf = cfg.cell("a").root.address.port, cfg.cell("b").leaf.address.port
        await until_in_loop(lambda: _served(root), "root a serves through leaf b")
        for envoy in envoys:
            dump = envoy.admin_get("/config_dump?include_eds")
            assert '"dynamic_' in dump and token not in dump, "an Envoy received the token over xDS"

        status, body = await asyncio.to_thread(request, root, "/v1/x", {ROOT_TOKEN: "forged-by-a-client-0123456789", SRC_CELL: "b"})
        assert status == 200 and body["name"] == "b-srv" and body["headers"].get(SRC_CELL) == "a", body
        assert ROOT_TOKEN not in body["headers"], "the token reached a server"
        for forged in ({SRC_CELL: "a"}, {SRC_CELL: "a", ROOT_TOKEN: "guessed-token-0123456789"}, {SRC_CELL: "a", ROOT_TOKEN: ""}):
            status, body = await asyncio.to_thread(request, leaf, "/v1/x", forged)
            assert status == 200 and body["name"] == "b-srv", body
            assert SRC_CELL not in body["headers"] and ROOT_TOKEN not in body["headers"], (forged, body["headers"])
        status, body = await asyncio.to_thread(request, leaf, "/v1/x", {SRC_CELL: "a", ROOT_TOKEN: token})  # as a root sends it
        assert status == 200 and body["headers"].get(SRC_CELL) == "a", body
    finally:
        for envoy in envoys:
            envoy.stop()
        await cp.stop()


def _served(port: int) -> bool:
    try:
        status, body = request(port, "/v1/x")
    except OSError:
        return False
    return status == 200 and body.get("name") == "b-srv"


def test_snapshot_bytes_hold_a_token_they_carry() -> None:
    """The search above can fail: a token put in a route config is found in the same bytes."""
    cfg = config_from_dict({
        "version": 1, "cells": [{"name": "a", "servers": ["127.0.0.1:1"], "leaf": {"address": "127.0.0.1:2", "probe": "127.0.0.1:3"},
                                 "root": {"address": "127.0.0.1:4"}}],
        "endpoints": [{"name": "gen", "match": {"prefix": "/v1/"}}]})
    from dlb.control_plane.envoy_resources import root_resources
    from dlb.envoy.root_token import root_token

    rs = root_resources(cfg, "a")
    rc = rs.routes[0]
    rc.request_headers_to_add.add().header.MergeFrom(type(rc.request_headers_to_add[0].header)(key=ROOT_TOKEN, value=root_token(cfg)))
    assert root_token(cfg).encode() in b"".join(r.SerializeToString() for r in rs.routes)
    assert json.dumps(token_secret(cfg)).count(root_token(cfg)) == 1  # derived tokens (no file) stay in the bootstrap only
