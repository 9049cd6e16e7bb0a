"""xDS-driven Envoy bootstraps: the Envoy knows only the control plane's address.

The bootstrap names the node (``node.cluster`` = tier, ``node.locality.zone`` = cell, which is the
control plane's snapshot key), one static cluster for the control plane (HTTP/2, since xDS is gRPC)
and ADS as the source of listeners and clusters; everything else arrives over ADS. The overload manager
(the downstream connection cap) is bootstrap-only in Envoy, so it is set here as in the static bootstraps.

One bootstrap serves every pod of a tier: Envoy's ``--service-node``, ``--service-cluster`` and
``--service-zone`` override ``node.id``, ``node.cluster`` and ``node.locality.zone`` (checked on
Envoy 1.40 in tests/e2e/test_deploy_code.py), so a pod's name and cell come from the downward API. The
control plane's address may be a DNS name (a Kubernetes Service): the cluster is then ``STRICT_DNS``,
since Envoy 1.40 refuses a name in a ``STATIC`` cluster ("malformed IP address").
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from dlb.config.hostport import is_ip
from dlb.config.model import HostPort, TlsFiles
from dlb.config.tls import CONTROL_PLANE, identity_name, spiffe_id
from dlb.envoy.bootstrap import admin_stats_cluster, overload_manager, ready_listener
from dlb.envoy.tls import upstream_tls

XDS_CLUSTER = "dlb_xds"
ROLES = {"root": "dlb-root", "leaf": "dlb-leaf"}


def ads_bootstrap(role: str, cell: str, xds: HostPort | Sequence[HostPort], admin_port: int, node_id: str | None = None,
                  delta: bool = False, ready_port: int | None = None, tls: TlsFiles | None = None,
                  token: dict[str, Any] | None = None, leaf_replica: int = 0) -> dict[str, Any]:
    """Bootstrap of an Envoy of ``role`` (root|leaf) in ``cell``, configured entirely over ADS.

    ``delta`` selects the incremental protocol (``DELTA_GRPC``) instead of state of the world;
    ``ready_port`` adds the ``dlb_ready`` listener (:func:`dlb.envoy.bootstrap.ready_listener`).
    ``tls`` (a config's ``tls`` section): mutual TLS to the control plane with this (role, cell)'s
    certificate — the identity the control plane authorises this node by. ``token``: the root token's
    static secret (:func:`dlb.envoy.root_token.token_secret`), which a root's listener from xDS names.
    ``leaf_replica`` k > 0: the cell's leaf replica k (``cells[].leaf.replicas[k-1]``), told apart by
    ``locality.sub_zone``, whose snapshot carries that replica's listener and agent addresses.
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {sorted(ROLES)}, got {role!r}")
    if role == "root" and token is None:
        raise ValueError("a root Envoy's bootstrap needs the root token secret (token_secret(cfg) or token_file_secret(path))")
    replicas = [xds] if isinstance(xds, HostPort) else list(xds)
    ads = {"ads": {}, "resource_api_version": "V3"}
    dns = not all(is_ip(r.host) for r in replicas)
    boot: dict[str, Any] = {
        "node": {
            "id": node_id or f"{role}-{cell}-{os.getpid()}",
            "cluster": ROLES[role],
            "locality": {"zone": cell, **({"sub_zone": str(leaf_replica)} if leaf_replica else {})},
        },
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "dynamic_resources": {
            "ads_config": {
                "api_type": "DELTA_GRPC" if delta else "GRPC",
                "transport_api_version": "V3",
                # Envoy's xDS stream back-off defaults to 0.5 s growing to 30 s; capped at 1 s so an
                # Envoy finds a restarted control plane as fast as the services do (dlb.xds.client).
                "grpc_services": [{"envoy_grpc": {"cluster_name": XDS_CLUSTER, "retry_policy": {
                    "retry_back_off": {"base_interval": "0.1s", "max_interval": "1s"}}}}],
                "set_node_on_first_message_only": True,
            },
            "cds_config": ads,
            "lds_config": ads,
        },
        "overload_manager": overload_manager(),
        "static_resources": {
            "clusters": [{
                "name": XDS_CLUSTER,
                "type": "STRICT_DNS" if dns else "STATIC",
                **({"dns_lookup_family": "V4_PREFERRED"} if dns else {}),
                "connect_timeout": "1s",
                "load_assignment": {"cluster_name": XDS_CLUSTER, "endpoints": [{"lb_endpoints": [
                    {"endpoint": {"address": {"socket_address": {"address": r.host, "port_value": r.port}}}}
                    for r in replicas]}]},
                # Control-plane replicas (active-active): the gRPC health check (served next to xDS)
                # takes a dead replica out within ~0.5 s, so a broken ADS stream reconnects to a live one.
                "health_checks": [{"timeout": "1s", "interval": "0.5s", "no_traffic_interval": "0.5s",
                                   "unhealthy_threshold": 1, "healthy_threshold": 1,
                                   "grpc_health_check": {}}],
                "typed_extension_protocol_options": {
                    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                        "explicit_http_config": {"http2_protocol_options": {
                            # Notice a dead control plane and reconnect; Envoy keeps serving its last config.
                            "connection_keepalive": {"interval": "10s", "timeout": "5s"}}},
                    }
                },
            }],
        },
    }
    if ready_port is not None:
        boot["static_resources"]["listeners"] = [ready_listener(ready_port)]
        boot["static_resources"]["clusters"].append(admin_stats_cluster(admin_port))
    if role == "root":
        boot["static_resources"]["secrets"] = [token]
    if tls is not None:
        xds_cluster = boot["static_resources"]["clusters"][0]
        xds_cluster["transport_socket"] = upstream_tls(tls, identity_name(role, cell), spiffe_id(CONTROL_PLANE))
    return boot
