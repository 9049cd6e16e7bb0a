"""Pure parts of the emulator: step-time profiles, the continuous-batching scheduler (fake clock),
request parsing and fault settings. No sockets, no sleeping."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from dlb.emulator.engine import Arrival, Engine, EngineRequest, simulate
from dlb.emulator.faults import FaultError, Faults
from dlb.emulator.openai import ApiError, OutputSampler, estimate_tokens, parse_request, token_text
from dlb.emulator.profile import (
    BUILTIN_PROFILES,
    Profile,
    ProfileError,
    load_profile,
    packaged_step_times,
    profile_from_step_times,
)

FAST = BUILTIN_PROFILES["fast-test"]


# -- profiles -----------------------------------------------------------------------------------------


def test_step_time_is_flat_then_linear_in_batch() -> None:
    p = Profile("t", base_ms=5.0, prefill_us_per_token=10.0, decode_us_per_seq=0.0, batch_knee=8, past_knee_ms_per_seq=0.5)
    assert p.step_time(1) == pytest.approx(0.005)
    assert p.step_time(8) == pytest.approx(0.005)
    assert p.step_time(12) == pytest.approx(0.005 + 4 * 0.0005)
    assert p.step_time(20) - p.step_time(16) == pytest.approx(p.step_time(16) - p.step_time(12))
    assert p.step_time(1, prefill_tokens=1000) == pytest.approx(0.005 + 0.010)


def test_measured_profile_reproduces_the_h200_measurement() -> None:
    data = packaged_step_times()
    for run in data["runs"]:
        prof = profile_from_step_times(data, run["model"])
        for point in run["decode"]:
            predicted = prof.step_time(point["batch"]) * 1e3
            assert predicted == pytest.approx(point["ms"], rel=0.3), (run["model"], point)  # eager-mode noise
        big = [p for p in run["decode"] if p["batch"] >= 64]
        for point in big:  # the linear part is fitted, so it must be close
            assert prof.step_time(point["batch"]) * 1e3 == pytest.approx(point["ms"], rel=0.03)
    p8 = profile_from_step_times(data, "llama-8b-shape")
    assert 16 <= p8.batch_knee <= 32  # "flat up to a batch of ~16-32"
    assert p8.prefill_us_per_token == pytest.approx(29, rel=0.05)  # "~29 us per token at 4096"


def test_builtin_llama_8b_h100_uses_production_floor_and_measured_shape() -> None:
    p = BUILTIN_PROFILES["llama-8b-h100"]
    measured = profile_from_step_times(packaged_step_times(), "llama-8b-shape")
    assert p.base_ms == 5.753 and p.prefill_us_per_token == 17.25 and p.decode_us_per_seq == 6.0
    assert p.batch_knee == measured.batch_knee and p.past_knee_ms_per_seq == measured.past_knee_ms_per_seq
    assert 5.7 < p.step_time(1) * 1e3 < 6.5  # ~6.5 ms/token at concurrency 1 on a real vLLM


def test_load_profile_from_files(tmp_path) -> None:
    f = tmp_path / "mine.json"
    f.write_text(json.dumps({"base_ms": 3, "prefill_us_per_token": 1, "decode_us_per_seq": 0, "batch_knee": 2,
                             "past_knee_ms_per_seq": 1}))  # fmt: skip
    p = load_profile(str(f))
    assert p.name == "mine" and p.step_time(4) == pytest.approx(0.005)
    data = tmp_path / "steps.json"
    data.write_text(json.dumps(packaged_step_times()))
    assert load_profile(f"{data}#llama-1b-shape").batch_knee > 30
    assert load_profile("fast-test", base_ms=7.0).base_ms == 7.0


@pytest.mark.parametrize(
    "content, needle",
    [
        ({"base_ms": 3, "prefill_us_per_token": 1, "decode_us_per_seq": 0, "batch_knee": 2, "past_knee_ms_per_seq": 1,
          "bogus": 1}, "bogus: unknown profile field"),
        ({"base_ms": 3}, "required profile field is missing"),
        ({"base_ms": -1, "prefill_us_per_token": 1, "decode_us_per_seq": 0, "batch_knee": 2, "past_knee_ms_per_seq": 1},
         "base_ms"),
        ({"runs": []}, "#MODEL"),
    ],
)
def test_bad_profile_files_name_file_and_field(tmp_path, content, needle) -> None:
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(content))
    with pytest.raises(ProfileError) as e:
        load_profile(str(f))
    assert str(f) in str(e.value) and needle in str(e.value)


def test_a_model_named_on_a_plain_profile_is_refused(tmp_path) -> None:
    """``prof.json#x`` ran the profile and dropped ``#x`` without a word."""
    f = tmp_path / "mine.json"
    f.write_text(json.dumps({"base_ms": 3, "prefill_us_per_token": 1, "decode_us_per_seq": 0, "batch_knee": 2,
                             "past_knee_ms_per_seq": 1}))  # fmt: skip
    with pytest.raises(ProfileError, match="'#x' names a run of a step-time file only"):
        load_profile(f"{f}#x")


