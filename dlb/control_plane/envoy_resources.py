"""Envoy resources (LDS/RDS/CDS/EDS) for the control plane, derived from the static bootstraps.

There is exactly one description of what a root or leaf Envoy runs: :mod:`dlb.envoy.bootstrap`, which
renders a static bootstrap from the DLB config (and is what ``envoy --mode validate`` checks in the
tests). This module turns such a bootstrap into dynamic resources instead of writing the listeners,
routes and clusters a second time:

- every ``STATIC`` cluster becomes an ``EDS`` cluster over ADS plus a ``ClusterLoadAssignment``
  (so endpoint changes are EDS pushes that do not drain the cluster); other cluster types (DNS,
  ORIGINAL_DST) are served as they are;
- every HTTP connection manager's inline ``route_config`` becomes an ``rds`` reference over ADS plus
  a ``RouteConfiguration`` resource;
- for endpoints with the flow mechanism, the fail-open ``weighted_clusters`` route carries the flow
  weights the control plane computed for this source cell, rounded by :func:`round_weights`.

Invariant the control plane relies on: a route never names a cluster that is not in the same
resource set (:func:`check_references`); with the server's make-before-break order (CDS → EDS → LDS
→ RDS) Envoy never sees a route to a cluster it has not received.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

# Registered so json_format can resolve the typed_config "@type"s of the bootstraps.
from envoy.config.bootstrap.v3 import bootstrap_pb2
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import config_source_pb2
from envoy.config.core.v3 import health_check_pb2 as health_status_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.config.trace.v3 import opentelemetry_pb2  # noqa: F401  (the Envoys' tracer, dlb.envoy.tracing)
from envoy.extensions.access_loggers.filters.cel.v3 import cel_pb2  # noqa: F401  (local replies matched by CEL, dlb.envoy.replies.ENVOY_REPLIES)
from envoy.extensions.access_loggers.grpc.v3 import als_pb2  # noqa: F401  (registers the access-log config type for json_format)
from envoy.extensions.clusters.aggregate.v3 import cluster_pb2 as aggregate_pb2  # noqa: F401  (the root's cell + fallback clusters)
from envoy.extensions.filters.http.credential_injector.v3 import credential_injector_pb2  # noqa: F401  (the root's token)
from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2  # noqa: F401
from envoy.extensions.filters.http.fault.v3 import fault_pb2  # noqa: F401
from envoy.extensions.filters.http.health_check.v3 import health_check_pb2  # noqa: F401  (the leaf's answer to the roots' check)
from envoy.extensions.filters.http.lua.v3 import lua_pb2  # noqa: F401  (the leaf's token check)
from envoy.extensions.filters.http.router.v3 import router_pb2  # noqa: F401
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.http.injected_credentials.generic.v3 import generic_pb2  # noqa: F401
from envoy.extensions.retry.host.previous_hosts.v3 import previous_hosts_pb2  # noqa: F401  (the leaf's retry host predicate)
from envoy.extensions.retry.priority.previous_priorities.v3 import previous_priorities_config_pb2  # noqa: F401  (the root's cross-cell retry)
from envoy.extensions.tracers.opentelemetry.samplers.v3 import parent_based_sampler_pb2, trace_id_ratio_based_sampler_pb2  # noqa: F401
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2  # noqa: F401  (mTLS to DLB services, docs/security.md)
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2  # noqa: F401
from google.protobuf import json_format
from google.protobuf.message import Message

from dlb.config.model import Config
from dlb.core.native_discrete import NativeWeights
from dlb.core.router import Mechanism
from dlb.envoy import bootstrap as envoy_bootstrap
from dlb.envoy.tracing import EnvoyTracing, add_tracing
from dlb.envoy.weights import round_weights
from dlb.xds import types

HCM_FILTER = "envoy.filters.network.http_connection_manager"
HCM_TYPE = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"


@dataclass(frozen=True)
class ResourceSet:
    """Resources for one Envoy, in deterministic order."""

    listeners: tuple[listener_pb2.Listener, ...]
    routes: tuple[route_pb2.RouteConfiguration, ...]
    clusters: tuple[cluster_pb2.Cluster, ...]
    endpoints: tuple[endpoint_pb2.ClusterLoadAssignment, ...]

    def by_type(self) -> dict[str, list[Message]]:
        return {
            types.CLUSTER: list(self.clusters),
            types.ENDPOINT: list(self.endpoints),
            types.LISTENER: list(self.listeners),
            types.ROUTE: list(self.routes),
        }


def _ads() -> config_source_pb2.ConfigSource:
    return config_source_pb2.ConfigSource(ads=config_source_pb2.AggregatedConfigSource(), resource_api_version=config_source_pb2.V3)


def from_bootstrap(bootstrap: Mapping[str, Any]) -> ResourceSet:
    """Dynamic resources equivalent to a static bootstrap's listeners and clusters."""
    static = bootstrap_pb2.Bootstrap.StaticResources()
    json_format.ParseDict(dict(bootstrap.get("static_resources", {})), static)
    clusters: list[cluster_pb2.Cluster] = []
    endpoints: list[endpoint_pb2.ClusterLoadAssignment] = []
    for static_cluster in static.clusters:
        c = cluster_pb2.Cluster.FromString(static_cluster.SerializeToString())
        if c.type == cluster_pb2.Cluster.STATIC and c.HasField("load_assignment"):
            cla = endpoint_pb2.ClusterLoadAssignment()
            cla.CopyFrom(c.load_assignment)
            cla.cluster_name = c.name
            c.ClearField("load_assignment")
            c.type = cluster_pb2.Cluster.EDS
            c.eds_cluster_config.eds_config.CopyFrom(_ads())
            endpoints.append(cla)
        clusters.append(c)
    listeners: list[listener_pb2.Listener] = []
    routes: list[route_pb2.RouteConfiguration] = []
    for static_listener in static.listeners:
        lis = listener_pb2.Listener.FromString(static_listener.SerializeToString())
        for chain in lis.filter_chains:
            for f in chain.filters:
                if f.name != HCM_FILTER or f.typed_config.type_url != HCM_TYPE:
                    continue
                hcm = hcm_pb2.HttpConnectionManager()
                f.typed_config.Unpack(hcm)
                if hcm.HasField("route_config"):
                    rc = route_pb2.RouteConfiguration()
                    rc.CopyFrom(hcm.route_config)
                    routes.append(rc)
                    hcm.ClearField("route_config")
                    hcm.rds.config_source.CopyFrom(_ads())
                    hcm.rds.route_config_name = rc.name
                    f.typed_config.Pack(hcm)
        listeners.append(lis)
    return ResourceSet(tuple(listeners), tuple(routes), tuple(clusters), tuple(endpoints))


