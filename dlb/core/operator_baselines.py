"""What operators run instead of DLB (DESIGN §3 "Operator baselines"), as pure decision logic.

Each policy is a root object with the :class:`~dlb.core.router.Router` surface, modelling the
Envoy-native configuration the real path serves (no DLB decision per request):

- :class:`LrGlobalRoot` (``lr-global``): every server of every allowed cell in one pool, Envoy
  ``LEAST_REQUEST`` = power of two choices on the active requests *this root* has in flight per host.
  The network delay is paid but not seen. It names the server itself (``pick_server``).
- :class:`LocalityFailoverRoot` (``locality-failover``): the source cell at priority 0, the other
  allowed cells at priorities 1..n by RTT, Envoy's priority load with overprovisioning factor 1.4 from
  each priority's healthy fraction, spill-over to the next priority; the leaf's least-request pick
  inside the cell.
- :class:`HubScoreRoot` (``hub-score``): per request the allowed cell with the best weighted score of
  pool-average queue depth, KV-cache utilisation and RTT (0.4 / 0.4 / 0.2), like llm-d's hub picker.

Health, modelled simply: *active health checks* see which servers are up (the live replica count a
probe carries; a cell's servers ``0..k_live−1`` are up, the engine's outage convention), and
*outlier detection* is Envoy's ``consecutive_5xx`` with its defaults (:class:`OutlierConfig`), fed by
the replies this root receives. Envoy's panic threshold (50 %) is modelled: ``lr-global`` then picks
among all its hosts, ``locality-failover`` splits by host count when every priority is in panic.

Hosts are numbered cell-major: cell j's servers are ``offset[j] .. offset[j] + replicas[j] − 1`` with
``offset`` the running sum of replicas (:func:`host_offsets`), the simulator's numbering.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dlb.core.latency_model import LatencyParams
from dlb.core.router import NO_CELL
from dlb.core.topology import Topology

#: Envoy's default overprovisioning factor (``overprovisioning_factor`` 140 in percent).
OVERPROVISIONING = 1.4


def host_offsets(replicas: Sequence[float]) -> list[int]:
    """First global host id of each cell (cell-major numbering), plus the total at the end."""
    out = [0]
    for k in replicas:
        out.append(out[-1] + int(round(k)))
    return out


def priority_loads(healthy: Sequence[int], total: Sequence[int], overprovisioning: float = OVERPROVISIONING,
                   panic_percent: float = 50.0) -> list[int]:
    """Envoy's per-priority load in percent (sums to 100), from each priority's healthy host count.

    Envoy's integer arithmetic (``LoadBalancerBase::recalculatePerPriorityState``): health_p =
    min(100, ⌊100·factor·healthy_p / total_p⌋); priorities take health in order until 100 is reached
    (spill-over); if the health sum is under 100 the loads are scaled to it; the rounding remainder
    goes to the first priority with health. *Total panic*: when the health sum is under 100 and every
    priority has fewer than ``panic_percent`` % of its hosts healthy (or none is healthy at all), the
    load follows host counts regardless of health.
    """
    factor = int(round(overprovisioning * 100))
    health = [min(100, factor * h // t) if t > 0 else 0 for h, t in zip(healthy, total, strict=True)]
    norm = min(100, sum(health))
    if norm < 100 and all(t == 0 or 100.0 * h / t < panic_percent for h, t in zip(healthy, total, strict=True)):
        return _split(list(total), sum(total))
    return _split(health, norm)


def _split(weights: list[int], norm: int) -> list[int]:
    """100 split as ⌊100·w/norm⌋ each, capped by what is left, remainder to the first non-zero weight."""
    if norm <= 0:
        return [100] + [0] * (len(weights) - 1)
    left = 100
    loads = []
    for w in weights:
        v = min(left, w * 100 // norm)
        loads.append(v)
        left -= v
    if left:
        loads[next(p for p, w in enumerate(weights) if w > 0)] += left
    return loads


@dataclass(frozen=True)
class OutlierConfig:
    """Envoy's outlier-detection defaults for ``consecutive_5xx``."""

    consecutive_5xx: int = 5
    base_ejection_s: float = 30.0
    max_ejection_s: float = 300.0
    #: Envoy's ``interval``: how often an ejected host's multiplier decays while it stays healthy.
    interval_s: float = 10.0
    #: At most this percentage of the cluster ejected at once (Envoy's default 10).
    max_ejection_percent: float = 10.0


