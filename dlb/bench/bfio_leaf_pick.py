"""The leaf's whole pick for a data-parallel group, per request (part of ``dlb bfio bench``).

Not only the BF-IO solve: what the leaf agent does for one ``request_headers`` message from its Envoy
— parse the ``ProcessingRequest``, the cell's server pick (prequal over the group's ranks, as
``dlb bfio dataplane`` runs it), the group's rank choice (predicted KV, allowed and admitting ranks,
the greedy BF-IO pick), the in-flight and resident records, the hold check and the reply. Timed in
process on :meth:`LeafAgent.handle` with a steady load: after every pick one random resident finishes
(its completion is not timed), so each rank holds about ``residents`` requests throughout.
"""

from __future__ import annotations

import random
import struct
import time
from typing import Any

import hpack
import numpy as np
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from dlb.core.bfio import DpBalancer
from dlb.core.hold_queue import HoldQueue
from dlb.core.latency_model import LatencyParams
from dlb.emulator.openai import ChunkEncoder
from dlb.envoy import contract
from dlb.ext_proc.leaf import LeafAgent
from dlb.ext_proc.leaf_state import Completion, LeafState, ServerState
from dlb.ext_proc.protocol import PROCESS_METHOD
from dlb.transport.h2 import CALL, PREFACE, H2Connection
from dlb.transport.limits import TransportStats

TARGET_US = 50.0


def _message(rid: str, length: int) -> bytes:
    hdrs = [base_pb2.HeaderValue(key=contract.REQUEST_ID, raw_value=rid.encode()),
            base_pb2.HeaderValue(key=contract.CONTENT_LENGTH, raw_value=str(length).encode()),
            base_pb2.HeaderValue(key=":path", raw_value=b"/v1/completions")]
    return ep.ProcessingRequest(request_headers=ep.HttpHeaders(headers=base_pb2.HeaderMap(headers=hdrs))).SerializeToString()


def leaf_pick(g: int, picks: int, policy: str = "bf-io", slots: int = 64, residents: int = 40,
              seed: int = 0) -> dict[str, Any]:  # fmt: skip
    """µs per :meth:`LeafAgent.handle` (CPU and wall, percentiles of per-call wall time) for G ranks.

    ``residents`` per rank stay below BF-IO's early hold (``hold_early`` of the slots free), so every
    call is a pick; a held request's cost is :func:`release_cost`'s."""
    rng = random.Random(seed)
    members = [f"10.0.0.1:{8000 + r}" for r in range(g)]
    bal = DpBalancer(ranks=g, policy=policy, slots=slots, hold=HoldQueue(1024, 5.0))
    state = LeafState(cell="c", servers=[ServerState(a) for a in members], replicas=g, prior=LatencyParams(0.1, 0.01, 4.0, 1.0),
                      choices=64, pick_rule="prequal", rng=np.random.default_rng(seed), dp_groups=[(bal, members)])
    agent = LeafAgent(state, clock=time.monotonic)
    msgs = [_message(f"r{i}", rng.randint(64, 24_000)) for i in range(picks + g * residents)]
    for m in msgs[:g * residents]:  # warm the group up to its steady load
        agent.handle(m)
    keys = list(state.inflight)
    laps: list[float] = []
    c0 = time.process_time()
    for i, m in enumerate(msgs[g * residents:]):
        t0 = time.perf_counter()
        agent.handle(m)
        laps.append(time.perf_counter() - t0)
        keys.append(f"r{g * residents + i}")
        k = keys.pop(rng.randrange(len(keys)))
        rec = state.inflight.get(k)
        if rec is not None:
            state.complete(time.monotonic(), Completion(k, members[rec.server], 200, 1.0))
    cpu = time.process_time() - c0
    us = np.array(laps) * 1e6
    # CPU includes the untimed completion per pick (the steady load's upkeep): an upper bound.
    return {"G": g, "policy": policy, "picks": picks, "residents_per_rank": residents,
            "cpu_us_mean_with_completion": cpu / picks * 1e6, "wall_us_p50": float(np.percentile(us, 50)),
            "wall_us_p90": float(np.percentile(us, 90)), "wall_us_p99": float(np.percentile(us, 99)),
            "target_us": TARGET_US, "meets_target": bool(np.percentile(us, 50) <= TARGET_US)}


def release_cost(g: int, releases: int, window: int = 16, slots: int = 64, seed: int = 0) -> dict[str, Any]:
    """µs per held-request release at G ranks: BF-IO weighing the ``window`` oldest held requests for the
    rank that freed (:meth:`DpBalancer.choose_backlog`). Off the request path (it runs when a completion
    arrives), but on the agent's event loop."""
    rng = np.random.default_rng(seed)
    bal = DpBalancer(ranks=g, slots=slots)
    for r in range(g):
        for j in range(slots):
            bal.open(0.0, f"x{r}-{j}", r, float(rng.uniform(16, 4000)))
    admit = np.zeros(g, dtype=bool)
    laps = []
    for k in range(releases):
        admit[:] = False
        admit[k % g] = True
        prompts = [float(p) for p in rng.uniform(16, 4000, window)]
        t0 = time.perf_counter()
        bal.choose_backlog(1.0, prompts, admit)
        laps.append(time.perf_counter() - t0)
    us = np.array(laps) * 1e6
    return {"G": g, "window": window, "releases": releases, "wall_us_p50": float(np.percentile(us, 50)),
            "wall_us_p90": float(np.percentile(us, 90))}


