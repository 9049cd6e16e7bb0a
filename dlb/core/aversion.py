"""Error aversion (paper 3.4; docs/design.md §3, reconstructed).

Leaves report an EMA error fraction ``e_j``. Each root keeps an aversion rate ``a_j ∈ [0, a_max]``:
every period, cells worse than the best by more than ``margin`` have ``a_j`` raised in proportion to
their gap; the others decay geometrically toward 0, which is the recovery path. A request skips cell
j with probability ``a_j``. ``a_max < 1`` keeps a trickle of traffic on a bad cell so its recovery is
observed (a cell that receives nothing reports no new errors and no successes either).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class AversionConfig:
    enabled: bool = True
    margin: float = 0.02
    gain: float = 2.0
    decay: float = 0.5
    max_rate: float = 0.9
    period_s: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_rate < 1.0:
            raise ValueError(f"aversion max_rate must be in [0, 1): {self.max_rate}")
        if not 0.0 <= self.decay <= 1.0:
            raise ValueError(f"aversion decay must be in [0, 1]: {self.decay}")
        if self.gain < 0 or self.margin < 0 or self.period_s <= 0:
            raise ValueError("aversion gain, margin must be >= 0 and period_s > 0")


def update_aversion(
    rates: np.ndarray, error_rates: np.ndarray, active: np.ndarray, cfg: AversionConfig
) -> np.ndarray:
    """One control period: return the new aversion rates.

    ``active`` marks the cells this root can currently use (allowed and with fresh probe state);
    the best error rate is taken over them only, so an unreachable healthy cell does not make every
    reachable one look bad. Inactive cells keep decaying.
    """
    new = rates * cfg.decay
    if not cfg.enabled or not active.any():
        return np.zeros_like(rates) if not cfg.enabled else new
    e_best = float(error_rates[active].min())
    gap = error_rates - (e_best + cfg.margin)
    worse = active & (gap > 0)
    new[worse] = rates[worse] + cfg.gain * gap[worse]
    return np.clip(new, 0.0, cfg.max_rate)