class OutlierDetector:
    """Per-host ``consecutive_5xx`` ejection with Envoy's growing ejection time.

    A host is ejected after ``consecutive_5xx`` failures in a row (unless the cluster already has
    ``max_ejection_percent`` ejected) for ``base × multiplier`` (capped at ``max_ejection_s``);
    the multiplier grows by one per ejection and decays by one per ``interval_s`` spent un-ejected.
    Un-ejection is exact in time (Envoy checks on its interval timer, up to 10 s later).
    """

    def __init__(self, hosts: int, config: OutlierConfig | None = None) -> None:
        self.config = config or OutlierConfig()
        self.hosts = hosts
        self.fails = [0] * hosts
        self.until = [-math.inf] * hosts  # ejected while now < until
        self.mult = [0] * hosts
        self.back_at = [0.0] * hosts  # when the multiplier last stopped growing (un-ejection)

    def ejected(self, host: int, now: float) -> bool:
        return now < self.until[host]

    def ejected_count(self, now: float) -> int:
        return sum(1 for u in self.until if now < u)

    def record(self, host: int, ok: bool, now: float) -> bool:
        """One reply from ``host``; True if this reply ejected it."""
        if ok:
            self.fails[host] = 0
            return False
        self.fails[host] += 1
        c = self.config
        if self.fails[host] < c.consecutive_5xx or self.ejected(host, now):
            return False
        if 100.0 * self.ejected_count(now) / self.hosts >= c.max_ejection_percent:
            return False
        if self.until[host] > -math.inf:  # un-ejected before: decay the multiplier for the quiet time
            quiet = max(0.0, now - self.until[host])
            self.mult[host] = max(0, self.mult[host] - int(quiet // c.interval_s))
        self.mult[host] += 1
        self.until[host] = now + min(c.max_ejection_s, c.base_ejection_s * self.mult[host])
        self.fails[host] = 0
        return True


def least_request_p2c(hosts: Sequence[int], active: Sequence[int], rng: np.random.Generator, choice_count: int = 2) -> int:
    """Envoy ``LEAST_REQUEST`` with equal weights: ``choice_count`` hosts drawn at random (with
    replacement), the one with the fewest active requests wins, the first drawn on a tie."""
    m = len(hosts)
    best = hosts[int(rng.random() * m)]
    for _ in range(choice_count - 1):
        h = hosts[int(rng.random() * m)]
        if active[h] < active[best]:
            best = h
    return best


def hub_scores(queue: np.ndarray, kv: np.ndarray, rtt: np.ndarray, weights: tuple[float, float, float] = (0.4, 0.4, 0.2)) -> np.ndarray:
    """Weighted score (higher is better) of candidate cells, each signal in [0, 1]:

    - queue: min–max over the candidates, ``(q_max − q)/(q_max − q_min)`` (llm-d's queue scorer),
      1 for all when they are equal;
    - KV: ``1 − utilisation`` (llm-d's KV-cache-utilisation scorer), utilisation clipped to [0, 1];
    - locality: min–max on RTT like the queue, so the nearest candidate scores 1 and the farthest 0.
    """
    def minmax(x: np.ndarray) -> np.ndarray:
        lo, hi = float(x.min()), float(x.max())
        return np.ones_like(x) if hi - lo <= 0 else (hi - x) / (hi - lo)

    wq, wk, wl = weights
    return wq * minmax(queue) + wk * (1.0 - np.clip(kv, 0.0, 1.0)) + wl * minmax(rtt)


class _HealthView:
    """What a root's Envoy knows of host health: servers up (active health checks, from probes) and
    its own outlier ejections (from the replies it receives)."""

    def __init__(self, topology: Topology, outlier: OutlierConfig | None) -> None:
        self.offsets = host_offsets(topology.replicas.tolist())
        self.cell_of = [j for j in range(topology.n) for _ in range(self.offsets[j + 1] - self.offsets[j])]
        self.up = [int(round(k)) for k in topology.replicas]
        self.outliers = OutlierDetector(self.offsets[-1], outlier)

    def on_probe(self, cell: int, replicas: float | None) -> None:
        if replicas is not None:
            self.up[cell] = int(round(replicas))

    def healthy_hosts(self, cell: int, now: float) -> list[int]:
        o = self.offsets[cell]
        return [h for h in range(o, o + self.up[cell]) if not self.outliers.ejected(h, now)]

    def on_reply(self, now: float, server: int, ok: bool) -> None:
        self.outliers.record(server, ok, now)


class _HealthFollower:
    """What the Envoy-native baselines share: health from probes (servers up) and their own replies
    (outlier ejection), and a cached candidate set rebuilt when health may have changed."""

    health: _HealthView
    _valid_until: float

    def on_probe(self, cell: int, now: float, rif: float, params: LatencyParams | None = None,
                 error_rate: float = 0.0, confidence: float = 1.0, replicas: float | None = None,
                 seen_until: float | None = None, capacity: float | None = None) -> None:
        if replicas is not None and int(round(replicas)) != self.health.up[cell]:
            self.health.on_probe(cell, replicas)
            self._valid_until = -math.inf

    def tick(self, now: float) -> None:
        """Nothing periodic: health changes arrive with probes and replies."""


class LrGlobalRoot(_HealthFollower):
    """``lr-global``: one pool of every server of every allowed cell, P2C on this root's active requests.

    The simulator calls ``pick_server`` instead of ``pick`` (the request then bypasses the leaf's pick)
    and ``on_reply`` when the answer is back, so the active count is what this Envoy sees: requests it
    sent and has not heard back from, network time included. Panic (Envoy's 50 % threshold): when
    fewer than half the pool is healthy, pick among all hosts of the pool.
    """

    def __init__(self, topology: Topology, source: int, rng: np.random.Generator,
                 outlier: OutlierConfig | None = None, choice_count: int = 2, panic_percent: float = 50.0) -> None:
        self.rng = rng
        self.health = _HealthView(topology, outlier)
        self.cells = [j for j in range(topology.n) if topology.allowed[source, j]]
        self.active = [0] * self.health.offsets[-1]
        self.choice_count = choice_count
        self.panic = panic_percent / 100.0
        self._pool: list[int] = []
        self._all = [h for j in self.cells for h in range(self.health.offsets[j], self.health.offsets[j + 1])]
        self._valid_until = -math.inf  # the healthy pool is rebuilt when health may have changed

    def _healthy(self, now: float) -> list[int]:
        if now >= self._valid_until:
            pool = [h for j in self.cells for h in self.health.healthy_hosts(j, now)]
            self._pool = pool if len(pool) >= self.panic * len(self._all) and pool else self._all
            ej = [u for u in self.health.outliers.until if u > now]
            self._valid_until = min(ej) if ej else math.inf
        return self._pool

    def pick_server(self, now: float) -> int:
        """The global host id for one request (``NO_CELL`` if the pool is empty); counts it active."""
        pool = self._healthy(now)
        if not pool:
            return NO_CELL
        h = least_request_p2c(pool, self.active, self.rng, self.choice_count)
        self.active[h] += 1
        return h

    def pick(self, now: float, session: str | None = None) -> int:
        """The cell of :meth:`pick_server`'s host (for callers that route by cell only)."""
        h = self.pick_server(now)
        return NO_CELL if h == NO_CELL else self.health.cell_of[h]

    def on_reply(self, now: float, server: int, ok: bool, picked: bool = True) -> None:
        """The answer for a request this root sent to ``server`` arrived (``ok`` False: a 5xx)."""
        if picked:
            self.active[server] -= 1
        before = self.health.outliers.until[server]
        self.health.on_reply(now, server, ok)
        if self.health.outliers.until[server] != before:
            self._valid_until = -math.inf



class LocalityFailoverRoot(_HealthFollower):
    """``locality-failover``: Envoy priorities by locality, spill-over by health, leaf pick inside.

    Priority 0 is the source cell, then the other allowed cells one priority each by RTT; each
    request draws a priority from :func:`priority_loads` on the healthy hosts (up and not ejected by
    this root). Overload is seen only through health: ejections after consecutive 5xx replies.
    """

    def __init__(self, topology: Topology, source: int, rng: np.random.Generator,
                 outlier: OutlierConfig | None = None, overprovisioning: float = OVERPROVISIONING) -> None:
        self.rng = rng
        self.health = _HealthView(topology, outlier)
        others = sorted((j for j in range(topology.n) if topology.allowed[source, j] and j != source),
                        key=lambda j: (topology.tau[source, j], j))
        self.order = ([source] if topology.allowed[source, source] else []) + others
        self.total = [self.health.offsets[j + 1] - self.health.offsets[j] for j in self.order]
        self.overprovisioning = overprovisioning
        self._cum: list[int] = []
        self._valid_until = -math.inf

    def loads(self, now: float) -> list[int]:
        """The current per-priority load (percent), in :attr:`order`."""
        healthy = [len(self.health.healthy_hosts(j, now)) for j in self.order]
        return priority_loads(healthy, self.total, self.overprovisioning)

    def pick(self, now: float, session: str | None = None) -> int:
        if not self.order:
            return NO_CELL
        if now >= self._valid_until:
            self._cum = list(np.cumsum(self.loads(now)))
            ej = [u for u in self.health.outliers.until if u > now]
            self._valid_until = min(ej) if ej else math.inf
        x = self.rng.random() * 100.0
        for p, c in enumerate(self._cum):
            if x < c:
                return self.order[p]
        return self.order[-1]

    def on_reply(self, now: float, server: int, ok: bool, picked: bool = False) -> None:
        """The answer from ``server`` (the leaf picked it) arrived; feeds outlier detection."""
        if self.health.outliers.record(server, ok, now):
            self._valid_until = -math.inf



class HubScoreRoot:
    """``hub-score``: per request the allowed cell with the best :func:`hub_scores`, on the signals of
    the last probe (``on_signals``: pool-average queue depth and KV utilisation). Ties go to the
    nearer cell. Like any per-request argmin on stale signals it herds between probes; that is the
    behaviour being modelled.
    """

    def __init__(self, topology: Topology, source: int, weights: tuple[float, float, float] = (0.4, 0.4, 0.2)) -> None:
        self.cells = np.array([j for j in range(topology.n) if topology.allowed[source, j]], dtype=np.int64)
        # Candidates ordered by RTT so argmax's first-wins tie rule prefers the nearer cell.
        rtt = 2.0 * topology.tau[source, self.cells]
        order = np.argsort(rtt, kind="stable")
        self.cells, self.rtt = self.cells[order], rtt[order]
        self.weights = weights
        self.queue = np.zeros(topology.n)
        self.kv = np.zeros(topology.n)
        self.seen = np.zeros(topology.n, bool)
        self.signalled = False
        self._best = NO_CELL

    def on_signals(self, cell: int, queue_depth: float, kv_utilisation: float, up: bool = True) -> None:
        """A probe's load signals for ``cell``: mean waiting requests per live server, mean KV use
        (``up`` False: no server of the cell is up, so it is no candidate)."""
        self.queue[cell] = queue_depth
        self.kv[cell] = kv_utilisation
        self.seen[cell] = up
        self.signalled = True
        self._best = NO_CELL  # recompute on the next pick

    def pick(self, now: float, session: str | None = None) -> int:
        if self._best == NO_CELL:
            live = self.seen[self.cells]
            if not live.any():  # before the first probe the hub knows only distance; after, all are down
                return NO_CELL if self.signalled else int(self.cells[0])
            cells, rtt = self.cells[live], self.rtt[live]
            s = hub_scores(self.queue[cells], self.kv[cells], rtt, self.weights)
            self._best = int(cells[int(np.argmax(s))])
        return self._best

    def on_probe(self, cell: int, now: float, rif: float, params: LatencyParams | None = None,
                 error_rate: float = 0.0, confidence: float = 1.0, replicas: float | None = None,
                 seen_until: float | None = None, capacity: float | None = None) -> None:
        """The load signals come through :meth:`on_signals`; nothing else in a probe is read."""

    def tick(self, now: float) -> None:
        """Nothing periodic."""