def test_unknown_profile_name_lists_builtins() -> None:
    with pytest.raises(ProfileError, match="fast-test"):
        load_profile("no-such-profile")


# -- scheduler ------------------------------------------------------------------------------------------


def closed_form_e2e(p: Profile, n: int, prompt: int, output: int) -> float:
    """n identical requests arriving together, all fitting in one batch and one prefill step."""
    return p.step_time(n, n * prompt) + (output - 1) * p.step_time(n, 0)


def test_concurrent_latency_matches_closed_form_flat_then_linear() -> None:
    prompt, output = 10, 20
    e2e = {}
    for n in range(1, 17):
        res = simulate(Engine(FAST, max_batch=64, max_queue=0), [Arrival(0.0, prompt, output)] * n)
        assert not any(r.rejected for r in res)
        for r in res:
            assert r.e2e == pytest.approx(closed_form_e2e(FAST, n, prompt, output))
            assert r.ttft == pytest.approx(FAST.step_time(n, n * prompt))
        e2e[n] = res[0].e2e
    knee = int(FAST.batch_knee)
    # Flat at low load: below the knee only the tiny per-sequence term grows.
    assert e2e[knee] / e2e[1] < 1.05
    # Linear past it: equal increments, each ~ output × slope.
    incs = [e2e[n + 1] - e2e[n] for n in range(knee, 16)]
    assert max(incs) - min(incs) < 1e-9
    assert incs[0] == pytest.approx(output * FAST.past_knee_ms_per_seq * 1e-3, rel=0.05)
    assert e2e[16] > 3 * e2e[1]


def test_batch_limit_queues_the_rest_in_waves() -> None:
    prompt, output = 10, 5
    res = simulate(Engine(FAST, max_batch=4, max_queue=100), [Arrival(0.0, prompt, output)] * 8)
    first = closed_form_e2e(FAST, 4, prompt, output)
    assert [r.e2e for r in res[:4]] == pytest.approx([first] * 4)
    assert [r.e2e for r in res[4:]] == pytest.approx([2 * first] * 4)  # second wave starts when the first ends


def test_queue_overflow_rejects_beyond_batch_plus_queue() -> None:
    eng = Engine(FAST, max_batch=2, max_queue=3)
    accepted = [eng.submit(EngineRequest(i, 10, 5), 0.0) for i in range(7)]
    assert accepted == [True] * 5 + [False] * 2
    eng.plan(0.0)
    assert len(eng.running) == 2 and len(eng.waiting) == 3 and not eng.can_accept()


def test_chunked_prefill_spreads_long_prompts_over_steps() -> None:
    p = replace(FAST, max_batch_tokens=1000)
    res = simulate(Engine(p, max_batch=4), [Arrival(0.0, 2500, 3)])
    ttft = 2 * p.step_time(1, 1000) + p.step_time(1, 500)
    assert res[0].ttft == pytest.approx(ttft)
    assert res[0].e2e == pytest.approx(ttft + 2 * p.step_time(1, 0))


