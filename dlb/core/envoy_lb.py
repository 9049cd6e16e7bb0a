"""Envoy's weighted ``ROUND_ROBIN`` and ``LEAST_REQUEST`` over a few hosts, as Envoy runs them (pure, no clock).

Why a model of Envoy's own code and not "pick in proportion to the weights": the native mechanisms'
quality in the simulator is only worth what the model of Envoy's pick is. Read from Envoy's source
(``least_request_lb.cc``, ``round_robin_lb.h``, ``load_balancer_impl.cc``, ``edf_scheduler.h``):

- **Weights unequal**: an earliest-deadline-first schedule. A pick pops the host with the earliest
  deadline (ties: first inserted), moves the schedule's clock to that deadline and puts the host back
  at ``clock + 1 / weight``. ``ROUND_ROBIN``: ``weight`` is the EDS weight. ``LEAST_REQUEST``:
  ``weight / (active + 1)^active_request_bias`` taken *at that moment* (``active``: this Envoy's
  requests at the host not answered yet, before the one being picked); other hosts keep the deadline
  of their last pick, so their active counts act only when they are picked or the schedule is rebuilt.
- **A host-set update** (an EDS push that changes a weight or a health status) rebuilds the schedule
  from every host's weight at that moment, started at a pseudo-random point of it
  (``createWithPicks``): modelled as each host's first deadline ``u / weight``, ``u`` uniform in (0, 1].
- **Weights all equal**: ``ROUND_ROBIN`` cycles through the hosts from a random start;
  ``LEAST_REQUEST`` draws ``choice_count`` hosts with replacement and takes the one with the fewest
  active requests (the first drawn on a tie).
- Only healthy hosts are candidates (panic mode off: the control plane never marks them all unhealthy).
"""

from __future__ import annotations

import heapq

import numpy as np

ROUND_ROBIN = "ROUND_ROBIN"
LEAST_REQUEST = "LEAST_REQUEST"


class EnvoyLb:
    """One Envoy's ``lb_policy`` over hosts ``0..n-1`` of one cluster (weights pushed by :meth:`update`)."""

    def __init__(self, weights: np.ndarray, rng: np.random.Generator, lb_policy: str = ROUND_ROBIN,
                 active_request_bias: float = 1.0, choice_count: int = 2) -> None:
        if lb_policy not in (ROUND_ROBIN, LEAST_REQUEST):
            raise ValueError(f"lb_policy must be {ROUND_ROBIN} or {LEAST_REQUEST}: {lb_policy}")
        self.rng = rng
        self.least_request = lb_policy == LEAST_REQUEST
        self.bias = active_request_bias if self.least_request else 0.0
        self.choice_count = choice_count
        self.active = np.zeros(len(weights), dtype=np.int64)
        self._heap: list[tuple[float, int, int]] = []
        self._clock = 0.0
        self._order = 0
        self._rr = 0
        self._hosts: list[int] = []
        self.weights = np.zeros(len(weights))
        self.update(weights, np.asarray(weights) > 0)

    def host_weight(self, h: int) -> float:
        """The schedule's weight of host ``h`` now (Envoy's ``hostWeight``)."""
        w = float(self.weights[h])
        if self.bias == 0.0:
            return w
        return w / (float(self.active[h]) + 1.0) ** self.bias

    def update(self, weights: np.ndarray, healthy: np.ndarray) -> None:
        """An EDS push: new weights (> 0 for every host in the cluster) and health; rebuilds the schedule."""
        self.weights = np.asarray(weights, dtype=float)
        self._hosts = [int(h) for h in np.flatnonzero(np.asarray(healthy, dtype=bool) & (self.weights > 0))]
        self._heap = []
        self._clock = 0.0
        self._rr = int(self.rng.integers(1 << 30))
        if len(self._hosts) <= 1 or len({float(self.weights[h]) for h in self._hosts}) == 1:
            return  # one host, or equal weights: no schedule (unweighted pick)
        for h in self._hosts:
            self._push(h, 1.0 - float(self.rng.random()))

    def _push(self, h: int, u: float = 1.0) -> None:
        heapq.heappush(self._heap, (self._clock + u / self.host_weight(h), self._order, h))
        self._order += 1

    def pick(self) -> int:
        """The host for one request (-1: no healthy host); counts it active."""
        hosts = self._hosts
        if not hosts:
            return -1
        if self._heap:
            deadline, _, h = heapq.heappop(self._heap)
            self._clock = deadline
            self._push(h)
        elif not self.least_request:
            h = hosts[self._rr % len(hosts)]
            self._rr += 1
        else:
            m = len(hosts)
            h = hosts[int(self.rng.random() * m)]
            for _ in range(self.choice_count - 1):
                other = hosts[int(self.rng.random() * m)]
                if self.active[other] < self.active[h]:
                    h = other
        self.active[h] += 1
        return h

    def answered(self, h: int) -> None:
        """The request sent to ``h`` got its answer (or failed): no longer active."""
        self.active[h] -= 1
