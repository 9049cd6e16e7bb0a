"""Envoy config fragments that connect a leaf Envoy's gRPC access log to the leaf agent.

The leaf agent learns about completions (status, latency, which server) and — in Envoy
``LEAST_REQUEST`` mode — about request starts from Envoy's HTTP gRPC access log service. These
builders are the single definition of that wiring; :mod:`dlb.envoy.bootstrap` composes them into
the leaf bootstrap (and :func:`add_leaf_access_log` patches an existing bootstrap dict).

``buffer_flush_interval`` is short (5 ms) because each completion releases RIF the probes report:
Envoy's default 1 s would make the cell look a second's worth of completions busier than it is.
Entries are still batched per flush, so the cost per request stays a few hundred bytes of protobuf.

The access log steers the cell (its starts are the cell's RIF, its 503s its error rate), so it has a
channel of its own that only the cell's Envoy reaches: ``cells[].leaf.access_log`` (a Unix socket by
default, or a loopback port), never the probe port that roots reach across the network (issue 14 row 5:
one unauthenticated stream on the probe port black-holed a cell). See docs/security.md.
"""

from __future__ import annotations

from typing import Any

from dlb.config.model import Config
from dlb.envoy.contract import ACCESS_LOG_NAME, LEAF_AGENT_CLUSTER, LEAF_HEALTH_PATH, READY_LISTENER, SRC_CELL
from dlb.envoy.health_check import service_health


def leaf_access_log(cluster: str = LEAF_AGENT_CLUSTER, flush_ms: float = 5.0) -> dict[str, Any]:
    """The leaf's gRPC access log, without the roots' health checks of this Envoy: matched on the path,
    not on Envoy's health-check mark, because the start entry is written before any filter runs."""
    return {
        "name": "envoy.access_loggers.http_grpc",
        "filter": {"header_filter": {"header": {"name": ":path", "string_match": {"exact": LEAF_HEALTH_PATH}, "invert_match": True}}},
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig",
            "common_config": {
                "log_name": ACCESS_LOG_NAME,
                "transport_api_version": "V3",
                "grpc_service": {"envoy_grpc": {"cluster_name": cluster}},
                "buffer_flush_interval": f"{flush_ms / 1000.0:.3f}s",
                "buffer_size_bytes": 16384,
            },
            "additional_request_headers_to_log": [SRC_CELL],
        },
    }


def leaf_access_log_options() -> dict[str, Any]:
    """Log at request start too, so the leaf counts RIF even when Envoy (not the agent) picks."""
    return {"flush_access_log_on_new_request": True}


def envoy_address(address: str) -> dict[str, Any]:
    """``unix:/path`` or ``host:port`` as an Envoy ``core.v3.Address``."""
    if address.startswith("unix:"):
        return {"pipe": {"path": address[len("unix:"):]}}
    host, _, port = address.rpartition(":")
    return {"socket_address": {"address": host.strip("[]"), "port_value": int(port)}}


def leaf_agent_cluster(address: str, name: str = LEAF_AGENT_CLUSTER) -> dict[str, Any]:
    """The agent's access-log channel (``Leaf.access_log_address()``) as a static HTTP/2 cluster.

    Always a local address (a Unix socket or a loopback port, checked by the config loader), so neither
    DNS nor TLS: whoever can open it is on the leaf Envoy's host (in Kubernetes, in its pod).
    """
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "0.25s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": envoy_address(address)}}]}]},
        "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}}},
    }


def add_leaf_access_log(bootstrap: dict[str, Any], cfg: Config, cell: str, flush_ms: float = 5.0) -> dict[str, Any]:
    """Patch a leaf bootstrap (from :func:`dlb.envoy.bootstrap.leaf_bootstrap`) in place; idempotent."""
    channel = cfg.cell(cell).leaf.access_log_address()
    sr = bootstrap["static_resources"]
    if not any(c["name"] == LEAF_AGENT_CLUSTER for c in sr["clusters"]):
        # The agent answers grpc.health.v1: NOT_SERVING while it drains, so Envoy stops logging to it first.
        sr["clusters"].append(service_health(leaf_agent_cluster(channel), grpc_health=True))
    for listener in sr["listeners"]:
        if listener["name"] == READY_LISTENER:  # a kubelet's probes are not traffic
            continue
        for chain in listener["filter_chains"]:
            for f in chain["filters"]:
                hcm = f["typed_config"]
                if "route_config" in hcm and not hcm.get("access_log"):
                    hcm["access_log"] = [leaf_access_log(LEAF_AGENT_CLUSTER, flush_ms)]
                    if cfg.cell(cell).leaf.ext_proc is None:
                        # Start entries only matter when Envoy picks; with a leaf ext_proc the agent
                        # already counted the request at pick time (halves the log traffic).
                        hcm["access_log_options"] = leaf_access_log_options()
    return bootstrap
