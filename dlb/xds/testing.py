"""Test and benchmark helpers: a raw xDS stream driver and hand-built Envoy resources.

``RawStream`` speaks the protocol with the plain xds-protos stubs (no client logic), so tests can send
exactly the requests they mean (stale nonces, NACKs, withdrawn names). ``barrier`` proves the absence
of a push without sleeping: it subscribes to a fresh custom type, which the server answers at once;
responses of one push go out in type order with unknown custom types last, so anything the server
meant to send before the barrier arrives first.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterable
from typing import Any

import grpc
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import base_pb2, config_source_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import any_pb2
from google.protobuf.message import Message

from dlb.xds.snapshot import resource_name, unwrap

_barrier_ids = itertools.count(1)
BARRIER_PREFIX = "type.googleapis.com/zzz.dlb.barrier"


class RawStream:
    """One ADS stream (SotW or delta) driven request by request."""

    def __init__(self, channel: grpc.aio.Channel, delta: bool = False) -> None:
        self.delta = delta
        self._queue: asyncio.Queue[Message | None] = asyncio.Queue()
        stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)

        async def requests() -> AsyncIterator[Message]:
            while True:
                item = await self._queue.get()
                if item is None:
                    return
                yield item

        method = stub.DeltaAggregatedResources if delta else stub.StreamAggregatedResources
        self.call = method(requests())

    async def send(self, req: Message) -> None:
        await self._queue.put(req)

    async def recv(self, timeout: float = 20.0) -> Any:
        async with asyncio.timeout(timeout):
            resp = await self.call.read()
        if resp is grpc.aio.EOF:
            raise EOFError(f"stream ended: {await self.call.code()} {await self.call.details()}")
        return resp

    async def barrier(self, node: base_pb2.Node | None = None) -> list[Any]:
        """Return every response that arrives before the barrier's own response."""
        type_url = f"{BARRIER_PREFIX}{next(_barrier_ids):06d}"
        if self.delta:
            await self.send(discovery_pb2.DeltaDiscoveryRequest(type_url=type_url, node=node))
        else:
            await self.send(discovery_pb2.DiscoveryRequest(type_url=type_url, node=node))
        before: list[Any] = []
        while True:
            resp = await self.recv()
            if resp.type_url == type_url:
                return before
            before.append(resp)

    async def close(self) -> None:
        await self._queue.put(None)
        self.call.cancel()


def sotw_request(type_url: str, names: Iterable[str] = (), version: str = "", nonce: str = "", node: base_pb2.Node | None = None,
                 error: str | None = None) -> discovery_pb2.DiscoveryRequest:
    req = discovery_pb2.DiscoveryRequest(type_url=type_url, resource_names=list(names), version_info=version,
                                         response_nonce=nonce)
    if node is not None:
        req.node.CopyFrom(node)
    if error is not None:
        req.error_detail.code = 3
        req.error_detail.message = error
    return req


def ack(resp: Any, names: Iterable[str] = (), node: base_pb2.Node | None = None) -> discovery_pb2.DiscoveryRequest:
    return sotw_request(resp.type_url, names, resp.version_info, resp.nonce, node)


def nack(resp: Any, kept_version: str, reason: str, names: Iterable[str] = ()) -> discovery_pb2.DiscoveryRequest:
    return sotw_request(resp.type_url, names, kept_version, resp.nonce, error=reason)


def names_of(resp: Any, cls: type[Message]) -> list[str]:
    """Resource names in a SotW response, unpacked as ``cls``."""
    return list(decode(resp, cls))


def decode(resp: Any, cls: type[Message]) -> dict[str, Message]:
    """A SotW response as {name: message}, unwrapping envoy.service.discovery.v3.Resource entries."""
    out: dict[str, Message] = {}
    for a in resp.resources:
        name, inner = unwrap(a)
        m = cls.FromString(inner.value)
        out[name if name is not None else resource_name(m)] = m
    return out


