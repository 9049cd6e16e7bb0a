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
A cell has no room either when a request sent there now is, by the cell's own latency model, served
only after the client's deadline ``deadline_s`` (the endpoint's request timeout): ``τ_ij + ℓ_j(N_j + 1)
≥ deadline_s``, the round trip plus the model's latency with this request added. Such a request counts
at the timeout whether it is served or refused, but served it holds a slot the next requests need: a
queue long enough to time requests out before the server rejects any (a batched server's) shows only
here. No margin: at equality the request is worth as much refused as served, and the model's error cuts
both ways. Only a fitted model (confidence > 0) no older than ``max_age_s`` counts; a prior is room.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from dlb.core.latency_model import latency_at


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
    #: Also count a cell full when its model puts this request past ``deadline_s`` (the module docstring).
    #: Off by default: on seed 43 it did not pass its verdict (research/routing-stress/deadline-shed.md).
    deadline: bool = False
    #: The client's deadline: the endpoint's request timeout in seconds (inf: none, never shed on it).
    deadline_s: float = math.inf

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
        if not self.deadline_s > 0:
            raise ValueError(f"shed deadline_s must be > 0 (inf: none): {self.deadline_s}")


class CellState(Protocol):
    """The part of a root's cell view the predicate reads (``dlb.core.router.CellView``)."""

    rif: np.ndarray
    sent: np.ndarray
    capacity: np.ndarray
    error_rate: np.ndarray
    last_probe: np.ndarray
    confidence: np.ndarray


class Models(Protocol):
    """Per-cell latency models ℓ(N) = a + b·s·softplus((N − c)/s) (``dlb.core.latency_model.ModelTable``)."""

    @property
    def a(self) -> np.ndarray: ...
    @property
    def b(self) -> np.ndarray: ...
    @property
    def c(self) -> np.ndarray: ...
    @property
    def s(self) -> np.ndarray: ...


def saturated(n: float, capacity: float, error_rate: float, age_s: float, cfg: ShedConfig) -> bool:
    """Whether one cell can take nothing more (False when its capacity is unknown or its state stale)."""
    if not capacity > 0 or not age_s <= cfg.max_age_s:
        return False
    return n >= cfg.fill * capacity or (n >= cfg.near_fill * capacity and error_rate >= cfg.min_error_rate)


def past_deadline(n: float, a: float, b: float, c: float, s: float, rtt_s: float, confidence: float, age_s: float,
                  cfg: ShedConfig) -> bool:
    """Whether a request sent now to a cell holding ``n`` is, by the cell's fitted model, answered only after
    the deadline: ``rtt_s + ℓ(n + 1) ≥ deadline_s`` (False without a deadline, a fitted model or fresh state)."""
    if not cfg.deadline or not confidence > 0 or not age_s <= cfg.max_age_s:
        return False
    return rtt_s + latency_at(n + 1.0, a, b, c, s) >= cfg.deadline_s


def should_shed(cells: Sequence[int], view: CellState, now: float, cfg: ShedConfig,
                models: Models | None = None, rtt_s: np.ndarray | None = None) -> bool:
    """True when ``cells`` (the usable ones) is not empty and every one of them has no room: saturated, or
    (with ``models`` and ``rtt_s``, the root's per-cell models and round trips) past the deadline.

    On the request path: stops at the first cell with room, and the first test is the cheap one
    (an older leaf reports no capacity, so without a deadline a fleet of them costs one comparison per
    request; with one, one latency evaluation).
    """
    if not cfg.enabled or not cells:
        return False
    m, rtt = (models, rtt_s) if cfg.deadline and cfg.deadline_s < math.inf else (None, None)
    cap, rif, sent, err, seen = view.capacity, view.rif, view.sent, view.error_rate, view.last_probe
    near = cfg.near_fill
    for j in cells:
        c = float(cap[j])
        if not c > 0 and m is None:
            return False
        n = float(rif[j] + sent[j])
        age = now - float(seen[j])
        if c > 0 and n >= near * c and saturated(n, c, float(err[j]), age, cfg):
            continue
        if m is None or rtt is None or not past_deadline(
                n, float(m.a[j]), float(m.b[j]), float(m.c[j]), float(m.s[j]), float(rtt[j]), float(view.confidence[j]), age, cfg):
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
