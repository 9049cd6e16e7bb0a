"""Prequal's server pick, balancing tokens waiting: a probe pool and the hot-cold lexicographic rule.

The DLB paper's leaf "selects an inference server ... using a distributed power-of-d-choices paradigm
that seeks to balance the number of tokens waiting to be processed in each queue", citing Prequal
(Wydrowski et al., NSDI '24). Prequal's two findings are what this module keeps:

- **A probe pool.** Each pick adds ``probes_per_pick`` fresh probes of random servers to a small pool;
  a probe answers (requests in flight, tokens waiting) and may serve up to ``max_uses`` picks while it is
  younger than ``max_age_s`` (Prequal's reuse budget), so a pick chooses among more than ``d``
  candidates without probing more. After a pick the chosen probe counts the new request (RIF + 1,
  tokens + its size), as Prequal does, so a burst does not pile onto one stale "idle" answer.
- **Hot-cold lexicographic rule (HCL).** A probe is *hot* when its RIF is above the ``hot_quantile``
  of the RIFs in the pool; among the cold, take the least *tokens waiting* (Prequal uses a latency
  estimate there; for an LLM server the work queued ahead of a new request is its tokens waiting, and
  RIF alone treats a 30-token chat and a 4 k-token prompt alike); if every probe is hot, take the
  lowest RIF. RIF bounds the tail (no server gets far more requests than the rest); tokens pick the
  fastest among the acceptable ones.

In the leaf a probe is a read of what the leaf already holds (its own per-server counts and the last
scrape of the server's vLLM gauges), so probing costs no I/O on the request path; the simulator feeds
the same pool from its server state. Pure: no I/O, no clock (``now`` is passed in), randomness from
the caller's generator.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class PrequalConfig:
    """Prequal's knobs; the defaults are the paper's (pool 16, Q_RIF 0.84) scaled to a cell's size."""

    probes_per_pick: int = 2
    pool_size: int = 16
    max_age_s: float = 1.0
    max_uses: int = 2
    hot_quantile: float = 0.84

    def __post_init__(self) -> None:
        if self.probes_per_pick < 1:
            raise ValueError(f"probes_per_pick must be >= 1, got {self.probes_per_pick}")
        if self.pool_size < self.probes_per_pick:
            raise ValueError(f"pool_size must be >= probes_per_pick ({self.probes_per_pick}), got {self.pool_size}")
        if not self.max_age_s > 0:
            raise ValueError(f"max_age_s must be > 0, got {self.max_age_s}")
        if self.max_uses < 1:
            raise ValueError(f"max_uses must be >= 1, got {self.max_uses}")
        if not 0.0 < self.hot_quantile <= 1.0:
            raise ValueError(f"hot_quantile must be in (0, 1], got {self.hot_quantile}")


@dataclass
class Probe:
    """One server's answer: requests in flight and tokens waiting when probed at ``at``."""

    server: int
    rif: float
    tokens: float
    at: float
    uses: int = 0


#: ``probe(server) -> (rif, tokens waiting)``: what the caller knows of a server right now.
ProbeFn = Callable[[int], tuple[float, float]]


@dataclass
class ProbePool:
    """The probe pool of one picker (a leaf replica)."""

    config: PrequalConfig = field(default_factory=PrequalConfig)
    rng: random.Random = field(default_factory=random.Random)
    probes: list[Probe] = field(default_factory=list)

    def refresh(self, now: float, candidates: list[int], probe: ProbeFn) -> None:
        """Drop expired probes and add fresh ones of ``probes_per_pick`` distinct random candidates
        (a fresh probe replaces an older one of the same server; the oldest go when the pool is full)."""
        cfg = self.config
        horizon = now - cfg.max_age_s
        live = set(candidates)
        self.probes = [p for p in self.probes if p.at >= horizon and p.uses < cfg.max_uses and p.server in live]
        k = min(cfg.probes_per_pick, len(candidates))
        picked = self.rng.sample(candidates, k) if k < len(candidates) else list(candidates)
        fresh = set(picked)
        self.probes = [p for p in self.probes if p.server not in fresh]
        for s in picked:
            rif, tokens = probe(s)
            self.probes.append(Probe(s, rif, tokens, now))
        if len(self.probes) > cfg.pool_size:
            del self.probes[: len(self.probes) - cfg.pool_size]  # appended in time order: oldest first

    def select(self) -> Probe:
        """The HCL choice among the pool's probes (the pool must not be empty).

        The threshold is one of the pool's RIFs, so at least one probe is cold; with few probes (fewer
        than ~1/(1 − hot_quantile)) none is hot and the rule is "least tokens waiting".
        """
        probes = self.probes
        threshold = quantile([p.rif for p in probes], self.config.hot_quantile)
        best = probes[0] if probes[0].rif <= threshold else None
        for p in probes:  # cold: least tokens waiting, then least RIF
            if p.rif <= threshold and (best is None or (p.tokens, p.rif) < (best.tokens, best.rif)):
                best = p
        assert best is not None
        return best

    def pick(self, now: float, candidates: list[int], probe: ProbeFn, tokens: float) -> int:
        """Refresh, select, and charge the chosen probe with the new request of ``tokens`` tokens."""
        if not candidates:
            raise ValueError("no candidate servers to pick from")
        self.refresh(now, candidates, probe)
        chosen = self.select()
        chosen.uses += 1
        chosen.rif += 1.0
        chosen.tokens += tokens
        return chosen.server


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` as one of them: the ⌈q·n⌉-th smallest."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]
