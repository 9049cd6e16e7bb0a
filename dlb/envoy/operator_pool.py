"""The root's pool cluster for the operator baselines ``lr-global`` and ``locality-failover`` (DESIGN §3).

What operators run instead of DLB, rendered as plain Envoy configuration so no DLB code decides a
request (the root Envoy has no ext_proc then; :func:`dlb.envoy.bootstrap.root_bootstrap`):

- ``lr-global``: every allowed cell in one priority, Envoy ``LEAST_REQUEST``. The root reaches a cell
  only through its leaf Envoy, so each cell is one host weighted by its replica count; Envoy's
  weighted least-request (weight ÷ (active + 1)) then spreads this root's active requests over cells
  in proportion to their servers — what power-of-two over a pool of every server converges to — and
  the leaf picks the server. Network delay is paid (the leaf's WAN emulation) and seen only as the
  longer time a request stays active.
- ``locality-failover``: the source cell at priority 0, the other allowed cells at priorities 1..n by
  RTT, Envoy's overprovisioning factor 1.4 and health-based spill-over, ``LEAST_REQUEST`` inside.

Health as an operator sets it up: an active HTTP check of each leaf on the first API prefix (any
answer below 500 is healthy — a leaf with no live server answers 503) and outlier detection with
Envoy's defaults (5 consecutive 5xx, 30 s base ejection). Overload is visible only through them.
"""

from __future__ import annotations

from typing import Any

from dlb.config.model import Config

POOL_CLUSTER = "dlb-operator-pool"
POOL_KINDS = ("lr-global", "locality-failover")
#: Active health check of each cell's leaf (Envoy has no default interval): fast enough that a dead
#: cell leaves the pool within ~2 s.
CHECK_INTERVAL_S = 1.0
CHECK_TIMEOUT_S = 1.0
CHECK_UNHEALTHY = 2


def pool_order(cfg: Config, src: str) -> list[str]:
    """Allowed destinations of ``src``: itself first (if allowed), then the others by RTT, then name."""
    allowed = [d.name for d in cfg.allowed_destinations(src)]
    others = sorted((d for d in allowed if d != src), key=lambda d: (cfg.rtt_ms(src, d), d))
    return ([src] if src in allowed else []) + others


def pool_cluster(base: dict[str, Any], cfg: Config, src: str, kind: str, check_path: str) -> dict[str, Any]:
    """``base`` (a LEAST_REQUEST cluster named :data:`POOL_CLUSTER`) with the baseline's localities,
    priorities, health check and outlier detection."""
    if kind not in POOL_KINDS:
        raise ValueError(f"policy weights {kind!r} has no pool cluster (pool baselines: {', '.join(POOL_KINDS)})")
    order = pool_order(cfg, src)
    groups = []
    for p, name in enumerate(order):
        cell = cfg.cell(name)
        leaves = [r.address for r in cell.leaf.all_replicas()]
        group: dict[str, Any] = {
            "locality": {"zone": name},
            # Every leaf replica of the cell, the cell's weight split over them.
            "lb_endpoints": [{"endpoint": {"address": {"socket_address": {"address": hp.host, "port_value": hp.port}}},
                              "load_balancing_weight": max(1, int(round(cell.replicas / len(leaves))))}
                             for hp in leaves],
        }
        if kind == "locality-failover":
            group["priority"] = p
        groups.append(group)
    base["load_assignment"] = {"cluster_name": POOL_CLUSTER, "endpoints": groups,
                               "policy": {"overprovisioning_factor": 140}}
    base["lb_policy"] = "LEAST_REQUEST"
    base["health_checks"] = [{
        # no_traffic_interval too: Envoy's default (60 s) would hold the first check after traffic starts.
        "timeout": f"{CHECK_TIMEOUT_S:g}s", "interval": f"{CHECK_INTERVAL_S:g}s", "no_traffic_interval": f"{CHECK_INTERVAL_S:g}s",
        "unhealthy_threshold": CHECK_UNHEALTHY, "healthy_threshold": 1,
        "http_health_check": {"path": check_path, "expected_statuses": [{"start": 200, "end": 500}]},
    }]
    base["outlier_detection"] = {}  # Envoy's defaults
    return base