def set_flow_weights(rs: ResourceSet, config: Config, src: str, flow_weights: Mapping[str, np.ndarray],
                     require_flow: bool = True) -> None:
    """Write each flow endpoint's weights (x_src over cells, index order) into its fallback route
    (``require_flow`` False: any endpoint's, for the hub-score baseline's weights).

    A route that retries across cells (a native flow endpoint's) names each cell's aggregate with its
    fallback, as the bootstrap does (:func:`~dlb.envoy.bootstrap.flow_cluster_name`); others the bare cells."""
    allowed = np.asarray(config.network.allowed[config.cell(src).index], dtype=bool)
    fallbacks = envoy_bootstrap.flow_fallbacks(config, src)
    by_route = {f"{ep.name}-fallback": ep for ep in config.endpoints}
    for rc in rs.routes:
        for vh in rc.virtual_hosts:
            for r in vh.routes:
                ep = by_route.get(r.name)
                if ep is None or ep.name not in flow_weights:
                    continue
                if require_flow and ep.policy.mechanism is not Mechanism.FLOW:
                    raise ValueError(f"endpoint {ep.name} is not a flow endpoint; it has no flow weights")
                x = np.asarray(flow_weights[ep.name], dtype=float)
                if x.shape != allowed.shape or np.any(x[~allowed] > 0):
                    raise ValueError(f"flow weights of {ep.name} from {src} must have {allowed.size} entries, 0 off the allowed arcs: {x}")
                ints = round_weights(x)
                across = fallbacks if r.route.retry_policy.retry_priority.name == envoy_bootstrap.PREVIOUS_PRIORITIES else {}
                wc = r.route.weighted_clusters
                del wc.clusters[:]
                for cell in config.cells:
                    if ints[cell.index] > 0:
                        wc.clusters.add(name=envoy_bootstrap.flow_cluster_name(config, cell.name, across)).weight.value = ints[cell.index]


