"""Flow routing: give a cell that slowed down and recovered the share of the split it held before.

Why: a cell whose servers slow down loses its share of ``x`` by the gradient step, as it should. When
it recovers, every cell's cost may sit below its knee, so the cost differences are round trips of tens
of milliseconds, and the step — sized for stability near the fixed point (:mod:`dlb.core.flow`) — moves
the cell back at that pace: in ``dlb bench faults`` (a cell 8× slower for 25 s, Flow-Grad) its share
climbed ~0.001 per second after its model was fast again, and it was not back to 80 % of its
pre-fault share 15 s after the restore in any run (research/operations.md). It is the case
``RootRouter._rejoin`` handles for a cell that leaves the usable set and returns; here the cell stays
usable but its *model* leaves and returns. The share it held before the slowdown is the loop's last
estimate of the equilibrium with the cell at its old speed; from there the step corrects whatever changed.

The rule, per cell, on the flow step's clock:

- its capacity ``min(1/b, replicas/a)`` (:func:`dlb.core.background.capacity_floor`) from the model the root uses, remembered at its best while the
  model is measured (confidence > 0: a configured prior is never a best), fading by ``e`` every ``memory_s``;
- *slowed* when the capacity falls under ``1/ratio`` of that best: the share held then is the largest it
  had over the last ``window_s`` (a slowdown shows in the cell's queue, which the costs read at once,
  before it shows in a refitted model, which takes the leaf's refit and change detection);
- *recovered* when the capacity is back to within ``recover_ratio`` of the best it had when it slowed: its
  share is raised to the one held (never lowered), the other cells give that up in proportion;
- a held share is dropped after ``memory_s`` without a recovery (the fleet has moved on).

Pure (time passed in), so the simulator, the roots and the control plane's flow loop share it.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class SlowedShareConfig:
    #: Slowed: capacity under ``1/ratio`` of the remembered best (0 turns the rule off).
    ratio: float = 2.0
    #: Recovered: capacity at least ``1/recover_ratio`` of the best when it slowed.
    recover_ratio: float = 1.25
    #: The share held is the largest over this many seconds before the slowdown was seen.
    window_s: float = 30.0
    #: The best capacity fades by ``e`` per ``memory_s``; a held share is dropped after it.
    memory_s: float = 600.0

    def __post_init__(self) -> None:
        if self.ratio and not (self.ratio > 1 and 1 <= self.recover_ratio < self.ratio):
            raise ValueError(f"slowed share needs ratio > 1 (or 0: off) and 1 <= recover_ratio < ratio: {self}")
        if self.window_s < 0 or self.memory_s <= 0:
            raise ValueError(f"slowed share needs window_s >= 0 and memory_s > 0: {self}")

    @property
    def enabled(self) -> bool:
        return self.ratio > 0


@dataclass
class SlowedShares:
    """Per-cell memory of the rule above; :meth:`observe` once per flow step."""

    n: int
    config: SlowedShareConfig = field(default_factory=SlowedShareConfig)
    best: np.ndarray = field(init=False)
    slowed: np.ndarray = field(init=False)
    held: np.ndarray = field(init=False)
    best_when_slowed: np.ndarray = field(init=False)
    since: np.ndarray = field(init=False)
    _at: float = math.nan
    _history: deque[tuple[float, np.ndarray]] = field(default_factory=deque)

    def __post_init__(self) -> None:
        self.best = np.zeros(self.n)
        self.slowed = np.zeros(self.n, dtype=bool)
        self.held = np.zeros(self.n)
        self.best_when_slowed = np.zeros(self.n)
        self.since = np.zeros(self.n)

    def observe(self, now: float, x: np.ndarray, cap: np.ndarray, measured: np.ndarray) -> np.ndarray | None:
        """Record this step's split ``x`` and capacities ``cap`` (used only where ``measured``: usable
        cells with a measured model); returns the shares to give back to cells that recovered now (0
        elsewhere), or None when none did."""
        cfg = self.config
        if not math.isnan(self._at) and now > self._at:
            self.best *= math.exp(-(now - self._at) / cfg.memory_s)
        self._at = now
        hist = self._history
        hist.append((now, x.copy()))
        while hist and hist[0][0] < now - cfg.window_s:
            hist.popleft()
        ok = measured & np.isfinite(cap) & (cap > 0)
        self.best = np.where(ok, np.maximum(self.best, cap), self.best)
        new = ok & ~self.slowed & (cap * cfg.ratio < self.best)
        if new.any():
            peak = np.max(np.stack([h for _, h in hist]), axis=0)
            self.held[new] = peak[new]
            self.best_when_slowed[new] = self.best[new]
            self.since[new] = now
            self.slowed |= new
        back = ok & self.slowed & (cap * cfg.recover_ratio >= self.best_when_slowed)
        expired = self.slowed & ~back & (now - self.since > cfg.memory_s)
        shares = np.where(back, self.held, 0.0)
        done = back | expired
        self.slowed &= ~done
        self.held[done] = 0.0
        return shares if back.any() else None

    def adopt(self, other: SlowedShares, pairs: list[tuple[int, int]]) -> None:
        """Take over ``other``'s memory for ``(other_cell, cell)`` pairs (a reconfiguration keeps it)."""
        for o, j in pairs:
            self.best[j], self.slowed[j], self.held[j] = other.best[o], other.slowed[o], other.held[o]
            self.best_when_slowed[j], self.since[j] = other.best_when_slowed[o], other.since[o]
        self._at = other._at
