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

The deadline alone cannot tell a congested server from a workload of long requests: with generations
4–10× the default a server's stay is near a third of the timeout even when it is not past its knee, and
refusing there refuses requests that would have finished (34 % refused at 10×, tuning seed 31). With
``slowdown`` set the leaf also refuses only a server that many times slower than its own uncongested stay
(:class:`StayFloor`: the lowest recent mean of its Little's-law stay), which a congested server is and an
uncongested one serving long requests is not. A server held near saturation from its start never shows an
uncongested stay and would learn a congested one (slowdown 2 lifted Disc-RIF's mean at 95 % load 1.4 % on
seed 107), so the floor counts only up to ``floor_cap`` × the cell model's unloaded latency. Off by
default: on fresh seed 113, slowdown 3 with the cap cut failures at 4× longer outputs from 2.5–2.6 % to
0.6 % (every policy under its bound, refusing none) and at 10× from 36 % to 16–18 %, and moved 95 % load's
mean by 0.2 % at most, but Disc-Lat's timeouts at 10× missed the bound (``research/routing-stress/admission-slowdown3.md``).
Operators serving long generations set it.
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
    #: Refuse only when the expected stay is also this many times the server's uncongested stay
    #: (:func:`uncongested_stay`; 0: off, the deadline alone decides; 3 for long generations, module docstring).
    slowdown: float = 0.0
    #: The floor counts as uncongested only up to this many times the latency model's unloaded latency
    #: ``a``: a server never seen uncongested (held near saturation, or a leaf started under overload)
    #: learns a congested floor, which would lift the limit; the model's ``a`` (its prior until fitted)
    #: bounds it. 4: on tuning seeds 31 and 107 caps 3–5 all kept 95 % load at the deadline-only rule, and
    #: 2 or less refused up to 3 % of long generations, whose uncongested stay exceeds ``a`` by their KV
    #: context's growth. 0: no cap.
    floor_cap: float = 4.0
    #: Time constant of the served stays' mean whose floor is the uncongested stay (seconds).
    stay_window_s: float = 60.0
    #: The floor rises by at most a factor e per this many seconds, so a lasting change to longer requests
    #: is learnt, while a congestion episode of a few minutes barely moves it.
    floor_rise_s: float = 600.0

    def __post_init__(self) -> None:
        if not self.deadline_s > 0:
            raise ValueError(f"admission deadline_s must be > 0 (inf: none): {self.deadline_s}")
        if not 0.0 < self.fraction <= 1.0:
            raise ValueError(f"admission fraction must be in (0, 1]: {self.fraction}")
        if not self.window_s > 0:
            raise ValueError(f"admission window_s must be > 0: {self.window_s}")
        if self.min_inflight < 1:
            raise ValueError(f"admission min_inflight must be >= 1: {self.min_inflight}")
        if not (math.isfinite(self.slowdown) and self.slowdown >= 0):
            raise ValueError(f"admission slowdown must be >= 0 (0: off): {self.slowdown}")
        if not (math.isfinite(self.floor_cap) and self.floor_cap >= 0):
            raise ValueError(f"admission floor_cap must be >= 0 (0: none): {self.floor_cap}")
        if not (self.stay_window_s > 0 and self.floor_rise_s > 0):
            raise ValueError(f"admission stay_window_s and floor_rise_s must be > 0: {self.stay_window_s}, {self.floor_rise_s}")

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


class StayFloor:
    """One server's uncongested stay: the lowest mean (over ``window_s``, decayed) of its Little's-law stay
    ``n / X`` sampled at each completion, allowed to rise by a factor e per ``rise_s`` of sampled time. Little's law, not the
    served requests' own stays: those are the short ones first (after a start, every long one is still
    running) and miss the cancelled ones, so their mean reads a server faster than it is. Pure: time
    passed in (:func:`record_done` feeds it)."""

    __slots__ = ("_floor", "_floor_t", "_sum", "_t", "_weight", "min_weight", "rise_s", "window_s")

    def __init__(self, window_s: float, rise_s: float, min_weight: float = 8.0) -> None:
        self.window_s, self.rise_s, self.min_weight = window_s, rise_s, min_weight
        self._sum = self._weight = self._t = 0.0
        self._floor = math.inf
        self._floor_t = 0.0

    def record(self, now: float, stay: float) -> None:
        """A stay sample at ``now``. The floor moves once the mean has ``min_weight`` samples behind it."""
        if now > self._t:
            k = math.exp(-(now - self._t) / self.window_s)
            self._sum *= k
            self._weight *= k
            self._t = now
        self._sum += stay
        self._weight += 1.0
        if self._weight >= self.min_weight:
            self._floor = min(self._risen(now), self._sum / self._weight)
            self._floor_t = now

    def _risen(self, now: float) -> float:
        # Only time with evidence lifts it: a gap with no completion counts as one window at most, so a
        # server idle for an hour, then flooded, is not judged by a floor that rose while nothing was seen.
        dt = min(max(0.0, now - self._floor_t), self.window_s)
        return self._floor * math.exp(dt / self.rise_s)  # inf stays inf

    def value(self, now: float) -> float:
        """The uncongested stay in seconds (0 before enough requests were served: no floor yet)."""
        return 0.0 if self._floor == math.inf else self._risen(now)


def record_done(rate: CompletionRate, floor: StayFloor | None, now: float, inflight: int) -> None:
    """A request finished (served) at a server now holding ``inflight``: count it, and once the rate has
    a window behind it, sample the server's stay ``inflight / rate`` into its floor."""
    rate.record(now)
    if floor is not None and now - rate.since >= rate.window_s:
        floor.record(now, inflight / rate.rate(now))


def uncongested_stay(floor: StayFloor | None, now: float, cfg: AdmissionConfig, unloaded_s: float = math.inf) -> float:
    """The stay :func:`admits` takes for a server's uncongested pace: its floor, at most ``cfg.floor_cap`` ×
    the latency model's unloaded latency ``unloaded_s`` (0: no floor yet). One function, so the leaf's
    gauge shows what admission compares with."""
    return _capped(floor.value(now) if floor is not None else 0.0, cfg, unloaded_s)


def _capped(floor_s: float, cfg: AdmissionConfig, unloaded_s: float) -> float:
    return min(floor_s, cfg.floor_cap * unloaded_s) if floor_s > 0.0 and cfg.floor_cap > 0 else floor_s


def admits(inflight: int, rate: CompletionRate, now: float, cfg: AdmissionConfig, floor: StayFloor | None = None,
           unloaded_s: float = math.inf) -> bool:
    """Whether a server holding ``inflight`` requests (this one not counted) takes one more: False only
    when its expected stay ``(inflight + 1) / rate`` reaches ``cfg.target_s`` and, with ``cfg.slowdown``,
    that many times its uncongested stay (``floor``, at most ``cfg.floor_cap`` × ``unloaded_s``, the
    latency model's unloaded latency). Before the floor has formed only a stuck server is
    refused: the rate lags arrivals by a stay at a start, and the prior's unloaded latency, tried in its
    place, refused 1–3 % more of the long requests of tuning seed 31 in the first seconds of each run."""
    if not cfg.enabled or inflight < cfg.min_inflight or now - rate.since < cfg.window_s or cfg.deadline_s == math.inf:
        return True
    x = rate.rate(now)
    if x <= 0.0:  # no completion in a whole window while holding ``min_inflight``: stuck, refuse
        return False
    limit = cfg.target_s
    if cfg.slowdown > 0:
        base = floor.value(now) if floor is not None else 0.0
        if base <= 0.0:
            return True
        limit = max(limit, cfg.slowdown * _capped(base, cfg, unloaded_s))
    return inflight + 1 < x * limit
