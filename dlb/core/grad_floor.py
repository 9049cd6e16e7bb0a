"""How close to a full cell the gradient cost may follow its model: a floor on ``1 − ρ`` per cell.

The gradient cost ``1/μ'(N) = ℓ/(1 − ρ)`` past the knee, with ``1 − ρ = (ℓ − Nℓ')/ℓ``. Near a full
cell that denominator is a small difference of two estimates, so a fitted model's dither reaches the
cost multiplied by ``1/(1 − ρ)²``. A fixed floor (``1 − GRAD_MAX_RHO`` = 0.05) bounds that, but it
also moves the fixed point wherever the optimum runs a cell above 95 % (the fluid model's 10- and
12-cell graphs at 95 % load end 3–9 % above the optimum with it, within 1 % at 0.005;
research/theory.md). With fitted models a floor of 0.01 made Flow-Grad worse than Rand
(research/routing-stress). So the floor is read from the models themselves: ``z`` standard deviations
of ``1 − ρ`` at the cell's current workload across the models it used over the last
``window_s`` seconds, clipped to ``[min_floor, max_floor]``. Models that do not move (exact ones, a
settled fit) get the low floor; a dithering fit keeps the fixed 0.05. Off by default (see
:class:`GradFloorConfig`).

Pure: time is passed in; one instance per router, a short ring of models per cell.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from dlb.core.latency_model import GRAD_MAX_RHO, latency_at


@dataclass(frozen=True)
class GradFloorConfig:
    """``enabled`` False (the default): the fixed floor ``max_floor`` for every cell.

    Off because it lost on the stochastic simulator's tuning seeds at every ``z`` tried: fitted models
    of batched cells sit at ``ρ̂`` ≈ 0.95–0.995 for much of a run with little spread between refits,
    so their error is bias, which no spread measures (research/routing-stress, "A floor from the
    models' spread").
    """

    enabled: bool = False
    #: The span of published models the spread is measured over (several refits of a leaf's window);
    #: until a cell has been observed this long, ``max_floor``.
    window_s: float = 30.0
    #: Distinct models kept per cell (the newest; bounds the work per probe).
    models: int = 16
    #: Standard deviations of ``1 − ρ`` the floor stays above.
    z: float = 2.0
    min_floor: float = 0.005
    max_floor: float = 1.0 - GRAD_MAX_RHO

    def __post_init__(self) -> None:
        if not (0.0 < self.min_floor <= self.max_floor < 1.0):
            raise ValueError(f"need 0 < min_floor <= max_floor < 1: {self.min_floor}, {self.max_floor}")
        if self.window_s <= 0 or self.models < 2 or self.z < 0:
            raise ValueError(f"invalid gradient-floor settings: {self}")


def headroom(n: float, a: float, b: float, c: float, s: float) -> float:
    """``1 − ρ = (ℓ − Nℓ')/ℓ`` of one model at workload ``n`` (scalar; no numpy on the probe path)."""
    z = (n - c) / s
    ell = latency_at(n, a, b, c, s)
    sig = 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))
    return (ell - n * b * sig) / ell


Model = tuple[float, float, float, float]


class ModelSpread:
    """Per cell, the distinct models in use over the last window and the floor their spread allows.

    Every model a cell changes to is kept (not one per time slot: a fit that alternates at the
    sampling period would look steady), with the time it came into use; one that stopped being in
    use before the window began is dropped.
    """

    def __init__(self, n: int, cfg: GradFloorConfig | None = None) -> None:
        self.cfg = cfg if cfg is not None else GradFloorConfig()
        self._ring: list[deque[tuple[float, Model]]] = [deque(maxlen=self.cfg.models) for _ in range(n)]
        self._first = [math.inf] * n
        self._now = [-math.inf] * n

    def observe(self, cell: int, now: float, a: float, b: float, c: float, s: float) -> None:
        """The model ``cell`` uses at ``now`` (call on every probe, whether or not the model changed)."""
        ring = self._ring[cell]
        model = (a, b, c, s)
        if not ring:
            self._first[cell] = now
            ring.append((now, model))
        elif ring[-1][1] != model:
            ring.append((now, model))
        while len(ring) > 1 and ring[1][0] <= now - self.cfg.window_s:
            ring.popleft()
        self._now[cell] = now

    def floor(self, cell: int, n: float) -> float:
        """The floor on ``1 − ρ`` for ``cell`` at workload ``n``, as of its last :meth:`observe`."""
        cfg = self.cfg
        ring = self._ring[cell]
        if not cfg.enabled or self._now[cell] - self._first[cell] < cfg.window_s:
            return cfg.max_floor
        if len(ring) == 1:
            return cfg.min_floor
        u = [headroom(n, *m) for _, m in ring]
        mean = sum(u) / len(u)
        sd = math.sqrt(sum((v - mean) ** 2 for v in u) / (len(u) - 1))
        return min(max(cfg.z * sd, cfg.min_floor), cfg.max_floor)
