"""A config reload keeps what the flow loop learned, in the root service's routers and the control plane's.

A reload builds new routers. Starting from scratch, a control plane's native flow endpoint would push the
replica split (Rand's) to every root Envoy and relearn from there, and a cell that was out at the reload
would come back without the share it held.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dlb.config import config_from_dict
from dlb.control_plane.service import ControlPlane
from dlb.core.costs import Cost
from dlb.core.flow import FlowConfig
from dlb.core.latency_model import LatencyParams
from dlb.core.router import Mechanism, PolicyConfig, RootRouter
from dlb.core.topology import Topology

P = LatencyParams(a=1.0, b=0.05, c=8.0, s=1.0)
PERIOD = 0.2


def doc(cells: list[str]) -> dict:
    out = [{"name": n, "root": {"address": f"127.0.0.1:{4000 + i}"},
            "leaf": {"address": f"127.0.0.1:{1000 + i}", "probe": f"127.0.0.1:{2000 + i}"},
            "servers": [f"127.0.0.1:{3000 + i}"], "replicas": 4} for i, n in enumerate(cells)]
    rtt = {a: {b: 10 for b in cells if b > a} for a in cells if any(b > a for b in cells)}
    return {"version": 1, "cells": out, "network": {"one_way_ms": rtt},
            "endpoints": [{"name": "chat", "match": {"prefix": "/v1/"}, "policy": {"mechanism": "flow", "cost": "rif"},
                           "latency_prior": {"a_s": 1.0, "b_s": 0.05, "c": 8}}]}


def drive(cp: ControlPlane, t0: float, rif: dict[str, float], steps: int) -> float:
    assert cp.flow is not None
    names = cp.config.cell_names
    t = t0
    for _ in range(steps):
        for name, n in rif.items():
            cp.flow.on_probe(names.index(name), t, n, 4.0, P, 1.0, 100, 0.0, 0.0)
        cp.flow.step(t)
        t = round(t + PERIOD, 9)
    return t


def test_a_control_plane_reload_keeps_the_native_split() -> None:
    """Before the change the reload put the split back to 0.5/0.5 (the replica split): this fails then."""
    cp = ControlPlane(config_from_dict(doc(["a", "b"])), probe=False, flow_loop=False)
    drive(cp, 0.0, {"a": 2.0, "b": 30.0}, 50)  # b loaded: the split leaves it
    assert cp.flow is not None
    before = cp.flow.weights()["chat"]
    assert before[0][0] > 0.7 and before[1][0] > 0.7
    cp.reload(config_from_dict(doc(["a", "b"])))
    after = cp.flow.weights()["chat"]
    for src in (0, 1):
        np.testing.assert_allclose(after[src], before[src])
    assert cp.flow.cells[1].rif == 30.0  # the probes too, not only the split


def test_a_reload_that_adds_a_cell_keeps_the_ratio_of_the_cells_it_keeps() -> None:
    cp = ControlPlane(config_from_dict(doc(["a", "b"])), probe=False, flow_loop=False)
    t = drive(cp, 0.0, {"a": 2.0, "b": 12.0}, 2)
    assert cp.flow is not None
    cp.flow.routers[("chat", 0)].x = np.array([0.7, 0.3])  # a split the loop might hold: keep it whatever it is
    x = cp.flow.weights()["chat"][0]
    cp.reload(config_from_dict(doc(["c", "b", "a"])))  # reordered, and a new cell c
    y = cp.flow.weights()["chat"][2]  # a is now index 2, and a source again
    assert y[2] / y[1] == pytest.approx(x[0] / x[1])
    assert cp.flow.cells[1].rif == 12.0 and cp.flow.cells[0].rif == 0.0
    drive(cp, t, {"a": 2.0, "b": 12.0, "c": 2.0}, 5)  # and the loop runs on from there
    assert cp.flow.weights()["chat"][2].sum() == pytest.approx(1.0)


def test_a_cell_out_at_the_reload_gets_its_share_back_when_it_returns() -> None:
    """``_rejoin``'s memory crosses the reload: without it the returning cell starts from 0."""
    topo = Topology.build(["a", "b", "c"], [4, 4, 4], [[0, 0.01, 0.01], [0.01, 0, 0.01], [0.01, 0.01, 0]])
    pol = PolicyConfig(Mechanism.FLOW, Cost.RIF, flow=FlowConfig(period_s=PERIOD))
    old = RootRouter(topo, 0, pol, P, np.random.default_rng(0))
    t = 0.0
    for _ in range(5):
        for j in range(3):
            old.on_probe(j, t, 4.0, P, seen_until=t)
        old.tick(t)
        t = round(t + PERIOD, 9)
    held = float(old.x[2])
    assert held > 0.2
    old.set_available(2, False)  # c's leaf is gone
    for _ in range(2):
        old.tick(t)
        t = round(t + PERIOD, 9)
    assert old.x[2] == 0.0
    new = RootRouter(Topology.build(["c", "a", "b"], [4, 4, 4], [[0, 0.01, 0.01], [0.01, 0, 0.01], [0.01, 0.01, 0]]),
                     1, pol, P, np.random.default_rng(0))
    new.carry_over(old, ["a", "b", "c"], ["c", "a", "b"])
    for j in range(3):
        new.on_probe(j, t, 4.0, P, seen_until=t)  # c is back
    for _ in range(2):
        new.tick(t)
        t = round(t + PERIOD, 9)
    assert new.x[0] == pytest.approx(held, rel=0.05)