# --- hand-built Envoy resources (tests, benchmark) ---------------------------------------------

def grpc_source(cluster: str) -> config_source_pb2.ConfigSource:
    """A non-ADS config source: the per-type service on ``cluster`` (Envoy opens one stream per type)."""
    src = config_source_pb2.ConfigSource(resource_api_version=config_source_pb2.V3)
    api = src.api_config_source
    api.api_type = config_source_pb2.ApiConfigSource.GRPC
    api.transport_api_version = config_source_pb2.V3
    api.grpc_services.add().envoy_grpc.cluster_name = cluster
    return src


def _ads_source() -> config_source_pb2.ConfigSource:
    return config_source_pb2.ConfigSource(ads=config_source_pb2.AggregatedConfigSource(),
                                          resource_api_version=config_source_pb2.V3)


def eds_cluster(name: str, connect_timeout_s: float = 1.0,
                source: config_source_pb2.ConfigSource | None = None) -> cluster_pb2.Cluster:
    c = cluster_pb2.Cluster(name=name, type=cluster_pb2.Cluster.EDS)
    c.connect_timeout.FromNanoseconds(int(connect_timeout_s * 1e9))
    c.eds_cluster_config.eds_config.CopyFrom(source or _ads_source())
    return c


def load_assignment(cluster: str, ports: list[int], host: str = "127.0.0.1") -> endpoint_pb2.ClusterLoadAssignment:
    cla = endpoint_pb2.ClusterLoadAssignment(cluster_name=cluster)
    group = cla.endpoints.add()
    for port in ports:
        ep = group.lb_endpoints.add()
        ep.endpoint.address.socket_address.address = host
        ep.endpoint.address.socket_address.port_value = port
    return cla


def route_config(name: str, weights: dict[str, int] | None = None, cluster: str | None = None,
                 direct_body: str | None = None) -> route_pb2.RouteConfiguration:
    """One virtual host, one catch-all route: to ``cluster``, to weighted clusters, or a direct response."""
    rc = route_pb2.RouteConfiguration(name=name)
    vh = rc.virtual_hosts.add(name="all", domains=["*"])
    r = vh.routes.add()
    r.match.prefix = "/"
    if direct_body is not None:
        r.direct_response.status = 200
        r.direct_response.body.inline_string = direct_body
    elif cluster is not None:
        r.route.cluster = cluster
    else:
        for c, w in (weights or {}).items():
            wc = r.route.weighted_clusters.clusters.add(name=c)
            wc.weight.value = w
    return rc


def http_listener(name: str, port: int, route_name: str,
                  source: config_source_pb2.ConfigSource | None = None) -> listener_pb2.Listener:
    hcm = hcm_pb2.HttpConnectionManager(stat_prefix=name)
    hcm.rds.route_config_name = route_name
    hcm.rds.config_source.CopyFrom(source or _ads_source())
    router = any_pb2.Any()
    router.Pack(router_pb2.Router())
    hcm.http_filters.add(name="envoy.filters.http.router", typed_config=router)
    packed = any_pb2.Any()
    packed.Pack(hcm)
    lst = listener_pb2.Listener(name=name)
    lst.address.socket_address.address = "127.0.0.1"
    lst.address.socket_address.port_value = port
    chain = lst.filter_chains.add()
    chain.filters.add(name="envoy.filters.network.http_connection_manager", typed_config=packed)
    return lst


def node(node_id: str, cluster: str = "test", wrapper: bool = True) -> base_pb2.Node:
    """A test node; ``wrapper`` announces support for discovery.v3.Resource-wrapped SotW resources."""
    return base_pb2.Node(id=node_id, cluster=cluster,
                         client_features=["xds.config.resource-in-sotw"] if wrapper else [])


__all__ = ["RawStream", "ack", "eds_cluster", "http_listener", "load_assignment", "nack", "names_of", "node",
           "route_config", "sotw_request"]
