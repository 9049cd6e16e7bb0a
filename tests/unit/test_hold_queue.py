"""The leaf-held queue of a data-parallel group: the queue alone, the leaf's hold/release, the transport's
deferred reply. One rule per test, the rule as its docstring. Real Envoy + agent + DP ranks:
``tests/integration/test_leaf_hold.py``."""

from __future__ import annotations

import random
from concurrent.futures import Future

import h2.events
import numpy as np
import pytest

from dlb.core.bfio import DpBalancer
from dlb.core.hold_queue import HoldQueue
from dlb.core.latency_model import LatencyParams
from dlb.ext_proc.leaf_state import HELD, HOLD_FULL, Completion, LeafState, ServerState
from dlb.transport.h2 import Later
from tests.unit.test_h2_connection import Pair, grpc_message

RANKS = [f"10.0.0.1:{8000 + r}" for r in range(4)]


def leaf(policy: str = "bf-io", slots: int = 2, max_len: int = 3, deadline_s: float = 1.0,
         hold_early: float = 0.0) -> LeafState:  # fmt: skip
    """A leaf over one 4-rank group; ``hold_early`` 0 (hold only when every rank is full) unless a test
    is about holding the last free slots."""
    bal = DpBalancer(ranks=4, policy=policy, slots=slots, hold=HoldQueue(max_len, deadline_s), hold_early=hold_early)
    return LeafState(cell="c", servers=[ServerState(a) for a in RANKS], replicas=4, prior=LatencyParams(0.1, 0.01, 4.0, 1.0),
                     choices=64, rng=np.random.default_rng(0), dp_groups=[(bal, list(RANKS))])


def done(st: LeafState, key: str, now: float) -> None:
    st.complete(now, Completion(key, st.servers[st.inflight[key].server].address, 200, 0.5))


def test_queue_bound_refuses_past_max_len() -> None:
    """At most ``max_len`` requests are held; the next is refused and counted."""
    q = HoldQueue(2, 1.0)
    assert q.offer(0.0, "a", 1, 1) and q.offer(0.0, "b", 1, 1)
    assert not q.offer(0.0, "c", 1, 1)
    assert len(q) == 2 and q.rejected_full == 1


def test_queue_deadline_expires_oldest_first() -> None:
    """A request held past ``deadline_s`` leaves by :meth:`expire`; younger ones stay."""
    q = HoldQueue(5, 1.0)
    q.offer(0.0, "a", 1, 1)
    q.offer(0.5, "b", 1, 1)
    assert q.expire(0.99) == []
    assert q.expire(1.0) == ["a"] and len(q) == 1 and q.expired == 1


def test_window_bounds_how_often_a_request_is_passed_over() -> None:
    """Any of the ``window`` oldest may be released, but one passed over ``window`` times goes next."""
    q = HoldQueue(10, 1.0)
    for k in "abcde":
        q.offer(0.0, k, 1, 1)
    assert [h.key for h in q.window(3)] == ["a", "b", "c"]
    q.take("c", 0.1)
    q.take("b", 0.1)
    assert q.head() is not None and q.head().key == "a" and q.head().skips == 2
    assert [h.key for h in q.window(3)] == ["a", "d", "e"]
    q.take("e", 0.1)
    assert [h.key for h in q.window(3)] == ["a"]  # passed over 3 times: no choice left
    assert [h.key for h in q.window(1)] == ["a"]


def test_queue_is_fifo_across_cancellations() -> None:
    """Release order is arrival order; a cancelled request is skipped, never released."""
    q = HoldQueue(10, 1.0)
    for k in "abcd":
        q.offer(0.0, k, 1, 1)
    assert q.cancel("b") and not q.cancel("b")
    assert [q.pop(0.1).key for _ in range(3)] == ["a", "c", "d"]
    assert q.head() is None and q.held_seconds == pytest.approx(0.3)


def test_below_the_bound_nothing_is_held() -> None:
    """While some rank has a free slot, the pick is the group's usual one and nothing waits."""
    st = leaf(slots=2)
    picks = [st.pick(0.0, f"r{i}", 400) for i in range(8)]
    assert HELD not in picks and sorted(picks) == [0, 0, 1, 1, 2, 2, 3, 3]


def test_full_group_holds_then_refuses_429() -> None:
    """With every rank at its bound the request is held; past the queue's length it is refused."""
    st = leaf(slots=1, max_len=2)
    assert all(st.pick(0.0, f"r{i}", 400) >= 0 for i in range(4))
    assert st.pick(0.0, "h1", 400) == HELD and st.last_held == "h1"
    assert st.pick(0.0, "h2", 400) == HELD
    assert st.pick(0.0, "h3", 400) == HOLD_FULL
    assert "h1" not in st.inflight  # a held request holds no rank


