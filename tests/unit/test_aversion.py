"""RecentErrors: aversion sees a cell's error EMA only while the cell's error counter keeps rising."""

from __future__ import annotations

import pytest

from dlb.control_plane.flow_controller import FlowController, FlowEndpoint
from dlb.core.aversion import RecentErrors
from dlb.core.costs import Cost
from dlb.core.latency_model import LatencyParams
from dlb.core.router import Mechanism, PolicyConfig
from dlb.core.topology import Topology


def test_errors_that_stop_report_zero_after_the_hold() -> None:
    r = RecentErrors(2, hold_s=2.0)
    assert r.observe(0, 10, 0.4, 0.0) == 0.4  # first sight of a failing cell: trust its EMA
    assert r.observe(0, 12, 0.4, 1.0) == 0.4
    assert r.observe(0, 12, 0.4, 3.0) == 0.4  # 2 s since the last new error: still within the hold
    assert r.observe(0, 12, 0.4, 3.5) == 0.0  # stopped: the lingering EMA no longer counts
    assert r.observe(0, 13, 0.4, 4.0) == 0.4  # one new error brings it back
    assert r.observe(1, 0, 0.0, 4.0) == 0.0


def test_a_restarted_leaf_counter_is_a_new_baseline_not_an_error() -> None:
    r = RecentErrors(1, hold_s=1.0)
    r.observe(0, 50, 0.3, 0.0)
    assert r.observe(0, 0, 0.3, 5.0) == 0.0  # counter went down: the leaf restarted
    assert r.observe(0, 1, 0.3, 5.5) == 0.3


def test_negative_hold_is_rejected() -> None:
    with pytest.raises(ValueError, match="hold_s"):
        RecentErrors(1, hold_s=-1.0)


def test_flow_loop_aversion_stops_when_the_cell_errors_stop() -> None:
    """The control plane's flow loop decays aversion like a root: not while the leaf's error EMA lingers."""
    topo = Topology.build(["a", "b"], [2, 2], [[0, 0.01], [0.01, 0]])
    p = LatencyParams(a=1.0, b=0.05, c=8.0, s=1.0)
    ctl = FlowController(topo, [FlowEndpoint("chat", PolicyConfig(Mechanism.FLOW, Cost.LATENCY), p)], [0, 1])
    errors, now = 0, 0.0
    while now < 5.0:  # cell a fails: its counter rises every probe
        errors += 3
        ctl.on_probe(0, now, 1.0, 2.0, p, 1.0, 100, 0.5, 100.0, errors)
        ctl.on_probe(1, now, 1.0, 2.0, p, 1.0, 100, 0.0, 100.0, 0)
        ctl.step(now)
        now += 0.25
    assert ctl.aversion[0] == pytest.approx(0.9)
    assert max(r.aversion[0] for r in ctl.routers.values()) == pytest.approx(0.9)
    stopped = now
    while now < stopped + 6.0:  # errors stop; the leaf's EMA stays at 0.5 for a long time
        ctl.on_probe(0, now, 1.0, 2.0, p, 1.0, 100, 0.5, 100.0, errors)
        ctl.on_probe(1, now, 1.0, 2.0, p, 1.0, 100, 0.0, 100.0, 0)
        ctl.step(now)
        now += 0.25
    assert ctl.aversion[0] < 0.1  # 2-s hold, then halved every period
    assert max(r.aversion[0] for r in ctl.routers.values()) < 0.1
