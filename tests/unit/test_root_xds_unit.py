"""The root service configured over xDS by a real control plane, hot-reloaded without dropping requests.

Here: the tests that run in-process (no sockets, no processes); the others: ``tests/integration/test_root_xds.py``.

Real parts: ``ControlPlane`` (gRPC xDS server), the service's ``XdsClient`` (ADS, SotW and delta), the
probe client against stand-in leaves (real gRPC Probe servers). Decisions are taken through
``RootService.decide`` — the same call the ext_proc stream makes for each request's headers.
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
