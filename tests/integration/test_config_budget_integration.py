"""Hostile and broken config files: a problem report naming file and line, never a traceback, a hang or gigabytes.

Here: the tests that start dlb services, open sockets or run subprocesses;
the others: ``tests/unit/test_config_budget.py``.
The rules and what the tests stand for: that file's docstring.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from bounded_wait import until
from test_config_budget import GOOD, alias_bomb

from dlb.procutil import free_port


def _status(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/fleet", timeout=10) as r:
        return json.loads(r.read())


def _wait_for(log: Path, text: str, proc: subprocess.Popen, count: int = 1) -> str:
    """Wait (bounded) until ``text`` appears ``count`` times in the log; fail at once if the process exited."""

    def seen() -> str | None:
        body = log.read_text()
        if body.count(text) >= count:
            return body
        assert proc.poll() is None, body[-3000:]
        return None

    return str(until(seen, f"{text!r} {count} time(s) in {log.name}", timeout=100))


def _start_control_plane(tmp_path: Path) -> tuple[Path, Path, int, subprocess.Popen]:
    """``dlb serve control-plane`` on GOOD with a JSON log: (config path, log, status port, process)."""
    cfg = tmp_path / "dlb.yaml"
    cfg.write_text(GOOD)
    log = tmp_path / "cp.log"
    xds, status = free_port(), free_port()
    env = {**os.environ, "DLB_LOG_FORMAT": "json"}
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "dlb.cli", "serve", "control-plane", "--config", str(cfg), "--no-probe",
                                 "--xds", f"127.0.0.1:{xds}", "--status", f"127.0.0.1:{status}"],
                                stdout=out, stderr=subprocess.STDOUT, env=env)
    return cfg, log, status, proc


def _two_cells() -> dict:
    """GOOD with a second cell: the config a successful reload must end up serving."""
    return {**yaml.safe_load(GOOD), "network": {"default_one_way_ms": 5}, "cells": [
        {"name": n, "leaf": {"address": f"127.0.0.1:1{i}010", "probe": f"127.0.0.1:9{i}10"}, "servers": [f"127.0.0.1:8{i}10"]}
        for i, n in enumerate(["a", "b"])]}


@pytest.mark.timeout(120)
def test_failed_sighup_reload_is_refused_and_the_old_config_keeps_serving(tmp_path: Path) -> None:
    cfg, log, status, proc = _start_control_plane(tmp_path)
    try:
        _wait_for(log, "control_plane_started", proc)
        assert list(_status(status)["cells"]) == ["a"]
        bad = [alias_bomb(9), "x: " + "[" * 5000 + "]" * 5000, GOOD + "probe: {<<: [1, 2]}\n"]
        for n, text in enumerate(bad, start=1):
            cfg.write_text(text)
            proc.send_signal(signal.SIGHUP)
            body = _wait_for(log, "reload refused: ", proc, count=n)
            assert list(_status(status)["cells"]) == ["a"], "the old config must keep serving"
        assert "Traceback" not in body and str(cfg) in body
        cfg.write_text(yaml.safe_dump(_two_cells()))
        proc.send_signal(signal.SIGHUP)
        _wait_for(log, "config_reloaded", proc)
        assert list(_status(status)["cells"]) == ["a", "b"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.timeout(120)
def test_a_sighup_during_a_reload_is_queued_and_the_latest_file_wins(tmp_path: Path) -> None:
    """A slow reload (a file at the loader's budgets) is running when the good file lands and a second
    SIGHUP comes: that signal used to be dropped (``config_reload_busy``) and the control plane kept
    serving an older config than the file on disk."""
    cfg, log, status, proc = _start_control_plane(tmp_path)
    try:
        _wait_for(log, "control_plane_started", proc)
        assert list(_status(status)["cells"]) == ["a"]
        _wait_for(log, "heap_frozen", proc)  # logged after the SIGHUP handler is installed

        def replace(text: str) -> None:  # as an editor or a ConfigMap update does: never half a file
            tmp = cfg.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(cfg)

        replace("x: " + "[" * 5000 + "]" * 5000 + "\n" + alias_bomb(9))  # slow to refuse
        proc.send_signal(signal.SIGHUP)
        replace(yaml.safe_dump(_two_cells()))
        proc.send_signal(signal.SIGHUP)  # while the first reload runs (or just after: either way the file wins)
        _wait_for(log, "config_reloaded", proc)
        assert list(_status(status)["cells"]) == ["a", "b"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