def test_release_goes_to_the_rank_that_freed_in_fifo_order() -> None:
    """A completion frees one rank; the oldest held request goes there (the only rank that can admit)."""
    st = leaf(slots=1, max_len=5)
    for i in range(4):
        st.pick(0.0, f"r{i}", 400)
    for k in ("h1", "h2"):
        assert st.pick(0.1, k, 400) == HELD
    assert st.release(0.2) == []
    freed = st.inflight["r2"].server
    done(st, "r2", 0.3)
    assert st.release(0.3) == [("h1", freed)]
    bal = st.dp_groups[0][0]
    assert bal.residents["h1"].rank == freed and st.inflight["h1"].server == freed


def test_release_picks_by_bf_io_among_ranks_with_room() -> None:
    """When two ranks can admit, the held request goes where BF-IO puts it: beside the light resident,
    not the 4000-token one (JSQ would see a tie)."""
    st = leaf(slots=2, max_len=5)
    bal = st.dp_groups[0][0]
    for rank, prompts in enumerate(((4000, 10), (10, 10), (10, 10), (10, 10))):
        for j, p in enumerate(prompts):
            bal.open(0.0, f"x{rank}{j}", rank, p)
    assert st.pick(0.0, "h", 400) == HELD
    bal.finish("x01", 0.1)  # rank 0 keeps its heavy request
    bal.finish("x11", 0.1)  # rank 1 keeps a light one
    assert st.release(0.1) == [("h", 1)]


def test_bf_io_chooses_which_held_request_the_freed_rank_gets() -> None:
    """One rank frees and the backlog offers a choice: BF-IO gives the light rank the large request
    (it stays under the heaviest rank), JSQ the oldest (FIFO)."""
    for policy, expect in (("bf-io", "big"), ("jsq", "small")):
        st = leaf(policy, slots=2, max_len=5)
        bal = st.dp_groups[0][0]
        for rank, prompts in enumerate(((9000, 10), (10, 10), (9000, 10), (9000, 10))):
            for j, p in enumerate(prompts):
                bal.open(0.0, f"x{rank}{j}", rank, p)
        assert st.pick(0.0, "small", 40) == HELD and st.pick(0.0, "big", 4 * 4000) == HELD
        bal.finish("x11", 0.1)  # the light rank frees a slot
        assert st.release(0.1) == [(expect, 1)], policy


def test_bf_io_holds_the_last_free_slots_and_fills_them_by_choice() -> None:
    """With at most a quarter of the slots free BF-IO holds arrivals too and releases them together:
    the large request goes to the light rank whatever the arrival order. Placed on arrival, the small
    one took the light rank's slot and the large one had only the heavy rank left."""
    st = leaf(slots=4, max_len=5, hold_early=0.25)
    bal = st.dp_groups[0][0]
    for rank, p in ((0, 100), (1, 400), (2, 9000), (3, 9000)):
        for j in range(3 if rank < 2 else 4):
            bal.open(0.0, f"x{rank}{j}", rank, p)  # 2 of 16 slots free: ranks 0 (300 tokens) and 1 (1200)
    assert st.pick(0.0, "small", 4 * 100) == HELD
    assert st.pick(0.0, "big", 4 * 1000) == HELD
    assert sorted(st.release(0.0)) == [("big", 0), ("small", 1)]


def test_others_hold_only_at_the_bound() -> None:
    """The early hold is BF-IO's (it chooses which request fills which slot); JSQ sends while a rank has room."""
    st = leaf("jsq", slots=4, max_len=5, hold_early=0.25)
    for i in range(16):
        assert st.pick(0.0, f"r{i}", 400) >= 0
    assert st.pick(0.0, "h", 400) == HELD


def test_bf_io_releases_a_short_queue_once_a_step() -> None:
    """While fewer than the window are held and ranks have room, BF-IO releases one batch per learnt
    step (every call at the same instant is that batch); a full window goes at once."""
    bal = DpBalancer(ranks=2, slots=8, step_s=0.5, hold=HoldQueue(100, 60.0), hold_early=1.0)
    ok = np.ones(2, dtype=bool)
    for k in ("a", "b"):
        bal.hold.offer(0.0, k, 100.0, 0.0)  # type: ignore[union-attr]
    first = bal.next_held(1.0, ok, window=4)
    assert first is not None
    bal.open(1.0, first[0].key, first[1], 100.0)
    assert bal.next_held(1.0, ok, window=4) is not None  # the same batch
    for k in ("c", "d"):
        bal.hold.offer(1.1, k, 100.0, 0.0)  # type: ignore[union-attr]
    assert bal.next_held(1.2, ok, window=4) is None  # a step has not passed
    assert bal.next_held(1.5, ok, window=4) is not None
    for k in "efgh":
        bal.hold.offer(1.6, k, 100.0, 0.0)  # type: ignore[union-attr]
    assert bal.next_held(1.7, ok, window=4) is not None  # four held: the window is full


