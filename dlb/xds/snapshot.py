"""Immutable snapshots of resources, serialized once.

A :class:`Resource` is one named xDS resource of any type: our code never looks inside it except to
find a cluster's EDS service name (for make-before-break). It is packed into ``google.protobuf.Any``
and serialized exactly once, deterministically, when the snapshot is built; the content hash of those
bytes is the resource's delta ``version`` and lets the server skip pushes that would change nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2
from google.protobuf.message import Message

from dlb.errors import DlbError
from dlb.xds import types, wire


class SnapshotError(DlbError, ValueError):
    """A snapshot could not be built (duplicate or missing names, wrong types)."""


@dataclass(frozen=True, slots=True)
class Resource:
    name: str
    type_url: str
    version: str  # content hash of the serialized message
    any_bytes: bytes  # serialized google.protobuf.Any
    sotw_field: bytes  # DiscoveryResponse.resources entry, ready to concatenate (wrapped if needed)
    delta_field: bytes  # DeltaDiscoveryResponse.resources entry (a discovery Resource), ready to concatenate
    eds_name: str = ""  # clusters only: the ClusterLoadAssignment name this cluster subscribes to
    sotw_plain_field: bytes = b""  # set only when sotw_field is wrapped: the bare Any entry

    def sotw(self, wrap_ok: bool) -> bytes:
        return self.sotw_field if wrap_ok or not self.sotw_plain_field else self.sotw_plain_field

    @staticmethod
    def from_message(message: Message, name: str | None = None, type_url: str | None = None) -> Resource:
        """Pack ``message`` once. ``type_url`` defaults to the message's own full name."""
        if isinstance(message, any_pb2.Any):
            packed = message
            if type_url and type_url != packed.type_url:
                raise SnapshotError(f"Any carries {packed.type_url!r}, expected {type_url!r}")
        else:
            packed = any_pb2.Any(type_url=type_url or types.type_url_of(message.DESCRIPTOR.full_name),
                                 value=message.SerializeToString(deterministic=True))
        if name is None:
            if isinstance(message, any_pb2.Any):
                raise SnapshotError(f"resource of type {packed.type_url} packed in Any needs an explicit name")
            name = resource_name(message)
        if not name:
            raise SnapshotError(f"resource of type {packed.type_url} has an empty name")
        any_bytes = packed.SerializeToString(deterministic=True)
        version = hashlib.sha256(packed.type_url.encode() + b"\0" + packed.value).hexdigest()[:16]
        delta = discovery_pb2.Resource(name=name, version=version, resource=packed).SerializeToString(deterministic=True)
        plain_bytes = any_bytes
        if isinstance(message, any_pb2.Any) or _derived_name(message) != name:
            # SotW responses carry bare Any; a name that is not inside the message travels in the
            # envoy.service.discovery.v3.Resource wrapper, for clients that support it (see
            # ``supports_wrapper``); others get the plain Any.
            any_bytes = any_pb2.Any(type_url=RESOURCE_WRAPPER, value=delta).SerializeToString(deterministic=True)
        eds_name = ""
        if packed.type_url == types.CLUSTER:
            eds_name = _cluster_eds_name(message if not isinstance(message, any_pb2.Any) else None, packed, name)
        return Resource(name=name, type_url=packed.type_url, version=version, any_bytes=any_bytes,
                        sotw_field=wire.length_delimited(wire.SotwResponseField.RESOURCES, any_bytes),
                        sotw_plain_field=(b"" if plain_bytes is any_bytes
                                          else wire.length_delimited(wire.SotwResponseField.RESOURCES, plain_bytes)),
                        delta_field=wire.length_delimited(wire.DeltaResponseField.RESOURCES, delta),
                        eds_name=eds_name)


RESOURCE_WRAPPER = types.type_url_of("envoy.service.discovery.v3.Resource")
# Client features announcing that SotW responses may wrap resources in discovery.v3.Resource: the
# xDS docs' spelling and the one gRPC sends. Envoy handles wrapped resources but announces nothing.
WRAPPER_FEATURES = frozenset({"xds.config.supports-resource-in-sotw", "xds.config.resource-in-sotw"})


