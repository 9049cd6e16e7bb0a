"""What clients' text can make the control plane's /status and /metrics hold: only served types by name, and
a bounded number of nodes labelled one by one (a stranger's 200 streams of bogus types and 500-byte node ids
grew /metrics to 7.5 MB and ~10,000 series)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from dlb.config.resources import FLOW_WEIGHTS, SERVED_TYPES
from dlb.xds import status as st
from dlb.xds import types


def metrics_of(reg: st.StatusRegistry) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(st.StatusCollector(reg))
    return generate_latest(registry).decode()


def test_a_type_nobody_serves_is_one_counted_entry_without_names() -> None:
    reg = st.StatusRegistry(served_types=SERVED_TYPES)
    reg.stream_opened("envoy-1", "dlb-leaf")
    reg.subscribed("envoy-1", types.ENDPOINT, {"cell-a"}, wildcard=False)
    reg.subscribed("envoy-1", FLOW_WEIGHTS, {"chat"}, wildcard=False)
    for k in range(10):
        reg.subscribed("envoy-1", f"type.googleapis.com/evil.T{'T' * 150}{k}", {f"n{j}" for j in range(999)}, wildcard=False)
        reg.nacked("envoy-1", f"type.googleapis.com/evil.T{k}", "v", "no")
    shown = reg.to_json()["nodes"]["envoy-1"]["types"]
    assert set(shown) == {"EDS", "dlb.v1.FlowWeights", st.OTHER_TYPE}, set(shown)
    assert shown[st.OTHER_TYPE]["subscribed"] == [] and shown[st.OTHER_TYPE]["subscribed_count"] == 999
    assert shown["EDS"]["subscribed"] == ["cell-a"]
    text = metrics_of(reg)
    assert "evil" not in text and 'type="other"' in text and 'dlb_xds_nacks_total{node="envoy-1",type="other"} 10.0' in text


def test_without_served_types_every_type_is_shown_as_before() -> None:
    reg = st.StatusRegistry()
    reg.subscribed("n", "type.googleapis.com/custom.T", {"x"}, wildcard=False)
    assert reg.to_json()["nodes"]["n"]["types"]["custom.T"]["subscribed"] == ["x"]


def test_nodes_past_the_labelled_count_are_summed_under_other(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(st, "LABELLED_NODES", 3)
    reg = st.StatusRegistry(served_types=SERVED_TYPES)
    for i in range(7):
        reg.stream_opened(f"node-{i}", "dlb-root")
        reg.sent(f"node-{i}", types.CLUSTER, "v1", "1")
        reg.acked(f"node-{i}", types.CLUSTER, "v1")
    text = metrics_of(reg)
    labelled = {line.split('node="')[1].split('"')[0] for line in text.splitlines() if line.startswith("dlb_xds_streams{")}
    assert labelled == {"node-0", "node-1", "node-2", "other"}, labelled
    assert 'dlb_xds_streams{node="other"} 4.0' in text
    assert 'dlb_xds_responses_total{node="other",type="CDS"} 4.0' in text
    assert 'dlb_xds_acked_version_info{node="other"' not in text  # a version is one node's, never summed


def test_a_gone_node_is_remembered_without_the_names_it_subscribed_to() -> None:
    """Closed streams' nodes stay 60 s; with their names (100 × 512 B per served type) 1,000 of them grew
    /status to 219 MB, outside the subscription budget, which counts open streams only."""
    reg = st.StatusRegistry(served_types=SERVED_TYPES)
    reg.stream_opened("envoy-1", "dlb-leaf")
    reg.subscribed("envoy-1", types.ENDPOINT, {f"n{j}".ljust(500, "x") for j in range(100)}, wildcard=False)
    assert len(reg.to_json()["nodes"]["envoy-1"]["types"]["EDS"]["subscribed"]) == st.SHOWN_NAMES
    reg.stream_closed("envoy-1")
    gone = reg.to_json()["nodes"]["envoy-1"]["types"]["EDS"]
    assert gone["subscribed"] == [] and gone["subscribed_count"] == 100
