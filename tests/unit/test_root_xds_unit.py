"""The root service configured over xDS by a real control plane, hot-reloaded without dropping requests.

Here: the tests that run in-process (no sockets, no processes);
the others: ``tests/integration/test_root_xds.py``.
The rules and what the tests stand for: that file's docstring.
"""

from __future__ import annotations

import asyncio

import pytest

from dlb.config import resources as dr
from dlb.ext_proc.root import RootService
from dlb.probe.client import ProbeTiming
from dlb.proto import resources_pb2


def test_bad_topology_for_this_root_is_rejected() -> None:
    """A topology without this root's cell cannot be applied: the xDS client NACKs it."""
    import dlb.ext_proc.root_xds as rx
    from dlb.xds.client import ResourceValidationError

    service = RootService(cell="zz", cell_names=(), endpoints=[], responses=[])
    sync = rx.RootXdsSync(service, "127.0.0.1:1", "zz", rx.ProbeManager(service, ProbeTiming(), "zz"))
    t = resources_pb2.Topology()
    t.cells.add(name="a", replicas=1, probe_address="127.0.0.1:1")
    t.rows.add(one_way_ms=[0.0], allowed=[True])
    with pytest.raises(ResourceValidationError, match="not in the topology"):
        asyncio.run(sync._on_topology({"topology": t}))


def test_dp_groups_resource_errors_name_the_field() -> None:
    msg = resources_pb2.DpGroups(cell="b")
    msg.groups.add(server="127.0.0.1:8000", ranks=2, policy="fastest", mean_decode_tokens=100)
    with pytest.raises(dr.ResourceError, match=r"DpGroups b.groups\[0\].policy"):
        dr.dp_groups_from_pb(msg)
    msg.groups[0].policy, msg.groups[0].mean_decode_tokens = "bf-io", 0.5
    with pytest.raises(dr.ResourceError, match=r"groups\[0\].mean_decode_tokens"):
        dr.dp_groups_from_pb(msg)
    msg.groups[0].mean_decode_tokens, msg.groups[0].server = 100, "no-port"
    with pytest.raises(dr.ResourceError, match=r"groups\[0\].server"):
        dr.dp_groups_from_pb(msg)


def test_flow_weights_that_arrive_after_the_config_seed_a_router_with_no_probe_yet() -> None:
    """Warm start: a restarted root routes by the control plane's last weights until its first probe
    answer, whichever of its xDS resources came first; once it has probe state, its own x rules."""
    import numpy as np

    import dlb.ext_proc.root_xds as rx
    from dlb.core.latency_model import LatencyParams
    from dlb.core.router import Mechanism, PolicyConfig
    from dlb.core.topology import Topology
    from dlb.ext_proc.root import EndpointSpec

    service = RootService(cell="a", cell_names=(), endpoints=[], responses=[], rng=np.random.default_rng(0))
    service.configure(Topology.build(["a", "b"], [1, 1], [[0.0, 0.01], [0.01, 0.0]]),
                      [EndpointSpec("chat", "/v1/", PolicyConfig(mechanism=Mechanism.FLOW), LatencyParams(0.1, 0.01, 4, 1))])
    sync = rx.RootXdsSync(service, "127.0.0.1:1", "a", rx.ProbeManager(service, ProbeTiming(), "a"))
    w = resources_pb2.FlowWeights(endpoint="chat", source_cell="a")
    w.weights["a"], w.weights["b"] = 0.0, 1.0
    sync._on_weights({"chat/a": w})
    router = service.endpoints[0].router
    np.testing.assert_allclose(router.x, [0.0, 1.0])
    assert {router.pick(0.0) for _ in range(20)} == {1}
    router.on_probe(0, 0.1, 0.0)
    w.weights["a"], w.weights["b"] = 1.0, 0.0
    sync._on_weights({"chat/a": w})
    np.testing.assert_allclose(router.x, [0.0, 1.0])  # probed: the router's own flow state is kept
