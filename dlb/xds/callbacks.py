"""What a stream tells its observers: one interface instead of counters poked from inside the streams.

The status registry (``dlb.xds.status``) and the scale benchmark (``dlb.bench.xds_scale``) both watch
streams; before this interface the streams incremented the registry's counters directly and the
registry grew one-off hooks for the benchmark. Every callback runs synchronously on the stream's
event loop, inside request handling or push building, so it must be cheap and must not block or
raise. When each one runs is part of the contract (go-control-plane documents its ``Callbacks`` the
same way):
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from typing import Protocol


class StreamCallbacks(Protocol):
    """Observer of xDS streams. Node ids identify streams' clients; type URLs are full URLs."""

    def stream_opened(self, node_id: str, cluster: str) -> None:
        """A stream received its first request (the one carrying the node)."""

    def subscribed(self, node_id: str, type_url: str, names: Set[str], wildcard: bool) -> None:
        """A request changed (or first set) what the stream subscribes to of ``type_url``."""

    def sent(self, node_id: str, type_url: str, version: str, nonce: str) -> None:
        """A response was built and is about to be written (``version`` is the snapshot version)."""

    def acked(self, node_id: str, type_url: str, version: str) -> None:
        """The client accepted the response it answers (current nonce, no error detail)."""

    def nacked(self, node_id: str, type_url: str, version: str, reason: str) -> None:
        """The client rejected the response carrying ``version``; ``reason`` is its error detail."""

    def stale_nonce(self, node_id: str, type_url: str, nonce: str) -> None:
        """A request answered a response that a newer one superseded; it is ignored (SotW) or only
        its subscription change is applied (delta)."""

    def stream_closed(self, node_id: str) -> None:
        """A stream that had opened ended (client gone, error, or server stop)."""


class NoCallbacks:
    """Every callback a no-op: subclass it to observe only some events."""

    def stream_opened(self, node_id: str, cluster: str) -> None:
        pass

    def subscribed(self, node_id: str, type_url: str, names: Set[str], wildcard: bool) -> None:
        pass

    def sent(self, node_id: str, type_url: str, version: str, nonce: str) -> None:
        pass

    def acked(self, node_id: str, type_url: str, version: str) -> None:
        pass

    def nacked(self, node_id: str, type_url: str, version: str, reason: str) -> None:
        pass

    def stale_nonce(self, node_id: str, type_url: str, nonce: str) -> None:
        pass

    def stream_closed(self, node_id: str) -> None:
        pass


class FanOut:
    """Several observers behind one :class:`StreamCallbacks` (called in order)."""

    def __init__(self, observers: Sequence[StreamCallbacks]) -> None:
        self.observers = tuple(observers)

    def stream_opened(self, node_id: str, cluster: str) -> None:
        for o in self.observers:
            o.stream_opened(node_id, cluster)

    def subscribed(self, node_id: str, type_url: str, names: Set[str], wildcard: bool) -> None:
        for o in self.observers:
            o.subscribed(node_id, type_url, names, wildcard)

    def sent(self, node_id: str, type_url: str, version: str, nonce: str) -> None:
        for o in self.observers:
            o.sent(node_id, type_url, version, nonce)

    def acked(self, node_id: str, type_url: str, version: str) -> None:
        for o in self.observers:
            o.acked(node_id, type_url, version)

    def nacked(self, node_id: str, type_url: str, version: str, reason: str) -> None:
        for o in self.observers:
            o.nacked(node_id, type_url, version, reason)

    def stale_nonce(self, node_id: str, type_url: str, nonce: str) -> None:
        for o in self.observers:
            o.stale_nonce(node_id, type_url, nonce)

    def stream_closed(self, node_id: str) -> None:
        for o in self.observers:
            o.stream_closed(node_id)


def combine(observers: Sequence[StreamCallbacks]) -> StreamCallbacks:
    """One observer as itself (no fan-out cost on the common path), several behind a :class:`FanOut`."""
    return observers[0] if len(observers) == 1 else FanOut(observers)
