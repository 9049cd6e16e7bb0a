"""Early, honest shedding: refuse a request at the root when no cell it may use can take it.

Why: when every allowed cell is full, a request sent anyway waits in a queue that only grows, then
fails at the server (overflow) or at the client's timeout — after holding a slot another request
needed. A 429 with ``Retry-After`` at once costs the client nothing it would have got.

What a root knows, and so what "saturated" means here. A probe's RIF counts the requests the leaf
admitted, and a cell holds at most its buffer — running slots plus queue limit of its serving
servers — so past the buffer extra load never shows in the RIF, only as rejections (the error
EMA). The buffer itself is the leaf's ``capacity`` in the probe answer (the most each server held
when it answered 429, summed: ``dlb.ext_proc.leaf_state``); an older leaf sends none. Cell j is
*saturated* when its capacity ``C_j`` is known, its probe is at most ``max_age_s`` old, and, with
``N_j`` = probe RIF + this root's sends no probe has seen yet (the root's own view, so sends between
two probes count at once and a root never sends more than the room it saw):

- ``N_j ≥ fill · C_j`` — the buffer is full: the next request is rejected, or
- ``N_j ≥ near_fill · C_j`` and ``e_j ≥ min_error_rate`` — mostly full *and* rejecting now: a leaf
  picks among servers (power of d), so some servers are full before the cell's sum is (simulated
  pipeline cells at 110 % load reject 1–11 % while 0.6–0.9 of their buffer is in use).

Busy is not saturated: a cell below ``near_fill`` of its buffer, or one near it that rejects
nothing, has room. Unknown capacity or stale state count as room, so a root never sheds on what it
does not know; a root sheds only while *every* usable cell is saturated. A shed books no send (the
cells' state is unchanged) but counts as an arrival, so the root's rate estimate still sees the demand.
Not covered: a server whose queue is long enough to time requests out before it rejects any (the
simulator's batched model at 110 % load: 17.5 % timed out, nothing rejected, nothing shed).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class ShedConfig:
    """When a root refuses a request (429) instead of queueing it; see the module docstring."""

    enabled: bool = True
    #: The buffer counts as full at this fraction of the leaf's capacity.
    fill: float = 1.0
    #: ... and already at this fraction while the cell's error EMA is at least ``min_error_rate``.
    near_fill: float = 0.7
    min_error_rate: float = 0.05
    #: Saturation evidence older than this (seconds since the probe) counts as room.
    max_age_s: float = 0.5
    #: Bounds of the ``Retry-After`` seconds (:func:`retry_after_s`).
    retry_after_min_s: int = 1
    retry_after_max_s: int = 30

    def __post_init__(self) -> None:
        if not 0.0 < self.fill <= 2.0:
            raise ValueError(f"shed fill must be in (0, 2]: {self.fill}")
        if not 0.0 < self.near_fill <= self.fill:
            raise ValueError(f"shed near_fill must be in (0, fill={self.fill}]: {self.near_fill}")
        if not 0.0 < self.min_error_rate <= 1.0:
            raise ValueError(f"shed min_error_rate must be in (0, 1]: {self.min_error_rate}")
        if not self.max_age_s > 0:
            raise ValueError(f"shed max_age_s must be > 0: {self.max_age_s}")
        if not 1 <= self.retry_after_min_s <= self.retry_after_max_s:
            raise ValueError(f"shed retry-after bounds must satisfy 1 <= min <= max: "
                             f"{self.retry_after_min_s}, {self.retry_after_max_s}")


class CellState(Protocol):
    """The part of a root's cell view the predicate reads (``dlb.core.router.CellView``)."""

    rif: np.ndarray
    sent: np.ndarray
    capacity: np.ndarray
    error_rate: np.ndarray
    last_probe: np.ndarray


def saturated(n: float, capacity: float, error_rate: float, age_s: float, cfg: ShedConfig) -> bool:
    """Whether one cell can take nothing more (False when its capacity is unknown or its state stale)."""
    if not capacity > 0 or not age_s <= cfg.max_age_s:
        return False
    return n >= cfg.fill * capacity or (n >= cfg.near_fill * capacity and error_rate >= cfg.min_error_rate)


def should_shed(cells: Sequence[int], view: CellState, now: float, cfg: ShedConfig) -> bool:
    """True when ``cells`` (the usable ones) is not empty and every one of them is saturated.

    On the request path: stops at the first cell with room, and the first test is the cheap one
    (an older leaf reports no capacity, so a fleet of them costs one comparison per request).
    """
    if not cfg.enabled or not cells:
        return False
    cap, rif, sent, err, seen = view.capacity, view.rif, view.sent, view.error_rate, view.last_probe
    near = cfg.near_fill
    for j in cells:
        c = float(cap[j])
        if not c > 0:
            return False
        n = float(rif[j] + sent[j])
        if n < near * c or not saturated(n, c, float(err[j]), now - float(seen[j]), cfg):
            return False
    return True


def retry_after_s(drain_s: Iterable[float], cfg: ShedConfig) -> int:
    """Seconds a refused client should wait: the shortest drain time of the saturated cells, rounded up,
    within ``[retry_after_min_s, retry_after_max_s]``.

    A cell's drain time is its expected latency at its load, ℓ_j(N_j): by then the requests that fill
    its buffer now have finished, so a retry meets a turned-over queue; sooner it meets the same one.
    The floor is one second (the header counts whole seconds, and every root has re-probed by then);
    the cap keeps a wrong latency model from parking clients for minutes. No finite time: the floor.
    """
    finite = [d for d in drain_s if math.isfinite(d) and d >= 0]
    wait = math.ceil(min(finite)) if finite else cfg.retry_after_min_s
    return int(min(max(wait, cfg.retry_after_min_s), cfg.retry_after_max_s))
