"""Data-parallel (DP) server mode: G ranks that step together behind a barrier.

What it models: DP attention with expert parallelism (DeepSeek-style MoE on vLLM or SGLang). Each rank
keeps its own batch and KV cache and computes its attention alone, then every rank joins the expert
all-to-all, so one *step* lasts as long as the slowest rank and the others idle at the barrier. That idle
time is what a rank-aware leaf policy (BF-IO, ``dlb/core/bfio.py``) is meant to remove, so it is
exported per rank (``dlb_dp_idle_seconds_total``) next to the busy time.

How ranks are addressed follows vLLM's *external* DP load balancing (docs/serving/data_parallel_deployment.md,
"External Load Balancing"): each rank is its own OpenAI-compatible HTTP server on its own port
(``vllm serve --data-parallel-size G --data-parallel-rank r --port 8000+r``), and an external router
picks the rank. Here rank r listens on ``port + r`` inside one process, so the lock step is exact.

Per-rank step time: a rank's attention cost grows with the KV tokens it holds, not only with its batch.
The profile's measured past-knee slope is the cost of one sequence at the measured 1024-token context
(``h200-llama-step-times.json``), so a rank pays ``past_knee_ms_per_seq / 1024`` per resident KV token,
on top of the profile's floor, per-sequence and prefill terms (:func:`rank_step_time`). The knee of the
single-GPU curve (the weight-read floor) is not applied per rank: in DP+EP the floor is the shared
expert stage, the same for every rank. This is a model, stated as such; the study and the emulator share it.
"""

from __future__ import annotations

import asyncio
import errno
import random
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge

from dlb.emulator import clock
from dlb.emulator.engine import Engine, StepPlan
from dlb.emulator.profile import Profile
from dlb.emulator.server import _MAX_LAG_S, EmulatorConfig, EmulatorServer
from dlb.log import get_logger

REF_CONTEXT_TOKENS = 1024  # context of the measured decode points the past-knee slope comes from


def rank_step_time(profile: Profile, batch: int, kv_tokens: int, prefill_tokens: int = 0) -> float:
    """Seconds one rank's share of a DP step takes with ``batch`` sequences holding ``kv_tokens``."""
    if batch <= 0:
        return 0.0
    ms = (
        profile.base_ms
        + profile.prefill_us_per_token * 1e-3 * prefill_tokens
        + profile.decode_us_per_seq * 1e-3 * batch
        + profile.past_knee_ms_per_seq * kv_tokens / REF_CONTEXT_TOKENS
    )
    return ms * 1e-3


def plan_time(profile: Profile, engine: Engine, plan: StepPlan | None) -> float:
    """A rank's compute time for its planned step (0 if it has nothing to run: it only waits)."""
    if plan is None:
        return 0.0
    return rank_step_time(profile, plan.batch, engine.kv_used, plan.prefill_tokens)


@dataclass(frozen=True)
class DpStep:
    """One lock-step: each rank's own compute time, and the step time (the slowest rank's)."""

    rank_times: tuple[float, ...]

    @property
    def duration(self) -> float:
        return max(self.rank_times)

    def idle(self, rank: int) -> float:
        return self.duration - self.rank_times[rank]


