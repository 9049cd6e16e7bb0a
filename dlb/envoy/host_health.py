"""Which hosts of a cluster an Envoy will not route to, and how many requests it sent each, read from its
admin ``/clusters?format=json``.

Why: the leaf agent reports a cell's healthy replicas to the roots; when it counted health its own way
(scrapes) while its Envoy's health check and outlier detection had taken every server out, roots kept
sending to a cell whose Envoy answered ``503 no_healthy_upstream`` to everything. Reading the Envoy's
own verdict makes the two views one. Pure: the caller fetches the JSON (off the request path).
"""

from __future__ import annotations

import json
from typing import Any

#: ``health_status`` flags under which Envoy routes no new request to a host (outside panic mode).
OUT_FLAGS = ("failed_active_health_check", "failed_outlier_check", "failed_eds_health", "pending_dynamic_removal",
             "excluded_via_immediate_hc_fail", "active_hc_timeout")
#: EDS health states Envoy does not route to.
OUT_EDS = ("UNHEALTHY", "DRAINING", "TIMEOUT")


def _address(host: dict[str, Any]) -> str | None:
    sock = host.get("address", {}).get("socket_address", {})
    ip, port = sock.get("address"), sock.get("port_value")
    if ip is None or port is None:
        return None
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _cluster_statuses(clusters_json: bytes | str) -> list[dict[str, Any]]:
    """Admin's ``cluster_statuses`` (ValueError when the text is not admin's JSON)."""
    try:
        doc = json.loads(clusters_json)
    except json.JSONDecodeError as e:
        raise ValueError(f"Envoy admin /clusters: not JSON ({e})") from None
    return doc.get("cluster_statuses", []) if isinstance(doc, dict) else []


def hosts_out(clusters_json: bytes | str, cluster: str) -> tuple[set[str], set[str]]:
    """``(every host, hosts out of rotation)`` of ``cluster`` as ``ip:port`` (``[ip]:port`` for IPv6).

    Raises ValueError when the text is not admin's JSON or names no such cluster (a wrong admin address
    must not read as "every server healthy").
    """
    for status in _cluster_statuses(clusters_json):
        if status.get("name") != cluster:
            continue
        every: set[str] = set()
        out: set[str] = set()
        for host in status.get("host_statuses", []):
            addr = _address(host)
            if addr is None:
                continue
            every.add(addr)
            health = host.get("health_status", {})
            if any(health.get(flag) for flag in OUT_FLAGS) or health.get("eds_health_status") in OUT_EDS:
                out.add(addr)
        return every, out
    raise ValueError(f"Envoy admin /clusters: no cluster {cluster!r}")


def requests_by_host(clusters_json: bytes | str) -> dict[str, int]:
    """Requests the Envoy sent each host (``ip:port``), summed over every cluster that holds it.

    Envoy counts a host's ``rq_total`` when a request is attached to a connection to it, so a retry
    counts on each host tried and an active health check (its own connection) not at all: this is where
    the Envoy's own routing sent traffic, whichever config (ext_proc, weights, a pool) decided it.
    """
    out: dict[str, int] = {}
    for status in _cluster_statuses(clusters_json):
        for host in status.get("host_statuses", []):
            addr = _address(host)
            if addr is None:
                continue
            for stat in host.get("stats", []):
                if stat.get("name") == "rq_total":
                    out[addr] = out.get(addr, 0) + int(stat.get("value", 0))
    return out
