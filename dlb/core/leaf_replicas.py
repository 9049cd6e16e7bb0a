"""One cell's state from the probe answers of its leaf replicas (≥ 2 leaf Envoys + agents over the same servers).

Every replica routes only the requests its own Envoy received, so each answer is a part of the cell:

- **RIF** is the sum of the replicas' RIF (each counts the requests it picked a server for).
- **Error rate** is the replicas' error EMAs weighted by their traffic shares; monotone counters
  (``completed``, ``errors``, per-source completions) are summed and kept monotone when a replica
  restarts (its counter starts a new base) or drops out (its last value stays in the sum), because
  the root's :class:`~dlb.core.aversion.RecentErrors` reads a falling counter as a restarted leaf.
- **Healthy servers**: the replicas see the *same* servers, so their counts are not added; the cell
  counts the largest (a server one replica's Envoy still reaches can serve the cell's requests).
  Capacity, the servers' queue (``waiting``) and KV use are properties of those shared servers too: max.
- **Latency model: one curve, combined at the root** from the replicas' own fits, not a shared
  sample pool (which would need the agents to talk to each other on every completion). A replica
  tags each sample with *its own* RIF, which is its share ``f`` of the cell's: its curve is
  ``ℓ_r(n) = ℓ(n / f)``, so on the cell's RIF axis ``ℓ(N) = ℓ_r(f·N)``, which for the softplus model
  is exact: ``a' = a, b' = b·f, c' = c/f, s' = s/f`` (``c < a/b`` is preserved). The rescaled curves
  estimate the same cell curve from disjoint samples and are averaged with weights = samples.
- **Traffic share** ``f``: each replica's completion rate (its ``completed`` counter's growth, forgotten
  over ``tau_s``) over the live replicas' total; equal shares until rates are known. With one live
  replica ``f = 1`` and the answer passes through unchanged.

Why the replicas do not exchange in-flight counts: the root's cost needs only the cell's total,
which the sum gives; inside the cell each replica balances its own share over the shared servers
with the same pick rule, and balanced parts sum to a balanced whole (the servers' own queue, which
Prequal-style picks also read, is total, not partial). Exchanging counts would put a cross-replica
round trip on the pick path or a second source of truth beside it.

A replica whose probe fails (``None``) drops out of the aggregate, not the cell: the cell is
unusable only when every replica has failed. Pure: time is passed in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

#: Time constant of each replica's completion-rate EMA (the traffic shares), seconds.
SHARE_TAU_S = 2.0


@dataclass(frozen=True)
class ReplicaAnswer:
    """What one leaf replica's probe answer says, on its own (partial) RIF axis."""

    rif: float
    error_rate: float = 0.0
    #: Monotone counters since the replica started, by name (``completed``, ``errors``, ``src:<cell>``…).
    counters: Mapping[str, int] = field(default_factory=dict)
    healthy: int | None = None  # healthy servers as this replica's Envoy sees them (None: not reported)
    #: Fitted ``(a, b, c, s)`` against this replica's RIF, or None (no model in the answer).
    params: tuple[float, float, float, float] | None = None
    confidence: float = 0.0
    samples: int = 0
    capacity: float | None = None
    waiting: float = -1.0  # the shared servers' queue, -1 unknown
    kv_usage: float = -1.0


@dataclass(frozen=True)
class CellAnswer:
    """The cell as one leaf would have reported it."""

    rif: float
    error_rate: float
    counters: dict[str, int]
    healthy: int | None
    params: tuple[float, float, float, float] | None
    confidence: float
    samples: int
    capacity: float | None
    waiting: float
    kv_usage: float
    live: int  # replicas in the aggregate


def rescale(params: tuple[float, float, float, float], share: float) -> tuple[float, float, float, float]:
    """A replica's curve fitted on its RIF ``n = f·N``, as a curve of the cell's RIF ``N`` (module docstring)."""
    a, b, c, s = params
    return (a, b * share, c / share, s / share)


@dataclass
class _Replica:
    answer: ReplicaAnswer
    at: float
    #: Completions and seconds, each an exponentially forgotten sum (time constant ``tau_s``): their ratio
    #: is the completion rate, which two answers a millisecond apart cannot throw off as an EMA of rates would.
    done: float = 0.0
    span: float = 0.0
    base: dict[str, int] = field(default_factory=dict)  # counter offsets from earlier lives of this replica

    @property
    def rate(self) -> float:
        """Completions per second; NaN until the replica has answered twice."""
        return self.done / self.span if self.span > 0 else math.nan

    def totals(self) -> dict[str, int]:
        c = self.answer.counters
        return {k: self.base.get(k, 0) + c.get(k, 0) for k in set(self.base) | set(c)}