def test_a_reload_that_moves_the_control_planes_own_ports_says_they_need_a_restart() -> None:
    """A reload applied 'config_reloaded' and silently kept the old status port (a stranger's report):
    the fields bound at start are named in a warning."""
    from structlog.testing import capture_logs

    d = doc(["a", "b"])
    cp = ControlPlane(config_from_dict(d), probe=False, flow_loop=False)
    with capture_logs() as logs:
        cp.reload(config_from_dict(doc(["a", "b"])))
        d["services"] = {"control_plane": {"status": "127.0.0.1:21802"}}
        cp.reload(config_from_dict(d))
    warned = [e for e in logs if e["event"] == "config_reload_needs_restart"]
    assert len(warned) == 1 and warned[0]["fields"] == ["services.control_plane.status"], warned


def test_a_reload_of_what_roots_and_envoys_read_at_start_says_it_needs_a_restart(tmp_path: Path) -> None:
    """The root services' probe timing and the Envoys' root token are bound at start: a reload names them."""
    from structlog.testing import capture_logs

    cp = ControlPlane(config_from_dict(doc(["a", "b"])), probe=False, flow_loop=False)
    token = tmp_path / "token"
    token.write_text("a-secret-of-32-characters-or-more-0123456789\n")
    d = doc(["a", "b"])
    d["probe"] = {"timeout_ms": 150}
    d["root_token_file"] = str(token)
    with capture_logs() as logs:
        cp.reload(config_from_dict(d))
    warned = [e for e in logs if e["event"] == "config_reload_needs_restart"]
    assert len(warned) == 1 and warned[0]["fields"] == ["probe.timeout_ms", "root_token_file"], warned


def test_reloads_are_counted_by_outcome_with_the_running_configs_digest() -> None:
    """A refused or half-applied reload was only a log line: /metrics counts them, and says which settings run."""
    from prometheus_client import generate_latest

    cp = ControlPlane(config_from_dict(doc(["a", "b"])), probe=False, flow_loop=False)

    def metrics() -> dict[str, str]:
        lines = generate_latest(cp.status_server.registry).decode().splitlines()
        return {ln.rsplit(" ", 1)[0]: ln.rsplit(" ", 1)[1] for ln in lines if ln.startswith("dlb_xds_config")}

    first = metrics()
    assert first['dlb_xds_config_reloads_total{result="applied"}'] == "0.0"
    digest = next(k for k in first if k.startswith("dlb_xds_config_info"))
    d = doc(["a", "b"])
    d["probe"] = {"period_ms": 100}
    cp.reload(config_from_dict(d))
    after = metrics()
    assert after['dlb_xds_config_reloads_total{result="needs_restart"}'] == "1.0"
    assert digest not in after  # other settings, another digest
    cp.reload(config_from_dict(doc(["a", "b"])))
    back = metrics()  # the probe period back: again a change the running roots do not take
    assert back['dlb_xds_config_reloads_total{result="needs_restart"}'] == "2.0"
    assert digest in back  # the same settings as at start: the same digest
    cp.reload(config_from_dict(doc(["a", "b"])))
    assert metrics()['dlb_xds_config_reloads_total{result="applied"}'] == "1.0"


