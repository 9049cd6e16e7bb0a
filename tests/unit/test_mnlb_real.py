"""MNLB on the real data path (dlb/control_plane/mnlb.py): demand from the leaves' per-source completion
counters, capacity from their models, the central LP every period."""

from __future__ import annotations

import numpy as np

from dlb.control_plane.mnlb import MnlbLoop
from dlb.core.baselines import rand_weights
from dlb.core.latency_model import LatencyParams
from dlb.core.topology import Topology


def _topo() -> Topology:
    # Two cells 40 ms apart, both allowed from both; equal servers.
    tau = np.array([[0.001, 0.040], [0.040, 0.001]])
    return Topology.build(("a", "b"), np.array([2.0, 2.0]), tau, np.ones((2, 2), bool))


def test_keeps_rands_split_until_a_period_has_measured_demand() -> None:
    """No demand measured yet (first period, or no completions): Rand's replica split, no solve."""
    loop = MnlbLoop(_topo(), ["chat"], [0, 1], period_s=10.0)
    m = LatencyParams(0.5, 0.01, 8.0, 1.0)
    for cell in (0, 1):
        loop.on_probe(cell, {}, m, 1.0)
    assert not loop.step(0.0) and not loop.step(10.0)
    np.testing.assert_allclose(loop.y, rand_weights(_topo()))
    assert loop.solves == 0


def test_measured_demand_below_capacity_stays_local() -> None:
    """Demand well inside each cell's capacity: the LP sends each source to its own (nearest) cell."""
    loop = MnlbLoop(_topo(), ["chat"], [0, 1], period_s=10.0)
    m = LatencyParams(0.5, 0.01, 8.0, 1.0)  # capacity 100 req/s
    loop.on_probe(0, {"a": 0, "b": 0}, m, 1.0)
    loop.on_probe(1, {"a": 0, "b": 0}, m, 1.0)
    loop.step(0.0)
    # Over 10 s: 100 from a and 60 from b completed, spread over both cells (as Rand sent them).
    loop.on_probe(0, {"a": 50, "b": 30}, m, 1.0)
    loop.on_probe(1, {"a": 50, "b": 30, "nowhere": 999}, m, 1.0)  # unknown sources are ignored
    assert loop.step(10.0)
    np.testing.assert_allclose(loop.demand, [10.0, 6.0])
    np.testing.assert_allclose(loop.y, np.eye(2), atol=1e-6)
    w = loop.weights()["chat"]
    np.testing.assert_allclose(w[0], [1.0, 0.0], atol=1e-6)


def test_a_cell_without_capacity_gets_nothing_and_restarted_counters_read_as_no_demand() -> None:
    """Capacity follows the models and health: cell b's leaf stops answering → its share goes to a; a
    leaf whose counters restart from 0 does not produce negative demand."""
    loop = MnlbLoop(_topo(), ["chat"], [0, 1], period_s=10.0)
    m = LatencyParams(0.5, 0.01, 8.0, 1.0)
    loop.on_probe(0, {"a": 0, "b": 0}, m, 1.0)
    loop.on_probe(1, {"a": 0, "b": 500}, m, 1.0)
    loop.step(0.0)
    loop.on_probe(0, {"a": 100, "b": 100}, m, 1.0)
    loop.on_probe(1, {"a": 0, "b": 0}, m, 1.0)  # restarted leaf: its counters went back to 0
    loop.on_probe_failure(1)
    assert loop.step(10.0)
    assert (loop.demand >= 0).all()
    np.testing.assert_allclose(loop.y[:, 1], [0.0, 0.0], atol=1e-6)


def test_leaf_counts_completions_per_source_from_the_access_log_and_reports_them() -> None:
    """The leaf agent's probe answer carries completions per x-dlb-src-cell (monotone), counting only
    known source cells and not its own background probes — the demand MNLB measures."""
    import asyncio

    from envoy.data.accesslog.v3 import accesslog_pb2
    from envoy.service.accesslog.v3 import als_pb2
    from test_leaf_state import make

    from dlb.ext_proc.leaf import LeafAgent
    from dlb.ext_proc.leaf_als import BACKGROUND_PROBE_ID

    agent = LeafAgent(make(2))
    agent.access_log.known_sources = frozenset({"a", "b"})
    msg = als_pb2.StreamAccessLogsMessage()
    for rid, src in (("r1", "a"), ("r2", "a"), ("r3", "b"), ("r4", "spoofed"), (BACKGROUND_PROBE_ID + "1", "b"), ("r5", "")):
        e = msg.http_logs.log_entry.add()
        e.common_properties.access_log_type = accesslog_pb2.AccessLogType.Value("DownstreamEnd")
        e.request.request_id = rid
        if src:
            e.request.request_headers["x-dlb-src-cell"] = src
        e.response.response_code.value = 200

    async def feed() -> None:
        async def one():  # an access-log stream of one message
            yield msg
        await agent.access_log.consume(one())

    asyncio.run(feed())
    assert dict(agent.probe.snapshot(0.0).completed_by_source) == {"a": 2, "b": 1}
