"""Leaf admission on the real data path: a leaf Envoy whose ext_proc agent refuses what its one server
would keep past a share of the clients' timeout answers an OpenAI-shaped 429 a client SDK can retry on,
counts it, and keeps the server serving (dlb/core/admission.py; the simulator's twin of this refusal is a
shed)."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import http.client
import json
import random
import tempfile
import time
import urllib.request
from pathlib import Path

from bounded_wait import until

from dlb.config import config_from_dict
from dlb.config.policy import set_plugins
from dlb.envoy.binary import EnvoyProcess
from dlb.envoy.bootstrap import leaf_bootstrap, write_bootstrap
from dlb.procutil import free_port
from dlb.testbed.emulator import EmulatorProcess
from dlb.testbed.process import ServiceProcess


def _metric(url: str, name: str) -> float:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith((name + "{", name + " ")))


def _chat(host: str, port: int) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(host, port, timeout=60)
    try:
        body = {"model": "dlb-emulated", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 200}
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"content-type": "application/json"})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def test_a_server_too_busy_for_the_timeout_gets_no_more_and_the_client_a_429() -> None:
    with tempfile.TemporaryDirectory(prefix="dlb-admission-") as tmp, contextlib.ExitStack() as stack:
        emu = stack.enter_context(EmulatorProcess(profile="fast-test", time_scale=40.0, server_id="a-0"))  # a slow server
        raw = {"version": 1, "cells": [{"name": "a", "servers": [emu.address],
               "leaf": {"address": f"127.0.0.1:{free_port()}", "probe": f"127.0.0.1:{free_port()}",
                        "ext_proc": f"127.0.0.1:{free_port()}"},
               "root": {"address": f"127.0.0.1:{free_port()}", "ext_proc": f"127.0.0.1:{free_port()}"}}],
               "endpoints": [{"name": "chat", "match": {"prefix": "/v1/"}, "policy": {"mechanism": "discrete", "cost": "rif"},
                              "timeout_s": 6, "latency_prior": {"a_s": 0.05, "b_s": 0.005, "c": 4, "s": 1}}],
               "services": {"control_plane": {"xds": f"127.0.0.1:{free_port()}", "status": f"127.0.0.1:{free_port()}"}}}
        raw = set_plugins(raw, {"type": "admission", "parameters": {"window_s": 2, "min_inflight": 4}},
                          {"type": "background-probe", "parameters": {"min_interval_ms": 0}})  # only our requests count
        path = Path(tmp) / "dlb.yaml"
        path.write_text(json.dumps(raw))
        cfg = config_from_dict(raw, source=str(path))
        metrics = f"127.0.0.1:{free_port()}"
        stack.enter_context(ServiceProcess("leaf", "--config", str(path), "--cell", "a", "--metrics", metrics))
        admin = free_port()
        boot = write_bootstrap(leaf_bootstrap(cfg, "a", admin_port=admin, emulate_wan=False, access_log=True), Path(tmp) / "leaf.yaml")
        stack.enter_context(EnvoyProcess(boot, admin, base_id=random.randrange(1, 60000)))
        hp = cfg.cell("a").leaf.address
        until(lambda: _chat(hp.host, hp.port)[0] == 200, "the leaf serving", timeout=60)
        time.sleep(2.5)  # past the server's first 2-s window, during which admission admits everything
        # 200 requests, far more than the slow server can finish within a third of 6 s.
        with cf.ThreadPoolExecutor(64) as pool:
            out = list(pool.map(lambda _: _chat(hp.host, hp.port), range(200)))
        refused = [(h, b) for s, h, b in out if s == 429]
        statuses = {s for s, _, _ in out}
        assert refused and statuses <= {200, 429}, statuses
        assert any(s == 200 for s, _, _ in out)  # the server kept serving what was admitted
        h, b = refused[0]
        err = json.loads(b)["error"]
        assert h["content-type"] == "application/json" and h["retry-after"] == "1"
        assert err["code"] == "dlb_no_capacity" and err["type"] == "rate_limit_error"
        url = f"http://{metrics}/metrics"
        until(lambda: _metric(url, "dlb_leaf_admission_refused_total") >= len(refused), "the refusals counted")
        assert _metric(url, "dlb_leaf_admission_refused_total") == len(refused)
