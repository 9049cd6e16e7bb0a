"""The control plane's ``/fleet`` view shows each cell's last probe whatever the endpoints' mechanism (with only
discrete endpoints there is no flow controller, and every cell read ``available: null, rif: null``)."""

from __future__ import annotations

import asyncio
import json

from dlb.config import config_from_dict


def test_fleet_shows_probe_state_without_a_flow_endpoint() -> None:
    from dlb.control_plane.service import ControlPlane
    from dlb.probe.target import ProbeTarget
    from dlb.proto import probe_pb2

    cells = [{"name": n, "leaf": {"address": f"127.0.0.1:{1000 + i}", "probe": f"127.0.0.1:{2000 + i}"},
              "servers": [f"127.0.0.1:{3000 + i}"]} for i, n in enumerate(["near", "far"])]
    doc = {"version": 1, "cells": cells, "network": {"one_way_ms": {"near": {"far": 20}}},
           "endpoints": [{"name": "chat", "match": {"prefix": "/v1/"}, "policy": {"mechanism": "discrete", "cost": "latency"}}]}

    async def scenario() -> dict:
        cp = ControlPlane(config_from_dict(doc), probe=False, flow_loop=False, clock=lambda: 100.0)
        assert cp.flow is None
        cp._on_probe(ProbeTarget(0, "near", ""), probe_pb2.ProbeResponse(cell="near", rif=7, error_rate=0.25, healthy_replicas=1), 100.0)
        cp._on_probe(ProbeTarget(1, "far", ""), None, 100.0)  # a failed probe
        return json.loads((await cp._fleet(None)).text)  # type: ignore[arg-type]

    cells_out = asyncio.run(scenario())["cells"]
    assert (cells_out["near"]["available"], cells_out["near"]["rif"], cells_out["near"]["error_rate"]) == (True, 7, 0.25)
    assert cells_out["far"]["available"] is False and cells_out["far"]["rif"] is None
