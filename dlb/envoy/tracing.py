"""Envoy's own spans: the OpenTelemetry tracer on a root or leaf Envoy's listener, exporting over OTLP/gRPC.

Why Envoy traces too: the services' spans (a root decision, a leaf pick) say what DLB decided; the
Envoys' spans say where the request's time went between them (the WAN hop, the upstream). With both,
one request through a root and a leaf is one trace of ≥ 4 spans. Envoy continues the request's W3C
``traceparent`` (its span a child of the client's, the leaf Envoy's a child of the root Envoy's, whose
router forwards its own), follows the parent's sampled flag, and samples ``sample_ratio`` of the
requests that carry none. Added to a rendered bootstrap, so a static file (``dlb config render``) and
the control plane's xDS resources get the same tracer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dlb.config.model import HostPort
from dlb.envoy.bootstrap import _cluster

OTLP_CLUSTER = "dlb_otlp"
HCM_TYPE = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
TRACED_LISTENERS = ("dlb_root", "dlb_leaf")


@dataclass(frozen=True)
class EnvoyTracing:
    """Where the Envoys send spans (an OTLP/gRPC collector) and the share of untraced requests they sample."""

    otlp: HostPort
    sample_ratio: float = 0.01

    def __post_init__(self) -> None:
        if not 0.0 <= self.sample_ratio <= 1.0:
            raise ValueError(f"sample_ratio must be in [0, 1], got {self.sample_ratio}")


def _sampler(ratio: float) -> dict[str, Any]:
    """OpenTelemetry's parent-based sampler around a trace-id ratio: the parent's flag, else ``ratio``."""
    samplers = "type.googleapis.com/envoy.extensions.tracers.opentelemetry.samplers.v3."
    ratio_sampler = {"name": "envoy.tracers.opentelemetry.samplers.trace_id_ratio_based", "typed_config": {
        "@type": samplers + "TraceIdRatioBasedSamplerConfig",
        "sampling_percentage": {"numerator": round(ratio * 1_000_000), "denominator": "MILLION"}}}
    return {"name": "envoy.tracers.opentelemetry.samplers.parent_based", "typed_config": {
        "@type": samplers + "ParentBasedSamplerConfig", "wrapped_sampler": ratio_sampler}}


def add_tracing(boot: dict[str, Any], tracing: EnvoyTracing, service_name: str) -> dict[str, Any]:
    """``boot`` with the OpenTelemetry tracer on its root/leaf listener and a cluster to the collector."""
    static = boot["static_resources"]
    for listener in static["listeners"]:
        if listener.get("name") not in TRACED_LISTENERS:
            continue
        for chain in listener.get("filter_chains", []):
            for f in chain.get("filters", []):
                hcm = f.get("typed_config", {})
                if hcm.get("@type") == HCM_TYPE:
                    hcm["tracing"] = {
                        # The sampler decides (measured: with random_sampling 0 Envoy 1.40 drops a sampled parent).
                        "random_sampling": {"value": 100.0},
                        "spawn_upstream_span": False,
                        "provider": {"name": "envoy.tracers.opentelemetry", "typed_config": {
                            "@type": "type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig",
                            "grpc_service": {"envoy_grpc": {"cluster_name": OTLP_CLUSTER}, "timeout": "1s"},
                            "service_name": service_name, "sampler": _sampler(tracing.sample_ratio)}},
                    }
    static["clusters"].append(_cluster(OTLP_CLUSTER, [(tracing.otlp, 1)], http2=True, connect_timeout_s=0.5))
    return boot
