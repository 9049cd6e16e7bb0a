"""Conditional session affinity (paper 3.5): a bounded LRU map session → cell with a TTL.

The stay-or-leave rule lives in the router: stay while the pinned cell's expected latency minus
``prefix_savings`` is no worse than the best alternative's, else move to that alternative.
This module only remembers, cheaply: an ``OrderedDict`` gives O(1) get/put/evict, and entries expire
lazily on access (no timers), so memory is bounded by ``max_sessions`` whatever the traffic — and by
bytes too: a session id longer than :data:`KEY_CHARS` is kept as its 128-bit digest (a client sending
58-KB ids grew a root by ~54 KB per request, ~5 GB at the cap).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

#: Session ids up to this long are kept as they are (a UUID is 36); longer ones as a digest.
KEY_CHARS = 64


def session_key(session: str) -> str:
    """What the cache keeps for ``session``: itself, or a fixed-size digest when it is long."""
    if len(session) <= KEY_CHARS:
        return session
    return "#" + hashlib.blake2b(session.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


@dataclass(frozen=True)
class AffinityConfig:
    enabled: bool = False
    header: str = "x-session-id"
    ttl_s: float = 600.0
    max_sessions: int = 100_000
    prefix_savings: float = 0.0  # seconds of expected latency a warm prefix cache saves (every cost)

    def __post_init__(self) -> None:
        if self.ttl_s <= 0 or self.max_sessions <= 0 or self.prefix_savings < 0:
            raise ValueError("affinity ttl_s and max_sessions must be > 0, prefix_savings >= 0")


class AffinityCache:
    """Bounded LRU with TTL, keyed by session id (string or hash)."""

    __slots__ = ("_map", "evictions", "max_sessions", "ttl")

    def __init__(self, max_sessions: int, ttl_s: float) -> None:
        self.ttl = ttl_s
        self.max_sessions = max_sessions
        self._map: OrderedDict[str, tuple[int, float]] = OrderedDict()
        self.evictions = 0

    def get(self, session: str, now: float) -> int | None:
        session = session_key(session)
        entry = self._map.get(session)
        if entry is None:
            return None
        cell, expires = entry
        if now >= expires:
            del self._map[session]
            return None
        self._map.move_to_end(session)
        return cell

    def put(self, session: str, cell: int, now: float) -> None:
        session = session_key(session)
        self._map[session] = (cell, now + self.ttl)
        self._map.move_to_end(session)
        while len(self._map) > self.max_sessions:
            self._map.popitem(last=False)
            self.evictions += 1

    def forget_cell(self, cell: int) -> None:
        """Drop every session pinned to a cell (e.g. the cell was removed from the topology)."""
        for key in [k for k, (c, _) in self._map.items() if c == cell]:
            del self._map[key]

    def __len__(self) -> int:
        return len(self._map)