def test_reported_limit_and_full_kv_bound_admission() -> None:
    """The bound is what a rank's metrics report (slots, KV full), not a guess: unknown slots never hold."""
    st = leaf(slots=0)
    assert all(st.pick(0.0, f"r{i}", 40) >= 0 for i in range(12))  # no bound known: nothing held
    for k in range(4):
        st.on_scrape(k, 3.0, 0.0, 0.2, admit_limit=3)
    assert st.pick(0.0, "h", 40) == HELD
    st.on_scrape(0, 3.0, 0.0, 0.2, admit_limit=5)  # rank 0 reports more slots
    assert st.release(0.0) == [("h", 0)]
    st.on_scrape(0, 3.0, 0.0, 0.99, admit_limit=5)  # ... but its KV cache is now full
    assert st.pick(0.0, "h2", 40) == HELD


def test_nothing_is_lost() -> None:
    """Every request offered ends exactly once: placed at once, released, refused, expired or cancelled."""
    rnd = random.Random(3)
    st = leaf(slots=2, max_len=4, deadline_s=0.5)
    q = st.dp_groups[0][0].hold
    assert q is not None
    placed = refused = cancelled = 0
    expired: list[str] = []
    released: list[str] = []
    now = 0.0
    for n in range(400):
        now += rnd.expovariate(20.0)
        i = st.pick(now, f"q{n}", 400)
        if i >= 0:
            placed += 1
        elif i == HOLD_FULL:
            refused += 1
        elif rnd.random() < 0.05:
            cancelled += st.cancel_held(f"q{n}")
        if st.inflight and rnd.random() < 0.5:
            done(st, rnd.choice(sorted(st.inflight)), now)
        released += [k for k, _ in st.release(now)]
        expired += st.expire_held(now)
    assert len(set(released)) == len(released) and not set(released) & set(expired)
    assert placed + len(released) + refused + len(expired) + cancelled + len(q) == 400
    assert (q.released, q.rejected_full, q.expired, q.cancelled) == (len(released), refused, len(expired), cancelled)
    assert refused and expired and released  # the run exercised every path


def test_transport_sends_a_later_reply_when_it_resolves() -> None:
    """A :class:`Later` answer: ``now`` goes out at once, the held reply only when its future resolves,
    and the connection asks the I/O layer to write it."""
    fut: Future[bytes] = Future()
    p = Pair(handler=lambda m: (Later(b"override", fut), False))
    writes: list[int] = []
    p.server.on_output = lambda: writes.append(1)
    p.request(1, b"headers")
    assert [e.data for e in p.of(h2.events.DataReceived, 1)] == [grpc_message(b"override")]
    fut.set_result(b"picked")
    assert writes == [1]
    p.pump()
    assert [e.data for e in p.of(h2.events.DataReceived, 1)][-1] == grpc_message(b"picked")


def test_transport_cancels_a_later_reply_when_the_stream_is_reset() -> None:
    """Envoy resetting the stream (its client left) cancels the pending reply: the request leaves the queue."""
    fut: Future[bytes] = Future()
    p = Pair(handler=lambda m: (Later(None, fut), False))
    p.request(1, b"headers")
    p.client.reset_stream(1)
    p.pump()
    assert fut.cancelled() and 1 not in p.server.streams


def test_reported_kv_replaces_the_elapsed_time_estimate() -> None:
    """A rank's reported KV is the workload BF-IO sees; the leaf adds only what it predicts changed since."""
    bal = DpBalancer(ranks=2, slots=4, step_s=0.01)
    bal.open(0.0, "a", 0, 100.0)
    assert bal.kv(1.0)[0] == pytest.approx(100.0 + 100.0)  # estimate: 1 s / 10 ms decoded
    bal.observe_kv(0, 150.0, 1.0)  # the rank says it holds 150 (it decoded slower than estimated)
    assert bal.kv(1.0)[0] == pytest.approx(150.0)
    bal.open(1.0, "b", 0, 40.0)
    assert bal.kv(1.5)[0] == pytest.approx(150.0 + 50.0 + 40.0 + 50.0)  # + decoded by a, + b's prompt and tokens
    assert bal.kv(1.5)[1] == 0.0  # rank 1 never reported: the estimate (empty)


