"""Leaf admission: refuse (429) a request its server would serve only near the client's timeout.

Why: a continuous-batching server past its batch knee shares its throughput among everything it holds
(processor sharing), so under overload every request in it slows down together, and with cancelling
client timeouts they are cut after most of their work was done. In the simulator's outage on tuning
seed 31 (batched, 60-s timeout), 54–59 % of the servers' busy time during the outage went to requests
later cancelled, nearly all of them cancelled in service, not in a queue
(``research/routing-stress/admission.md``). Refusing at once the requests that would push a server
there keeps its work on requests that finish; a refusal counts as a failure, as the timeout would have.

Rule, per server, from what a leaf already knows (each server's requests in flight ``n``) and one
thing it measures (each server's completions per second ``X``): by Little's law a request sent now
stays about ``(n + 1) / X`` seconds. The leaf refuses it when that is at least ``fraction`` × the
client's deadline (a third). Little's law needs no latency model and reads a collapsing server correctly: when
requests stop finishing, ``X`` falls and the estimate rises. Guards: fewer than ``min_inflight`` in
flight (too few for the estimate, and not a server in trouble) or a server watched for less than one
``window_s`` (no rate yet) always admits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class AdmissionConfig:
    """When a leaf refuses a request at its picked server; see the module docstring."""

    #: On since its verdict on seed 89's outages (research/routing-stress/admission.md): DLB 0.72–0.73 × lr-global's
    #: mean and 1.6–2.1 % client-visible failures (off: 0.99–1.05 ×, 3.4–4.0 %); nothing changed at 80 % load.
    enabled: bool = True
    #: The client's deadline: the endpoint's request timeout in seconds (inf: none, never refuse).
    deadline_s: float = math.inf
    #: Refuse when the expected stay reaches this share of the deadline. Under processor sharing a request's
    #: stay grows with its size: at a third, requests up to the simulated workload's p97.5 output length
    #: (3× its mean) still finish. Tuned on seed 31's outage among 0.25, 0.33, 0.5 and 0.75: the fewest
    #: client-visible failures (0.25 had a ~1 s lower mean but 0.1–0.4 point more failures).
    fraction: float = 0.33
    #: Time constant of the completion-rate estimate (seconds), and the warm-up before any refusal.
    window_s: float = 10.0
    #: Never refuse at a server with fewer requests in flight than this.
    min_inflight: int = 8

    def __post_init__(self) -> None:
        if not self.deadline_s > 0:
            raise ValueError(f"admission deadline_s must be > 0 (inf: none): {self.deadline_s}")
        if not 0.0 < self.fraction <= 1.0:
            raise ValueError(f"admission fraction must be in (0, 1]: {self.fraction}")
        if not self.window_s > 0:
            raise ValueError(f"admission window_s must be > 0: {self.window_s}")
        if self.min_inflight < 1:
            raise ValueError(f"admission min_inflight must be >= 1: {self.min_inflight}")

    @property
    def target_s(self) -> float:
        """The longest expected stay admitted (inf without a deadline)."""
        return self.fraction * self.deadline_s


class CompletionRate:
    """One server's completions per second: an exponentially decayed count over ``window_s``, corrected
    for the time it has been watched (so the first windows are not biased low). Pure: time passed in."""

    __slots__ = ("_count", "_t", "since", "window_s")

    def __init__(self, now: float, window_s: float) -> None:
        self.window_s = window_s
        self.since = now
        self._count = 0.0
        self._t = now

    def reset(self, now: float) -> None:
        """Start again (the server came back): what it did before says nothing now."""
        self.since = now
        self._count = 0.0
        self._t = now

    def record(self, now: float) -> None:
        """One request finished (served, not failed) at ``now``."""
        if now > self._t:
            self._count *= math.exp(-(now - self._t) / self.window_s)
            self._t = now
        self._count += 1.0

    def rate(self, now: float) -> float:
        """Completions per second (0 before the first); over the first window the estimate divides by the
        weight the watched time has had, ``window_s · (1 − e^(−age / window_s))``, not by ``window_s``."""
        age = now - self.since
        if age <= 0:
            return 0.0
        w = self.window_s
        count = self._count * math.exp(-(now - self._t) / w) if now > self._t else self._count
        return count / (w * -math.expm1(-age / w))


def admits(inflight: int, rate: CompletionRate, now: float, cfg: AdmissionConfig) -> bool:
    """Whether a server holding ``inflight`` requests (this one not counted) takes one more: False only
    when its expected stay ``(inflight + 1) / rate`` reaches ``cfg.target_s`` (module docstring)."""
    if not cfg.enabled or inflight < cfg.min_inflight or now - rate.since < cfg.window_s or cfg.deadline_s == math.inf:
        return True
    # No completion in a whole window while holding ``min_inflight``: the estimate is infinite, refuse.
    return inflight + 1 < rate.rate(now) * cfg.target_s