def _frame(ftype: int, flags: int, sid: int, payload: bytes) -> bytes:
    n = len(payload)
    return struct.pack(">BHBBI", n >> 16, n & 0xFFFF, ftype, flags, sid) + payload


def _data(sid: int, message: bytes) -> bytes:
    return _frame(0x0, 0, sid, b"\x00" + struct.pack(">I", len(message)) + message)


def stream_chunk_cost(g: int, chunks: int, streams: int = 256, seed: int = 0) -> dict[str, Any]:
    """µs per response-body chunk the leaf counts (:mod:`dlb.ext_proc.leaf_tokens`): parse the
    observability filter's message, count its SSE bytes, update BF-IO's view of the request's rank — what
    :meth:`LeafAgent.handle` does per chunk, timed in process over ``streams`` open responses on G ranks.
    Each chunk is one emulator token event (~230 bytes); the HTTP/2 transport's share is not included."""
    rng = random.Random(seed)
    members = [f"10.0.0.1:{8000 + r}" for r in range(g)]
    bal = DpBalancer(ranks=g, slots=max(1, streams // g + 1))
    state = LeafState(cell="c", servers=[ServerState(a) for a in members], replicas=g, prior=LatencyParams(0.1, 0.01, 4.0, 1.0),
                      choices=64, pick_rule="prequal", rng=np.random.default_rng(seed), dp_groups=[(bal, members)])
    agent = LeafAgent(state, clock=time.monotonic)
    calls = []
    for i in range(streams):
        agent.handle(_message(f"r{i}", rng.randint(64, 24_000)))
        head = ep.ProcessingRequest(request_headers=ep.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
            base_pb2.HeaderValue(key=contract.REQUEST_ID, raw_value=f"r{i}".encode())])), observability_mode=True)
        CALL.state = None
        agent.handle(head.SerializeToString())
        calls.append(CALL.state)
    event = ChunkEncoder("completion", "cmpl-0123456789abcdef", 1_700_000_000, "dlb-emulated", True).token(" tok", None)
    msg = ep.ProcessingRequest(response_body=ep.HttpBody(body=event), observability_mode=True).SerializeToString()
    laps: list[float] = []
    c0 = time.process_time()
    for i in range(chunks):
        CALL.state = calls[i % streams]
        t0 = time.perf_counter()
        agent.handle(msg)
        laps.append(time.perf_counter() - t0)
    cpu = time.process_time() - c0
    us = np.array(laps) * 1e6
    # The same through DLB's HTTP/2 transport: each chunk one DATA frame on one of ``streams`` calls.
    conn = H2Connection(PROCESS_METHOD.encode(), agent.handle, TransportStats())
    conn.initiate()
    conn.receive_data(PREFACE + _frame(0x4, 0, 0, b""))
    enc = hpack.Encoder()
    hdrs = [(":method", "POST"), (":scheme", "http"), (":path", PROCESS_METHOD), (":authority", "dlb"),
            ("content-type", "application/grpc"), ("te", "trailers")]
    sids = [2 * k + 1 for k in range(streams)]
    for k, sid in enumerate(sids):
        head = ep.ProcessingRequest(request_headers=ep.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
            base_pb2.HeaderValue(key=contract.REQUEST_ID, raw_value=f"r{k}".encode())])), observability_mode=True)
        conn.receive_data(_frame(0x1, 0x4, sid, enc.encode(hdrs)) + _data(sid, head.SerializeToString()))
    conn.data_to_send()
    frame_laps: list[float] = []
    c1 = time.process_time()
    for i in range(chunks):
        f = _data(sids[i % streams], msg)
        t0 = time.perf_counter()
        conn.receive_data(f)
        conn.data_to_send()
        frame_laps.append(time.perf_counter() - t0)
    cpu_h2 = time.process_time() - c1
    fus = np.array(frame_laps) * 1e6
    return {"G": g, "streams": streams, "chunks": chunks, "chunk_bytes": len(event), "cpu_us_mean": cpu / chunks * 1e6,
            "wall_us_p50": float(np.percentile(us, 50)), "wall_us_p90": float(np.percentile(us, 90)),
            "h2_cpu_us_mean": cpu_h2 / chunks * 1e6, "h2_wall_us_p50": float(np.percentile(fus, 50)),
            "h2_wall_us_p90": float(np.percentile(fus, 90)), "tokens_counted": agent.tokens.counted}
