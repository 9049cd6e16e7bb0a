"""xDS client for our own services (root/leaf agents): ADS over grpc.aio, SotW or delta.

A service subscribes to type URLs (wildcard or names) with the protobuf class to decode them and a
callback. The callback sees the whole current set of resources of that subscription; if it raises,
the response is NACKed with the exception text and the last good resources stay in effect, so a bad
push from the control plane can never take a service down. The stream reconnects with jittered
exponential backoff; on reconnect the client announces what it holds (SotW: last ACKed
``version_info``; delta: ``initial_resource_versions``) and keeps serving its last good resources
meanwhile. Unchanged content (e.g. a re-send after reconnect) is ACKed without calling back.

Delta mode (``delta=True``) suits many small, independently changing resources (per-cell state):
only changed resources cross the wire.
"""

from __future__ import annotations

import asyncio
import inspect
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import any_pb2
from google.protobuf.message import DecodeError, Message

from dlb.errors import DlbError
from dlb.log import get_logger
from dlb.xds import types
from dlb.xds.snapshot import WRAPPER_FEATURES, unwrap

log = get_logger("dlb.xds.client")

UpdateCallback = Callable[[dict[str, Message]], Awaitable[None] | None]

_INVALID_ARGUMENT = 3


class ResourceValidationError(DlbError, ValueError):
    """Raised by an update callback to reject (NACK) a response."""


@dataclass
class Subscription:
    type_url: str
    message_cls: type[Message]
    callback: UpdateCallback
    names: set[str] | None = None  # None = wildcard
    resources: dict[str, Message] = field(default_factory=dict)  # last good
    raw: dict[str, bytes] = field(default_factory=dict)  # last good, serialized (change detection)
    versions: dict[str, str] = field(default_factory=dict)  # delta: last good per-resource versions
    version: str = ""  # last ACKed (system) version
    nonce: str = ""  # nonce of the latest response on the current stream
    updates: int = 0
    nacks: int = 0
    last_error: str = ""

    def request(self) -> discovery_pb2.DiscoveryRequest:
        names = [types.WILDCARD] if self.names is None else sorted(self.names)
        return discovery_pb2.DiscoveryRequest(type_url=self.type_url, resource_names=names, version_info=self.version,
                                              response_nonce=self.nonce)

    def initial_delta_request(self) -> discovery_pb2.DeltaDiscoveryRequest:
        names = [types.WILDCARD] if self.names is None else sorted(self.names)
        return discovery_pb2.DeltaDiscoveryRequest(type_url=self.type_url, resource_names_subscribe=names,
                                                   initial_resource_versions=self.versions)

    def keep(self, names: set[str] | None) -> None:
        if names is not None:
            self.resources = {n: m for n, m in self.resources.items() if n in names}
            self.raw = {n: b for n, b in self.raw.items() if n in names}
            self.versions = {n: v for n, v in self.versions.items() if n in names}


#: gRPC's own reconnect back-off on every xDS channel, capped at 1 s: uncapped (gRPC's default grows
#: to 120 s) a service took up to ~50 s to find a restarted control plane. A reconnect attempt to a
#: dead control plane is one refused TCP connect, so a 1-s cap costs nothing.
RECONNECT_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)


#: Keepalive that notices a frozen control plane (SIGSTOP, a hung host: its kernel still ACKs) in ~15 s.
#: gRPC times a keepalive ping out after ``grpc.http2.ping_timeout_ms`` (60 s by default, whatever
#: ``keepalive_timeout_ms`` says: seen in its keepalive trace), so services took 61-92 s to re-home to
#: another replica; and it stops pinging an idle stream after 2 pings unless told otherwise. The servers
#: allow a ping every 5 s (``dlb.xds.server``).
KEEPALIVE_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.http2.ping_timeout_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
)


def xds_channel_options(extra: list[tuple[str, int]] | None = None) -> list[tuple[str, int]]:
    """The xDS channel's options: keepalive and the capped reconnect back-off, then ``extra`` (which wins)."""
    merged = dict([*KEEPALIVE_OPTIONS, *RECONNECT_OPTIONS])
    merged.update(extra or [])
    return list(merged.items())


@dataclass
class Backoff:
    """Full-jitter exponential backoff (AWS architecture blog): spreads reconnect storms.

    Capped at 1 s, like the channel's (:data:`RECONNECT_OPTIONS`): a service must find a restarted
    control plane within about a second.
    """

    initial: float = 0.1
    maximum: float = 1.0
    attempt: int = 0

    def next(self) -> float:
        delay = min(self.maximum, self.initial * (2 ** self.attempt))
        self.attempt += 1
        return random.uniform(delay / 2, delay)

    def reset(self) -> None:
        self.attempt = 0


