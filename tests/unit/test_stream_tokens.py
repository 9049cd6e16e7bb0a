"""The leaf's stream token count (dlb/core/stream_tokens.py) and how BF-IO's view uses it (DpBalancer.progress).

Rules: the count of a response is the number of decode events a client reads, whatever the chunking;
the server's own ``usage.completion_tokens`` replaces it when present; generated text cannot fake an
event; the state stays bounded and the count capped whatever an upstream sends. A counted request's
share of its rank's predicted KV is its count, not elapsed time.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlb.core.bfio import DpBalancer
from dlb.core.stream_tokens import CARRY, MAX_TOKENS, TokenCount
from dlb.emulator.openai import SSE_DONE, ChunkEncoder, sse, usage_chunk


def _body(n: int, *, kind: str = "completion", usage: bool = True, text: str = "tok") -> bytes:
    enc = ChunkEncoder(kind, "cmpl-1", 1, "m", usage)  # type: ignore[arg-type]
    out = [enc.token(text, "length" if i == n - 1 else None, role=kind == "chat" and i == 0) for i in range(n)]
    if usage:
        out.append(sse(usage_chunk(kind, "cmpl-1", 1, "m", 10, n)))  # type: ignore[arg-type]
    return b"".join([*out, SSE_DONE])


def _feed(body: bytes, cuts: list[int], seen: list[int] | None = None) -> TokenCount:
    c = TokenCount()
    last = 0
    for k in [*sorted(set(cuts)), len(body)]:
        n = c.feed(body[last:k])
        last = k
        if seen is not None:
            seen.append(n)
    return c


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 40), kind=st.sampled_from(["completion", "chat"]), usage=st.booleans(),
       cuts=st.lists(st.integers(0, 20_000), max_size=30))
def test_count_equals_the_events_a_client_reads_however_the_body_is_chunked(n: int, kind: str, usage: bool,
                                                                            cuts: list[int]) -> None:
    body = _body(n, kind=kind, usage=usage)
    seen: list[int] = []
    c = _feed(body, [k % (len(body) + 1) for k in cuts], seen)
    assert c.tokens == n
    assert c.ends - c.skips == n and c.usage == (n if usage else -1)
    assert len(c.tail) <= CARRY
    assert max(seen) == n  # never above the truth on the way (the leaf's metric keeps the high-water mark)


def test_every_single_byte_split_counts_the_same() -> None:
    body = _body(5, usage=True)
    for k in range(len(body) + 1):
        assert _feed(body, [k]).tokens == 5
    assert _feed(body, list(range(len(body)))).tokens == 5  # one byte at a time


def test_generated_text_cannot_fake_an_event_or_a_usage() -> None:
    text = 'data: x\n\ndata: [DONE] "completion_tokens":999 "choices":[]'
    body = _body(3, usage=False, text=text)
    assert json.dumps(text) in body.decode()  # escaped inside the JSON string: no raw newline, no raw quote
    assert _feed(body, []).tokens == 3


def test_usage_replaces_the_event_count() -> None:
    # vLLM's chat stream opens with a role-only event: no token.
    role = sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    body = role + _body(4, kind="chat", usage=True)
    c = TokenCount()
    c.feed(body[: body.index(b'"choices":[]')])
    assert c.tokens == 4
    c = TokenCount()
    c.feed(body.replace(b'"completion_tokens":4', b'"completion_tokens":6'))
    assert c.tokens == 6  # the server's own count wins
    # A non-streamed JSON body: its usage is the count.
    assert _feed(b'{"choices":[{"text":"abc"}],"usage":{"prompt_tokens":3,"completion_tokens":17,"total_tokens":20}}', [60]).tokens == 17


def test_state_is_bounded_and_the_count_capped_whatever_the_upstream_sends() -> None:
    c = TokenCount()
    c.feed(b"data: x\n\n" * 200_000)  # one huge chunk of events
    assert len(c.tail) <= CARRY and c.tokens == 200_000
    for _ in range(6):
        c.feed(b"\n\n" * 200_000)
    assert c.tokens == MAX_TOKENS and c.capped
    d = TokenCount()
    d.feed(b'"completion_tokens":' + b"9" * 40 + b",")  # digits past 19: not a count
    d.feed(b'"completion_tokens":99999999999,')
    assert d.tokens == MAX_TOKENS


def test_a_counted_request_adds_its_count_not_elapsed_time_to_its_rank() -> None:
    b = DpBalancer(ranks=2, policy="bf-io", horizon=5, mean_decode_tokens=100.0, step_s=0.01)
    r = b.assign(0.0, "a", 1000)
    other = 1 - b.assign(0.0, "b", 1000)
    assert other == r
    assert b.kv(1.0)[r] == pytest.approx(1100.0)  # elapsed time: 1 s at 10 ms per token
    b.progress("a", 7)
    assert b.kv(1.0)[r] == pytest.approx(1007.0)  # the stream says 7 decoded
    assert b.kv(5.0)[r] == pytest.approx(1007.0)  # and time alone does not move it
    b.progress("a", 30)
    assert b.kv(5.0)[r] == pytest.approx(1030.0)
    b.progress("nope", 5)  # unknown requests are ignored
    # Finishing removes exactly what it added; its step-time sample uses its own decode length.
    step = b.step_s
    b.finish("a", 1.2, duration_s=1.2)
    assert b.kv(9.0)[r] == 0.0 and b.est_n[r] == 0 and b.counted_sum[r] == 0
    assert b.step_s == pytest.approx(step + 0.1 * (1.2 / 30 - step))


def test_a_count_bridges_the_time_since_a_kv_report() -> None:
    b = DpBalancer(ranks=1, policy="bf-io", mean_decode_tokens=100.0, step_s=0.01, report_lag_steps=0.0)
    b.assign(0.0, "a", 500)
    b.progress("a", 4)
    b.observe_kv(0, 520.0, 1.0)  # the rank's own report: 520 resident
    b.progress("a", 10)
    assert b.kv(3.0)[0] == pytest.approx(526.0)  # the report plus the 6 tokens counted since


def _leaf_config(dp: bool) -> dict[str, object]:
    server: dict[str, object] = {"address": "127.0.0.1:8100", **({"dp_ranks": 2} if dp else {})}
    return {
        "version": 1,
        "cells": [{"name": "a", "leaf": {"address": "127.0.0.1:10010", "probe": "127.0.0.1:9010",
                                         "ext_proc": "127.0.0.1:9011"},
                   "servers": [server, "127.0.0.1:8200"]}],
        "endpoints": [{"name": "m", "match": {"prefix": "/v1/"}}],
    }


@pytest.mark.parametrize("dp", [False, True])
def test_only_a_leaf_with_a_dp_server_sends_response_bodies_and_never_waits_for_them(dp: bool) -> None:
    from dlb.config import config_from_dict
    from dlb.envoy.bootstrap import STREAM_TOKENS_FILTER, leaf_bootstrap

    boot = leaf_bootstrap(config_from_dict(_leaf_config(dp)), "a", admin_port=9902, emulate_wan=False)
    hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    names = [f["name"] for f in hcm["http_filters"]]
    modes = [f["typed_config"]["processing_mode"] for f in hcm["http_filters"] if "processing_mode" in f.get("typed_config", {})]
    assert modes[0]["response_body_mode"] == "NONE"  # the pick filter: headers only, as before
    if not dp:
        assert STREAM_TOKENS_FILTER not in names and len(modes) == 1
        return
    f = hcm["http_filters"][names.index(STREAM_TOKENS_FILTER)]
    assert names.index(STREAM_TOKENS_FILTER) == names.index("envoy.filters.http.ext_proc") + 1  # after the pick
    tc = f["typed_config"]
    assert tc["observability_mode"] is True and tc["failure_mode_allow"] is True
    assert tc["processing_mode"]["response_body_mode"] == "STREAMED"
    assert [p["exact"] for p in tc["forward_rules"]["allowed_headers"]["patterns"]] == ["x-request-id"]