def test_a_reload_wakes_the_flow_loop_sleeping_on_the_old_period() -> None:
    """The loop slept on the period it read: reloaded from 60 s back to 200 ms, a stranger's native root kept
    a dead cell at full weight until the old sleep ended. No socket: the loop alone, its rebuilds counted."""
    import asyncio
    import copy

    slow = doc(["a", "b"])
    slow["endpoints"][0]["policy"] = {"mechanism": "flow", "cost": "rif", "flow": {"period_ms": 60_000}}
    fast = copy.deepcopy(slow)
    fast["endpoints"][0]["policy"]["flow"]["period_ms"] = 20

    async def run() -> int:
        cp = ControlPlane(config_from_dict(slow), probe=False)
        rebuilds = []
        cp.rebuild = lambda *a, **k: rebuilds.append(1) or {}  # type: ignore[method-assign]
        loop = asyncio.create_task(cp._flow_loop())
        await asyncio.sleep(0.1)
        assert not rebuilds  # asleep for 60 s
        cp.reload(config_from_dict(fast))
        await asyncio.sleep(0.3)
        loop.cancel()
        return len(rebuilds)

    assert asyncio.run(run()) >= 3  # stepping every 20 ms from the reload on


def test_a_stop_right_after_a_reload_ends_the_flow_loop() -> None:
    """A SIGTERM just after a SIGHUP: the reload's wake and the stop's cancel landed in one loop turn, and
    Python 3.11's ``asyncio.wait_for`` returned the wake instead of raising the cancel, so the loop slept
    again and ``dlb serve control-plane`` never exited (CI, 2 in 20 runs of the SIGHUP test)."""
    import asyncio

    async def run() -> bool:
        cp = ControlPlane(config_from_dict(doc(["a", "b"])), probe=False)
        cp.rebuild = lambda *a, **k: {}  # type: ignore[method-assign]
        loop = asyncio.create_task(cp._flow_loop())
        await asyncio.sleep(0.05)  # asleep on the period
        cp._flow_wake.set()  # what reload() does
        loop.cancel()  # what stop() does, in the same turn
        done, _ = await asyncio.wait({loop}, timeout=2.0)
        if not done:
            loop.cancel()
        return bool(done)

    assert asyncio.run(run()), "the flow loop swallowed its cancel"


def test_a_reloaded_cell_prior_replaces_the_learned_curve_of_that_cell_only() -> None:
    """A stranger set a cell's prior slower and reloaded: nothing changed, the root kept the curve it had
    learned (confidence > 0 outranks any later model) and the leaf its measured one. Now a changed prior
    resets that cell's curve at the root, and a leaf without samples in its window takes the new prior."""
    from dlb.core.estimator import LatencyEstimator

    topo = Topology.build(["a", "b"], [4, 4], [[0, 0.01], [0.01, 0]])
    pol = PolicyConfig(Mechanism.DISCRETE, Cost.LATENCY)
    learned = LatencyParams(0.3, 0.02, 8.0, 1.0)
    old = RootRouter(topo, 0, pol, P, np.random.default_rng(0))
    for j in range(2):
        old.on_probe(j, 1.0, 2.0, learned, confidence=0.9, seen_until=1.0)
    slower = LatencyParams(2.0, 0.1, 8.0, 1.0)
    new = RootRouter(topo, 0, pol, P, np.random.default_rng(0), cell_priors=[P, slower])
    new.carry_over(old, ["a", "b"], ["a", "b"])
    assert (new.models.a[0], new.view.confidence[0]) == (learned.a, 0.9)  # a's prior unchanged: kept
    assert (new.models.a[1], new.view.confidence[1]) == (slower.a, 0.0)  # b's changed: the new prior
    new.on_probe(1, 2.0, 2.0, slower, confidence=0.0, seen_until=2.0)  # the leaf's new prior is now taken
    assert new.models.a[1] == slower.a

    est = LatencyEstimator(P)
    est.effective_prior = est.params = learned  # a measured prior, no samples left in the window
    est.reset_prior(slower)
    assert (est.effective_prior, est.params, est.confidence) == (slower, slower, 0.0)
    est = LatencyEstimator(P)
    for k in range(5):
        est.record(float(k), 2.0, 0.5)
    est.effective_prior = learned  # measured, and samples back it: it stays
    est.reset_prior(slower)
    assert est.effective_prior == learned and est.prior == slower