class DpEmulator:
    """G :class:`EmulatorServer` ranks on ports ``port .. port+G-1`` sharing one lock-step engine loop."""

    def __init__(self, config: EmulatorConfig, dp_size: int) -> None:
        if dp_size < 1:
            raise ValueError(f"dp_size: must be >= 1, got {dp_size}")
        self.config = config
        self.dp_size = dp_size
        base_id = config.server_id or "emulator"
        # Each rank has its faults and so its admin API: at admin_port + r (any free port when 0).
        self.ranks = [
            EmulatorServer(config, port=0, server_id=f"{base_id}-dp{r}", seed=config.seed + r,
                           admin_port=None if config.admin_port is None else config.admin_port and config.admin_port + r)
            for r in range(dp_size)
        ]
        self.profile = self.ranks[0].profile
        self.port = 0
        self.admin_port: int | None = None  # rank 0's; rank r's is ranks[r].admin_port
        self.steps = 0
        self.idle_s = [0.0] * dp_size
        self.busy_s = [0.0] * dp_size
        self.step_s = 0.0
        self.tokens = 0
        # Each rank's own /metrics carries its DP families (registered on that rank's registry).
        self._m_idle: list[Counter] = []
        self._m_busy: list[Counter] = []
        self._m_kv: list[Gauge] = []
        for r, srv in enumerate(self.ranks):
            reg = srv.metrics.registry
            idle = Counter("dlb_dp_idle_seconds", "Time this DP rank waited at the step barrier for a slower rank.",
                           ["rank"], registry=reg)
            busy = Counter("dlb_dp_busy_seconds", "Time this DP rank computed its share of DP steps.", ["rank"], registry=reg)
            kv = Gauge("dlb_dp_kv_tokens", "KV tokens resident on this DP rank.", ["rank"], registry=reg)
            # The rank's admission bound, reported so a leaf holding requests for the group need not guess it.
            Gauge("dlb_dp_max_num_seqs", "Running sequences this DP rank admits at most (its --max-num-seqs).",
                  registry=reg).set(config.max_batch)
            self._m_idle.append(idle.labels(str(r)))
            self._m_busy.append(busy.labels(str(r)))
            self._m_kv.append(kv.labels(str(r)))
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Bind G consecutive ports (any free block when ``config.port`` is 0) and start stepping."""
        want = self.config.port
        for attempt in range(50):
            base = want or random.randint(20000, 60000 - self.dp_size)
            started: list[EmulatorServer] = []
            try:
                for r, srv in enumerate(self.ranks):
                    srv.config.port = base + r
                    await srv.start(run_engine=False)
                    started.append(srv)
                break
            except OSError as e:
                for srv in started:
                    await srv.stop()
                if want or e.errno != errno.EADDRINUSE or attempt == 49:
                    raise
        self.port = self.ranks[0].port
        self.admin_port = self.ranks[0].admin_port
        self._wake = asyncio.Event()
        moved = clock.StepEnd()
        for srv in self.ranks:
            srv._wake = self._wake  # any rank's arrival wakes the shared loop
            srv.step_end = moved  # and any rank's fault change moves the shared step's end
        self._task = asyncio.create_task(self._loop(), name=f"emulator-dp-{self.config.server_id}")
        for srv in self.ranks:
            srv._engine_task = self._task
            self._task.add_done_callback(srv._engine_died)
        get_logger("dlb.emulator").info("emulator_dp_started", server_id=self.config.server_id, dp_size=self.dp_size,
                                        ports=[s.port for s in self.ranks])  # fmt: skip

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            except Exception as e:
                get_logger("dlb.emulator").debug("emulator_dp_loop_ended", error=repr(e))
        for srv in self.ranks:
            srv._engine_task = None
            await srv.stop()

    async def __aenter__(self) -> DpEmulator:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _loop(self) -> None:
        assert self._wake is not None
        deadline = clock.now()
        while True:
            now = clock.now()
            plans = [srv.engine.plan(now) for srv in self.ranks]
            for srv in self.ranks:
                srv.metrics.sync_engine(srv.engine)
            if all(p is None for p in plans):
                self._wake.clear()
                await self._wake.wait()
                deadline = clock.now()
                continue
            step = DpStep(tuple(plan_time(self.profile, s.engine, p) for s, p in zip(self.ranks, plans, strict=True)))
            base = step.duration * self.config.time_scale
            start = max(deadline, now - _MAX_LAG_S)
            # One StepEnd shared by every rank (start): any rank's fault change moves the step's end.
            deadline = await self.ranks[0].step_end.sleep_step(start, base, lambda: max(s.faults.slowdown for s in self.ranks))
            done_at = clock.now()
            self._account_step(step)
            for srv, plan in zip(self.ranks, plans, strict=True):
                if plan is not None:
                    events = srv.engine.complete(plan, done_at)
                    self.tokens += len(events)
                    srv._account(plan, events, done_at)
            for r, srv in enumerate(self.ranks):  # after the step: what each rank now holds
                self._m_kv[r].set(srv.engine.kv_used)

    def _account_step(self, step: DpStep) -> None:
        """Per-rank busy and barrier-idle time of one step, in profile seconds (before time scaling)."""
        self.steps += 1
        self.step_s += step.duration
        for r in range(len(self.ranks)):
            busy, idle = step.rank_times[r], step.idle(r)
            self.busy_s[r] += busy
            self.idle_s[r] += idle
            self._m_busy[r].inc(busy)
            self._m_idle[r].inc(idle)

    def state(self) -> dict[str, Any]:
        """Group totals: idle fraction = Σ idle / (G · Σ step time)."""
        total = self.step_s * self.dp_size
        return {
            "dp_size": self.dp_size,
            "ports": [s.port for s in self.ranks],
            "steps": self.steps,
            "step_seconds": self.step_s,
            "idle_seconds": list(self.idle_s),
            "busy_seconds": list(self.busy_s),
            "idle_fraction": (sum(self.idle_s) / total) if total > 0 else 0.0,
            "generated_tokens": self.tokens,
        }
