"""Snapshot cache: node key → latest snapshot, plus the watches of open streams.

Split as in envoyproxy/go-control-plane: the *cache* only stores snapshots and wakes streams; the
*server* (``dlb.xds.sotw`` / ``dlb.xds.delta``) decides per stream what to send. A watch is a wake-up
flag, not a queue of versions: ``set_snapshot`` replaces the snapshot and pokes the watches, and a
stream that wakes later reads only the newest snapshot. Bursts of ``set_snapshot`` therefore coalesce
into one push, and setting content identical to the current snapshot changes nothing (no new version,
no wake-up).

Versions are ``<stamp>-<boot_id>``: the stamp is 16 hex digits of microseconds since the epoch, never
less than the previous stamp + 1, so versions compare as strings in the order they were made, also
across control-plane replicas (active-active, each building its own snapshots); the boot id is random
per process, so a restarted control plane never reuses a version a client already holds. A client
that re-homes from another replica announces the version it holds (:meth:`SnapshotCache.resume`):
if that is newer than this replica's, the snapshot is re-stamped first, so no version goes backwards.
"""

from __future__ import annotations

import asyncio
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


def version_stamp(version: str) -> int | None:
    """The stamp of a version this cache (of any replica) made, or None for any other text."""
    head, _, _ = version.partition("-")
    if len(head) != 16:
        return None
    try:
        return int(head, 16)
    except ValueError:
        return None


@dataclass
class SnapshotCache:
    node_key: NodeKeyFn = node_id_key
    boot_id: str = field(default_factory=lambda: os.urandom(3).hex())
    _snapshots: dict[str, Snapshot] = field(default_factory=dict)
    _watches: dict[str, set[Watch]] = field(default_factory=dict)
    _stamp: int = 0
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
            version = self._install(key, snapshot, 0)
            watches = list(self._watches.get(key, ()))
        log.debug("snapshot_set", key=key, version=version, watches=len(watches))
        for w in watches:
            w.wake()
        return version

    def _install(self, key: str, snapshot: Snapshot, after: int) -> str:
        """Store ``snapshot`` under a new version stamped later than ``after`` and every earlier one (lock held)."""
        self._stamp = max(self._stamp + 1, time.time_ns() // 1000, after + 1)
        version = f"{self._stamp:016x}-{self.boot_id}"
        self._snapshots[key] = replace(snapshot, version=version)
        self._set_times[version] = time.monotonic()
        if len(self._set_times) > 1024:
            del self._set_times[next(iter(self._set_times))]
        return version

    def resume(self, key: str, held: str) -> None:
        """A client of ``key`` opened a stream holding version ``held`` (from this or another replica):
        if it is newer than this replica's, re-stamp the snapshot (same content) past it, so the client's
        version never goes backwards when it re-homes. Nobody is woken: the content did not change."""
        stamp = version_stamp(held)
        with self._lock:
            current = self._snapshots.get(key)
            if current is None or stamp is None or held <= current.version:
                return
            version = self._install(key, current, stamp)
        log.info("snapshot_restamped", key=key, held=held, version=version)

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
