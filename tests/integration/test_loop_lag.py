"""Every long-running service exports its own event-loop lag, and a blocked loop shows in it.

Rules: ``dlb serve root``, ``dlb serve leaf``, ``dlb serve epp`` and ``dlb serve control-plane`` export
``dlb_<service>_loop_lag_seconds`` (a heartbeat's lag) and ``dlb_<service>_loop_lag_longest_seconds``
on their metrics port; a root whose loop cannot run for 0.5 s (the process stopped with SIGSTOP, as a
box that gives the CPU elsewhere stops it) records a lag of at least 0.5 s minus the heartbeat period.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from pathlib import Path

import pytest
from bounded_wait import until
from scrape import metric_samples
from test_config_budget_integration import _start_control_plane, _wait_for

from dlb.procutil import free_port
from dlb.service.loop_lag import PERIOD_S
from dlb.testbed.process import ServiceProcess

pytestmark = pytest.mark.timeout(180)
BLOCK_S = 0.5


def _config(tmp: str) -> Path:
    raw = {"version": 1, "cells": [{"name": "a", "servers": [f"127.0.0.1:{free_port()}"],
                                    "leaf": {"address": f"127.0.0.1:{free_port()}", "probe": f"127.0.0.1:{free_port()}"},
                                    "root": {"address": f"127.0.0.1:{free_port()}", "ext_proc": f"127.0.0.1:{free_port()}"}}],
           "endpoints": [{"name": "chat", "match": {"prefix": "/v1/"}, "policy": {"mechanism": "discrete", "cost": "rif"}}]}
    path = Path(tmp) / "dlb.yaml"
    path.write_text(json.dumps(raw))
    return path


def _over(samples: dict[str, float], prefix: str, bound: str) -> float:
    """Heartbeats whose lag was over ``bound`` seconds (a bucket bound) so far."""
    return samples[f"{prefix}_loop_lag_seconds_count"] - samples[f'{prefix}_loop_lag_seconds_bucket{{le={bound}}}']


def test_a_root_stopped_for_half_a_second_shows_it_in_its_loop_lag() -> None:
    with tempfile.TemporaryDirectory(prefix="dlb-looplag-") as tmp, \
            ServiceProcess("root", "--config", str(_config(tmp)), "--cell", "a", "--metrics", "127.0.0.1:0") as root:
        address = f"127.0.0.1:{root.ready['metrics']}"
        before = until(lambda: (s := metric_samples(address)).get("dlb_root_loop_lag_seconds_count", 0) > 0 and s, "root heartbeats")
        assert isinstance(before, dict)
        os.kill(root.pid, signal.SIGSTOP)
        try:
            time.sleep(BLOCK_S)  # the loop cannot run for at least BLOCK_S
        finally:
            os.kill(root.pid, signal.SIGCONT)

        def late_beat() -> dict[str, float] | None:
            s = metric_samples(address)
            return s if _over(s, "dlb_root", "0.25") > _over(before, "dlb_root", "0.25") else None

        after = until(late_beat, "a heartbeat lag over 0.25 s in dlb_root_loop_lag_seconds")
        assert isinstance(after, dict)
        assert after["dlb_root_loop_lag_longest_seconds"] >= BLOCK_S - PERIOD_S
        assert after["dlb_root_loop_lag_seconds_sum"] - before["dlb_root_loop_lag_seconds_sum"] >= BLOCK_S - PERIOD_S


def test_the_leaf_agent_and_the_control_plane_export_their_loop_lag(tmp_path: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="dlb-looplag-") as tmp, \
            ServiceProcess("leaf", "--config", str(_config(tmp)), "--cell", "a", "--metrics", "127.0.0.1:0", "--envoy-check-period-ms", "0",
                           "--scrape-period-ms", "0") as leaf:
        address = f"127.0.0.1:{leaf.ready['metrics']}"
        samples = until(lambda: (s := metric_samples(address)).get("dlb_leaf_loop_lag_seconds_count", 0) > 0 and s, "leaf heartbeats")
        assert isinstance(samples, dict) and "dlb_leaf_loop_lag_longest_seconds" in samples
    _, log, status, proc = _start_control_plane(tmp_path)
    try:
        _wait_for(log, "heap_frozen", proc)
        samples = until(lambda: (s := metric_samples(f"127.0.0.1:{status}")).get("dlb_xds_loop_lag_seconds_count", 0) > 0 and s,
                        "control-plane heartbeats")
        assert isinstance(samples, dict) and "dlb_xds_loop_lag_longest_seconds" in samples
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_epp_exports_its_loop_lag(tmp_path: Path) -> None:
    from test_epp_limits import start

    with start(tmp_path) as epp:
        address = f"127.0.0.1:{epp.ready['metrics']}"
        samples = until(lambda: (s := metric_samples(address)).get("dlb_epp_loop_lag_seconds_count", 0) > 0 and s, "EPP heartbeats")
        assert isinstance(samples, dict) and "dlb_epp_loop_lag_longest_seconds" in samples
