"""Has a cell changed under its model? Block tests on the ratio of measured to predicted latency.

The background prober (:mod:`dlb.core.background`) detects a change from its probes, but a cell that
still has traffic sends no probes: when it silently becomes 3× slower, the only evidence is its own
traffic, and the recency weights of the fit outvote the window of old samples only after about a
half-life (issue 12 measured a worst 26–38 s to move traffic away, against a 30-s target). This
detector reads that traffic: each sample's latency ÷ the model's prediction at its RIF, averaged in
blocks of ``block`` samples; a block whose mean ratio is off by more than ``tolerance`` is a
surprise (:func:`dlb.core.background.surprise`), and ``after`` same-sign surprising blocks in a row
declare a change that began with the first of them — once the detector is armed by ``after`` calm
blocks in a row (the model predicting within tolerance) since the last change. The caller drops the samples older than that
and refits at once (:meth:`dlb.core.estimator.LatencyEstimator.record` does both).

Blocks, not single samples: one request's latency varies with its size (the workload's decode
lengths have a coefficient of variation ~0.8), so three single surprises in a row happen by chance
every few minutes on a busy cell; a mean over 16 has ~1/4 of that spread, and three such blocks off
by ×1.5 in a row is rare without a change (on a model that is right on average). A model that is
wrong on average for 48 samples in a row is worth refitting from recent samples anyway. Pure and
clock-free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dlb.core.background import surprise


@dataclass
class ChangeDetector:
    """Feed (time, measured ÷ predicted) per sample; :meth:`add` returns the change's start when one is declared."""

    block: int = 16
    tolerance: float = 0.5
    after: int = 3
    #: Changes declared so far (a diagnostic), and the last one's sign (+1 slower, -1 faster, 0 none yet).
    changes: int = 0
    last_sign: int = 0
    _n: int = 0
    _sum: float = 0.0
    _block_start: float = math.nan
    _streak: int = 0
    _since: float = math.nan
    _calm: int = 0  # blocks in a row the model predicted within tolerance

    def __post_init__(self) -> None:
        if self.block < 1 or self.after < 1 or not self.tolerance > 0:
            raise ValueError(f"change detector needs block >= 1, after >= 1 and tolerance > 0: {self}")

    def add(self, now: float, ratio: float) -> float | None:
        """One sample's measured ÷ predicted latency at ``now``; the start of a change just declared, else None."""
        if not (ratio > 0 and math.isfinite(ratio)):
            return None
        if self._n == 0:
            self._block_start = now
        self._n += 1
        self._sum += ratio
        if self._n < self.block:
            return None
        sign = surprise(self._sum / self._n, 1.0, self.tolerance)
        start = self._block_start
        self._n, self._sum = 0, 0.0
        if sign == 0:
            self._streak = 0
            self._calm += 1
            return None
        if self._calm < self.after:
            # Not armed: a change is a departure from a model that was predicting well. A model that
            # misfits the cell chronically (a curve of the wrong shape) surprises block after block;
            # declaring a change each time would keep dropping the samples it needs (measured: a
            # batched-server cell's Flow-Grad latency 6.8 s -> 9.8 s).
            self._streak = 0
            return None
        if self._streak * sign < 0:
            self._streak = 0
        if self._streak == 0:
            self._since = start
        self._streak += sign
        if abs(self._streak) < self.after:
            return None
        self._streak = self._calm = 0
        self.changes += 1
        self.last_sign = sign
        return self._since

    def reset(self) -> None:
        """Forget the block in progress and the streak (after a refit: later samples meet a new model)."""
        self._n, self._sum, self._streak = 0, 0.0, 0