def supports_wrapper(node: Any) -> bool:
    return node.user_agent_name == "envoy" or any(f in WRAPPER_FEATURES for f in node.client_features)


def unwrap(packed: any_pb2.Any) -> tuple[str | None, any_pb2.Any]:
    """A SotW response entry as (name if wrapped, the resource's Any)."""
    if packed.type_url == RESOURCE_WRAPPER:
        res = discovery_pb2.Resource.FromString(packed.value)
        return res.name, res.resource
    return None, packed


def _derived_name(message: Message) -> str:
    try:
        return resource_name(message)
    except SnapshotError:
        return ""


def resource_name(message: Message) -> str:
    """The xDS name of a message: ``cluster_name`` for ClusterLoadAssignment, else its ``name`` field."""
    for attr in ("cluster_name", "name"):
        if attr in message.DESCRIPTOR.fields_by_name:
            return str(getattr(message, attr))
    raise SnapshotError(f"{message.DESCRIPTOR.full_name} has no name field; pass (name, message)")


def _cluster_eds_name(message: Message | None, packed: any_pb2.Any, name: str) -> str:
    from envoy.config.cluster.v3 import cluster_pb2

    cluster = message if message is not None else cluster_pb2.Cluster.FromString(packed.value)
    if cluster.type != cluster_pb2.Cluster.EDS:
        return ""
    return cluster.eds_cluster_config.service_name or name


ResourceInput: TypeAlias = Message | tuple[str, Message] | Resource


@dataclass(frozen=True, slots=True)
class Snapshot:
    """All resources one node (or group of nodes) may see, by type URL and name.

    ``version`` is empty until :meth:`SnapshotCache.set_snapshot` assigns one; it is unique across
    restarts because it embeds the cache's boot id. ``digest`` identifies the content, so setting an
    identical snapshot is a no-op.
    """

    resources: Mapping[str, Mapping[str, Resource]]
    version: str = ""
    digest: str = ""
    type_digests: Mapping[str, str] = field(default_factory=dict)

    @staticmethod
    def build(items: Iterable[ResourceInput], extra_types: Iterable[str] = ()) -> Snapshot:
        """Build from messages, ``(name, message)`` pairs or :class:`Resource` s.

        ``extra_types`` lists types that exist but are empty (a full-state type with no resources
        tells a wildcard client to delete everything it has of that type).
        """
        by_type: dict[str, dict[str, Resource]] = {t: {} for t in extra_types}
        for item in items:
            if isinstance(item, Resource):
                res = item
            elif isinstance(item, tuple):
                res = Resource.from_message(item[1], name=item[0])
            else:
                res = Resource.from_message(item)
            bucket = by_type.setdefault(res.type_url, {})
            if res.name in bucket:
                raise SnapshotError(f"duplicate resource name {res.name!r} for type {res.type_url}")
            bucket[res.name] = res
        return Snapshot.of(by_type)

    @staticmethod
    def from_types(by_type: Mapping[str, Iterable[tuple[str, Message]]]) -> Snapshot:
        """Build from ``{type_url: [(name, message), ...]}`` (empty lists keep the type present)."""
        return Snapshot.build([Resource.from_message(m, name=n, type_url=t) for t, items in by_type.items() for n, m in items],
                              extra_types=list(by_type))

    @staticmethod
    def of(by_type: Mapping[str, Mapping[str, Resource]], version: str = "") -> Snapshot:
        type_digests = {t: _digest(sorted((n, r.version) for n, r in rs.items())) for t, rs in by_type.items()}
        digest = _digest(sorted(type_digests.items()))
        return Snapshot(resources={t: dict(rs) for t, rs in by_type.items()}, version=version, digest=digest,
                        type_digests=type_digests)

    def get(self, type_url: str) -> Mapping[str, Resource]:
        return self.resources.get(type_url, {})

    def type_urls(self) -> list[str]:
        return sorted(self.resources, key=types.order_key)


def _digest(pairs: Iterable[tuple[str, str]]) -> str:
    h = hashlib.sha256()
    for a, b in pairs:
        h.update(a.encode() + b"\0" + b.encode() + b"\n")
    return h.hexdigest()[:16]
