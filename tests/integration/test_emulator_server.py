"""The emulator over real sockets on 127.0.0.1: OpenAI wire format, streaming, metrics, overload,
fault knobs, and the three ways to run it (async in-process, threaded, child process)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable
from typing import Any, TypeVar

import aiohttp
import pytest
from bounded_wait import until_in_loop
from prometheus_client.parser import text_string_to_metric_families

from dlb.emulator import EmulatorServer, ThreadedEmulator
from dlb.emulator.client import get_faults, get_state, reset_faults, set_faults
from dlb.emulator.profile import BUILTIN_PROFILES
from dlb.testbed.emulator import EmulatorProcess

T = TypeVar("T")
FAST = BUILTIN_PROFILES["fast-test"]


def run(coro: Awaitable[T], timeout: float = 60.0) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


def emulator(**kw: Any) -> EmulatorServer:
    kw.setdefault("profile", "fast-test")
    kw.setdefault("server_id", "emu-test")
    return EmulatorServer(**kw)


async def post(s: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, dict[str, Any], aiohttp.typedefs.LooseHeaders]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with s.post(url, data=data, headers={"Content-Type": "application/json"}) as r:
        return r.status, await r.json(content_type=None), r.headers


async def read_sse(resp: aiohttp.ClientResponse) -> list[tuple[float, str]]:
    """(arrival time, data payload) for every SSE event of a response."""
    out = []
    async for raw in resp.content:
        line = raw.decode().strip()
        if line.startswith("data: "):
            out.append((time.monotonic(), line[len("data: "):]))
    return out


async def wait_state(s: aiohttp.ClientSession, url: str, pred: Any, timeout: float = 20.0) -> dict[str, Any]:
    async def matched() -> dict[str, Any] | None:
        async with s.get(url + "/admin/state") as r:
            st = await r.json()
        return st if pred(st) else None

    return await until_in_loop(matched, "the emulator's state to match", timeout, period=0.01)


async def scrape(s: aiohttp.ClientSession, url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with s.get(url + "/metrics") as r:
        assert r.status == 200
        text = await r.text()
    out = {}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def metric(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted({"model_name": "dlb-emulated", **labels}.items())))]


def assert_openai_error(body: dict[str, Any]) -> None:
    assert set(body) == {"error"}
    assert set(body["error"]) >= {"message", "type", "param", "code"} and body["error"]["message"]


# -- wire format -------------------------------------------------------------------------------------------


def test_non_streaming_completion_and_chat_are_well_formed() -> None:
    async def go() -> None:
        async with emulator() as emu, aiohttp.ClientSession() as s:
            st, body, headers = await post(s, emu.url + "/v1/completions",
                                           {"model": "dlb-emulated", "prompt": "x" * 40, "max_tokens": 6})  # fmt: skip
            assert st == 200 and headers["x-dlb-server"] == "emu-test"
            assert body["object"] == "text_completion" and body["model"] == "dlb-emulated"
            (choice,) = body["choices"]
            assert choice["finish_reason"] == "length" and choice["index"] == 0
            assert body["usage"] == {"prompt_tokens": 10, "completion_tokens": 6, "total_tokens": 16}
            assert len(choice["text"]) == 6 * 4
            st, body, _ = await post(s, emu.url + "/v1/chat/completions",
                                     {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 3})  # fmt: skip
            assert st == 200 and body["object"] == "chat.completion"
            msg = body["choices"][0]["message"]
            assert msg["role"] == "assistant" and len(msg["content"]) == 12
            assert body["usage"]["completion_tokens"] == 3 and body["usage"]["prompt_tokens"] == 2 + 4

    run(go())


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_streaming_is_incremental_and_ends_with_usage_and_done(kind: str) -> None:
    n_tokens = 12
    path = "/v1/completions" if kind == "completion" else "/v1/chat/completions"
    req: dict[str, Any] = {"max_tokens": n_tokens, "stream": True, "stream_options": {"include_usage": True}}
    req.update({"prompt": "hello"} if kind == "completion" else {"messages": [{"role": "user", "content": "hello"}]})

    async def go() -> None:
        # 20 ms engine steps: slow enough that a buffered response would be obvious.
        async with emulator(time_scale=10.0) as emu, aiohttp.ClientSession() as s:
            async with s.post(emu.url + path, json=req) as resp:
                assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
                assert resp.headers["x-dlb-server"] == "emu-test"
                first = await resp.content.readline()
                assert first.startswith(b"data: {")
                # The first token reached us while the request is still generating: not buffered.
                st = await wait_state(s, emu.admin_url, lambda st: True)
                assert st["running"] == 1
                rest = await read_sse(resp)
            events = [json.loads(first[6:])] + [json.loads(p) for _, p in rest[:-1]]
            assert rest[-1][1] == "[DONE]"
            usage = events[-1]
            assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": usage["usage"]["prompt_tokens"],
                                                                 "completion_tokens": n_tokens,
                                                                 "total_tokens": usage["usage"]["total_tokens"]}  # fmt: skip
            tokens = events[:-1]
            assert len(tokens) == n_tokens  # one chunk per decode step
            assert all(e["usage"] is None for e in tokens)
            assert [e["choices"][0]["finish_reason"] for e in tokens] == [None] * (n_tokens - 1) + ["length"]
            if kind == "chat":
                assert tokens[0]["object"] == "chat.completion.chunk"
                assert tokens[0]["choices"][0]["delta"]["role"] == "assistant"
                assert all(e["choices"][0]["delta"]["content"] for e in tokens)
            else:
                assert all(e["choices"][0]["text"] for e in tokens)
            # Arrival times spread over the decode steps (loose bound: steps only ever run late, and the
            # engine catches up by at most 50 ms).
            times = [t for t, _ in rest[: n_tokens - 1]]
            assert times[-1] - times[0] >= 0.5 * (n_tokens - 3) * FAST.step_time(1) * 10.0

    run(go())


def test_streaming_without_usage_option_has_no_usage_chunk() -> None:
    async def go() -> None:
        async with emulator() as emu, aiohttp.ClientSession() as s:
            async with s.post(emu.url + "/v1/completions", json={"prompt": "x", "max_tokens": 3, "stream": True}) as resp:
                events = await read_sse(resp)
            assert [p for _, p in events][-1] == "[DONE]"
            chunks = [json.loads(p) for _, p in events[:-1]]
            assert len(chunks) == 3 and all("usage" not in c for c in chunks)

    run(go())


def test_models_health_and_unknown_paths() -> None:
    async def go() -> None:
        async with emulator(models=("a", "b")) as emu, aiohttp.ClientSession() as s:
            async with s.get(emu.url + "/v1/models") as r:
                body = await r.json()
                assert r.status == 200 and r.headers["x-dlb-server"] == "emu-test"
            assert body["object"] == "list" and [m["id"] for m in body["data"]] == ["a", "b"]
            assert all(m["object"] == "model" for m in body["data"])
            async with s.get(emu.url + "/health") as r:
                assert r.status == 200
            async with s.get(emu.url + "/v2/nothing") as r:
                assert r.status == 404
                assert_openai_error(await r.json())
            async with s.get(emu.url + "/v1/completions") as r:
                assert r.status == 405
                assert_openai_error(await r.json())
            st, body, _ = await post(s, emu.url + "/v1/completions", {"model": "b", "prompt": "x", "max_tokens": 1})
            assert st == 200 and body["model"] == "b"

    run(go())


def test_malformed_and_invalid_requests_get_openai_errors() -> None:
    async def go() -> None:
        async with emulator() as emu, aiohttp.ClientSession() as s:
            st, body, _ = await post(s, emu.url + "/v1/completions", b'{"prompt": "x", ')
            assert st == 400
            assert_openai_error(body)
            assert body["error"]["type"] == "invalid_request_error" and "JSON" in body["error"]["message"]
            st, body, _ = await post(s, emu.url + "/v1/chat/completions", {"model": "dlb-emulated"})
            assert st == 400 and body["error"]["param"] == "messages"
            st, body, _ = await post(s, emu.url + "/v1/completions", {"model": "gpt-9", "prompt": "x"})
            assert st == 404 and body["error"]["param"] == "model"

    run(go())


# -- load: metrics, queueing, overflow, disconnects -------------------------------------------------------


def test_metrics_track_running_waiting_and_totals() -> None:
    prompts = ["x" * (40 * (i + 1)) for i in range(5)]  # 10, 20, ..., 50 prompt tokens

    async def go() -> None:
        async with emulator(max_batch=2, max_queue=10, time_scale=5.0) as emu, aiohttp.ClientSession() as s:
            m0 = await scrape(s, emu.url)
            assert metric(m0, "vllm:num_requests_running") == 0 and metric(m0, "vllm:prompt_tokens_total") == 0
            tasks = [asyncio.create_task(post(s, emu.url + "/v1/completions", {"prompt": p, "max_tokens": 30}))
                     for p in prompts]  # fmt: skip
            await wait_state(s, emu.admin_url, lambda st: st["running"] == 2 and st["waiting"] == 3)
            m1 = await scrape(s, emu.url)
            assert metric(m1, "vllm:num_requests_running") == 2
            assert metric(m1, "vllm:num_requests_waiting") == 3
            assert 0 < metric(m1, "vllm:gpu_cache_usage_perc") < 1
            results = await asyncio.gather(*tasks)
            assert [st for st, _, _ in results] == [200] * 5
            m2 = await scrape(s, emu.url)
            assert metric(m2, "vllm:num_requests_running") == 0 and metric(m2, "vllm:num_requests_waiting") == 0
            assert metric(m2, "vllm:gpu_cache_usage_perc") == 0
            assert metric(m2, "vllm:prompt_tokens_total") == sum(range(10, 51, 10))
            assert metric(m2, "vllm:generation_tokens_total") == 5 * 30
            assert metric(m2, "vllm:e2e_request_latency_seconds_count") == 5
            assert metric(m2, "vllm:time_to_first_token_seconds_count") == 5
            assert metric(m2, "vllm:request_success_total", finished_reason="length") == 5
            # Requests that waited for a slot took longer end to end than the engine time alone.
            assert metric(m2, "vllm:e2e_request_latency_seconds_sum") > 5 * 30 * FAST.step_time(1) * 5.0

    run(go())


@pytest.mark.parametrize("status", [429, 503])
def test_queue_overflow_answers_with_configured_status(status: int) -> None:
    async def go() -> None:
        async with emulator(max_batch=1, max_queue=1, time_scale=10.0, overflow_status=status) as emu, \
                aiohttp.ClientSession() as s:  # fmt: skip
            long = {"prompt": "x", "max_tokens": 200}
            t1 = asyncio.create_task(post(s, emu.url + "/v1/completions", long))
            await wait_state(s, emu.admin_url, lambda st: st["running"] == 1)
            t2 = asyncio.create_task(post(s, emu.url + "/v1/completions", long))
            await wait_state(s, emu.admin_url, lambda st: st["waiting"] == 1)
            st, body, headers = await post(s, emu.url + "/v1/completions", long)
            assert st == status and headers["x-dlb-server"] == "emu-test"
            assert_openai_error(body)
            assert "overloaded" in body["error"]["message"]
            m = await scrape(s, emu.url)
            assert metric(m, "dlb_emulator_requests_rejected_total", reason="queue_full") == 1
            for t in (t1, t2):
                t.cancel()
            await asyncio.gather(t1, t2, return_exceptions=True)

    run(go())


def test_client_disconnect_frees_the_slot() -> None:
    async def go() -> None:
        async with emulator(max_batch=1, time_scale=10.0) as emu:
            async with aiohttp.ClientSession() as s:
                resp = await s.post(emu.url + "/v1/completions", json={"prompt": "x", "max_tokens": 5000, "stream": True})
                await resp.content.readline()
                resp.close()  # drop the connection mid-stream
            async with aiohttp.ClientSession() as s:
                # Finishing naturally would take 100 s: only an abort frees the slot within the wait.
                await wait_state(s, emu.admin_url, lambda st: st["running"] == 0 and st["waiting"] == 0, timeout=10)
                st, _, _ = await post(s, emu.url + "/v1/completions", {"prompt": "x", "max_tokens": 2})
                assert st == 200

    run(go())


def test_latency_grows_past_the_knee_under_concurrency() -> None:
    """Live server, same shape as the pure model: the per-request engine time the server reports
    (e2e sum, all requests start together) grows with concurrency past the knee. Compared through
    lower bounds only: a step never finishes early."""

    async def batch_e2e(n: int) -> float:
        async with emulator(max_batch=32) as emu, aiohttp.ClientSession() as s:
            body = {"prompt": "x", "max_tokens": 20}
            await asyncio.gather(*[post(s, emu.url + "/v1/completions", body) for _ in range(n)])
            return metric(await scrape(s, emu.url), "vllm:e2e_request_latency_seconds_sum") / n

    lat16 = run(batch_e2e(16))
    assert lat16 >= 19 * FAST.step_time(16)  # 16 sequences past a knee of 4: ~7x the unloaded step


# -- fault knobs ----------------------------------------------------------------------------------------


def test_fault_knobs_flip_a_running_server_bad_and_back() -> None:
    async def go() -> None:
        async with emulator() as emu, aiohttp.ClientSession() as s:
            url = emu.url + "/v1/completions"
            async with s.post(emu.admin_url + "/admin/faults", json={"error_rate": 1.0, "error_status": 502}) as r:
                assert r.status == 200 and (await r.json())["error_rate"] == 1.0
            results = [await post(s, url, {"prompt": "x", "max_tokens": 2}) for _ in range(10)]
            assert [st for st, _, _ in results] == [502] * 10
            for _, body, headers in results:
                assert_openai_error(body)
                assert headers["x-dlb-server"] == "emu-test"
            async with s.delete(emu.admin_url + "/admin/faults") as r:
                assert (await r.json())["error_rate"] == 0.0
            assert (await post(s, url, {"prompt": "x", "max_tokens": 2}))[0] == 200

            async with s.post(emu.admin_url + "/admin/faults", json={"down": True}) as r:
                assert r.status == 200
            for path in ("/health", "/v1/models", "/metrics"):
                async with s.get(emu.url + path) as r:
                    assert r.status == 503
                    assert_openai_error(await r.json())
            assert (await post(s, url, {"prompt": "x"}))[0] == 503
            async with s.get(emu.admin_url + "/admin/faults") as r:
                assert (await r.json())["down"] is True
            async with s.post(emu.admin_url + "/admin/faults", json={"down": False}) as r:
                assert r.status == 200
            async with s.get(emu.url + "/health") as r:
                assert r.status == 200

            for bad, field in [({"error_rate": 1.5}, "error_rate"), ({"slowdwn": 2}, "slowdwn")]:
                async with s.post(emu.admin_url + "/admin/faults", json=bad) as r:
                    body = await r.json()
                    assert r.status == 400 and body["error"]["param"] == field
            async with s.post(emu.admin_url + "/admin/faults", data=b"{oops") as r:
                assert r.status == 400
            async with s.get(emu.admin_url + "/admin/faults") as r:
                assert await r.json() == {"error_rate": 0.0, "error_status": 500, "slowdown": 1.0,
                                          "extra_latency_ms": 0.0, "health_delay_ms": 0.0, "down": False}  # fmt: skip

    run(go())


def test_slowdown_and_extra_latency_increase_latency() -> None:
    tokens = 10

    async def timed(s: aiohttp.ClientSession, url: str) -> float:
        t0 = time.monotonic()
        st, _, _ = await post(s, url, {"prompt": "x", "max_tokens": tokens})
        assert st == 200
        return time.monotonic() - t0

    async def go() -> None:
        async with emulator() as emu, aiohttp.ClientSession() as s:
            url = emu.url + "/v1/completions"
            assert await timed(s, url) >= tokens * FAST.step_time(1)
            engine_time = tokens * FAST.step_time(1)
            emu.set_faults(slowdown=20.0)
            slow = await timed(s, url)
            assert slow >= 20.0 * engine_time  # a lower bound: a slowed step never ends early
            emu.set_faults({"slowdown": 1.0, "extra_latency_ms": 300.0})
            delayed = await timed(s, url)
            assert delayed >= 0.3 + engine_time

    run(go())


@pytest.mark.parametrize("dp", [False, True])
def test_a_fault_reset_reaches_the_step_under_way(dp: bool) -> None:
    """A step begun at slowdown 1000 (2 s of the fast profile's 2 ms) used to run to its end after a reset,
    and a step at 1e308 never ended: the request below took the whole slowed step."""
    from dlb.emulator.dp import DpEmulator
    from dlb.emulator.server import EmulatorConfig

    async def go() -> float:
        emu: Any = DpEmulator(EmulatorConfig(profile="fast-test", server_id="dp-reset"), dp_size=2) if dp else emulator()
        async with emu, aiohttp.ClientSession() as s:
            ranks = emu.ranks if dp else [emu]
            for r in ranks:
                r.set_faults(slowdown=1000.0)
            url = ranks[0].url + "/v1/completions"
            t0 = time.monotonic()
            req = asyncio.create_task(post(s, url, {"prompt": "x", "max_tokens": 3}))
            await asyncio.sleep(0.3)  # inside the first slowed step (2 s)
            for r in ranks:
                r.set_faults(slowdown=1.0)
            st, _, _ = await req
            assert st == 200
            return time.monotonic() - t0

    assert run(go()) < 1.5  # 2 s with the step's end left where it was


# -- threaded and child-process runners, CLI -------------------------------------------------------------


def _http(method: str, url: str, body: Any = None) -> tuple[int, Any, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null"), r.headers
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null"), e.headers


def test_threaded_emulator_and_admin_client() -> None:
    with ThreadedEmulator(profile="fast-test", server_id="thr", seed=7, output_mode="sample", output_mean=5) as emu:
        st, body, headers = _http("POST", emu.url + "/v1/completions", {"prompt": "x"})
        assert st == 200 and headers["x-dlb-server"] == "thr" and body["usage"]["completion_tokens"] >= 1
        assert body["choices"][0]["finish_reason"] in ("stop", "length")
        emu.set_faults(error_rate=1.0)
        assert get_faults(emu.admin_url)["error_rate"] == 1.0
        assert _http("POST", emu.url + "/v1/completions", {"prompt": "x"})[0] == 500
        assert reset_faults(emu.admin_url)["error_rate"] == 0.0
        assert set_faults(emu.admin_url, slowdown=2.0)["slowdown"] == 2.0
        assert get_state(emu.admin_url)["faults"]["slowdown"] == 2.0
    assert emu._thread is None  # stopped and joined
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{emu.port}/health", timeout=2)


def test_child_process_emulator_serves_and_stops_cleanly() -> None:
    with EmulatorProcess(server_id="child-1", profile="fast-test", max_batch=4, model=["m-a", "m-b"],
                         error_rate=1.0, error_status=503) as p:  # fmt: skip
        st, body, headers = _http("POST", p.url + "/v1/chat/completions",
                                  {"model": "m-b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})  # fmt: skip
        assert st == 503 and headers["x-dlb-server"] == "child-1"  # start-up fault flags took effect
        reset_faults(p.admin_url)
        st, body, _ = _http("POST", p.url + "/v1/chat/completions",
                            {"model": "m-b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})  # fmt: skip
        assert st == 200 and body["model"] == "m-b"
        assert get_state(p.admin_url)["config"]["max_batch"] == 4
        assert p.stop() == 0
        assert "emulator_started" in p.log_text() and "emulator_stopped" in p.log_text()


def test_fidelity_tool_measures_the_live_server_against_its_model() -> None:
    """The live emulator is never faster than its own model (a step cannot end early), and the tool
    reports one row per concurrency with the model's prediction from the pure scheduler."""
    from dlb.bench.emulator_fidelity import measure

    rows = measure("fast-test", [1, 3], prompt_tokens=16, output_tokens=5, waves=1, time_scale=2.0)
    assert [r.concurrency for r in rows] == [1, 3]
    assert rows[0].model_e2e_s == pytest.approx(2.0 * (FAST.step_time(1, 16) + 4 * FAST.step_time(1)))
    for r in rows:
        assert r.e2e_ratio >= 0.95 and r.ttft_ratio >= 0.95


def test_engine_failure_answers_instead_of_hanging() -> None:
    async def go() -> None:
        async with emulator(time_scale=5.0) as emu, aiohttp.ClientSession() as s:
            def broken(plan, now):
                raise RuntimeError("engine bug")

            emu.engine.complete = broken  # type: ignore[method-assign]
            st, body, _ = await post(s, emu.url + "/v1/completions", {"prompt": "x", "max_tokens": 3})
            assert st == 500 and body["error"]["message"] == "emulator engine failed"
            assert body["error"]["code"] == "engine_failed"  # a client switches on the code; never null on a 5xx
            st, body, _ = await post(s, emu.url + "/v1/completions", {"prompt": "x", "max_tokens": 3})
            assert st == 503 and body["error"]["code"] == "engine_not_running"

    run(go())


def test_prefix_cache_reports_cached_tokens_and_metrics() -> None:
    system = "You are a helpful assistant. " * 80  # ~2300 characters shared by every request
    msgs = lambda q: [{"role": "system", "content": system}, {"role": "user", "content": q}]

    async def go() -> None:
        async with emulator(prefix_cache=True) as emu, aiohttp.ClientSession() as s:
            url = emu.url + "/v1/chat/completions"
            _, first, _ = await post(s, url, {"messages": msgs("first question"), "max_tokens": 2})
            _, second, _ = await post(s, url, {"messages": msgs("another question"), "max_tokens": 2})
            assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
            cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
            assert len(system) // 4 - 32 <= cached < second["usage"]["prompt_tokens"]
            async with s.post(url, json={"messages": msgs("q"), "max_tokens": 2, "stream": True,
                                         "stream_options": {"include_usage": True}}) as r:  # fmt: skip
                events = [json.loads(p) for _, p in (await read_sse(r))[:-1]]
            assert events[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == cached
            _, other, _ = await post(s, emu.url + "/v1/completions", {"prompt": "unrelated " * 100, "max_tokens": 1})
            assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            m = await scrape(s, emu.url)
            assert metric(m, "vllm:prefix_cache_hits_total") == 2 * cached
            total_prompt = first["usage"]["prompt_tokens"] + 2 * second["usage"]["prompt_tokens"]
            assert metric(m, "vllm:prefix_cache_queries_total") >= total_prompt
        async with emulator() as emu, aiohttp.ClientSession() as s:  # off by default: plain usage
            _, body, _ = await post(s, emu.url + "/v1/chat/completions", {"messages": msgs("x"), "max_tokens": 1})
            assert "prompt_tokens_details" not in body["usage"]

    run(go())


def test_a_request_cut_by_shutdown_gets_a_coded_503() -> None:
    """A request in flight when the server stops is answered 503 with a non-null ``error.code`` (the faults
    bench saw ``code: null`` here: a client had nothing to switch on)."""
    async def go() -> None:
        async with aiohttp.ClientSession() as s:
            emu = emulator(time_scale=50.0)
            await emu.start()
            pending = asyncio.ensure_future(post(s, emu.url + "/v1/completions", {"prompt": "x", "max_tokens": 50}))
            await until_in_loop(lambda: emu._live, "the request reached the engine", period=0.01)
            await emu.stop()
            st, body, _ = await pending
            assert st == 503 and body["error"]["code"] == "server_shutting_down"

    run(go())