def native_assignment(cla: endpoint_pb2.ClusterLoadAssignment, config: Config, src: int,
                      w: NativeWeights) -> endpoint_pb2.ClusterLoadAssignment:
    """A native-discrete cluster's hosts (the allowed cells' leaves, in cell order) with weights ``w``;
    a cell not usable now is UNHEALTHY, so Envoy's least-request skips it (panic mode is off)."""
    out = endpoint_pb2.ClusterLoadAssignment()
    out.CopyFrom(cla)
    hosts = list(out.endpoints[0].lb_endpoints)
    cells = [c for c in config.cells if config.network.allowed[src][c.index]]
    if len(hosts) != len(cells):
        raise ValueError(f"{cla.cluster_name}: {len(hosts)} hosts for {len(cells)} allowed cells")
    for host, cell in zip(hosts, cells, strict=True):
        host.load_balancing_weight.value = max(1, w.weights[cell.index])
        host.health_status = health_status_pb2.HEALTHY if w.healthy[cell.index] else health_status_pb2.UNHEALTHY
    return out


def root_resources(config: Config, cell: str, flow_weights: Mapping[str, np.ndarray] | None = None,
                   reuse_port: bool = False, tracing: EnvoyTracing | None = None) -> ResourceSet:
    """Everything a root Envoy in ``cell`` gets over ADS; flow endpoints run natively in Envoy.
    ``reuse_port``: several root Envoys of the cell share its address on one host (``dlb up --root-envoys``)."""
    boot = envoy_bootstrap.root_bootstrap(config, cell, admin_port=0, native_flow=True, reuse_port=reuse_port)
    rs = from_bootstrap(add_tracing(boot, tracing, f"envoy-root-{cell}") if tracing is not None else boot)
    if flow_weights:
        set_flow_weights(rs, config, cell, flow_weights)
    check_references(rs)
    return rs


def leaf_resources(config: Config, cell: str, emulate_wan: bool = False, tracing: EnvoyTracing | None = None) -> ResourceSet:
    """Everything a leaf Envoy in ``cell`` gets over ADS."""
    # The access log is how the leaf agent learns completions (RIF release, latency samples, errors): a
    # leaf Envoy configured over xDS must feed its agent exactly as a statically configured one does.
    boot = envoy_bootstrap.leaf_bootstrap(config, cell, admin_port=0, emulate_wan=emulate_wan, access_log=True)
    rs = from_bootstrap(add_tracing(boot, tracing, f"envoy-leaf-{cell}") if tracing is not None else boot)
    check_references(rs)
    return rs


def check_references(rs: ResourceSet) -> None:
    """Raise if a route names a cluster the set does not contain (such a route is never pushed)."""
    have = {c.name for c in rs.clusters}
    for rc in rs.routes:
        for vh in rc.virtual_hosts:
            for r in vh.routes:
                names = [w.name for w in r.route.weighted_clusters.clusters]
                if r.route.cluster:
                    names.append(r.route.cluster)
                missing = [n for n in names if n not in have]
                if missing:
                    raise ValueError(f"route {rc.name}/{r.name} names clusters not in the resource set: {missing}")