def test_decode_continues_while_a_newcomer_prefills() -> None:
    eng = Engine(FAST, max_batch=4)
    a = EngineRequest(1, 10, 10)
    eng.submit(a, 0.0)
    eng.complete(eng.plan(0.0), 1.0)
    assert a.generated == 1
    b = EngineRequest(2, 100, 10)
    eng.submit(b, 1.0)
    plan = eng.plan(1.0)
    assert plan.decode == (a,) and plan.prefill == ((b, 100),)
    assert plan.duration == pytest.approx(FAST.step_time(2, 100))
    events = eng.complete(plan, 2.0)
    assert {(e.request.rid, e.index) for e in events} == {(1, 1), (2, 0)}


def test_kv_cache_limit_delays_admission_and_reports_usage() -> None:
    p = replace(FAST, kv_cache_tokens=150)
    eng = Engine(p, max_batch=8)
    a, b = EngineRequest(1, 100, 2), EngineRequest(2, 100, 2)
    eng.submit(a, 0.0)
    eng.submit(b, 0.0)
    eng.complete(eng.plan(0.0), 1.0)
    assert eng.running == [a] and list(eng.waiting) == [b]  # b's prompt does not fit next to a's
    assert eng.kv_usage == pytest.approx(101 / 150)
    eng.complete(eng.plan(1.0), 2.0)  # a finishes
    eng.plan(2.0)
    assert eng.running == [b]


def test_abort_frees_the_slot_and_drops_pending_tokens() -> None:
    eng = Engine(FAST, max_batch=1, max_queue=1)
    a, b = EngineRequest(1, 10, 50), EngineRequest(2, 10, 5)
    eng.submit(a, 0.0)
    eng.submit(b, 0.0)
    plan = eng.plan(0.0)
    eng.abort(a)  # client disconnects mid-step
    assert eng.complete(plan, 1.0) == []
    assert eng.plan(1.0) is not None and eng.running == [b]


def test_idle_gaps_do_not_count_as_latency() -> None:
    res = simulate(Engine(FAST, max_batch=4), [Arrival(0.0, 10, 3), Arrival(5.0, 10, 3)])
    assert res[0].e2e == pytest.approx(res[1].e2e)
    assert res[1].finished_at > 5.0


# -- request parsing -------------------------------------------------------------------------------------

MODELS = ("m1", "m2")


def parse(kind, body, max_model_len=1000):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_request(kind, raw, MODELS, max_model_len)


def test_prompt_tokens_are_estimated_from_text_length() -> None:
    assert parse("completion", {"prompt": "x" * 40}).prompt_tokens == 10
    assert parse("completion", {"prompt": "x" * 41}).prompt_tokens == 11
    assert parse("completion", {"prompt": [1, 2, 3]}).prompt_tokens == 3
    assert parse("completion", {"prompt": ["x" * 8]}).prompt_tokens == 2
    chat = parse("chat", {"messages": [{"role": "system", "content": "x" * 20},
                                       {"role": "user", "content": [{"type": "text", "text": "y" * 20}]}]})  # fmt: skip
    assert chat.prompt_tokens == 10 + 2 * 4
    assert chat.model == "m1" and chat.max_tokens is None and not chat.stream


def test_generated_text_re_estimates_to_the_token_count() -> None:
    text = "".join(token_text(7, i) for i in range(33))
    assert estimate_tokens(text) == 33


def test_stream_options_and_max_tokens() -> None:
    r = parse("chat", {"model": "m2", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 9,
                       "stream": True, "stream_options": {"include_usage": True}})  # fmt: skip
    assert (r.model, r.max_tokens, r.stream, r.include_usage) == ("m2", 9, True, True)


