"""The Envoys' OpenTelemetry tracer: on the root's and leaf's listener only, exporting to a cluster of its
own, and the same in a rendered file and in the control plane's xDS resources (which parse it into
Envoy's protobuf types: a misspelt field or type fails here)."""

from __future__ import annotations

import pytest
from test_foreign_probe import _foreign

from dlb.config import HostPort, config_from_dict
from dlb.control_plane.envoy_resources import leaf_resources, root_resources
from dlb.envoy.bootstrap import root_bootstrap
from dlb.envoy.tracing import OTLP_CLUSTER, EnvoyTracing, add_tracing

TRACING = EnvoyTracing(HostPort("127.0.0.1", 4317), 0.25)


def test_the_root_listener_traces_to_the_collector_cluster() -> None:
    cfg = config_from_dict(_foreign(source="vllm"))
    boot = add_tracing(root_bootstrap(cfg, "a", admin_port=0, ready_port=9), TRACING, "envoy-root-a")
    traced = {lis["name"]: "tracing" in lis["filter_chains"][0]["filters"][0]["typed_config"] for lis in boot["static_resources"]["listeners"]}
    assert traced["dlb_root"] and not any(v for k, v in traced.items() if k != "dlb_root")  # not the readiness listener
    hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    sampler = hcm["tracing"]["provider"]["typed_config"]["sampler"]["typed_config"]["wrapped_sampler"]["typed_config"]
    assert sampler["sampling_percentage"] == {"numerator": 250_000, "denominator": "MILLION"}
    assert hcm["tracing"]["provider"]["typed_config"]["grpc_service"]["envoy_grpc"]["cluster_name"] == OTLP_CLUSTER
    otlp = next(c for c in boot["static_resources"]["clusters"] if c["name"] == OTLP_CLUSTER)
    assert otlp["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]["port_value"] == 4317


def test_xds_resources_carry_the_tracer_and_parse_as_envoy_types() -> None:
    cfg = config_from_dict(_foreign(address="127.0.0.1:10020", probe="127.0.0.1:9020"))  # two DLB cells
    for rs in (root_resources(cfg, "a", tracing=TRACING), leaf_resources(cfg, "b", tracing=TRACING)):
        assert OTLP_CLUSTER in {c.name for c in rs.clusters}
    assert OTLP_CLUSTER not in {c.name for c in root_resources(cfg, "a").clusters}  # off by default


def test_a_sample_ratio_outside_0_1_is_refused() -> None:
    with pytest.raises(ValueError, match="sample_ratio"):
        EnvoyTracing(HostPort("127.0.0.1", 4317), 1.5)
