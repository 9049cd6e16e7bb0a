"""A leaf-held FIFO of requests waiting for a data-parallel rank with room (pure: no I/O, time passed in).

Why the leaf holds them: BF-IO's gain comes from choosing *which* rank takes a request at the moment
one has room. Sent at once to a full group, a request waits in the queue of the rank it was sent to,
and by the time it runs the choice decided nothing (``docs/bfio.md``: above capacity the data-path gain
vanished). Held here, each request is placed when a rank can admit it, on the rank BF-IO picks then.

Bounded twice: at most ``max_len`` requests (past it a request is refused at once: 429) and at most
``deadline_s`` each (past it: 503), so neither memory nor a client's wait grows without limit.
Bounded bypass, not strict FIFO: a policy that weighs request sizes (BF-IO) may release any of the
``window`` oldest requests — choosing *which* request goes to the rank that has room is where a backlog
helps, since when one rank frees a slot there is no choice of rank left. A request passed over
``window`` times is released next whatever its size, so none starves; ``window`` 1 is strict FIFO.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

#: Longest hold a DP group may configure. The leaf Envoy's ext_proc ``max_message_timeout`` is this plus
#: :data:`REPLY_MARGIN_S`: a held request's reply (the pick, or the 503 at its deadline) must reach Envoy
#: before its message timer fires, or Envoy fails open and sends the request past the queue. Under the
#: idle timeouts a held request (no bytes either way) must also survive: the leaf's stream_idle_timeout
#: and the root route's idle_timeout, both 300 s; the leaf route has no timeout (the root owns it).
MAX_HOLD_S = 120.0
REPLY_MARGIN_S = 1.0


@dataclass(slots=True)
class Held:
    key: str  # the in-flight record key (x-request-id)
    prompt_tokens: float
    tokens: float  # the request's size estimate, charged to its server when released
    arrived: float
    deadline: float
    skips: int = 0  # times a younger request was released before it


@dataclass
class HoldQueue:
    """The held requests of one DP group, oldest first, with counters for the agent's metrics."""

    max_len: int
    deadline_s: float

    def __post_init__(self) -> None:
        if self.max_len < 1:
            raise ValueError(f"hold_queue: must be >= 1, got {self.max_len}")
        if not self.deadline_s > 0:
            raise ValueError(f"hold_deadline_ms: must be > 0, got {self.deadline_s * 1000}")
        self._order: deque[Held] = deque()
        self._live: dict[str, Held] = {}  # key → entry; entries of _order not here were cancelled
        self.held_total = 0
        self.released = 0
        self.rejected_full = 0
        self.expired = 0
        self.cancelled = 0
        self.held_seconds = 0.0  # summed over released requests

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, key: str) -> bool:
        return key in self._live

    def offer(self, now: float, key: str, prompt_tokens: float, tokens: float) -> bool:
        """Hold a request; False (and counted) when the queue is full. A duplicate key is held once."""
        if key in self._live:
            return True
        if len(self._live) >= self.max_len:
            self.rejected_full += 1
            return False
        h = Held(key, prompt_tokens, tokens, now, now + self.deadline_s)
        self._order.append(h)
        self._live[key] = h
        self.held_total += 1
        return True

    def head(self) -> Held | None:
        """The oldest live request (cancelled entries ahead of it are dropped)."""
        order = self._order
        while order and self._live.get(order[0].key) is not order[0]:
            order.popleft()
        return order[0] if order else None

    def pop(self, now: float) -> Held:
        """Release the oldest request (call :meth:`head` first: it must exist)."""
        h = self.head()
        if h is None:
            raise IndexError("no request is held")
        return self.take(h.key, now)

    def window(self, size: int) -> list[Held]:
        """The ``size`` oldest live requests, oldest first; only the head once it was passed over ``size`` times."""
        head = self.head()
        if head is None:
            return []
        if head.skips >= size:
            return [head]
        out: list[Held] = []
        for h in self._order:
            if self._live.get(h.key) is h:
                out.append(h)
                if len(out) == size:
                    break
        return out

    def take(self, key: str, now: float) -> Held:
        """Release one held request; every older one still held counts one more skip."""
        h = self._live.pop(key)
        for older in self._order:
            if older is h:
                break
            if self._live.get(older.key) is older:
                older.skips += 1
        if self._order and self._order[0] is h:
            self._order.popleft()
        else:
            self._compact()
        self.released += 1
        self.held_seconds += max(0.0, now - h.arrived)
        return h

    def cancel(self, key: str) -> bool:
        """Forget a held request (its client or Envoy's stream went away); O(1), the entry is skipped later."""
        if self._live.pop(key, None) is None:
            return False
        self.cancelled += 1
        self._compact()
        return True

    def _compact(self) -> None:
        if len(self._order) > 2 * self.max_len:  # many dead entries (cancelled, taken out of order): drop them
            self._order = deque(h for h in self._order if self._live.get(h.key) is h)

    def expire(self, now: float) -> list[str]:
        """Remove and return the requests whose deadline has passed (oldest first)."""
        out: list[str] = []
        while (h := self.head()) is not None and h.deadline <= now:
            self._order.popleft()
            del self._live[h.key]
            out.append(h.key)
        self.expired += len(out)
        return out
