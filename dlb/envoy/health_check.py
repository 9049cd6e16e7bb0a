"""Envoy's active health check of DLB's own gRPC services (ext_proc, leaf agent).

Why a module of its own: the bootstrap renderer and the access-log wiring (:mod:`dlb.envoy.als`) both
add health-checked service clusters; with the builder in the renderer, the two imported each other.
"""

from __future__ import annotations

from typing import Any


def service_health(cluster: dict[str, Any], *, grpc_health: bool) -> dict[str, Any]:
    """Health-check one of DLB's own gRPC services (ext_proc, leaf agent) from Envoy, every 0.5 s.

    A service that is draining or dead is then *unhealthy* rather than a connect timeout per stream:
    the ext_proc filter fails open at once and the access log stops writing into a closed socket. The
    leaf agent serves ``grpc.health.v1.Health`` (NOT_SERVING while it drains, :mod:`dlb.service.health`);
    the ext_proc listeners run DLB's own HTTP/2 transport, whose drain closes the listener, so a TCP
    connect is their check. One host per cluster: panic mode (route to unhealthy hosts when too few
    are healthy) is off, or an unhealthy lone host would be used anyway.
    """
    check: dict[str, Any] = {"timeout": "0.25s", "interval": "0.5s", "no_traffic_interval": "0.5s",
                             "unhealthy_threshold": 1, "healthy_threshold": 1}
    if grpc_health:
        check["grpc_health_check"] = {}
    else:
        check["tcp_health_check"] = {}
    cluster["health_checks"] = [check]
    cluster["common_lb_config"] = {"healthy_panic_threshold": {"value": 0.0}}
    return cluster
