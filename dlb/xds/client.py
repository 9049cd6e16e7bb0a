"""xDS client for our own services (root/leaf agents): ADS, state of the world, over grpc.aio.

A service subscribes to type URLs (wildcard or names) with the protobuf class to decode them and a
callback. The callback sees the whole current set of resources of that subscription; if it raises,
the response is NACKed with the exception text and the last good resources stay in effect, so a bad
push from the control plane can never take a service down. The stream reconnects with jittered
exponential backoff; on reconnect the client announces its last ACKed version and keeps serving its
last good resources meanwhile. Unchanged content (e.g. a re-send after reconnect) is ACKed without
calling the callback again.
"""

from __future__ import annotations

import asyncio
import inspect
import random
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf.message import DecodeError, Message

from dlb.log import get_logger
from dlb.xds import types
from dlb.xds.snapshot import unwrap

log = get_logger("dlb.xds.client")

UpdateCallback = Callable[[dict[str, Message]], Awaitable[None] | None]

_INVALID_ARGUMENT = 3


class ResourceValidationError(ValueError):
    """Raised by an update callback to reject (NACK) a response."""


@dataclass
class Subscription:
    type_url: str
    message_cls: type[Message]
    callback: UpdateCallback
    names: set[str] | None = None  # None = wildcard
    resources: dict[str, Message] = field(default_factory=dict)  # last good
    raw: dict[str, bytes] = field(default_factory=dict)  # last good, serialized (change detection)
    version: str = ""  # last ACKed version
    nonce: str = ""  # nonce of the latest response on the current stream
    updates: int = 0
    nacks: int = 0
    last_error: str = ""

    def request(self, node: base_pb2.Node | None) -> discovery_pb2.DiscoveryRequest:
        names = [types.WILDCARD] if self.names is None else sorted(self.names)
        req = discovery_pb2.DiscoveryRequest(type_url=self.type_url, resource_names=names, version_info=self.version,
                                             response_nonce=self.nonce)
        if node is not None:
            req.node.CopyFrom(node)
        return req


@dataclass
class Backoff:
    """Full-jitter exponential backoff (AWS architecture blog): spreads reconnect storms."""

    initial: float = 0.1
    maximum: float = 5.0
    attempt: int = 0

    def next(self) -> float:
        delay = min(self.maximum, self.initial * (2 ** self.attempt))
        self.attempt += 1
        return random.uniform(delay / 2, delay)

    def reset(self) -> None:
        self.attempt = 0