@dataclass
class ReplicaMerge:
    """One cell's replicas: feed each probe result to :meth:`update`, which returns the cell's answer."""

    tau_s: float = SHARE_TAU_S
    #: Every replica ever seen (its last answer and counter base), live or dropped: the sums never go down.
    _seen: dict[int, _Replica] = field(default_factory=dict)
    _live: set[int] = field(default_factory=set)

    def update(self, replica: int, answer: ReplicaAnswer | None, now: float) -> CellAnswer | None:
        """Record one replica's answer (None: its probes failed, it leaves the aggregate); the cell's
        answer after it, or None when no replica is live (the cell is unusable)."""
        if answer is None:
            self._live.discard(replica)
        else:
            self._record(replica, answer, now)
            self._live.add(replica)
        return self.merged()

    def _record(self, replica: int, answer: ReplicaAnswer, now: float) -> None:
        prev = self._seen.get(replica)
        base: dict[str, int] = {}
        done = span = 0.0
        if prev is not None:
            base = dict(prev.base)
            for k, v in prev.answer.counters.items():
                if answer.counters.get(k, 0) < v:  # a restarted replica: its counters start again from 0
                    base[k] = base.get(k, 0) + v
            if now > prev.at and replica in self._live:
                keep = math.exp(-(now - prev.at) / self.tau_s)
                new = answer.counters.get("completed", 0) - prev.answer.counters.get("completed", 0)
                done, span = prev.done * keep + max(new, 0), prev.span * keep + (now - prev.at)
        self._seen[replica] = _Replica(answer, now, done, span, base)

    def shares(self) -> dict[int, float]:
        """Each live replica's traffic share: its completion rate over the live total, else equal."""
        if not self._live:
            return {}
        rates = {k: self._seen[k].rate for k in self._live}
        total = sum(rates.values())
        if not all(math.isfinite(x) for x in rates.values()) or total <= 0:
            return {k: 1.0 / len(rates) for k in rates}
        return {k: x / total for k, x in rates.items()}

    def merged(self) -> CellAnswer | None:
        if not self._live:
            return None
        shares = self.shares()
        answers = {k: self._seen[k].answer for k in sorted(self._live)}
        counters: dict[str, int] = {}
        for r in self._seen.values():
            for k, v in r.totals().items():
                counters[k] = counters.get(k, 0) + v
        healthy = [a.healthy for a in answers.values() if a.healthy is not None]
        caps = [a.capacity for a in answers.values() if a.capacity is not None]
        params, confidence, samples = combine_models({k: (a.params, a.confidence, a.samples) for k, a in answers.items()}, shares)
        return CellAnswer(
            rif=sum(a.rif for a in answers.values()),
            error_rate=sum(shares[k] * a.error_rate for k, a in answers.items()),
            counters=counters,
            healthy=max(healthy) if healthy else None,
            params=params,
            confidence=confidence,
            samples=samples,
            capacity=max(caps) if caps else None,
            waiting=max(a.waiting for a in answers.values()),
            kv_usage=max(a.kv_usage for a in answers.values()),
            live=len(answers),
        )


def combine_models(fits: Mapping[int, tuple[tuple[float, float, float, float] | None, float, int]],
                   shares: Mapping[int, float]) -> tuple[tuple[float, float, float, float] | None, float, int]:
    """One ``(params, confidence, samples)`` from each replica's fit and traffic share: the rescaled curves
    averaged with weights = samples (equal when none has samples); a mean that loses ``c < a/b`` falls back
    to the best-sampled replica's rescaled curve."""
    with_model = {k: f for k, f in fits.items() if f[0] is not None and shares.get(k, 0.0) > 0}
    if not with_model:
        return None, 0.0, 0
    samples = sum(f[2] for f in with_model.values())
    weights = {k: (f[2] if samples > 0 else 1.0) for k, f in with_model.items()}
    total = sum(weights.values())
    scaled = {k: rescale(f[0], shares[k]) for k, f in with_model.items() if f[0] is not None}
    mean = tuple(sum(weights[k] * scaled[k][i] for k in scaled) / total for i in range(4))
    confidence = sum(weights[k] * f[1] for k, f in with_model.items()) / total
    a, b, c, _ = mean
    if not c * b < a:
        best = max(with_model, key=lambda k: (with_model[k][2], -k))
        return scaled[best], confidence, samples
    return (mean[0], mean[1], mean[2], mean[3]), confidence, samples
