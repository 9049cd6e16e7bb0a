"""``/fleet``'s ``throughput_rps``: completions counted over a window, not over one probe gap."""

from __future__ import annotations

import pytest

from dlb.control_plane.flow_controller import FlowController, FlowEndpoint
from dlb.core.costs import Cost
from dlb.core.latency_model import LatencyParams
from dlb.core.router import Mechanism, PolicyConfig
from dlb.core.topology import Topology

P = LatencyParams(a=1.0, b=0.05, c=8.0, s=1.0)


def test_a_steady_completion_rate_reads_steady_between_probes_50_ms_apart() -> None:
    """A leaf completing 10 requests a second, probed every 50 ms: over one gap the rate read 0 or 20."""
    ctl = FlowController(Topology.build(["a"], [4], [[0.0]]), [FlowEndpoint("chat", PolicyConfig(Mechanism.FLOW, Cost.RIF), P)], [0])
    reads = []
    for k in range(200):  # 10 s
        now = k * 0.05
        ctl.on_probe(0, now, 2.0, 4.0, P, 1.0, 100, 0.0, float(int(now * 10)))
        ctl.step(now)
        if now >= 2.5:
            reads.append(ctl.throughput)
    assert min(reads) == pytest.approx(10.0, rel=0.06) and max(reads) == pytest.approx(10.0, rel=0.06)
    ctl.on_probe(0, 10.0, 2.0, 4.0, P, 1.0, 100, 0.0, 3.0)  # a restarted leaf: its counter starts again
    ctl.on_probe(0, 12.0, 2.0, 4.0, P, 1.0, 100, 0.0, 23.0)
    ctl.step(12.0)
    assert ctl.throughput == pytest.approx(10.0)
