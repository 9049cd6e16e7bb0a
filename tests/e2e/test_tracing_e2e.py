"""One request through real root and leaf Envoys with tracing on: the root's decision and the leaf's pick
arrive at a real OTLP collector as spans of the request's own trace (the client's ``traceparent``), each
saying what it decided. Envoy forwards ``traceparent`` to both ext_procs; its own spans are not configured."""

from __future__ import annotations

import pytest
from bounded_wait import until

from dlb.service.tracing import otlp_unavailable
from dlb.testbed.otlp_collector import Collector
from dlb.testbed.stack import CellSpec, metric_value, request, start_data_plane

pytestmark = [pytest.mark.envoy, pytest.mark.timeout(180), pytest.mark.skipif(otlp_unavailable() is not None, reason=f"{otlp_unavailable()}")]

ENDPOINT = {"name": "chat", "match": {"prefix": "/v1/"}, "policy": {"mechanism": "discrete", "cost": "latency"},
            "latency_prior": {"a_s": 0.05, "b_s": 0.005, "c": 4, "s": 1}}
TRACE_ID, CLIENT_SPAN = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"


def test_root_decision_and_leaf_pick_join_the_clients_trace() -> None:
    collector = Collector()
    otlp = ("--otlp-endpoint", f"127.0.0.1:{collector.start()}", "--trace-sample-ratio", "0")
    plane = start_data_plane([CellSpec("a", servers=2), CellSpec("b", servers=1)], "a", ENDPOINT, root_args=otlp, leaf_args=otlp)
    try:
        until(lambda: metric_value(plane.root_metrics(), "dlb_root_cell_usable", endpoint="chat", cell="a") == 1.0, "cell a usable")
        host, port = plane.root_url
        status, headers, _ = request(host, port, headers={"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"})
        assert status == 200
        assert request(host, port)[0] == 200  # no traceparent, ratio 0: not sampled, no span
        until(lambda: {s.name for _, s in collector.spans} >= {"dlb.root.decide", "dlb.leaf.pick"}, "both spans exported", timeout=20)
    finally:
        plane.close()
        collector.stop()
    spans = {s.name: (service, s) for service, s in collector.spans}
    assert len(collector.spans) == 2, [s.name for _, s in collector.spans]
    for name, service in (("dlb.root.decide", "dlb-root-a"), ("dlb.leaf.pick", None)):
        svc, span = spans[name]
        assert span.trace_id.hex() == TRACE_ID and span.parent_span_id.hex() == CLIENT_SPAN
        assert service is None or svc == service
    root = {a.key: a.value for a in spans["dlb.root.decide"][1].attributes}
    leaf_service, leaf_span = spans["dlb.leaf.pick"]
    leaf = {a.key: a.value for a in leaf_span.attributes}
    cell = root["dlb.cell"].string_value
    assert root["dlb.endpoint"].string_value == "chat" and root["dlb.policy"].string_value == "Disc-Lat"
    assert {"dlb.cost.a", "dlb.cost.b", "dlb.aversion.a", "dlb.aversion.b"} <= set(root)
    # The leaf that picked is the cell the root chose, and it names the server that served.
    assert leaf_service == f"dlb-leaf-{cell}" and leaf["dlb.cell"].string_value == cell
    assert leaf["dlb.server"].string_value in {e.address for e in plane.emulators[cell]}
    assert headers.get("x-dlb-server", "").startswith(cell)
