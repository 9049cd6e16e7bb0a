"""A leaf's pick rule changed in the config reaches the running leaf over xDS, without a restart.

Real processes on 127.0.0.1: ``dlb serve control-plane`` (reloaded with SIGHUP, as operators do) and
``dlb serve leaf --xds``; the leaf's rule is read from its Prometheus metrics, the way an operator
would check it. The test fails if the leaf ignores the pushed ``dlb.v1.LeafPolicy`` (its metrics keep
the file's rule) or if it restarted to apply it (another pid).
"""

from __future__ import annotations

import os
import signal
import tempfile
import urllib.request
from pathlib import Path

import pytest
import yaml
from bounded_wait import until

from dlb.config.policy import set_plugins
from dlb.launch.metrics_text import metric_value
from dlb.procutil import free_port
from dlb.testbed.process import ServiceProcess

pytestmark = pytest.mark.timeout(120)


def _config(xds: str, status: str, plugins: list[dict]) -> dict:
    doc = {
        "version": 1,
        # With a leaf ext_proc: without one the leaf Envoy picks, and the metric says envoy-least-request.
        "cells": [{"name": n, "leaf": {"address": f"127.0.0.1:{free_port()}", "probe": f"127.0.0.1:{free_port()}",
                                       "ext_proc": f"127.0.0.1:{free_port()}"},
                   "servers": [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]} for n in ("a", "b")],
        "network": {"default_one_way_ms": 5},
        "endpoints": [{"name": "m", "match": {"prefix": "/"}}],
        "services": {"control_plane": {"xds": xds, "status": status}},
    }
    # Background probes off: no leaf Envoy runs here for them to go through.
    return set_plugins(doc, {"type": "background-probe", "parameters": {"min_interval_ms": 0}}, *plugins)


def _rule(metrics: str) -> tuple[str | None, float | None]:
    text = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=5).read().decode()
    rules = [r for r in ("prequal", "rif") if metric_value(text, "dlb_leaf_pick_rule", rule=r) == 1.0]
    return (rules[0] if len(rules) == 1 else None), metric_value(text, "dlb_leaf_pick_choices")


def test_a_reloaded_pick_rule_reaches_the_running_leaf() -> None:
    with tempfile.TemporaryDirectory(prefix="dlb-leaf-policy-") as tmp:
        path = Path(tmp) / "dlb.yaml"
        xds, status = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        path.write_text(yaml.safe_dump(_config(xds, status, [{"type": "prequal", "parameters": {"choices": 2}}])))
        metrics = f"127.0.0.1:{free_port()}"
        with ServiceProcess("control-plane", "--config", str(path), "--no-probe") as cp, \
                ServiceProcess("leaf", "--config", str(path), "--cell", "b", "--xds", xds, "--metrics", metrics,
                               "--envoy-check-period-ms", "0", "--scrape-period-ms", "0") as leaf:  # fmt: skip
            pid = leaf.pid
            assert _rule(metrics) == ("prequal", 2.0)
            doc = yaml.safe_load(path.read_text())
            set_plugins(doc, {"type": "rif", "parameters": {"choices": 3}})
            path.write_text(yaml.safe_dump(doc))
            os.kill(cp.pid, signal.SIGHUP)
            until(lambda: _rule(metrics) == ("rif", 3.0), what="the leaf picking by the reloaded rule", timeout=30)
            assert leaf.pid == pid and leaf.proc.poll() is None  # applied live, not by a restart
            # And back: a second change is applied as well (not a one-off at connect time).
            set_plugins(doc, {"type": "prequal", "parameters": {"choices": 2}})
            path.write_text(yaml.safe_dump(doc))
            os.kill(cp.pid, signal.SIGHUP)
            until(lambda: _rule(metrics) == ("prequal", 2.0), what="the leaf back on prequal", timeout=30)


def _probes_failed(metrics: str) -> float:
    text = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=5).read().decode()
    return metric_value(text, "dlb_leaf_background_probes_total", outcome="failed") or 0.0


def test_background_probes_turned_on_in_the_config_start_without_a_restart() -> None:
    """The ``background-probe`` plugin is live too: switched on by a reload, the running leaf starts
    probing (here through an address where no Envoy listens, so its probes are counted as failed)."""
    with tempfile.TemporaryDirectory(prefix="dlb-leaf-policy-") as tmp:
        path = Path(tmp) / "dlb.yaml"
        xds, status = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        path.write_text(yaml.safe_dump(_config(xds, status, [])))
        metrics = f"127.0.0.1:{free_port()}"
        with ServiceProcess("control-plane", "--config", str(path), "--no-probe") as cp, \
                ServiceProcess("leaf", "--config", str(path), "--cell", "b", "--xds", xds, "--metrics", metrics,
                               "--envoy-check-period-ms", "0", "--scrape-period-ms", "0") as leaf:  # fmt: skip
            pid = leaf.pid
            until(lambda: _rule(metrics)[0] == "prequal", what="the leaf serving its metrics", timeout=30)
            assert _probes_failed(metrics) == 0.0  # off in the file: no probe sent
            doc = yaml.safe_load(path.read_text())
            set_plugins(doc, {"type": "background-probe", "parameters": {"min_interval_ms": 200, "max_interval_ms": 1000}})
            path.write_text(yaml.safe_dump(doc))
            os.kill(cp.pid, signal.SIGHUP)
            until(lambda: _probes_failed(metrics) > 0, what="background probes sent after the reload", timeout=30)
            assert leaf.pid == pid and leaf.proc.poll() is None  # applied live, not by a restart
