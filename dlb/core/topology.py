"""Cells, replicas, one-way network latencies and allowed arcs (traffic residency)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class Topology:
    """The routing graph ``(C, A)`` of the paper, section 3.2.1.

    ``tau[i, j]`` is the one-way latency from cell i to cell j in seconds; ``allowed[i, j]`` says
    whether source i may route to destination j (residency rules make it asymmetric). Arrays are
    made read-only so a topology can be shared between routers without copies.
    """

    names: tuple[str, ...]
    replicas: np.ndarray
    tau: np.ndarray
    allowed: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.names)
        replicas = np.asarray(self.replicas, dtype=float).reshape(-1)
        tau = np.asarray(self.tau, dtype=float)
        allowed = np.asarray(self.allowed, dtype=bool)
        if n == 0:
            raise ValueError("topology needs at least one cell")
        if len(set(self.names)) != n:
            raise ValueError(f"duplicate cell names in {self.names}")
        if replicas.shape != (n,) or np.any(replicas <= 0):
            raise ValueError(f"replicas must be {n} positive numbers, got {replicas}")
        if tau.shape != (n, n) or np.any(tau < 0) or not np.all(np.isfinite(tau)):
            raise ValueError(f"tau must be a finite non-negative {n}x{n} matrix")
        if allowed.shape != (n, n):
            raise ValueError(f"allowed must be a {n}x{n} boolean matrix")
        empty = [self.names[i] for i in range(n) if not allowed[i].any()]
        if empty:
            raise ValueError(f"cells with no allowed destination: {empty}")
        for name, arr in (("replicas", replicas), ("tau", tau), ("allowed", allowed)):
            frozen = arr.copy()
            frozen.flags.writeable = False
            object.__setattr__(self, name, frozen)
        object.__setattr__(self, "names", tuple(self.names))

    @property
    def n(self) -> int:
        return len(self.names)

    def index(self, name: str) -> int:
        return self.names.index(name)

    def out_neighbors(self, i: int) -> np.ndarray:
        """``C+(i)``: destinations source i may use."""
        return np.flatnonzero(self.allowed[i])

    def in_neighbors(self, j: int) -> np.ndarray:
        """``C-(j)``: sources that may send to j."""
        return np.flatnonzero(self.allowed[:, j])

    @classmethod
    def build(
        cls,
        names: Sequence[str],
        replicas: Sequence[float] | np.ndarray,
        tau: Sequence[Sequence[float]] | np.ndarray,
        allowed: Sequence[Sequence[bool]] | np.ndarray | None = None,
    ) -> Topology:
        """Convenience constructor; ``allowed`` defaults to the complete graph."""
        n = len(names)
        allowed_arr = np.ones((n, n), dtype=bool) if allowed is None else np.asarray(allowed, dtype=bool)
        return cls(tuple(names), np.asarray(replicas, float), np.asarray(tau, float), allowed_arr)
