"""The leaf's bookkeeping for one cell, pure and clock-free (callers pass ``now``).

What it does, and why here rather than in Envoy:

- **Pick a server**, by one of two rules (``pick_rule``):
  ``rif`` — power-of-d choices: sample ``d`` distinct usable servers and take the least loaded, where
  load = ``max(RIF counted by this leaf, running + waiting scraped from the server's vLLM metrics) /
  weight``. The leaf's own count is exact and immediate (incremented at pick time); the scraped number
  is stale but also sees work that did not come through this leaf. With ``d ≥ n`` this is
  join-the-shortest-queue. Random sampling keeps several leaf replicas from herding.
  ``prequal`` (what the paper's leaf does) — balance *tokens waiting* with Prequal's probe pool and
  hot-cold rule (:mod:`dlb.core.server_pick`). A probe of server i answers RIF as above and tokens
  waiting = ``max(tokens of the leaf's requests in flight there, scraped running + waiting × the mean
  request size) / weight``; a request's size is its prompt estimate (``content-length`` / 4 bytes per
  token: the leaf sees headers, not the body) plus ``expected_output_tokens``. A server whose scraped
  KV-cache usage is at ``kv_full`` or more cannot admit anything new, so its probe reads as hot.
- **Count RIF** at pick time, keyed by Envoy's ``x-request-id``, and release it when the access log
  reports the request finished (or after ``max_age_s``, so a lost log entry cannot leak RIF forever).
  Without a leaf ext_proc (Envoy ``LEAST_REQUEST`` picks), the access log's *start* entries open the
  same records, so RIF is counted either way.
- **Measure**: each completion gives a (cell RIF at arrival, latency) sample for
  :class:`LatencyEstimator` and an outcome for :class:`ErrorTracker` (both from the routing core).
- **Passive health**: ``eject_after`` consecutive failures of one server remove it from picking for
  ``eject_s``; so do failed scrapes and the leaf Envoy's own verdict (:meth:`LeafState.set_envoy_view`);
  if every server is out we pick among all (fail open, never a local 503).
- **Admission** (:mod:`dlb.core.admission`; with a deadline, the endpoints' longest timeout): a request whose picked server
  would, by Little's law on this leaf's requests there (its RIF ÷ its completions per second), keep it
  past a share of the clients' timeout is refused (:data:`REFUSED`, a 429) instead of slowing that
  server's whole batch.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from dlb.core.admission import AdmissionConfig, CompletionRate, StayFloor, admits, record_done
from dlb.core.bfio import DpBalancer
from dlb.core.estimator import ErrorTracker, EstimatorConfig, LatencyEstimator
from dlb.core.fit import Censored
from dlb.core.latency_model import LatencyParams
from dlb.core.server_pick import PrequalConfig, ProbePool

UNKNOWN = -1
#: :meth:`LeafState.pick` outcomes that name no server: the request is held for a DP rank, refused
#: because the group's hold queue is full, or refused by admission (:mod:`dlb.core.admission`).
HELD = -2
HOLD_FULL = -3
REFUSED = -4
PICK_RULES = ("rif", "prequal")
#: Bytes of request body per prompt token, for the size estimate (JSON chat bodies: ~4 for English).
BYTES_PER_TOKEN = 4.0


@dataclass
class ServerState:
    address: str  # "ip:port" as Envoy's ORIGINAL_DST cluster expects it
    weight: float = 1.0
    rif: int = 0  # requests this leaf sent there and has not seen finish
    scraped: float = -1.0  # running + waiting from the server's metrics, -1 = unknown
    waiting: float = -1.0
    #: Most requests seen running while others waited: the server's concurrency limit (-1 unknown).
    batch_limit: float = -1.0
    kv_usage: float = -1.0  # scraped KV-cache usage 0..1, -1 = unknown
    tokens: float = 0.0  # estimated tokens of this leaf's requests in flight there
    scrape_failures: int = 0
    consecutive_errors: int = 0
    ejected_until: float = -math.inf
    picks: int = 0
    completed: int = 0
    errors: int = 0
    cut_streams: int = 0  # responses it started and then broke off (counted in errors too)
    #: Most requests seen in flight at the server when it answered 429 (its queue full): what it admits,
    #: running slots + queue limit (-1 unknown). The most, not the last: a refusal seen with fewer in
    #: flight (others just finished) must not make a busy server look full.
    admit_limit: float = -1.0
    #: The leaf Envoy routes nothing here (its health check or outlier detection took it out).
    envoy_out: bool = False
    #: This leaf's requests served there per second (admission only; made at the first pick it judges).
    done_rate: CompletionRate | None = None
    #: Its uncongested stay: the floor of its served requests' mean stay (admission only, made with done_rate).
    stay_floor: StayFloor | None = None


@dataclass
class InFlight:
    server: int  # index into servers, UNKNOWN when Envoy picked (LEAST_REQUEST mode)
    started: float
    cell_rif: int  # cell RIF at arrival, this request included
    tokens: float = 0.0  # size estimate charged to the server's tokens waiting
    owner: int | None = None  # the access-log stream that opened it (None: the agent's own pick)


@dataclass
class Completion:
    """One finished request as the access log reports it."""

    request_id: str
    upstream: str  # "ip:port" of the server Envoy talked to ("" if none)
    status: int  # HTTP status (0 = no response: reset, connect failure)
    duration_s: float  # leaf-side latency (first byte in → last byte out)
    client_abort: bool = False  # downstream went away: not the cell's fault, not a latency sample
    probe: bool = False  # the leaf's own background probe request (dlb.core.background)
    #: The server (or the connection to it) died after the response had started: the client got a
    #: status 200 and part of the body, then a reset. A failure of the server, not a fast success.
    cut: bool = False


def is_error(status: int) -> bool:
    """5xx, 429 (queue full) and "no response at all" count against the cell."""
    return status in (0, 429) or status >= 500


@dataclass
class LeafState:
    cell: str
    servers: list[ServerState]
    replicas: int
    prior: LatencyParams
    choices: int = 2
    max_age_s: float = 900.0
    eject_after: int = 3
    eject_s: float = 2.0
    scrape_fail_threshold: int = 2
    #: A server whose scrapes failed (counted unhealthy) counts healthy again only this long after its
    #: first good scrape: until the leaf Envoy's own health check has seen it too. Without the wait a
    #: cell whose servers all came back was reported usable ~0.1–0.5 s before Envoy would route to them.
    rejoin_hold_s: float = 0.0
    error_tau_s: float = 5.0
    estimator_config: EstimatorConfig = field(default_factory=EstimatorConfig)
    rng: np.random.Generator = field(default_factory=np.random.default_rng)
    pick_rule: str = "rif"  # "rif" (power-of-d on RIF) or "prequal" (tokens waiting, probe pool + HCL)
    prequal: PrequalConfig = field(default_factory=PrequalConfig)
    expected_output_tokens: float = 128.0
    kv_full: float = 0.95
    #: In-flight records kept at most. A cell runs thousands of requests at once, not 100,000: past this a
    #: start is refused (counted) rather than let one access-log stream grow the table and the cell's RIF
    #: without bound (issue 14 row 5: 200,000 fake starts black-holed a cell).
    max_inflight: int = 100_000
    #: Held requests a DP group's policy may choose among (the oldest ones); each is passed over at most
    #: this many times (:meth:`HoldQueue.window`). 1 = strict FIFO.
    hold_window: int = 16
    #: Refuse what the picked server would keep past a share of the clients' timeout (none by default: never).
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)

    #: Data-parallel servers: each balancer and its ranks' addresses in rank order (docs/bfio.md).
    dp_groups: list[tuple[DpBalancer, list[str]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.servers:
            raise ValueError(f"cell {self.cell}: a leaf needs at least one server")
        #: rank address → (its group's balancer, the group's rank addresses)
        self.dp_of = {a: (b, members) for b, members in self.dp_groups for a in members}
        self._dp_idx: dict[int, list[int]] = {}  # id(a group's members) → their server indices
        self._sole: tuple[DpBalancer, list[str]] | bool | None = False  # False: not yet worked out
        self.inflight: dict[str, InFlight] = {}
        self.by_address = {s.address: i for i, s in enumerate(self.servers)}
        # Its own dither stream per leaf (drawn from this leaf's generator): leaves sharing one seed
        # would dither every cell by the same factor, which changes no ranking.
        self.estimator = LatencyEstimator(self.prior, self.estimator_config,
                                          random.Random(f"{self.cell}-{int(self.rng.integers(1 << 62))}"))
        self.errors = ErrorTracker(self.error_tau_s)
        if self.pick_rule not in PICK_RULES:
            raise ValueError(f"cell {self.cell}: pick_rule must be one of {', '.join(PICK_RULES)}, got {self.pick_rule!r}")
        self.pool = ProbePool(self.prequal, random.Random(int(self.rng.integers(2**63))))
        self._tokens_sum = 0.0  # of every request size estimate seen, for the mean request size
        self._tokens_n = 0
        #: Requests this leaf saw start (the background prober counts silence from the last one).
        self.started = 0
        self.completed = 0
        self.failed = 0
        self.cut_streams = 0
        self.client_aborts = 0  # requests whose client (or root, at its timeout) left before the answer ended
        self.expired = 0
        self.unmatched = 0
        self.inflight_refused = 0
        self.admission_refused = 0  # requests refused by admission (429)
        self.orphaned = 0  # records dropped because the stream that opened them ended
        self._owned: dict[int, set[str]] = {}
        #: Outcomes each open access-log stream reported, taken back from ``errors`` when it ends.
        self._owner_errors: dict[int, ErrorTracker] = {}
        self._seq = 0
        self.last_held = ""  # the key of the request the last HELD pick holds

    # -- reconfiguration (xDS) ---------------------------------------------------------------------
    def set_servers(self, servers: list[tuple[str, float]], replicas: int | None = None) -> None:
        """Replace the server set (an EDS update), keeping the state of servers that stay.

        In-flight records follow their server to its new index; those on a removed server keep
        counting in the cell's RIF (the request is still running) but no longer in a server's.
        """
        if not servers:
            raise ValueError(f"cell {self.cell}: a leaf needs at least one server")
        old = self.servers
        new = []
        for address, weight in servers:
            i = self.by_address.get(address)
            st = old[i] if i is not None else ServerState(address)
            st.weight = float(weight)
            new.append(st)
        index = {st.address: i for i, st in enumerate(new)}
        if len(index) != len(new):
            raise ValueError(f"cell {self.cell}: duplicate server addresses in {[a for a, _ in servers]}")
        for rec in self.inflight.values():
            if rec.server != UNKNOWN:
                rec.server = index.get(old[rec.server].address, UNKNOWN)
        self.servers, self.by_address = new, index
        self._dp_idx, self._sole = {}, False
        self.pool.probes.clear()  # probes name servers by index, which just changed
        self.replicas = replicas if replicas else len(new)

    def set_dp_groups(self, groups: list[tuple[DpBalancer, list[str]]]) -> None:
        """Replace the data-parallel groups (a DpGroups update from the control plane).

        A group whose ranks and settings are unchanged keeps its balancer, and so the residents it
        counts; a changed or new one starts empty (requests already on its ranks finish unseen by it,
        which :meth:`DpBalancer.finish` ignores). Ranks not (yet) among the servers are never picked.
        """
        def settings(b: DpBalancer) -> tuple[object, ...]:
            hold = (b.hold.max_len, b.hold.deadline_s) if b.hold is not None else None
            return b.ranks, b.policy, b.horizon, b.mean_decode_tokens, b.slots, hold

        old = {tuple(members): bal for bal, members in self.dp_groups}
        kept = []
        for bal, members in groups:
            prev = old.get(tuple(members))
            kept.append((prev if prev is not None and settings(prev) == settings(bal) else bal, list(members)))
        of = {a: (b, m) for b, m in kept for a in m}
        if len(of) != sum(len(m) for _, m in kept):
            raise ValueError(f"cell {self.cell}: a rank address belongs to two DP groups")
        self.dp_groups, self.dp_of = kept, of
        self._dp_idx, self._sole = {}, False

    def set_policy(self, pick_rule: str, choices: int, window_s: float, refit_period_s: float) -> None:
        """Apply a new leaf policy (from the config over xDS) to the running leaf; the next pick uses it.

        Server state, in-flight records and samples are kept: a rule change must not look like a restart.
        The probe pool restarts empty when its size changes (its probes were taken for the old rule).
        """
        if pick_rule not in PICK_RULES:
            raise ValueError(f"cell {self.cell}: pick_rule must be one of {', '.join(PICK_RULES)}, got {pick_rule!r}")
        prequal = replace(self.prequal, probes_per_pick=choices, pool_size=max(PrequalConfig.pool_size, choices))  # as at start
        estimator_config = replace(self.estimator_config, window_s=window_s, refit_period_s=refit_period_s)  # validates
        self.pick_rule, self.choices = pick_rule, choices
        if prequal != self.prequal:
            self.prequal = prequal
            self.pool = ProbePool(prequal, self.pool.rng)
        self.estimator_config = self.estimator.config = estimator_config

    def set_admission(self, cfg: AdmissionConfig) -> None:
        """Apply admission settings (config or xDS). The servers' completion rates and stay floors are kept,
        unless a time constant they were made with changed: then they start again (a decayed count kept under
        another window would read a wrong rate), and each server is admitted until it has a new floor."""
        old = self.admission
        self.admission = cfg
        if (old.window_s, old.stay_window_s, old.floor_rise_s) != (cfg.window_s, cfg.stay_window_s, cfg.floor_rise_s):
            for s in self.servers:
                s.done_rate = s.stay_floor = None

    def _admits(self, i: int, now: float) -> bool:
        s = self.servers[i]
        if s.done_rate is None:
            s.done_rate = CompletionRate(now, self.admission.window_s)
            s.stay_floor = StayFloor(self.admission.stay_window_s, self.admission.floor_rise_s)
        return admits(s.rif, s.done_rate, now, self.admission, s.stay_floor, self.estimator.params.a)

    def set_prior(self, prior: LatencyParams) -> None:
        """A new fleet prior (from the control plane); the next refit shrinks toward it."""
        self.prior = prior
        self.estimator.reset_prior(prior)

    def set_envoy_view(self, out: set[str]) -> None:
        """The leaf Envoy's verdict (:mod:`dlb.envoy.host_health`): ``out`` are the servers it routes
        nothing to. They are neither picked nor counted healthy, so what probes report is what the
        Envoy can serve: a cell whose Envoy took every server out reports 0 healthy replicas."""
        for s in self.servers:
            s.envoy_out = s.address in out

    # -- picking ---------------------------------------------------------------------------------
    def _ok(self, s: ServerState, now: float) -> bool:
        return s.ejected_until <= now and s.scrape_failures < self.scrape_fail_threshold and not s.envoy_out

    def usable(self, now: float, among: Sequence[int] | None = None) -> list[int]:
        """Healthy servers (of ``among``: a gateway's subset hint, when given); all of them if none is."""
        pool = range(len(self.servers)) if among is None else among
        ok = [i for i in pool if self._ok(self.servers[i], now)]
        return ok or list(pool)

    def load(self, i: int) -> float:
        s = self.servers[i]
        return max(float(s.rif), s.scraped) / s.weight

    def choose(self, now: float, among: Sequence[int] | None = None) -> int:
        """Power-of-d choice among usable servers (no side effects)."""
        cand = self.usable(now, among)
        if len(cand) > self.choices:
            idx = self.rng.choice(len(cand), size=self.choices, replace=False)
            cand = [cand[int(k)] for k in idx]
        best = min(self.load(i) for i in cand)
        ties = [i for i in cand if self.load(i) <= best]
        return ties[0] if len(ties) == 1 else ties[int(self.rng.integers(len(ties)))]

    def request_tokens(self, content_length: int | None) -> float:
        """Size estimate of a request from its body length (4 bytes per token) plus the output guess."""
        prompt = max(1.0, content_length / BYTES_PER_TOKEN) if content_length else 1.0
        return prompt + self.expected_output_tokens

    def _probe(self, i: int) -> tuple[float, float]:
        s = self.servers[i]
        if s.kv_usage >= self.kv_full:
            return math.inf, math.inf
        mean = self._tokens_sum / self._tokens_n if self._tokens_n else self.expected_output_tokens + 1.0
        return max(float(s.rif), s.scraped) / s.weight, max(s.tokens, s.scraped * mean) / s.weight

    def pick(self, now: float, request_id: str | None, content_length: int | None = None,
             among: Sequence[int] | None = None) -> int:
        """Choose a server for a request and count it in flight.

        A pick that lands on a rank of a data-parallel server is handed to that server's balancer, which
        picks the rank by its own policy (BF-IO, JSQ, round robin) among the group's usable ranks.
        """
        tokens = self.request_tokens(content_length)
        # A cell whose servers are all ranks of one DP group: the server pick could only name that group,
        # so it is skipped (at G = 32 it was a third of the leaf's pick, ``dlb bfio bench``).
        sole = self._sole_group() if among is None else None
        if sole is not None:
            dp: tuple[DpBalancer, list[str]] | None = sole
            i = UNKNOWN
        else:
            if self.pick_rule == "prequal":
                i = self.pool.pick(now, self.usable(now, among), self._probe, tokens)
            else:
                i = self.choose(now, among)
            dp = self.dp_of.get(self.servers[i].address) if self.dp_of else None
            if dp is None:
                if self.admission.enabled and not self._admits(i, now):
                    self.admission_refused += 1
                    return REFUSED
                self.start(now, request_id, i, tokens)
                return i
        prompt_tokens = content_length / BYTES_PER_TOKEN if content_length else 0.0
        assert dp is not None  # both branches above end here only with a group
        bal, members = dp
        idx, allowed = self._dp_allowed(members, now, among)
        if not allowed.any() and i == UNKNOWN:  # no usable rank: whatever the cell's fallback picks
            i = self.choose(now, among)
        if allowed.any():
            admit = bal.admitting(allowed) if bal.hold is not None else allowed
            if bal.should_hold(allowed, admit):  # every rank at its bound (BF-IO: nearly), or others held first
                if not request_id:
                    self._seq += 1
                    request_id = f"dlb-anon-{self._seq}"
                self.last_held = request_id
                return HELD if bal.hold.offer(now, request_id, prompt_tokens, tokens) else HOLD_FULL  # type: ignore[union-attr]
            i = idx[bal.choose(now, prompt_tokens, admit)]
        key = self.start(now, request_id, i, tokens)
        bal.open(now, key, members.index(self.servers[i].address), prompt_tokens)
        return i

    def _sole_group(self) -> tuple[DpBalancer, list[str]] | None:
        """The DP group every server of the cell is a rank of, if there is one (cached until the next
        server or group update)."""
        if self._sole is False:
            of = [self.dp_of.get(s.address) for s in self.servers]
            first = of[0]
            self._sole = first if first is not None and all(g is not None and g[0] is first[0] for g in of) else None
        return self._sole  # type: ignore[return-value]

    def _dp_allowed(self, members: list[str], now: float,
                    among: Sequence[int] | None = None) -> tuple[list[int], npt.NDArray[np.bool_]]:
        idx = self._dp_idx.get(id(members))
        if idx is None:
            idx = self._dp_idx[id(members)] = [self.by_address.get(a, UNKNOWN) for a in members]
        servers, thr = self.servers, self.scrape_fail_threshold
        allowed = np.fromiter(
            (k != UNKNOWN and (among is None or k in among) and servers[k].ejected_until <= now
             and servers[k].scrape_failures < thr and not servers[k].envoy_out for k in idx),  # self._ok, inlined
            dtype=bool, count=len(idx))  # fmt: skip
        return idx, allowed

    def release(self, now: float) -> list[tuple[str, int]]:
        """Place held requests while a rank of their group can admit one; returns ``(key, server index)``
        of each. The group's policy picks the request among the ``hold_window`` oldest and its rank
        (:meth:`DpBalancer.choose_backlog`; FIFO for policies blind to sizes)."""
        out: list[tuple[str, int]] = []
        for bal, members in self.dp_groups:
            q = bal.hold
            if q is None or q.head() is None:
                continue
            idx, allowed = self._dp_allowed(members, now)
            while (nxt := bal.next_held(now, allowed, self.hold_window)) is not None:
                h, r = nxt
                key = self.start(now, h.key, idx[r], h.tokens)
                bal.open(now, key, r, h.prompt_tokens)
                out.append((key, idx[r]))
        return out

    def expire_held(self, now: float) -> list[str]:
        """Keys of held requests past their deadline (removed from their queues)."""
        return [k for bal, _ in self.dp_groups if bal.hold is not None for k in bal.hold.expire(now)]

    def cancel_held(self, key: str) -> bool:
        """Forget a held request whose ext_proc stream ended (Envoy gave up on it, or the client left)."""
        return any(bal.hold.cancel(key) for bal, _ in self.dp_groups if bal.hold is not None)

    def _dp_finish(self, rec: InFlight, request_id: str, now: float, duration_s: float | None, ok: bool) -> None:
        if rec.server == UNKNOWN or not self.dp_of:
            return
        dp = self.dp_of.get(self.servers[rec.server].address)
        if dp is not None:
            dp[0].finish(request_id, now, duration_s, ok)

    def start(self, now: float, request_id: str | None, server: int = UNKNOWN, tokens: float = 0.0,
              owner: int | None = None) -> str:
        """Open an in-flight record (returns its key; a synthetic one if Envoy gave no request id).

        ``owner`` ties the record to the access-log stream that reported the start: when that stream
        ends, :meth:`drop_owner` forgets what it opened (its completions can no longer arrive).
        """
        if not request_id:
            self._seq += 1
            request_id = f"dlb-anon-{self._seq}"
        prev = self.inflight.get(request_id)
        if prev is not None:  # duplicate start (ext_proc + ALS start entry): keep the first record
            if prev.server == UNKNOWN and server != UNKNOWN:
                prev.server = server
                prev.tokens = tokens
                self.servers[server].rif += 1
                self.servers[server].tokens += tokens
                self.servers[server].picks += 1
            return request_id
        self.started += 1
        if len(self.inflight) >= self.max_inflight:
            self.inflight_refused += 1
            return request_id
        if server != UNKNOWN:
            self.servers[server].rif += 1
            self.servers[server].tokens += tokens
            self.servers[server].picks += 1
        if tokens > 0:
            self._tokens_sum += tokens
            self._tokens_n += 1
        self.inflight[request_id] = InFlight(server, now, len(self.inflight) + 1, tokens, owner)
        if owner is not None:
            self._owned.setdefault(owner, set()).add(request_id)
        return request_id

    def drop_owner(self, owner: int, now: float, at_most: int | None = None) -> int:
        """Forget what an ended access-log stream reported: the in-flight records it opened (returns how
        many; ``at_most`` per call, so a caller can spread 100,000 of them over loop turns) and its
        outcomes in the error rate — a local peer's fake 503s end with its stream."""
        reported = self._owner_errors.pop(owner, None)
        if reported is not None:
            self.errors.remove(reported, now)
        owned = self._owned.get(owner, set())
        n = 0
        while owned and (at_most is None or n < at_most):
            k = owned.pop()
            r = self.inflight.get(k)
            if r is not None and r.owner == owner:
                self._forget(k, now)
                n += 1
        if not owned:
            self._owned.pop(owner, None)
        self.orphaned += n
        return n

    def unowned(self) -> list[str]:
        """Keys of the agent's own picks: records no access-log stream opened (with a leaf ext_proc, Envoy
        logs no request starts, so every pick). See :meth:`drop_unowned`."""
        return [k for k, r in self.inflight.items() if r.owner is None]

    def drop_unowned(self, keys: Sequence[str], now: float) -> int:
        """Forget those of ``keys`` still in flight and unowned (returns how many): the leaf Envoy's last
        log stream ended, so the Envoy that would report their completions is gone. Kept, a ``kill -9``
        of the leaf Envoy held each cut request's RIF and tokens for ``max_age_s`` (15 min), steering the
        pick and the roots away from the cell's servers."""
        n = 0
        for k in keys:
            r = self.inflight.get(k)
            if r is not None and r.owner is None:
                self._forget(k, now)
                n += 1
        self.orphaned += n
        return n

    def _forget(self, key: str, now: float) -> None:
        """Drop a record whose completion will never come (it releases its server's RIF and tokens)."""
        rec = self.inflight.pop(key)
        if rec.owner is not None and (owned := self._owned.get(rec.owner)) is not None:
            owned.discard(key)
        self._dp_finish(rec, key, now, None, False)
        if rec.server != UNKNOWN:
            self.servers[rec.server].rif -= 1
            self.servers[rec.server].tokens -= rec.tokens

    # -- completions ------------------------------------------------------------------------------
    def complete(self, now: float, c: Completion, owner: int | None = None) -> None:
        """A finished request; ``owner``: the access-log stream that reported it (see :meth:`drop_owner`)."""
        rec = self.inflight.pop(c.request_id, None)
        if rec is not None and rec.owner is not None and (owned := self._owned.get(rec.owner)) is not None:
            owned.discard(c.request_id)
        if rec is None:
            self.unmatched += 1  # e.g. the leaf restarted mid-request; still an outcome
            cell_rif = len(self.inflight) + 1
            server = UNKNOWN
        else:
            cell_rif = rec.cell_rif
            server = rec.server
            if server != UNKNOWN:
                self.servers[server].rif -= 1
                self.servers[server].tokens -= rec.tokens
            self._dp_finish(rec, c.request_id, now, c.duration_s, not c.client_abort and not is_error(c.status))
        if server == UNKNOWN and c.upstream:
            server = self.by_address.get(c.upstream, UNKNOWN)
        if c.client_abort:
            self.client_aborts += 1
            return  # the client left: says nothing about the cell's health or speed
        if c.probe and 400 <= c.status < 500 and c.status != 429:
            return  # a probe the servers refused (e.g. a wrong --background-probe-model): no sample, not the cell's fault
        # A refusal (4xx but 429: a bad body, an unknown model, a prompt too long) ends in milliseconds
        # without serving anything: counted, never a latency or done-rate sample. It was one, so a client
        # sending bad requests (or probes the servers refuse whose tag Envoy replaced) made a cell's model
        # ~1000x fast and drew every root's traffic to it.
        refused = 400 <= c.status < 500 and c.status != 429
        if c.status == 429 and server != UNKNOWN:
            s = self.servers[server]
            s.admit_limit = max(s.admit_limit, float(s.rif), s.scraped)  # its own request no longer counted
        err = is_error(c.status) or c.cut
        if c.cut:
            self.cut_streams += 1
            if server != UNKNOWN:
                self.servers[server].cut_streams += 1
        self.completed += 1
        self.errors.record(now, err)
        if owner is not None:
            tracker = self._owner_errors.get(owner)
            if tracker is None:
                tracker = self._owner_errors[owner] = ErrorTracker(self.error_tau_s)
            tracker.record(now, err)
        if server != UNKNOWN:
            s = self.servers[server]
            s.completed += 1
            if not err and not refused and s.done_rate is not None:
                record_done(s.done_rate, s.stay_floor, now, s.rif)
            if err:
                s.errors += 1
                s.consecutive_errors += 1
                if s.consecutive_errors >= self.eject_after:
                    s.ejected_until = now + self.eject_s
                    s.consecutive_errors = 0
            else:
                s.consecutive_errors = 0
        if err:
            self.failed += 1
        elif c.duration_s > 0 and rec is not None and not refused:
            # Only a request seen starting is a latency sample. One that started before this agent did
            # has no known RIF at arrival (``cell_rif`` above is a guess for the error bookkeeping) and may
            # have ended long ago: a restarted agent gets the entries its Envoy kept while it was down all
            # at once, mostly ~3.5-s streams that had run at RIF ~20, and took them as taking 3.5 s at
            # RIF 1 — its first model 17× slow, which the roots adopted for 1–3 s (research/operations.md).
            self.estimator.record(now, float(cell_rif), c.duration_s)

    def expire(self, now: float) -> int:
        """Forget in-flight records older than ``max_age_s`` (their completion was lost)."""
        horizon = now - self.max_age_s
        old = [k for k, r in self.inflight.items() if r.started < horizon]
        for k in old:
            self._forget(k, now)
        self.expired += len(old)
        return len(old)

    # -- scraped metrics -------------------------------------------------------------------------
    def on_scrape_slow(self, i: int) -> None:
        """A scrape connected but timed out: the server's load is unknown for now, its health unchanged.

        Health is decided by what fails outright (refused scrapes here, errors in the access log,
        Envoy's own health checks); slowness is load, which the latency model and the pick rule see.
        """
        s = self.servers[i]
        s.scraped = -1.0
        s.waiting = -1.0
        s.kv_usage = -1.0

    def on_scrape(self, i: int, running: float | None, waiting: float | None, kv_usage: float | None = None,
                  now: float | None = None, admit_limit: float | None = None, kv_tokens: float | None = None) -> None:
        """A scrape's result (``running`` and ``waiting`` both ``None``: it failed). ``now`` starts the
        rejoin hold of a server that was unhealthy; without it (tests of the load figures) there is none.
        ``admit_limit`` and ``kv_tokens``: a DP rank's running-slot bound (for the hold queue) and resident
        KV (BF-IO's measured workload), as the rank reports them."""
        s = self.servers[i]
        dp = self.dp_of.get(s.address) if self.dp_of else None
        if dp is not None and running is not None:
            rank = dp[1].index(s.address)
            dp[0].set_admission(rank, admit_limit, kv_usage is not None and kv_usage >= self.kv_full)
            if kv_tokens is not None and now is not None:
                dp[0].observe_kv(rank, kv_tokens, now)
        if running is None and waiting is None:
            s.scrape_failures += 1
            if s.scrape_failures >= self.scrape_fail_threshold:
                s.scraped = -1.0
                s.waiting = -1.0
                s.kv_usage = -1.0
            return
        if s.scrape_failures >= self.scrape_fail_threshold and now is not None:
            s.ejected_until = max(s.ejected_until, now + self.rejoin_hold_s)
        s.scrape_failures = 0
        s.scraped = (running or 0.0) + (waiting or 0.0)
        s.waiting = waiting if waiting is not None else -1.0
        if running is not None and waiting is not None and waiting > 0 and running > s.batch_limit:
            # Requests wait only when the server runs all it will: its knee, measured (issue 12).
            s.batch_limit = running
            if all(x.batch_limit > 0 for x in self.servers):
                self.estimator.set_knee(sum(x.batch_limit for x in self.servers))
        s.kv_usage = kv_usage if kv_usage is not None else -1.0

    def running(self, now: float) -> Censored:
        """The requests still in flight (RIF at arrival, age) for the latency fit: each is a lower
        bound the fitted curve must respect (:class:`~dlb.core.fit.Censored`). At most the
        estimator's ``max_samples``, evenly spread, so a refit with a huge backlog stays cheap on the loop."""
        recs = list(self.inflight.values())
        total = len(recs)
        step = max(1, math.ceil(total / self.estimator.config.max_samples))
        recs = recs[::step]
        return Censored(np.fromiter((r.cell_rif for r in recs), float, len(recs)),
                        now - np.fromiter((r.started for r in recs), float, len(recs)), total)

    # -- what probes report -------------------------------------------------------------------------
    @property
    def rif(self) -> int:
        return len(self.inflight)

    def healthy(self, now: float) -> int:
        return sum(1 for s in self.servers if self._ok(s, now))

    def healthy_replicas(self, now: float) -> int:
        """k_j scaled by the healthy fraction of servers (what the RIF cost N_j/k_j should divide by)."""
        return math.ceil(self.replicas * self.healthy(now) / len(self.servers))

    def capacity(self, now: float) -> float | None:
        """Requests the cell admits before its servers refuse: the healthy servers' admit limits summed;
        None until every healthy server has refused once (a root never sheds on a guess)."""
        limits = [s.admit_limit for s in self.servers if self._ok(s, now)]
        return float(sum(limits)) if limits and min(limits) > 0 else None

    def waiting(self) -> float:
        vals = [s.waiting for s in self.servers if s.waiting >= 0]
        return float(sum(vals)) if vals else -1.0

    def kv_usage(self) -> float:
        """Mean scraped KV-cache usage over the servers that reported one, -1 if none did."""
        vals = [s.kv_usage for s in self.servers if s.kv_usage >= 0]
        return float(sum(vals) / len(vals)) if vals else -1.0
