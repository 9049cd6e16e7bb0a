"""The simulator's ``batched`` server model: every server is the emulator's continuous-batching
:class:`~dlb.emulator.engine.Engine`, so the simulator and the emulated servers share one model.

An event per engine step would cost ~50 steps per second per server (a 100-server fleet simulated
for 10 minutes is 3 M steps); instead a server runs its plan for as many identical steps as
:meth:`Engine.repeatable` allows and is woken early only when something changes the batch: an
arrival cuts the run at the end of the step in progress (where a real scheduler would admit it),
and the end of a run retires whoever finished. Token counts are exactly those of single steps, and a
run's time is the sum of its steps' times (:meth:`StepPlan.run_time`: each step's context is one
token per sequence longer than the last). A run also ends where the KV growth would force a
preemption, so preemptions happen at the step where single steps have them. A request whose client
gave up is aborted at once (:meth:`BatchedServers.abort`), as vLLM aborts one whose stream was reset.
"""

from __future__ import annotations

from collections.abc import Callable

from dlb.emulator.engine import Engine, EngineRequest, StepPlan
from dlb.emulator.profile import Profile


class BatchedServers:
    """All servers of one run; ``schedule(t, server, version)`` asks the event loop for a wake-up."""

    def __init__(self, profiles: list[Profile], max_batch: int, max_waiting_tokens: list[int],
                 schedule: Callable[[float, int, int], None], abortable: bool = False) -> None:
        self.engines = [Engine(p, max_batch=max_batch, max_waiting_tokens=m)
                        for p, m in zip(profiles, max_waiting_tokens, strict=True)]
        n = len(profiles)
        self.plan: list[StepPlan | None] = [None] * n
        self.t0 = [0.0] * n  # start of the current run
        self.k = [0] * n  # steps in it
        self.version = [0] * n  # bumps when a run is cut: older wake-ups are stale
        #: Step-time multiplier per server (a ``slow`` disruption: the cell silently becomes slower),
        #: and the one the current run started with.
        self.slowdown = [1.0] * n
        self.slowdown_of_run = [1.0] * n
        self.schedule = schedule
        #: ``abortable``: each queued request's (server, engine request) by id, so it can be aborted.
        self.live: dict[int, tuple[int, EngineRequest]] | None = {} if abortable else None

    def arrive(self, srv: int, rid: int, prompt_tokens: int, output_tokens: int, now: float) -> bool:
        """Queue request ``rid`` at server ``srv``; False if the server's waiting queue is full."""
        eng = self.engines[srv]
        req = EngineRequest(rid, prompt_tokens, output_tokens)
        if not eng.submit(req, now):
            return False
        if self.live is not None:
            self.live[rid] = (srv, req)
        if self.plan[srv] is None:
            self._start(srv, now)
        else:
            self._cut(srv, now)
        return True

    def set_slowdown(self, srv: int, factor: float, now: float) -> None:
        """From the end of the step in progress, server ``srv``'s steps take ``factor`` × the profile's."""
        self.slowdown[srv] = factor
        if self.plan[srv] is not None:
            self._cut(srv, now)

    def _cut(self, srv: int, now: float) -> None:
        """End the current run after the step in progress (it still completes), so the next run sees
        what changed: a request to admit, or a new speed."""
        k = self.k[srv]
        if k > 1:
            plan = self.plan[srv]
            assert plan is not None
            slow = self.slowdown_of_run[srv]
            m = plan.steps_by((now - self.t0[srv]) / slow, k)
            if m < k:
                self.k[srv] = m
                self.version[srv] += 1
                self.schedule(self.t0[srv] + plan.run_time(m) * slow, srv, self.version[srv])

    def wake(self, srv: int, version: int, now: float) -> list[int] | None:
        """A run ended: apply it, start the next one; the ids of requests that finished (None if stale)."""
        if version != self.version[srv]:
            return None
        plan = self.plan[srv]
        assert plan is not None
        done = self.engines[srv].retire(plan, now, self.k[srv])
        self._start(srv, now)
        live = self.live
        if live is not None:
            for r in done:
                del live[r.rid]
        return [r.rid for r in done]

    def abort(self, rid: int, now: float) -> None:
        """Request ``rid``'s client went away: the engine drops it at once, freeing its batch slot and
        KV (:meth:`Engine.abort`, vLLM's abort). If it was running, or first in the queue (whose head
        alone decides admission), the run in progress ends after its current step, where a real
        scheduler would next plan, so the room it left is used from there. Needs ``abortable``."""
        assert self.live is not None, "BatchedServers(abortable=True) tracks requests to abort"
        srv, req = self.live.pop(rid)
        eng = self.engines[srv]
        changes_plan = req.admitted_at is not None or (bool(eng.waiting) and eng.waiting[0] is req)
        eng.abort(req)
        if changes_plan and self.plan[srv] is not None:
            self._cut(srv, now)

    def _start(self, srv: int, now: float) -> None:
        eng = self.engines[srv]
        plan = eng.plan(now)
        self.plan[srv] = plan
        if plan is None:
            return
        k = eng.repeatable(plan)
        slow = self.slowdown[srv]
        self.t0[srv], self.k[srv], self.slowdown_of_run[srv] = now, k, slow
        self.version[srv] += 1
        self.schedule(now + plan.run_time(k) * slow, srv, self.version[srv])

    def waiting(self, srv: int) -> int:
        return len(self.engines[srv].waiting)

    def running(self, srv: int) -> int:
        return len(self.engines[srv].running)

    @property
    def preemptions(self) -> int:
        """Preemptions over every server so far."""
        return sum(e.preemptions for e in self.engines)
