"""Who gets a connection slot: the total and per-peer caps, and which connection gives its slot up.

Why: a cap alone lets whoever fills it first keep it. 4,300 connections that sent the HTTP/2 preface
and SETTINGS and then nothing held all 4,096 slots of the root's ext_proc, and every new connection —
a restarted root Envoy's included — was refused, so traffic bypassed DLB. Here a connection that has
opened a stream (what Envoy does on the connection it just made) is never displaced by one that has
not; at a cap, the new connection takes the slot of the oldest connection, of that peer or overall,
that has not opened a stream yet. A squatter can only push out other squatters, and each squat ends
at the first-stream timeout anyway (:class:`~.limits.H2Limits`). A new connection is refused only
when every slot it could take is held by connections that have opened streams: clients, bounded per
address by the per-peer cap.

Chosen over a separate listener for the root Envoy because it needs no identity: it holds wherever
the Envoy connects from (the same loopback address as an attacker on the host, a pod address in
Kubernetes) and needs no second port, socket path or config field. Pure bookkeeping (no I/O); the
server closes the connections it names.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

C = TypeVar("C", bound=Hashable)


@dataclass
class Admission(Generic[C]):
    """Slots for connections ``C`` under ``cap`` in total and ``peer_cap`` per peer address."""

    cap: int
    peer_cap: int
    #: Whether a connection can be closed now (one still being handed to the loop cannot).
    closable: Callable[[C], bool] = lambda _c: True
    _peer_of: dict[C, str] = field(default_factory=dict)
    _per_peer: dict[str, int] = field(default_factory=dict)
    #: Connections with no stream opened yet, oldest first (dicts keep insertion order).
    _unproven: dict[C, None] = field(default_factory=dict)
    _unproven_by_peer: dict[str, dict[C, None]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self._peer_of)

    def make_room(self, peer: str) -> list[C] | None:
        """The connections to close so one more from ``peer`` fits (forgotten here already), or None
        if there is no room: every candidate has opened a stream."""
        victims: list[C] = []
        if self._per_peer.get(peer, 0) >= self.peer_cap:
            victim = self._oldest(self._unproven_by_peer.get(peer, {}), victims)
            if victim is None:
                return None
            victims.append(victim)
        if len(self._peer_of) - len(victims) >= self.cap:
            victim = self._oldest(self._unproven, victims)
            if victim is None:
                return None
            victims.append(victim)
        for victim in victims:
            self.remove(victim)
        return victims

    def _oldest(self, conns: Iterable[C], skip: list[C]) -> C | None:
        for conn in conns:
            if conn not in skip and self.closable(conn):
                return conn
        return None

    def add(self, conn: C, peer: str) -> None:
        """Count ``conn`` (after :meth:`make_room` said there is room); it has opened no stream yet."""
        self._peer_of[conn] = peer
        self._per_peer[peer] = self._per_peer.get(peer, 0) + 1
        self._unproven[conn] = None
        self._unproven_by_peer.setdefault(peer, {})[conn] = None

    def proven(self, conn: C) -> None:
        """``conn`` opened a stream: no new connection can take its slot from now on."""
        self._unproven.pop(conn, None)
        peer = self._peer_of.get(conn)
        if peer is not None:
            self._drop_unproven(peer, conn)

    def remove(self, conn: C) -> None:
        """Forget ``conn`` (closed, or chosen to make room); a second call does nothing."""
        peer = self._peer_of.pop(conn, None)
        if peer is None:
            return
        left = self._per_peer[peer] - 1
        if left:
            self._per_peer[peer] = left
        else:
            del self._per_peer[peer]
        self._unproven.pop(conn, None)
        self._drop_unproven(peer, conn)

    def _drop_unproven(self, peer: str, conn: C) -> None:
        mine = self._unproven_by_peer.get(peer)
        if mine is not None:
            mine.pop(conn, None)
            if not mine:
                del self._unproven_by_peer[peer]