class XdsClient:
    def __init__(self, target: str, node: base_pb2.Node, backoff: Backoff | None = None,
                 channel_options: list[tuple[str, int]] | None = None) -> None:
        self.target = target
        self.node = node
        self.backoff = backoff or Backoff()
        self.channel_options = channel_options or [("grpc.keepalive_time_ms", 30_000)]
        self.subscriptions: dict[str, Subscription] = {}
        self.connected = asyncio.Event()
        self.connects = 0
        self._queue: asyncio.Queue | None = None
        self._node_sent = False
        self._task: asyncio.Task | None = None
        self._channel: grpc.aio.Channel | None = None
        self.log = log.bind(node=node.id, target=target)

    # --- API --------------------------------------------------------------------------------
    def subscribe(self, type_url: str, message_cls: type[Message], callback: UpdateCallback,
                  names: Iterable[str] | None = None) -> Subscription:
        """Subscribe (wildcard when ``names`` is None). Works before and after :meth:`start`."""
        sub = Subscription(type_url, message_cls, callback, None if names is None else set(names))
        self.subscriptions[type_url] = sub
        self._send(sub.request(None))
        return sub

    async def set_names(self, type_url: str, names: Iterable[str] | None) -> None:
        """Change a subscription. Withdrawn names are dropped here (the server sends nothing for
        them, per the protocol) and the callback sees the narrowed set."""
        sub = self.subscriptions[type_url]
        sub.names = None if names is None else set(names)
        self._send(sub.request(None))
        if sub.names is not None and set(sub.resources) - sub.names:
            sub.resources = {n: m for n, m in sub.resources.items() if n in sub.names}
            sub.raw = {n: b for n, b in sub.raw.items() if n in sub.names}
            result = sub.callback(dict(sub.resources))
            if inspect.isawaitable(result):
                await result

    def resources(self, type_url: str) -> dict[str, Message]:
        """The last good resources of a subscription (kept across reconnects and NACKs)."""
        return dict(self.subscriptions[type_url].resources)

    async def start(self) -> "XdsClient":
        self._channel = grpc.aio.insecure_channel(self.target, options=self.channel_options)
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

    async def __aenter__(self) -> "XdsClient":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # --- stream -----------------------------------------------------------------------------
    def _send(self, req: discovery_pb2.DiscoveryRequest) -> None:
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
                self.log.warning("xds stream ended by server; reconnecting")
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                self.log.warning("xds stream failed; reconnecting", code=exc.code().name, details=exc.details())
            except Exception as exc:  # never let a broken peer kill the service
                self.log.error("xds client error; reconnecting", error=repr(exc))
            self.connected.clear()
            self._queue = None
            await asyncio.sleep(self.backoff.next())

    async def _stream_once(self) -> None:
        assert self._channel is not None
        queue: asyncio.Queue = asyncio.Queue()
        self._queue, self._node_sent = queue, False

        async def requests():
            while True:
                yield await queue.get()

        for sub in self.subscriptions.values():
            sub.nonce = ""  # nonces are per stream; version_info announces what we hold
            self._send(sub.request(None))
        call = ads_pb2_grpc.AggregatedDiscoveryServiceStub(self._channel).StreamAggregatedResources(requests())
        self.connects += 1
        try:
            async for resp in call:
                self.connected.set()
                self.backoff.reset()
                await self._on_response(resp)
        finally:
            call.cancel()

    async def _on_response(self, resp: discovery_pb2.DiscoveryResponse) -> None:
        sub = self.subscriptions.get(resp.type_url)
        if sub is None:
            return
        sub.nonce = resp.nonce
        try:
            raw: dict[str, bytes] = {}
            decoded: dict[str, Message] = {}
            for entry in resp.resources:
                wrapped_name, any_msg = unwrap(entry)
                if any_msg.type_url != sub.type_url:
                    raise ResourceValidationError(f"resource of type {any_msg.type_url} in a {sub.type_url} response")
                msg = sub.message_cls.FromString(any_msg.value)
                name = wrapped_name if wrapped_name is not None else _name(msg)
                if sub.names is not None and name not in sub.names:
                    continue  # sent before the server saw our narrowed subscription
                if name in decoded:
                    raise ResourceValidationError(f"duplicate resource {name!r}")
                decoded[name] = msg
                raw[name] = any_msg.value
            if raw != sub.raw:
                result = sub.callback(dict(decoded))
                if inspect.isawaitable(result):
                    await result
        except (ResourceValidationError, DecodeError) as exc:
            self._nack(sub, resp, str(exc))
            self.log.warning("rejected xds update", type=types.short(sub.type_url), version=resp.version_info, reason=str(exc))
            return
        except Exception as exc:
            self._nack(sub, resp, f"{type(exc).__name__}: {exc}")
            self.log.exception("update callback failed; NACKed", type=types.short(sub.type_url), version=resp.version_info)
            return
        sub.resources, sub.raw, sub.version = decoded, raw, resp.version_info
        sub.updates += 1
        self._send(sub.request(None))  # ACK

    def _nack(self, sub: Subscription, resp: discovery_pb2.DiscoveryResponse, reason: str) -> None:
        sub.nacks += 1
        sub.last_error = reason
        req = sub.request(None)  # version_info stays the last good version
        req.error_detail.code = _INVALID_ARGUMENT
        req.error_detail.message = reason
        self._send(req)


def _name(msg: Message) -> str:
    fields = msg.DESCRIPTOR.fields_by_name
    for attr in ("cluster_name", "name"):
        if attr in fields:
            return str(getattr(msg, attr))
    raise ResourceValidationError(f"{msg.DESCRIPTOR.full_name} has no name field")