def grpc_target(spec: str) -> str:
    """``host:port`` as it is; several control-plane replicas, ``a:p,b:p``, as one gRPC target over all.

    Why gRPC's ``ipv4:``/``ipv6:`` address lists: the channel's ``pick_first`` keeps one connection and,
    when that replica dies, connects to the next address, so a stream re-homes after one reconnect
    back-off. Several DNS names cannot be one target: give one name that resolves to every replica (a
    headless Kubernetes Service).
    """
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if len(parts) <= 1:
        return parts[0] if parts else spec
    if all(p.startswith("[") for p in parts):
        return "ipv6:" + ",".join(parts)
    if all(p.rpartition(":")[0].replace(".", "").isdigit() for p in parts):
        return "ipv4:" + ",".join(parts)
    raise ValueError(f"xDS replicas {spec!r}: give IP addresses (a:port,b:port) or one DNS name that resolves to every replica")


class XdsClient:
    def __init__(self, target: str, node: base_pb2.Node, backoff: Backoff | None = None, delta: bool = False,
                 channel_options: list[tuple[str, int]] | None = None,
                 credentials: grpc.ChannelCredentials | None = None,
                 renewed: Callable[[], grpc.ChannelCredentials | None] | None = None) -> None:
        self.target = grpc_target(target)
        self.credentials = credentials  # None: plaintext; else TLS (mutual when it holds a certificate)
        #: Asked before each reconnect: new credentials (a renewed certificate) mean a new channel.
        self.renewed = renewed
        if self.target != target.strip():
            # An address list has no host of its own to check a certificate against: the first replica's
            # (so with TLS, replicas given by IP share a certificate naming that address; dlb up's do).
            first = target.split(",", maxsplit=1)[0].strip()
            channel_options = [("grpc.default_authority", first), *(channel_options or [])]  # type: ignore[list-item]
        self.node = base_pb2.Node()
        self.node.CopyFrom(node)
        for feature in sorted(WRAPPER_FEATURES - set(node.client_features)):
            self.node.client_features.append(feature)  # we unwrap discovery.v3.Resource in SotW
        self.delta = delta
        self.backoff = backoff or Backoff()
        self.channel_options = xds_channel_options(channel_options)
        self.subscriptions: dict[str, Subscription] = {}
        self.connected = asyncio.Event()
        self.connects = 0
        self._queue: asyncio.Queue[Message] | None = None
        self._node_sent = False
        self._task: asyncio.Task[None] | None = None
        self._channel: grpc.aio.Channel | None = None
        self.log = log.bind(node=node.id, target=target, mode="delta" if delta else "sotw")

    # --- API --------------------------------------------------------------------------------
    def subscribe(self, type_url: str, message_cls: type[Message], callback: UpdateCallback,
                  names: Iterable[str] | None = None) -> Subscription:
        """Subscribe (wildcard when ``names`` is None). Works before and after :meth:`start`."""
        sub = Subscription(type_url, message_cls, callback, None if names is None else set(names))
        self.subscriptions[type_url] = sub
        self._send(sub.initial_delta_request() if self.delta else sub.request())
        return sub

    async def set_names(self, type_url: str, names: Iterable[str] | None) -> None:
        """Change a subscription. Withdrawn names are dropped here (the server sends nothing for
        them, per the protocol) and the callback sees the narrowed set."""
        sub = self.subscriptions[type_url]
        old = sub.names
        sub.names = None if names is None else set(names)
        if self.delta:
            old_set = {types.WILDCARD} if old is None else old
            new_set = {types.WILDCARD} if sub.names is None else sub.names
            self._send(discovery_pb2.DeltaDiscoveryRequest(
                type_url=type_url, resource_names_subscribe=sorted(new_set - old_set),
                resource_names_unsubscribe=sorted(old_set - new_set)))
        else:
            self._send(sub.request())
        if sub.names is not None and set(sub.resources) - sub.names:
            sub.keep(sub.names)
            await _call(sub.callback, dict(sub.resources))

    def resources(self, type_url: str) -> dict[str, Message]:
        """The last good resources of a subscription (kept across reconnects and NACKs)."""
        return dict(self.subscriptions[type_url].resources)

    async def start(self) -> XdsClient:
        if self.credentials is None:
            self._channel = grpc.aio.insecure_channel(self.target, options=self.channel_options)
        else:
            self._channel = grpc.aio.secure_channel(self.target, self.credentials, options=self.channel_options)
        self._task = asyncio.create_task(self._run(), name=f"xds-client-{self.node.id}")
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def __aenter__(self) -> XdsClient:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # --- stream -----------------------------------------------------------------------------
    def _send(self, req: Any) -> None:
        if self._queue is None:
            return  # not connected: the subscription goes out when the stream opens
        if not self._node_sent:
            req.node.CopyFrom(self.node)  # the first request on each stream carries the node
            self._node_sent = True
        self._queue.put_nowait(req)

    async def _run(self) -> None:
        while True:
            try:
                await self._stream_once()
                self.log.warning("xds_stream_ended_reconnecting")
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                self.log.warning("xds_stream_failed_reconnecting", code=exc.code().name, details=exc.details())
            except Exception as exc:  # never let a broken peer kill the service
                self.log.error("xds_client_error_reconnecting", error=repr(exc))
            self.connected.clear()
            self._queue = None
            await asyncio.sleep(self.backoff.next())
            fresh = self.renewed() if self.renewed is not None else None
            if fresh is not None and self._channel is not None:
                old, self.credentials = self._channel, fresh
                self._channel = grpc.aio.secure_channel(self.target, fresh, options=self.channel_options)
                await old.close()

    async def _stream_once(self) -> None:
        assert self._channel is not None
        queue: asyncio.Queue[Message] = asyncio.Queue()
        self._queue, self._node_sent = queue, False

        async def requests() -> AsyncIterator[Message]:
            while True:
                yield await queue.get()

        for sub in self.subscriptions.values():
            sub.nonce = ""  # nonces are per stream
            self._send(sub.initial_delta_request() if self.delta else sub.request())
        stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(self._channel)
        call = (stub.DeltaAggregatedResources if self.delta else stub.StreamAggregatedResources)(requests())
        self.connects += 1
        try:
            async for resp in call:
                self.connected.set()
                self.backoff.reset()
                target = self.subscriptions.get(resp.type_url)
                if target is not None:
                    await (self._on_delta_response(target, resp) if self.delta else self._on_response(target, resp))
        finally:
            call.cancel()

    def _decode(self, sub: Subscription, name: str | None, any_msg: any_pb2.Any) -> tuple[str, Message]:
        if any_msg.type_url != sub.type_url:
            raise ResourceValidationError(f"resource of type {any_msg.type_url} in a {sub.type_url} response")
        msg = sub.message_cls.FromString(any_msg.value)
        return (name if name is not None else _name(msg)), msg

    async def _apply(self, sub: Subscription, resp: Any, decoded: dict[str, Message], raw: dict[str, bytes]) -> bool:
        """Hand a new state to the callback; False (and a NACK) if it was rejected."""
        if raw == sub.raw:
            return True
        try:
            await _call(sub.callback, dict(decoded))
        except ResourceValidationError as exc:
            self._nack(sub, resp, str(exc))
            self.log.warning("xds_update_rejected", type=types.short(sub.type_url), reason=str(exc))
            return False
        except Exception as exc:
            self._nack(sub, resp, f"{type(exc).__name__}: {exc}")
            self.log.exception("xds_update_callback_failed", type=types.short(sub.type_url))
            return False
        return True

    async def _on_response(self, sub: Subscription, resp: discovery_pb2.DiscoveryResponse) -> None:
        sub.nonce = resp.nonce
        raw: dict[str, bytes] = {}
        decoded: dict[str, Message] = {}
        try:
            for entry in resp.resources:
                wrapped_name, any_msg = unwrap(entry)
                name, msg = self._decode(sub, wrapped_name, any_msg)
                if sub.names is not None and name not in sub.names:
                    continue  # sent before the server saw our narrowed subscription
                if name in decoded:
                    raise ResourceValidationError(f"duplicate resource {name!r}")
                decoded[name], raw[name] = msg, any_msg.value
        except (ResourceValidationError, DecodeError) as exc:
            self._nack(sub, resp, str(exc))
            return
        if await self._apply(sub, resp, decoded, raw):
            sub.resources, sub.raw, sub.version = decoded, raw, resp.version_info
            sub.updates += 1
            self._send(sub.request())  # ACK

    async def _on_delta_response(self, sub: Subscription, resp: discovery_pb2.DeltaDiscoveryResponse) -> None:
        sub.nonce = resp.nonce
        decoded, raw, versions = dict(sub.resources), dict(sub.raw), dict(sub.versions)
        try:
            for res in resp.resources:
                name, msg = self._decode(sub, res.name, res.resource)
                if sub.names is not None and name not in sub.names:
                    continue
                decoded[name], raw[name], versions[name] = msg, res.resource.value, res.version
            for name in resp.removed_resources:
                decoded.pop(name, None)
                raw.pop(name, None)
                versions.pop(name, None)
        except (ResourceValidationError, DecodeError) as exc:
            self._nack(sub, resp, str(exc))
            return
        if await self._apply(sub, resp, decoded, raw):
            sub.resources, sub.raw, sub.versions, sub.version = decoded, raw, versions, resp.system_version_info
            sub.updates += 1
            self._send(discovery_pb2.DeltaDiscoveryRequest(type_url=sub.type_url, response_nonce=resp.nonce))

    def _nack(self, sub: Subscription, resp: Any, reason: str) -> None:
        sub.nacks += 1
        sub.last_error = reason
        if self.delta:
            req = discovery_pb2.DeltaDiscoveryRequest(type_url=sub.type_url, response_nonce=resp.nonce)
        else:
            req = sub.request()  # version_info stays the last good version
        req.error_detail.code = _INVALID_ARGUMENT
        req.error_detail.message = reason
        self.log.warning("nack_sent", type=types.short(sub.type_url), reason=reason)
        self._send(req)


async def _call(callback: UpdateCallback, resources: dict[str, Message]) -> None:
    result = callback(resources)
    if inspect.isawaitable(result):
        await result


def _name(msg: Message) -> str:
    fields = msg.DESCRIPTOR.fields_by_name
    for attr in ("cluster_name", "name"):
        if attr in fields:
            return str(getattr(msg, attr))
    raise ResourceValidationError(f"{msg.DESCRIPTOR.full_name} has no name field")