@pytest.mark.parametrize(
    "kind, body, status, param",
    [
        ("completion", b"{not json", 400, None),
        ("completion", b"[1, 2]", 400, None),
        ("completion", {"max_tokens": 5}, 400, "prompt"),
        ("completion", {"prompt": "x", "model": "other"}, 404, "model"),
        ("completion", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
        ("completion", {"prompt": "x", "max_tokens": "5"}, 400, "max_tokens"),
        ("completion", {"prompt": ["a", "b"]}, 400, "prompt"),
        ("completion", {"prompt": "x", "n": 2}, 400, "n"),
        ("completion", {"prompt": "x", "stream": "yes"}, 400, "stream"),
        ("completion", {"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options"),
        ("completion", {"prompt": "x", "max_tokens": 1000}, 400, "max_tokens"),
        ("chat", {"messages": []}, 400, "messages"),
        ("chat", {"messages": [{"content": "x"}]}, 400, "messages[0]"),
        ("chat", {"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
    ],
)
def test_bad_requests_name_the_field(kind, body, status, param) -> None:
    with pytest.raises(ApiError) as e:
        parse(kind, body)
    assert e.value.status == status and e.value.param == param
    body_json = e.value.body()
    assert set(body_json["error"]) == {"message", "type", "param", "code"} and body_json["error"]["message"]


def test_output_sampler_is_seeded_and_capped() -> None:
    req = parse("completion", {"prompt": "x" * 40})
    a = [OutputSampler(mean=50, seed=3).output_tokens(req, 1000) for _ in range(1)]
    s1, s2 = OutputSampler(mean=50, seed=3), OutputSampler(mean=50, seed=3)
    seq1 = [s1.output_tokens(req, 1000) for _ in range(200)]
    assert seq1 == [s2.output_tokens(req, 1000) for _ in range(200)]
    assert seq1[0] == a[0]
    counts = [n for n, _ in seq1]
    assert 35 < sum(counts) / len(counts) < 65 and len(set(counts)) > 20
    exact = parse("completion", {"prompt": "x", "max_tokens": 7})
    assert OutputSampler(mode="max_tokens").output_tokens(exact, 1000) == (7, "length")
    capped = [OutputSampler(mean=50, mode="sample", seed=s).output_tokens(exact, 1000) for s in range(50)]
    assert all(n <= 7 for n, _ in capped) and {r for _, r in capped} == {"length", "stop"}


# -- faults ---------------------------------------------------------------------------------------------


def test_fault_updates_are_partial_and_validated() -> None:
    f = Faults().updated({"error_rate": 0.5, "slowdown": 3})
    assert (f.error_rate, f.slowdown, f.error_status, f.down) == (0.5, 3, 500, False)
    for patch, field in [({"error_rate": 2}, "error_rate"), ({"error_status": 200}, "error_status"),
                         ({"slowdown": 0}, "slowdown"), ({"down": "yes"}, "down"), ({"eror_rate": 1}, "eror_rate"),
                         ({"slowdown": 1e308}, "slowdown"), ({"extra_latency_ms": 1e9}, "extra_latency_ms"),
                         ({"health_delay_ms": 600_001}, "health_delay_ms")]:  # fmt: skip
        with pytest.raises(FaultError, match=f"^{re_escape(field)}:"):
            f.updated(patch)


def re_escape(s: str) -> str:
    import re

    return re.escape(s)


def test_error_rate_fraction_is_roughly_honoured() -> None:
    import random

    rng = random.Random(1)
    f = Faults(error_rate=0.3)
    hits = sum(f.inject_error(rng) for _ in range(2000))
    assert math.isclose(hits / 2000, 0.3, abs_tol=0.05)
    assert not any(Faults().inject_error(rng) for _ in range(100))


# -- invariants under random load (hypothesis) -----------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

arrivals_st = st.lists(
    st.tuples(st.floats(0, 0.5), st.integers(1, 3000), st.integers(1, 40)).map(lambda t: Arrival(*t)),
    min_size=1,
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(arrivals=arrivals_st, max_batch=st.integers(1, 8), max_queue=st.integers(0, 10),
       budget=st.integers(64, 4096), kv=st.integers(3100, 20000))  # fmt: skip
def test_engine_invariants_under_random_load(arrivals, max_batch, max_queue, budget, kv) -> None:
    prof = replace(FAST, max_batch_tokens=budget, kv_cache_tokens=kv)
    eng = Engine(prof, max_batch=max_batch, max_queue=max_queue)
    # Instrument steps: the batch limit and token budget hold in every step.
    orig_plan = eng.plan

    def checked_plan(now):
        plan = orig_plan(now)
        if plan is not None:
            assert plan.batch <= max_batch and len(eng.running) <= max_batch
            assert plan.prefill_tokens + len(plan.decode) <= max(budget, len(plan.decode))
            assert plan.duration == pytest.approx(prof.step_time(plan.batch, plan.prefill_tokens))
        assert len(eng.waiting) <= max_queue + max_batch
        return plan

    eng.plan = checked_plan  # type: ignore[method-assign]
    res = simulate(eng, arrivals)
    assert not eng.running and not eng.waiting
    served = [r for r in res if not r.rejected]
    assert served  # the first arrival always finds a free slot
    for a, r in zip(arrivals, res, strict=True):
        if r.rejected:
            continue
        # Never faster than running alone on an idle GPU.
        alone = simulate(Engine(prof, max_batch=1, max_queue=0), [Arrival(0.0, a.prompt_tokens, a.output_tokens)])[0]
        assert r.ttft >= alone.ttft - 1e-12 and r.e2e >= alone.e2e - 1e-12
        assert r.first_token_at <= r.finished_at
    if max_queue + max_batch >= len(arrivals):
        assert len(served) == len(arrivals)  # nothing rejected while there was room


@pytest.mark.parametrize("kind", ["completion", "chat"])
@pytest.mark.parametrize("include_usage", [True, False])
def test_chunk_encoder_fast_path_is_byte_identical(kind, include_usage) -> None:
    from dlb.emulator.openai import ChunkEncoder, chunk, sse

    enc = ChunkEncoder(kind, 'id-"1', 123, 'mo"del\\', include_usage)
    for text in (" the", 'a"b\\c\n', "\u00fc\u4e2d"):
        for reason in (None, "length", "stop"):
            for role in (False, True):
                expected = sse(chunk(kind, 'id-"1', 123, 'mo"del\\', text, reason, include_usage, role=role))
                assert enc.token(text, reason, role=role) == expected


# -- prefix caching ---------------------------------------------------------------------------------------


def test_prefix_blocks_chain_over_the_whole_prefix() -> None:
    from dlb.emulator.prefix_cache import text_blocks, token_blocks

    a = text_blocks("A" * 64 + "B" * 64 + "C" * 10, 4)
    b = text_blocks("A" * 64 + "B" * 64 + "D" * 70, 4)
    c = text_blocks("Z" * 64 + "B" * 64, 4)
    assert len(a) == 2 and len(b) == 3  # partial last blocks are never cached
    assert a == b[:2]
    assert c[1] != a[1]  # same block text after a different prefix is a different block
    assert token_blocks(list(range(40)))[:2] == token_blocks(list(range(32)))
    assert token_blocks(list(range(15))) == ()


def test_prefix_cache_matches_leading_blocks_and_evicts_lru() -> None:
    from dlb.emulator.prefix_cache import PrefixCache

    cache = PrefixCache(capacity_blocks=4, block_tokens=16)
    cache.insert([b"a1", b"a2", b"a3"])
    assert cache.match([b"a1", b"a2", b"x3"]) == 32
    assert cache.match([b"x1", b"a2"]) == 0  # only a leading run counts
    cache.insert([b"b1", b"b2"])  # over capacity: the least recently used goes (a3)
    assert len(cache) == 4 and cache.match([b"a1", b"a2", b"a3"]) == 32


def test_cached_prefix_skips_prefill_in_the_engine() -> None:
    cold = simulate(Engine(FAST, max_batch=4), [Arrival(0.0, 1000, 5)])[0]
    warm = simulate(Engine(FAST, max_batch=4), [Arrival(0.0, 1000, 5, cached_tokens=992)])[0]
    full = simulate(Engine(FAST, max_batch=4), [Arrival(0.0, 1000, 5, cached_tokens=5000)])[0]
    assert cold.ttft == pytest.approx(FAST.step_time(1, 1000))
    assert warm.ttft == pytest.approx(FAST.step_time(1, 8))
    assert full.ttft == pytest.approx(FAST.step_time(1, 1))  # the last prompt token is always computed
    assert warm.e2e - warm.ttft == pytest.approx(cold.e2e - cold.ttft)


def test_repeated_decode_steps_equal_single_steps() -> None:
    """``complete(plan, now, steps=k)`` with k from ``repeatable`` leaves the engine exactly as k
    single steps do (what lets the simulator skip steps)."""
    from dlb.emulator.engine import Engine, EngineRequest

    prof = BUILTIN_PROFILES["fast-test"]
    a, b = Engine(prof, max_batch=8), Engine(prof, max_batch=8)
    for eng in (a, b):
        for i, (p, o) in enumerate([(30, 7), (50, 12), (10, 3), (80, 20)]):
            eng.submit(EngineRequest(i, p, o), 0.0)
    now_a = now_b = 0.0
    while a.running or a.waiting:
        plan = a.plan(now_a)
        assert plan is not None
        k = a.repeatable(plan)
        now_a += k * plan.duration
        a.complete(plan, now_a, steps=k)
        for _ in range(k):
            pb = b.plan(now_b)
            assert pb is not None and pb.batch == plan.batch and pb.duration == plan.duration
            now_b += pb.duration
            b.complete(pb, now_b)
        assert [(r.rid, r.generated) for r in a.running] == [(r.rid, r.generated) for r in b.running]
        assert now_a == pytest.approx(now_b)
    assert a.steps == b.steps and a.steps > 0 and not b.running


def test_waiting_queue_bounded_by_prompt_tokens() -> None:
    from dlb.emulator.engine import Engine, EngineRequest

    eng = Engine(BUILTIN_PROFILES["fast-test"], max_batch=1, max_waiting_tokens=100)
    assert eng.submit(EngineRequest(0, 500, 5), 0.0)  # a free batch slot takes any prompt
    assert eng.plan(0.0) is not None and len(eng.running) == 1
    assert eng.submit(EngineRequest(1, 60, 5), 0.0)
    assert not eng.submit(EngineRequest(2, 50, 5), 0.0)  # 60 + 50 tokens would wait
    assert eng.submit(EngineRequest(3, 40, 5), 0.0)
    assert eng.waiting_tokens == 100


def _reference_emits(eng: Engine) -> int:
    """Tokens the running set emits in the next step: every decoding sequence, and every prompt the
    token budget completes."""
    decode = [r for r in eng.running if r.in_decode]
    budget = eng.profile.max_batch_tokens - len(decode)
    n = len(decode)
    for r in eng.running:
        if not r.in_decode and budget > 0:
            take = min(r.prefill_len - r.prefilled, budget)
            n += take == r.prefill_len - r.prefilled
            budget -= take
    return n


def _reference_step(eng: Engine, now: float) -> tuple[list, list, float, list, int] | None:
    """One engine step by the plain rules (kept as the spec of the inlined hot path): while the step's
    tokens would overflow the KV cache, preempt the youngest of several running requests to the front
    of the queue (it recomputes prompt + generated); unless that happened, admit FCFS while the
    prompt and its first token fit next to the running set's KV and growth; decode every sequence past
    its prefill, give the rest of the token budget to prefills in order; retire the finished."""
    kv = lambda: sum(r.kv_tokens for r in eng.running)
    cap = eng.profile.kv_cache_tokens
    preempted = 0
    while len(eng.running) > 1 and kv() + _reference_emits(eng) > cap:
        victim = eng.running.pop()
        victim.prefilled, victim.prefill_len = victim.cached_tokens, victim.prompt_tokens + victim.generated
        eng.waiting.appendleft(victim)
        eng.waiting_tokens += victim.kv_tokens
        preempted += 1
    admitted: list = []
    grow = _reference_emits(eng)
    while not preempted and eng.waiting and len(eng.running) < eng.max_batch:
        head = eng.waiting[0]
        if eng.running and kv() + grow + len(admitted) + head.kv_tokens + 1 > cap:
            break
        eng.waiting.popleft()
        eng.waiting_tokens -= head.kv_tokens
        head.admitted_at = now if head.admitted_at is None else head.admitted_at
        eng.running.append(head)
        admitted.append(head)
    if not eng.running:
        return None
    decode = [r for r in eng.running if r.in_decode]
    budget = max(0, eng.profile.max_batch_tokens - len(decode))
    prefill = []
    context = sum(r.kv_tokens for r in decode)
    for r in eng.running:
        if not r.in_decode and budget > 0:
            take = min(r.prefill_len - r.prefilled, budget)
            prefill.append((r, take))
            context += r.prefilled + take
            budget -= take
    duration = eng.profile.step_time(len(decode) + len(prefill), sum(n for _, n in prefill), context)
    events = []
    for r in decode:
        r.generated = min(r.generated + 1, r.output_tokens)
        events.append((r.rid, r.generated - 1, r.finished))
    for r, n in prefill:
        r.prefilled += n
        if r.in_decode:
            r.generated += 1
            events.append((r.rid, r.generated - 1, r.finished))
    eng.running = [r for r in eng.running if not r.finished]
    return [r.rid for r in decode], [(r.rid, n) for r, n in prefill], duration, events, preempted


#: FAST with a context term: 64 tokens of KV per sequence-equivalent, so random prompts cross the knee.
FAST_CTX = replace(FAST, ref_context_tokens=64)


@settings(max_examples=100, deadline=None)
@given(arrivals=st.lists(st.tuples(st.just(0.0), st.integers(1, 3000), st.integers(1, 400)).map(lambda t: Arrival(*t)),
                         min_size=1, max_size=30),
       max_batch=st.integers(1, 8), budget=st.integers(64, 4096), kv=st.integers(3000, 8000),
       ctx=st.sampled_from([FAST, FAST_CTX]))
def test_engine_steps_equal_the_plain_rules(arrivals, max_batch, budget, kv, ctx) -> None:
    """The engine's inlined hot path (plan / preemption / admission / complete, run millions of times
    by the simulator) takes exactly the plain rules' steps: same batches, budgets, durations, tokens and
    preemptions; and no request is lost: every one finishes with all its tokens."""
    prof = replace(ctx, max_batch_tokens=budget, kv_cache_tokens=kv)
    fast, ref = Engine(prof, max_batch=max_batch, max_queue=64), Engine(prof, max_batch=max_batch, max_queue=64)
    reqs = []
    for eng in (fast, ref):
        reqs.append([EngineRequest(i, a.prompt_tokens, a.output_tokens) for i, a in enumerate(arrivals)])
        for r in reqs[-1]:
            eng.submit(r, 0.0)
    now, steps, preempted = 0.0, 0, 0
    while True:
        before = fast.preemptions
        plan, want = fast.plan(now), _reference_step(ref, now)
        if plan is None or want is None:
            assert plan is None and want is None
            break
        now += plan.duration
        got = [(e.request.rid, e.index, e.finished) for e in fast.complete(plan, now)]
        assert ([r.rid for r in plan.decode], [(r.rid, n) for r, n in plan.prefill], plan.duration, got,
                fast.preemptions - before) == want
        assert [r.rid for r in fast.running] == [r.rid for r in ref.running]
        assert fast.kv_used == sum(r.kv_tokens for r in fast.running)  # the running count is right
        if len(fast.running) > 1:
            assert fast.kv_used <= kv  # preemption keeps the KV within the cache
        preempted += want[4]
        steps += 1
    assert fast.preemptions == preempted == sum(r.preempted for r in reqs[0])
    assert all(r.generated == r.output_tokens and r.finished_at is not None for r in reqs[0])
    assert steps > 0 and not fast.waiting and not ref.waiting
