"""The engine's context term and KV preemption (dlb/emulator/engine.py, dlb/emulator/profile.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dlb.emulator.engine import Engine, EngineRequest
from dlb.emulator.profile import BUILTIN_PROFILES, packaged_step_times

FAST = BUILTIN_PROFILES["fast-test"]
#: FAST with a context term: one "sequence" of the batch curve is 100 tokens of KV.
FAST_CTX = replace(FAST, ref_context_tokens=100)


def test_context_term_is_the_measured_curve_at_its_context_and_scales_with_kv() -> None:
    """At the measurement's 1024 tokens per sequence the step time is the measured curve; past the
    knee it grows with the KV read, not the sequence count: 32 sequences of 2048 tokens cost what 64
    of 1024 do (the measured 37.8 ms), 64 of 512 what 32 of 1024 do; below the knee it is the floor."""
    p = BUILTIN_PROFILES["llama-8b-h200-eager"]
    assert p.ref_context_tokens == 1024
    measured = {d["batch"]: d["ms"] for d in packaged_step_times()["runs"][1]["decode"]}
    for b in (64, 128):
        assert p.step_time(b, 0, b * 1024) == p.step_time(b)
        assert p.step_time(b, 0, b * 1024) * 1e3 == pytest.approx(measured[b], rel=0.03)
    assert p.step_time(32, 0, 32 * 2048) == pytest.approx(p.step_time(64))
    assert p.step_time(64, 0, 64 * 512) == pytest.approx(p.step_time(32))
    assert p.step_time(8, 0, 8 * 2048) == p.step_time(1) == pytest.approx(p.base_ms * 1e-3)  # 16 k tokens: flat
    per_token_ms = (p.step_time(64, 0, 64 * 1024 + 1000) - p.step_time(64, 0, 64 * 1024)) * 1e3 / 1000
    assert per_token_ms == pytest.approx(p.past_knee_ms_per_seq / 1024)
    assert 0.40e-3 < per_token_ms < 0.46e-3  # 0.43 µs per KV token, from 0.442 ms per 1024-token sequence
    assert FAST.step_time(8, 0, 10**6) == FAST.step_time(8)  # a profile without the term ignores context


@pytest.mark.parametrize(("batch", "context", "steps"), [(3, 50, 40), (30, 200, 1), (30, 200, 500), (5, 9_000, 7)])
def test_decode_run_time_is_the_sum_of_its_steps(batch: int, context: int, steps: int) -> None:
    """k decode steps, each one token per sequence longer, take the sum of the single steps' times
    (crossing the knee part-way included): what lets the simulator run them as one event."""
    want = sum(FAST_CTX.step_time(batch, 0, context + i * batch) for i in range(steps))
    assert FAST_CTX.decode_run_time(batch, context, steps) == pytest.approx(want, rel=1e-12)


def _run_to_end(eng: Engine, now: float = 0.0) -> float:
    while (plan := eng.plan(now)) is not None:
        now += plan.duration
        eng.complete(plan, now)
    return now


def test_preemption_happens_exactly_when_the_next_step_would_overflow_the_kv() -> None:
    """Two requests of 100-token prompts decode in a 230-token cache: each step adds 2 tokens, so the
    step that would take the KV past 230 preempts the younger one (and not a step earlier); it waits at
    the head of the queue, is readmitted when the other finishes, recomputes its prompt and the tokens
    it had generated as one prefill, and then finishes every token it owes."""
    eng = Engine(replace(FAST, kv_cache_tokens=230), max_batch=4)
    old, young = EngineRequest(0, 100, 40), EngineRequest(1, 100, 40)
    eng.submit(old, 0.0)
    eng.submit(young, 0.0)
    now, kv_before = 0.0, []
    while eng.preemptions == 0:
        kv_before.append(eng.kv_used)
        plan = eng.plan(now)
        assert plan is not None
        if eng.preemptions:
            break
        assert eng.kv_used + plan.batch <= 230  # the step about to run fits
        now += plan.duration
        eng.complete(plan, now)
    assert kv_before[-1] + 2 > 230 and kv_before[-2] + 2 <= 230  # preempted at the first overflowing step
    assert eng.running == [old] and list(eng.waiting) == [young]
    assert young.preempted == 1 and young.prefilled == 0 and young.prefill_len == 100 + young.generated
    owed = young.generated
    assert eng.waiting_tokens == young.kv_tokens == 100 + owed
    first_token_at = young.first_token_at
    # Readmitted only when it fits again, its prefill recomputes prompt + generated, then it continues.
    recomputed = []
    while young.finished_at is None:
        plan = eng.plan(now)
        assert plan is not None
        recomputed += [n for r, n in plan.prefill if r is young]
        now += plan.duration
        eng.complete(plan, now)
    assert sum(recomputed) == 100 + owed and old.finished_at is not None
    assert young.generated == young.output_tokens == 40 and young.first_token_at == first_token_at
    assert eng.preemptions == 1 and not eng.running and not eng.waiting


def test_no_request_is_lost_to_preemption_and_repeated_steps_equal_single_steps() -> None:
    """Many requests in a small cache with the context term: preemptions happen, every request
    finishes with all its tokens, and the simulator's repeated steps (``repeatable`` / ``run_time``)
    reach the same state at the same time as single steps, preemptions included."""
    prof = replace(FAST_CTX, kv_cache_tokens=1_500)
    sizes = [(300, 60), (200, 90), (250, 30), (100, 120), (400, 50), (150, 80)]
    a, b = Engine(prof, max_batch=8), Engine(prof, max_batch=8)
    reqs_a = [EngineRequest(i, p, o) for i, (p, o) in enumerate(sizes)]
    for eng, reqs in ((a, reqs_a), (b, [EngineRequest(i, p, o) for i, (p, o) in enumerate(sizes)])):
        for r in reqs:
            eng.submit(r, 0.0)
    now_a = now_b = 0.0
    while (plan := a.plan(now_a)) is not None:
        k = a.repeatable(plan)
        now_a += plan.run_time(k)
        a.complete(plan, now_a, steps=k, finished_only=True)
        for _ in range(k):
            pb = b.plan(now_b)
            assert pb is not None and pb.batch == plan.batch
            now_b += pb.duration
            b.complete(pb, now_b)
        assert [(r.rid, r.generated) for r in a.running] == [(r.rid, r.generated) for r in b.running]
        assert a.kv_used == b.kv_used == sum(r.kv_tokens for r in a.running)
        assert now_a == pytest.approx(now_b, rel=1e-12)
        assert a.preemptions == b.preemptions
    assert b.plan(now_b) is None and a.preemptions > 0
    assert all(r.finished_at is not None and r.generated == r.output_tokens for r in reqs_a)
    assert a.steps == b.steps


def test_steps_by_finds_the_step_in_progress() -> None:
    """The step in progress at an elapsed time (where an arrival cuts a simulator run)."""
    eng = Engine(FAST_CTX, max_batch=8)
    for i in range(6):
        eng.submit(EngineRequest(i, 200, 50), 0.0)
    now = 0.0
    plan = eng.plan(now)
    while plan is not None and plan.prefill:
        now += plan.duration
        eng.complete(plan, now)
        plan = eng.plan(now)
    assert plan is not None
    k = eng.repeatable(plan)
    assert k > 3
    ends = [plan.run_time(m) for m in range(1, k + 1)]
    assert ends[1] - ends[0] > ends[0]  # the context grows: each step is longer than the one before
    assert plan.steps_by(0.0, k) == 1
    assert plan.steps_by(ends[0], k) == 2  # exactly at a step's end the next one is in progress
    assert plan.steps_by((ends[1] + ends[2]) / 2, k) == 3
    assert plan.steps_by(10.0, k) == k
