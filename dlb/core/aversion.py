"""Error aversion (paper 3.4; docs/design.md §3, reconstructed).

Leaves report an EMA error fraction ``e_j``. Each root keeps an aversion rate ``a_j ∈ [0, a_max]``:
every period, cells worse than the best by more than ``margin`` have ``a_j`` raised in proportion to
their gap; the others decay geometrically toward 0, which is the recovery path. A request skips cell
j with probability ``a_j``. ``a_max < 1`` keeps a trickle of traffic on a bad cell so its recovery is
observed (a cell that receives nothing reports no new errors and no successes either).

The gain sets what kind of controller this is. With decay d per period, a steady gap settles the
aversion at ``gain · gap / (1 − d)``: with the default gain 0.5 and d = 0.5, **a_j = the cell's excess
error rate** — a cell failing 30 % more than the best loses 30 % of its traffic. The earlier gain 2.0
made it 4 × the gap, so any gap above 0.23 hit the cap in one period: bang-bang. When several cells
fail because they are *overloaded* (not broken), bang-bang aversion herds the fleet: most cells at the
cap, every root's traffic lands on the one or two cells not averted, those overflow and become averted
in turn. In the simulator (scenario 3006, 80 % load, Flow-Grad) that cycle, once a random overflow
started it, held for the rest of the run: 30,000 failed requests and 1.26 × Rand's latency in 2 of 3
trials; with gain 0.5, 189 and 992 failures and 0.81–0.85 × Rand (research/sim/issue-11/README.md). A
broken cell (error rate ~1) still reaches the cap in ~3 periods.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class AversionConfig:
    enabled: bool = True
    margin: float = 0.02
    gain: float = 0.5
    decay: float = 0.5
    max_rate: float = 0.9
    period_s: float = 1.0
    #: Utilisation (of a cell's model capacity 1/b) up to which a healthy cell counts as able to take
    #: diverted load (:func:`cap_to_headroom`).
    headroom_rho: float = 0.95

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_rate < 1.0:
            raise ValueError(f"aversion max_rate must be in [0, 1): {self.max_rate}")
        if not 0.0 <= self.decay <= 1.0:
            raise ValueError(f"aversion decay must be in [0, 1]: {self.decay}")
        if self.gain < 0 or self.margin < 0 or self.period_s <= 0:
            raise ValueError("aversion gain, margin must be >= 0 and period_s > 0")
        if not 0.0 < self.headroom_rho <= 1.0:
            raise ValueError(f"aversion headroom_rho must be in (0, 1]: {self.headroom_rho}")


#: A decaying rate below this is 0: one skip in a thousand averts nothing worth naming.
RATE_FLOOR = 1e-3


def update_aversion(
    rates: np.ndarray, error_rates: np.ndarray, active: np.ndarray, cfg: AversionConfig
) -> np.ndarray:
    """One control period: return the new aversion rates.

    ``active`` marks the cells this root can currently use (allowed and with fresh probe state);
    the best error rate is taken over them only, so an unreachable healthy cell does not make every
    reachable one look bad. Inactive cells keep decaying.
    """
    new = rates * cfg.decay
    new[new < RATE_FLOOR] = 0.0  # a cell that recovered reads 0, not 7e-42 (an alert on == 0 never cleared)
    if not cfg.enabled or not active.any():
        return np.zeros_like(rates) if not cfg.enabled else new
    e_best = float(error_rates[active].min())
    gap = error_rates - (e_best + cfg.margin)
    worse = active & (gap > 0)
    new[worse] = rates[worse] + cfg.gain * gap[worse]
    return np.clip(new, 0.0, cfg.max_rate)


def cap_to_headroom(rates: np.ndarray, inflow: np.ndarray, spare: float) -> np.ndarray:
    """Scale ``rates`` down so the load they divert, ``Σ a_j·inflow_j``, fits in ``spare`` (same units).

    :func:`update_aversion` compares each cell with the best one, so when every cell overflows every
    rate climbs: the fleet's traffic lands on the one or two cells not averted, which overflow in
    turn (herding). Diverting more than the healthy cells can take only moves the errors, so the
    rates shrink together until it fits; with no spare anywhere they are 0 and shedding takes over.
    """
    diverted = float(np.dot(rates, inflow))
    if diverted <= spare or diverted <= 0.0:
        return rates
    return rates * (max(spare, 0.0) / diverted)


def fold_into_split(x: np.ndarray, rates: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """A flow vector with the averted shares moved to the other cells in ``mask``, pro rata.

    Under flow routing aversion acts on ``x`` itself once per period (``x_j ← x_j(1 − a_j)``,
    renormalised), so the vector the flow step integrates is the split actually served and cannot
    wind up against a diversion it does not see. If every cell in ``mask`` would lose all its share,
    ``x`` is returned unchanged.
    """
    kept = np.where(mask, x * (1.0 - rates), 0.0)
    total = float(kept.sum())
    if total <= 0.0:
        return x
    return kept / total


@dataclass
class RecentErrors:
    """Which cells are failing *now*, from the monotone error counters leaves report in probes.

    The leaf's ``error_rate`` is an EMA: it stays high for many seconds after a cell's errors stop,
    and aversion fed with it kept a recovered cell avoided for ~10 s (measured, issue 13). The
    counter tells the difference at once: a cell whose counter has not moved for ``hold_s`` has
    stopped failing, so :meth:`observe` reports 0 for it and the aversion decays from the next period.
    ``hold_s`` should span a few error inter-arrivals of a failing cell that aversion already starves
    (default two aversion periods), or a still-failing cell would flap between avoided and not.
    A counter that goes down is a restarted leaf: it starts a new baseline and counts as no news.
    """

    n: int
    hold_s: float = 2.0
    _errors: list[int] = field(default_factory=list)
    _last_rise: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.hold_s < 0:
            raise ValueError(f"hold_s must be >= 0: {self.hold_s}")
        self._errors = [-1] * self.n
        self._last_rise = [-math.inf] * self.n

    def adopt(self, other: RecentErrors, other_cell: int, cell: int) -> None:
        """Take over ``other``'s counter baseline for ``other_cell`` as ``cell`` (a reconfiguration)."""
        self._errors[cell] = other._errors[other_cell]
        self._last_rise[cell] = other._last_rise[other_cell]

    def observe(self, cell: int, errors: int, ema: float, now: float) -> float:
        """The error rate aversion should see for ``cell``: its EMA while errors keep coming, else 0."""
        prev = self._errors[cell]
        if prev >= 0 and errors > prev:
            self._last_rise[cell] = now
        elif prev < 0 and ema > 0:
            self._last_rise[cell] = now  # first sight of a failing cell: trust the EMA for one hold
        self._errors[cell] = errors
        return ema if now - self._last_rise[cell] <= self.hold_s else 0.0
