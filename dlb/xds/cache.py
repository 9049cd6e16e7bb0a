"""Snapshot cache: node key → latest snapshot, plus the watches of open streams.

Split as in envoyproxy/go-control-plane: the *cache* only stores snapshots and wakes streams; the
*server* (``dlb.xds.sotw`` / ``dlb.xds.delta``) decides per stream what to send. A watch is a wake-up
flag, not a queue of versions: ``set_snapshot`` replaces the snapshot and pokes the watches, and a
stream that wakes later reads only the newest snapshot. Bursts of ``set_snapshot`` therefore coalesce
into one push, and setting content identical to the current snapshot changes nothing (no new version,
no wake-up).

Versions are ``<boot_id>-<counter>``: the boot id is random per process, so a restarted control
plane never reuses a version a client already holds with different content.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from envoy.config.core.v3 import base_pb2

from dlb.log import get_logger
from dlb.xds.snapshot import Snapshot

NodeKeyFn = Callable[[base_pb2.Node], str]

log = get_logger("dlb.xds.cache")


def node_id_key(node: base_pb2.Node) -> str:
    """Default node key: one snapshot per node id."""
    return str(node.id)


def node_cluster_key(node: base_pb2.Node) -> str:
    """Group nodes by ``node.cluster`` (all Envoys of a cell share a snapshot)."""
    return str(node.cluster)


@dataclass(eq=False)
class Watch:
    """A stream's interest in one node key; ``notify`` must be cheap and never block."""

    key: str
    notify: Callable[[], None]
    loop: asyncio.AbstractEventLoop | None = None
    thread: int = field(default_factory=threading.get_ident)

    def wake(self) -> None:
        # set_snapshot may be called from another thread (a config reloader); hop onto the loop.
        if self.loop is not None and threading.get_ident() != self.thread:
            self.loop.call_soon_threadsafe(self.notify)
        else:
            self.notify()


@dataclass
class SnapshotCache:
    node_key: NodeKeyFn = node_id_key
    boot_id: str = field(default_factory=lambda: f"{int(time.time()):x}{os.urandom(3).hex()}")
    _snapshots: dict[str, Snapshot] = field(default_factory=dict)
    _watches: dict[str, set[Watch]] = field(default_factory=dict)
    _counter: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _set_times: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def set_snapshot(self, key: str, snapshot: Snapshot) -> str:
        """Install ``snapshot`` for ``key`` and wake its streams; returns the version in effect.

        Identical content (same digest) keeps the current version and wakes nobody.
        """
        with self._lock:
            current = self._snapshots.get(key)
            if current is not None and current.digest == snapshot.digest:
                return current.version
            version = f"{self.boot_id}-{next(self._counter)}"
            self._snapshots[key] = replace(snapshot, version=version)
            self._set_times[version] = time.monotonic()
            if len(self._set_times) > 1024:
                del self._set_times[next(iter(self._set_times))]
            watches = list(self._watches.get(key, ()))
        log.debug("snapshot_set", key=key, version=version, watches=len(watches))
        for w in watches:
            w.wake()
        return version

    def get_snapshot(self, key: str) -> Snapshot | None:
        return self._snapshots.get(key)

    def clear_snapshot(self, key: str) -> None:
        """Forget ``key``; its streams keep what they have (nothing is pushed)."""
        with self._lock:
            self._snapshots.pop(key, None)

    def keys(self) -> list[str]:
        return sorted(self._snapshots)

    def set_time(self, version: str) -> float | None:
        """Monotonic time ``version`` was set (for push-to-ACK latency)."""
        return self._set_times.get(version)

    def watch(self, key: str, notify: Callable[[], None]) -> Watch:
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        w = Watch(key=key, notify=notify, loop=loop)
        with self._lock:
            self._watches.setdefault(key, set()).add(w)
        return w

    def cancel(self, watch: Watch) -> None:
        with self._lock:
            ws = self._watches.get(watch.key)
            if ws is not None:
                ws.discard(watch)
                if not ws:
                    del self._watches[watch.key]

    @property
    def watch_count(self) -> int:
        return sum(len(ws) for ws in self._watches.values())
