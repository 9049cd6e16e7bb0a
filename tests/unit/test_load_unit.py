"""Workloads (seeded, open loop) and the ``dlb load`` generator against a real local HTTP server.

Here: the tests that run in-process (no sockets, no processes);
the others: ``tests/integration/test_load.py``.
The rules and what the tests stand for: that file's docstring.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from dlb.load.cli import _targets
from dlb.load.workload import (
    WorkloadRequest,
    WorkloadSpec,
    generate,
    read_trace,
    write_trace,
)

SPEC = WorkloadSpec(rate_rps=20.0, duration_s=200.0, sources={"a": 3.0, "b": 1.0}, seed=5)


def test_same_seed_same_workload_and_rate_mix_and_sources_as_specified() -> None:
    reqs = generate(SPEC)
    assert reqs == generate(SPEC) and reqs != generate(WorkloadSpec(**{**SPEC.__dict__, "seed": 6}))
    assert all(a.t <= b.t for a, b in itertools.pairwise(reqs)) and reqs[-1].t < SPEC.duration_s
    n = len(reqs)
    assert abs(n / SPEC.duration_s - SPEC.rate_rps) < 0.15 * SPEC.rate_rps
    chat = [r for r in reqs if r.endpoint == "chat"]
    assert abs(len(chat) / n - SPEC.chat_fraction) < 0.08
    assert abs(sum(r.source == "a" for r in reqs) / n - 0.75) < 0.08
    assert all(r.session == "" for r in reqs if r.endpoint == "completions")


def test_session_turns_carry_the_conversation_so_prompts_grow() -> None:
    sessions: dict[str, list[WorkloadRequest]] = {}
    for r in generate(SPEC):
        if r.session:
            sessions.setdefault(r.session, []).append(r)
    multi = [s for s in sessions.values() if len(s) > 1]
    assert len(multi) > 20
    for turns in multi:
        first = turns[0].turn  # > 0 for a conversation already under way at the start
        assert [r.turn for r in turns] == list(range(first, first + len(turns)))
        assert len({r.source for r in turns}) == 1
        assert all(b.prompt_tokens > a.prompt_tokens or b.prompt_tokens == SPEC.max_prompt for a, b in itertools.pairwise(turns))
    mean_turns = sum(len(s) for s in sessions.values()) / len(sessions)
    assert 2.0 < mean_turns < 4.0  # geometric, mean 3 (truncated at the end of the run)


def test_a_short_run_offers_its_rate_with_conversations_under_way_at_the_start() -> None:
    """Sessions used to start at 0 and lose their turns past the end: ``dlb load --rate 5 --duration 5``
    offered 2.9 req/s. Averaged over seeds, every duration now gets its rate, chat share included."""
    for duration in (5.0, 60.0):
        runs = [generate(WorkloadSpec(rate_rps=5.0, duration_s=duration, sources={"a": 1.0}, seed=s)) for s in range(200)]
        offered = sum(len(r) for r in runs) / (len(runs) * duration)
        chat = sum(q.endpoint == "chat" for r in runs for q in r) / (len(runs) * duration)
        assert abs(offered - 5.0) < 0.25, (duration, offered)
        assert abs(chat - 3.0) < 0.2, (duration, chat)
        assert all(q.t >= 0 for r in runs for q in r)
    late = [q for r in runs for q in r if q.endpoint == "chat" and q.t < 1.0]
    assert any(q.turn > 0 for q in late)  # a conversation already under way at the start


def test_trace_round_trip_and_a_bad_line_names_file_line_and_field(tmp_path: Path) -> None:
    reqs = generate(WorkloadSpec(rate_rps=5, duration_s=10, sources={"a": 1.0}))
    path = tmp_path / "t.jsonl"
    write_trace(reqs, path)
    assert read_trace(path) == reqs
    path.write_text('{"t": 0, "prompt_tokens": 3, "max_tokens": 2}\n{"t": 1, "prompt_tokens": "x", "max_tokens": 2}\n')
    with pytest.raises(ValueError, match=r"t.jsonl:2: bad trace record"):
        read_trace(path)
    path.write_text('{"t": 0, "endpoint": "embeddings", "prompt_tokens": 3, "max_tokens": 2}\n')
    with pytest.raises(ValueError, match=r"t.jsonl:1: endpoint"):
        read_trace(path)


def test_the_base_url_dlb_up_prints_is_a_url_dlb_load_takes() -> None:
    """``dlb up`` prints ``base_url http://HOST:PORT/v1`` (what an OpenAI client takes); given to ``--url``
    it sent every request to ``/v1/v1/...`` and all of them came back 404."""
    assert _targets(["http://127.0.0.1:10000/v1", "eu=http://127.0.0.1:10001/v1/", "us=https://root.example/"]) == {
        "": "http://127.0.0.1:10000", "eu": "http://127.0.0.1:10001", "us": "https://root.example/"}


def test_constant_arrivals_send_rate_times_duration_requests_evenly_spaced() -> None:
    """``--arrival constant`` kept the Poisson draw's count: ``--rate 10 --duration 3`` sent 28 requests."""
    import argparse

    from dlb.load.cli import build_requests

    for rate, duration in ((10.0, 3.0), (3.0, 2.0), (50.0, 7.0)):
        args = argparse.Namespace(trace=None, endpoint="mixed", rate=rate, duration=duration, sessions=3.0, output_median=80.0,
                                  prompt_median=300.0, seed=1, arrival="constant")
        reqs = build_requests(args, [])
        n = round(rate * duration)
        assert [r.t for r in reqs] == [k * duration / n for k in range(n)], (rate, duration)