def test_a_report_does_not_erase_a_request_the_rank_has_not_admitted_yet() -> None:
    """A KV report taken before the rank admitted a just-placed request lacks it; the leaf keeps counting it
    until the report can include it (``report_lag_steps``), then the report governs again."""
    bal = DpBalancer(ranks=2, slots=4, step_s=0.01)
    bal.open(0.0, "a", 0, 100.0)
    bal.observe_kv(0, 150.0, 1.0)
    bal.open(1.0, "b", 0, 4000.0)
    bal.observe_kv(0, 151.0, 1.005)  # a's growth only: b is still on its way to the rank
    assert bal.kv(1.005)[0] == pytest.approx(151.0 + 4000.0 + 0.5)
    bal.observe_kv(0, 4160.0, 1.05)  # two steps on: the report holds b
    assert bal.kv(1.05)[0] == pytest.approx(4160.0)
    bal.report_lag_steps = 0.0  # without the lag the early report would have erased b
    bal.open(2.0, "c", 0, 4000.0)
    bal.observe_kv(0, 4260.0, 2.005)
    assert bal.kv(2.005)[0] == pytest.approx(4260.0)


def test_backlog_choice_matches_the_full_cost_over_every_rank() -> None:
    """``choose_backlog`` prices only the open ranks; the pick equals the cost taken over all ranks."""
    rng = np.random.default_rng(3)
    for _ in range(200):
        bal = DpBalancer(ranks=8, slots=4, step_s=1.0, mean_decode_tokens=32.0)
        for k in range(int(rng.integers(8, 32))):
            bal.open(0.0, f"r{k}", int(rng.integers(0, 8)), float(rng.lognormal(7.0, 0.8)))
        admit = bal.admitting(np.ones(8, dtype=bool))
        if not admit.any():
            continue
        prompts = [float(x) for x in rng.lognormal(7.0, 0.8, 16)]
        i, r = bal.choose_backlog(1.0, prompts, admit)
        open_ = bal.open_ranks(admit)
        costs = [min(float(bal.picker.costs(bal.kv(1.0), bal.nrun, p)[0][k]) for k in np.flatnonzero(open_))
                 - (p * float(bal.picker.qh.sum()) + float((bal.picker.qh * bal.picker.hs).sum())) / 8 for p in prompts]
        assert i == int(np.argmin(costs)) and admit[r]


def test_hold_settings_travel_over_xds() -> None:
    """``DpGroups`` carries the hold queue (0 deadline = the default); a deadline past the cap is refused by name."""
    from dlb.config import resources as dr
    from dlb.proto import resources_pb2

    msg = resources_pb2.DpGroups(cell="b")
    msg.groups.add(server="127.0.0.1:8000", ranks=2, policy="bf-io", mean_decode_tokens=100, hold_queue=64)
    ((_, _, group),) = dr.dp_groups_from_pb(msg)
    assert (group.hold_queue, group.hold_deadline_ms) == (64, 5000.0)
    assert group.hold_early == 0.25  # unset: the default
    msg.groups[0].hold_early = 0.0  # set to 0 (hold only when no rank admits) is not unset
    assert dr.dp_groups_from_pb(msg)[0][2].hold_early == 0.0
    msg.groups[0].hold_early = 1.5
    with pytest.raises(dr.ResourceError, match=r"groups\[0\].hold_early"):
        dr.dp_groups_from_pb(msg)
    msg.groups[0].hold_early = 0.5
    msg.groups[0].hold_deadline_ms = 500_000
    with pytest.raises(dr.ResourceError, match=r"groups\[0\].hold_deadline_ms"):
        dr.dp_groups_from_pb(msg)


def test_config_hold_early_round_trips_through_xds() -> None:
    from dlb.config import config_from_dict
    from dlb.config import resources as dr

    cfg = config_from_dict({
        "version": 1,
        "cells": [{"name": "a", "leaf": {"address": "127.0.0.1:10010", "probe": "127.0.0.1:9010"},
                   "servers": [{"address": "127.0.0.1:8100", "dp_ranks": 2, "hold_queue": 4, "hold_early": 0.0}]}],
        "endpoints": [{"name": "m", "match": {"prefix": "/v1/"}}],
    })
    ((_, _, group),) = dr.dp_groups_from_pb(dr.dp_groups(cfg, "a"))
    assert group == cfg.cells[0].servers[0].dp
