"""Continuous-batching engine model (pure: no I/O, no clock; times are passed in).

This is the part of a vLLM-style server that decides latency, reduced to its scheduling rules:

- A request is *waiting* until the scheduler admits it into the *running* set (at most ``max_batch``
  sequences, and only while its prompt, and the token it may emit this step, fit in the KV cache that
  the running sequences leave after this step's growth). Waiting beyond the free slots is
  bounded by ``max_queue`` requests, or, with ``max_waiting_tokens``, by the prompt tokens waiting (a
  bound in KV-cache units, which is what the simulator uses instead of a fixed count); an arrival
  past the bound is rejected (the HTTP layer answers 429/503).
- Each engine step runs every running sequence together: sequences past their prompt decode one
  token each; newly admitted ones get a chunk of their prompt within the per-step token budget
  (chunked prefill). A request whose prompt completes in a step emits its first token in that step.
- **Preemption** (vLLM's recompute mode): every running sequence that emits a token in a step grows
  its KV by one. When that growth would overflow the KV cache, the youngest running request (the last
  admitted) is preempted: its KV is freed, it goes back to the *front* of the waiting queue, and when
  readmitted it recomputes its prompt and the tokens it already generated as a prefill, then
  continues (tokens already emitted stay emitted). No request is admitted in a step that preempted.
  ``preemptions`` counts them (vLLM's ``vllm:num_preemptions``). A request alone in the batch is never
  preempted.
- The step takes ``profile.step_time(batch, prefill_tokens, context)``, ``context`` being the KV its
  attention reads (each decoding sequence's prompt and generated tokens, each prompt chunk's prefix
  and chunk): flat at low load, linear past the knee (:mod:`dlb.emulator.profile` says what each
  term is calibrated from), so latency is flat at low load and grows linearly past it.

The HTTP layer drives it with the wall clock (``plan`` → sleep ``plan.duration`` → ``complete``);
:func:`simulate` drives it with a virtual clock, which is how the tests check the latency model
exactly. The simulator (:mod:`dlb.sim.engine`) runs this same class for every simulated server, so the
emulator and the simulator share one server model. It cannot afford one event per engine step, so it
uses :meth:`Engine.repeatable` and ``complete(plan, now, steps=k)``: a pure-decode step with no
admissible arrival repeats with the same batch until its shortest request finishes or the KV growth
would force a preemption, and ``k`` steps are applied at once (bit-for-bit the same token counts as
``k`` single steps; their time is :meth:`StepPlan.run_time`, the sum of the single steps' times, which
grow with the context). So that a run of steps costs the same whatever the batch size, a decoding
request's token count is read off its engine's step counter rather than stored, and a heap of finishing
steps names who finishes and how many steps the batch can repeat: no step touches every sequence.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from operator import attrgetter

from dlb.emulator.profile import Profile


@dataclass(eq=False)
class EngineRequest:
    """One sequence's progress through the engine (identity equality: two requests are never "equal")."""

    rid: int
    prompt_tokens: int
    output_tokens: int  # tokens this request will generate (max_tokens or sampled)
    model: str = ""
    arrival: float = 0.0
    prefilled: int = 0
    generated: int = 0
    admitted_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    aborted: bool = False
    cached_tokens: int = 0  # prompt prefix found in the prefix cache: skips prefill
    #: Tokens to compute before decoding: the prompt, plus the generated tokens after a preemption.
    prefill_len: int = 0
    preempted: int = 0  # times this request was preempted
    # While it decodes in an engine's running set, a request's token count is not stored but read off
    # that engine's step counter (``generated`` = ``_clock._ticks - _base``): every decoding sequence
    # gains one token per step, so the engine applies a run of steps without touching each sequence.
    _gen: int = field(default=0, init=False, repr=False)
    _clock: Engine | None = field(default=None, init=False, repr=False)
    _base: int = field(default=0, init=False, repr=False)
    #: Admission number in its engine: running order, and which of its finish-heap entries is current.
    _seq: int = field(default=-1, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1:
            raise ValueError(f"request {self.rid}: prompt_tokens must be >= 1, got {self.prompt_tokens}")
        if self.output_tokens < 1:
            raise ValueError(f"request {self.rid}: output_tokens must be >= 1, got {self.output_tokens}")
        # A fully cached prompt still computes its last token (it produces the first output), as vLLM does.
        self.cached_tokens = max(0, min(self.cached_tokens, self.prompt_tokens - 1))
        self.prefilled = max(self.prefilled, self.cached_tokens)
        self.prefill_len = max(self.prefill_len, self.prompt_tokens)

    def _get_generated(self) -> int:
        c = self._clock
        return self._gen if c is None else c._ticks - self._base

    def _set_generated(self, value: int) -> None:
        if self._clock is not None:
            raise AttributeError(f"request {self.rid}: generated is counted by its engine while it decodes")
        self._gen = value

    @property
    def in_decode(self) -> bool:
        return self.prefilled >= self.prefill_len

    @property
    def finished(self) -> bool:
        return self.generated >= self.output_tokens

    @property
    def kv_tokens(self) -> int:
        """KV cache held while running: the whole prompt is reserved at admission (as vLLM allocates
        blocks when it schedules), plus every generated token (also what a preempted request needs back)."""
        return self.prompt_tokens + self.generated


# ``generated`` is a dataclass field (an argument of ``__init__``, in ``repr``) read through the lazy
# count above; the property replaces the field's class-level default once the dataclass is built.
EngineRequest.generated = property(EngineRequest._get_generated, EngineRequest._set_generated)  # type: ignore[assignment]
_by_seq = attrgetter("_seq")


@dataclass(slots=True)
class StepPlan:
    """What one engine step computes; ``duration`` is in profile seconds (before any time scale).
    Not frozen (never changed once made): the simulator makes one per engine wake-up, and a frozen
    dataclass's ``__init__`` costs over twice as much."""

    decode: tuple[EngineRequest, ...]
    prefill: tuple[tuple[EngineRequest, int], ...]  # (request, prompt tokens computed this step)
    duration: float
    #: KV tokens the step's attention reads (what the profile's context term charges).
    context: int = 0
    #: The profile that timed it (:meth:`run_time` of repeated steps); None: steps of equal time.
    profile: Profile | None = None

    @property
    def batch(self) -> int:
        return len(self.decode) + len(self.prefill)

    @property
    def prefill_tokens(self) -> int:
        return sum(n for _, n in self.prefill)

    def run_time(self, steps: int) -> float:
        """Profile seconds of ``steps`` back-to-back runs of this plan (more than one only for a
        pure-decode plan, whose context grows by one token per sequence per step)."""
        if steps == 1 or self.profile is None:
            return steps * self.duration
        return self.profile.decode_run_time(len(self.decode), self.context, steps)

    def steps_by(self, elapsed: float, steps: int) -> int:
        """The step (1-based, at most ``steps``) in progress ``elapsed`` profile seconds after the run
        started: the first whose end is later than ``elapsed``."""
        lo, hi = 1, steps
        while lo < hi:
            mid = (lo + hi) // 2
            if self.run_time(mid) > elapsed:
                hi = mid
            else:
                lo = mid + 1
        return lo


@dataclass(slots=True)
class TokenEvent:
    """A request produced a token in a step (``index`` 0 is the first token). Not frozen: one is
    built per decoding sequence per step, and a frozen dataclass's ``__init__`` costs over twice as much."""

    request: EngineRequest
    index: int
    finished: bool


@dataclass
class Engine:
    """The scheduler state of one emulated GPU."""

    profile: Profile
    max_batch: int = 16
    max_queue: int = 64
    #: If set, the waiting queue is bounded by its prompt tokens instead of ``max_queue`` requests.
    max_waiting_tokens: int | None = None
    waiting: deque[EngineRequest] = field(default_factory=deque)
    running: list[EngineRequest] = field(default_factory=list)
    steps: int = 0
    preemptions: int = 0

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {self.max_queue}")
        if self.max_waiting_tokens is not None and self.max_waiting_tokens < 1:
            raise ValueError(f"max_waiting_tokens must be >= 1, got {self.max_waiting_tokens}")
        if self.running:
            raise ValueError("running must start empty: requests enter it only through submit and plan")
        self.waiting_tokens = sum(r.kv_tokens for r in self.waiting)
        # Kept up to date as requests are admitted, grow, finish, leave: the KV the running set holds
        # (= kv_used) and how many of them are still prefilling, so a batch that only decodes is
        # planned without a pass over it. The running list is always its decoding requests followed
        # by its prefilling ones (admission appends, prompts complete in order, preemption takes the
        # last), so the two are a split of it, not a filter.
        self._kv = 0
        self._prefilling = 0
        #: Decode steps so far (the clock of every decoding request's token count), how many running
        #: requests decode, admissions so far, and a heap of (step at which it finishes, admission, request)
        #: of the decoding ones (entries of requests that left decoding are skipped when met).
        self._ticks = 0
        self._decoding = 0
        self._admitted = 0
        self._finish: list[tuple[int, int, EngineRequest]] = []

    def _settle(self, req: EngineRequest) -> None:
        """Store the token count of a decoding request that leaves decoding (preempted or aborted)."""
        req._gen = self._ticks - req._base
        req._clock = None
        self._decoding -= 1

    # -- admission -------------------------------------------------------------------------------------

    def can_accept(self, prompt_tokens: int = 1) -> bool:
        """Whether one more arrival fits: free batch slots absorb arrivals, then ``max_queue`` more wait
        (or, with ``max_waiting_tokens``, as many as that many prompt tokens)."""
        free = max(0, self.max_batch - len(self.running))
        if self.max_waiting_tokens is not None:
            return len(self.waiting) < free or self.waiting_tokens + prompt_tokens <= self.max_waiting_tokens
        return len(self.waiting) < self.max_queue + free

    def submit(self, req: EngineRequest, now: float) -> bool:
        """Queue a request; False (and nothing changes) if the queue is full."""
        if not self.can_accept(req.prompt_tokens):
            return False
        req.arrival = now
        self.waiting.append(req)
        self.waiting_tokens += req.kv_tokens
        return True

    def abort(self, req: EngineRequest) -> None:
        """Drop a request (client went away); frees its slot at once, like vLLM's abort."""
        req.aborted = True
        if req in self.running:
            if req._clock is self:
                self._settle(req)
            self.running.remove(req)
            self._kv -= req.kv_tokens
            self._prefilling -= not req.in_decode
        else:
            try:
                self.waiting.remove(req)
            except ValueError:
                pass
            else:
                self.waiting_tokens -= req.kv_tokens

    @property
    def kv_used(self) -> int:
        """KV tokens the running set holds (kept up to date, not summed: the simulator reads it often)."""
        return self._kv

    @property
    def kv_usage(self) -> float:
        """Fraction of KV cache in use (vLLM reports ``gpu_cache_usage_perc`` as a 0..1 fraction)."""
        return min(1.0, self.kv_used / self.profile.kv_cache_tokens)

    def _preempt(self, req: EngineRequest) -> None:
        """Recompute-style preemption: free ``req``'s KV, send it to the front of the queue; readmitted,
        it prefills its prompt and what it generated again (vLLM's ``PreemptionMode.RECOMPUTE``)."""
        if req._clock is self:
            self._settle(req)
        self.running.remove(req)  # its KV blocks are freed
        self._kv -= req.kv_tokens
        self._prefilling -= not req.in_decode
        req.prefilled = req.cached_tokens
        req.prefill_len = req.prompt_tokens + req.generated
        req.preempted += 1
        self.preemptions += 1
        self.waiting.appendleft(req)
        self.waiting_tokens += req.kv_tokens

    def _growth(self) -> tuple[int, int, list[EngineRequest], list[EngineRequest], int]:
        """(KV held by the running set, tokens it emits this step, decoding, still prefilling, the KV
        the prefilling ones hold)."""
        running = self.running
        if not self._prefilling:  # every running sequence decodes: one token each
            return self._kv, len(running), running[:], [], 0
        split = len(running) - self._prefilling
        decode, pending = running[:split], running[split:]
        grow = split
        budget = self.profile.max_batch_tokens - grow
        held = 0
        for r in pending:  # a prompt that completes this step emits its first token
            held += r.prompt_tokens + r._gen  # not decoding: the count is stored
            if budget > 0:
                need = r.prefill_len - r.prefilled
                if need <= budget:
                    grow += 1
                budget -= need
        return self._kv, grow, decode, pending, held

    def plan(self, now: float) -> StepPlan | None:
        """Preempt what the KV cannot hold, admit what fits, and describe the next step (None: nothing to run)."""
        running, waiting = self.running, self.waiting
        prof = self.profile
        cap = prof.kv_cache_tokens
        n = len(running)
        if not self._prefilling and (not waiting or n >= self.max_batch) and (self._kv + n <= cap or n == 1):
            # The common step of a busy server: every sequence decodes, nothing to preempt or admit.
            if not n:
                return None
            kv = self._kv
            return StepPlan(tuple(running), (), prof.step_time(n, 0, kv), kv, prof)
        kv, grow, decode, pending, held = self._growth()
        preempted = False
        while kv + grow > cap and len(running) > 1:  # this step's tokens would overflow the KV cache
            self._preempt(running[-1])
            preempted = True
            kv, grow, decode, pending, held = self._growth()
        # Admission, FCFS without overtaking: each prompt's KV is reserved up front, with room for the
        # token it may emit this step; a prompt that does not fit waits, which is how a full KV cache
        # turns into queueing on a real server. None in a step that had to preempt (as vLLM).
        if waiting and not preempted and len(running) < self.max_batch:
            projected = kv + grow
            while waiting and len(running) < self.max_batch:
                head = waiting[0]
                need = head.prompt_tokens + head._gen  # waiting: the count is stored
                if running and projected + need + 1 > cap:
                    break
                waiting.popleft()
                self.waiting_tokens -= need
                if head.admitted_at is None:
                    head.admitted_at = now
                projected += need + 1
                head._seq = self._admitted
                self._admitted += 1
                running.append(head)
                pending.append(head)
                self._kv += need
                self._prefilling += 1
        if not running:
            return None
        budget = max(0, self.profile.max_batch_tokens - len(decode))
        prefill: list[tuple[EngineRequest, int]] = []
        prefill_tokens = 0
        context = kv - held  # what the decoding sequences hold
        for r in pending:
            if budget <= 0:
                break
            take = min(r.prefill_len - r.prefilled, budget)
            prefill.append((r, take))
            prefill_tokens += take
            context += r.prefilled + take
            budget -= take
        batch = len(decode) + len(prefill)
        duration = self.profile.step_time(batch, prefill_tokens, context)
        return StepPlan(decode=tuple(decode), prefill=tuple(prefill), duration=duration, context=context,
                        profile=self.profile)

    def repeatable(self, plan: StepPlan) -> int:
        """How many times ``plan`` can run back to back with the same batch if nothing arrives meanwhile.

        A step with prefill changes the batch (the prompt moves to decode), so it runs once. A
        pure-decode step repeats until its shortest request finishes, or until one more step's growth
        would overflow the KV cache (the next plan preempts): ``plan`` already admitted every waiting
        request that fits, and more decoding only grows the KV in use, so nothing waiting becomes
        admissible before a request leaves. Each repeat is one token longer per sequence, so it takes
        a little longer (:meth:`StepPlan.run_time`).
        """
        if plan.prefill or not plan.decode:
            return 1
        # The decoding requests are exactly ``plan.decode`` (the plan just made): the earliest valid
        # entry of the finish heap is the shortest one's finishing step.
        heap = self._finish
        while heap[0][2]._clock is not self or heap[0][2]._seq != heap[0][1]:
            heapq.heappop(heap)
        k = heap[0][0] - self._ticks
        d = len(plan.decode)
        if d > 1:  # a lone sequence is never preempted
            k = min(k, (self.profile.kv_cache_tokens - plan.context) // d)
        return max(1, k)

    def complete(self, plan: StepPlan, now: float, steps: int = 1, finished_only: bool = False) -> list[TokenEvent]:
        """Apply ``steps`` runs of a finished plan ending at ``now``: emit tokens, retire finished requests.

        ``steps > 1`` is for pure-decode plans (see :meth:`repeatable`); each decoding request gains
        ``steps`` tokens and one event (its last token) is reported. ``finished_only``: report only
        the requests that finished (what :meth:`retire` returns, as events).
        """
        finished = self.retire(plan, now, steps)
        if finished_only:
            return [TokenEvent(r, r.output_tokens - 1, True) for r in finished]
        events: list[TokenEvent] = []
        for r in plan.decode:
            if not r.aborted:
                g = r.generated
                events.append(TokenEvent(r, g - 1, g >= r.output_tokens))
        for r, _ in plan.prefill:  # every one was still prefilling when planned: those done now emitted a token
            if not r.aborted and r.prefilled >= r.prefill_len:
                g = r.generated
                events.append(TokenEvent(r, g - 1, g >= r.output_tokens))
        return events

    def retire(self, plan: StepPlan, now: float, steps: int = 1) -> list[EngineRequest]:
        """:meth:`complete` without its token events: the requests that finished (decoding ones in running
        order, then completed prompts in plan order). The simulator calls it once per run of steps and
        reads only who finished, so no event is built per sequence."""
        if steps < 1 or (steps > 1 and plan.prefill):
            raise ValueError(f"steps must be >= 1 and 1 for a plan with prefill, got {steps}")
        self.steps += steps
        # Every decoding request gains ``steps`` tokens by the clock moving; the finish heap names the
        # ones that reached their last token (a request past it stops there: its overshoot is not KV).
        ticks = self._ticks = self._ticks + steps
        grown = self._decoding * steps
        heap = self._finish
        finished: list[EngineRequest] = []
        while heap and heap[0][0] <= ticks:
            end, seq, r = heapq.heappop(heap)
            if r._clock is not self or r._seq != seq:
                continue  # preempted or aborted since: a stale entry
            grown -= ticks - end
            r._gen = r.output_tokens
            r._clock = None
            finished.append(r)
        self._decoding -= len(finished)
        if len(finished) > 1:
            finished.sort(key=_by_seq)  # in running order, as the plan lists them
        for r, n in plan.prefill:
            if r.aborted:
                continue
            r.prefilled += n
            if r.prefilled >= r.prefill_len:  # a (re)computed prompt emits the next token
                g = r._gen + 1
                grown += 1
                self._prefilling -= 1
                if r.first_token_at is None:
                    r.first_token_at = now
                if g >= r.output_tokens:
                    r._gen = g
                    finished.append(r)
                else:  # it decodes from the next step: its count runs on the clock
                    r._clock, r._base = self, ticks - g
                    self._decoding += 1
                    heapq.heappush(heap, (ticks - g + r.output_tokens, r._seq, r))
        self._kv += grown
        if finished:
            running = self.running
            for r in finished:
                r.finished_at = now
                running.remove(r)
                self._kv -= r.kv_tokens
        return finished


@dataclass(frozen=True)
class Arrival:
    """Input to :func:`simulate`."""

    time: float
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int = 0


@dataclass(frozen=True)
class SimResult:
    arrival: float
    first_token_at: float | None  # None if rejected
    finished_at: float | None
    rejected: bool

    @property
    def e2e(self) -> float:
        assert self.finished_at is not None
        return self.finished_at - self.arrival

    @property
    def ttft(self) -> float:
        assert self.first_token_at is not None
        return self.first_token_at - self.arrival


def simulate(engine: Engine, arrivals: list[Arrival]) -> list[SimResult]:
    """Run the engine on a virtual clock until every request finished; results in arrival order.

    Same rule as the live server: arrivals during a step wait for the next step boundary.
    """
    order = sorted(range(len(arrivals)), key=lambda i: arrivals[i].time)
    reqs: list[EngineRequest | None] = [None] * len(arrivals)
    rejected = [False] * len(arrivals)
    pending = [(arrivals[i].time, i) for i in order]
    heapq.heapify(pending)
    now = 0.0
    while pending or engine.running or engine.waiting:
        while pending and pending[0][0] <= now:
            t, i = heapq.heappop(pending)
            a = arrivals[i]
            r = EngineRequest(rid=i, prompt_tokens=a.prompt_tokens, output_tokens=a.output_tokens,
                              cached_tokens=a.cached_tokens)  # fmt: skip
            if engine.submit(r, t):
                reqs[i] = r
            else:
                rejected[i] = True
        plan = engine.plan(now)
        if plan is None:
            if not pending:
                break
            now = pending[0][0]
            continue
        now += plan.duration
        engine.complete(plan, now)
    out = []
    for i, a in enumerate(arrivals):
        done = reqs[i]
        out.append(
            SimResult(
                arrival=a.time,
                first_token_at=done.first_token_at if done else None,
                finished_at=done.finished_at if done else None,
                rejected=rejected[i],
            )
        )
    return out
