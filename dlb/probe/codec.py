"""The ``dlb.v1`` probe messages in and out: a leaf's answer encoded, a poller's checks on decoding it.

Why one module: the leaf writes the latency model into ``ProbeResponse.model`` and the roots and the
control plane read it back; the field mapping (``a_s``, ``b_s``, ``c``, ``s``) and the refusal of
impossible answers must be the same on every side.
"""

from __future__ import annotations

import math

from dlb.core.latency_model import LatencyParams
from dlb.core.leaf_replicas import CellAnswer, ReplicaAnswer
from dlb.probe.target import ProbeTarget
from dlb.proto import probe_pb2

#: More requests in flight than any cell holds: an answer above it is corrupt or hostile, and its
#: product with the overflow inflation would reach inf in the cost arithmetic.
MAX_RIF = 1e9
#: A model parameter beyond these is no fit of a real cell (a knee smoother than 1e-6 requests, a
#: latency of 30 years): refused so the cost arithmetic never overflows on it.
MIN_SMOOTHNESS = 1e-6
MAX_PARAM = 1e9


def check_answer(target: ProbeTarget, resp: probe_pb2.ProbeResponse) -> None:
    """Refuse (ValueError) a probe answer no leaf can mean: another cell's, or a state out of range.

    Everything else a leaf sends is used as is (tests/unit/test_decoder_fuzz.py feeds random answers through
    this and the root's ``on_probe`` and asserts decisions stay well-formed).
    """
    if resp.cell != target.name:
        raise ValueError(f"leaf at {target.address} answered for cell {resp.cell[:100]!r}, expected {target.name!r}")
    if not (math.isfinite(resp.rif) and 0 <= resp.rif <= MAX_RIF and 0.0 <= resp.error_rate <= 1.0):
        raise ValueError(f"leaf at {target.address} sent an impossible state: rif={resp.rif}, error_rate={resp.error_rate}")


def model_message(p: LatencyParams, confidence: float, samples: int) -> probe_pb2.LatencyModel:
    """A leaf's fitted ℓ(N) as the probe's ``LatencyModel``."""
    return probe_pb2.LatencyModel(a_s=p.a, b_s=p.b, c=p.c, s=p.s, confidence=confidence, samples=samples)


def model_of(resp: probe_pb2.ProbeResponse) -> LatencyParams | None:
    """The answer's ℓ(N), or None when it carries none or one outside the model's domain (the poller
    then keeps its previous or prior curve)."""
    if not resp.HasField("model"):
        return None
    m = resp.model
    if not (m.s >= MIN_SMOOTHNESS and max(m.a_s, m.b_s, m.c, m.s) <= MAX_PARAM):
        return None
    try:
        return LatencyParams(m.a_s, m.b_s, m.c, m.s)
    except ValueError:
        return None


def replica_answer(resp: probe_pb2.ProbeResponse) -> ReplicaAnswer:
    """One leaf replica's answer as :mod:`dlb.core.leaf_replicas` reads it."""
    counters = {"completed": resp.completed, "errors": resp.errors}
    counters.update({f"src:{k}": v for k, v in resp.completed_by_source.items()})
    m = resp.model
    return ReplicaAnswer(rif=resp.rif, error_rate=resp.error_rate, counters=counters,
                         healthy=resp.healthy_replicas if resp.HasField("healthy_replicas") else None,
                         params=(m.a_s, m.b_s, m.c, m.s) if model_of(resp) is not None else None,
                         confidence=m.confidence, samples=m.samples,
                         capacity=resp.capacity if resp.HasField("capacity") else None,
                         waiting=resp.waiting, kv_usage=resp.kv_usage)


def cell_response(cell: CellAnswer, parts: list[probe_pb2.ProbeResponse]) -> probe_pb2.ProbeResponse:
    """The merged answer of a cell's live replicas (``parts``, their last answers) as one leaf's answer."""
    out = probe_pb2.ProbeResponse(cell=parts[0].cell, rif=cell.rif, replicas=max(p.replicas for p in parts),
                                  error_rate=min(max(cell.error_rate, 0.0), 1.0),
                                  timestamp_unix_ns=max(p.timestamp_unix_ns for p in parts),
                                  completed=cell.counters.get("completed", 0), errors=cell.counters.get("errors", 0),
                                  waiting=cell.waiting, kv_usage=cell.kv_usage)
    for k, v in cell.counters.items():
        if k.startswith("src:"):
            out.completed_by_source[k[4:]] = v
    if cell.healthy is not None:
        out.healthy_replicas = cell.healthy
    if cell.capacity is not None:
        out.capacity = cell.capacity
    if cell.params is not None:
        a, b, c, s = cell.params
        out.model.CopyFrom(probe_pb2.LatencyModel(a_s=a, b_s=b, c=c, s=s, confidence=cell.confidence, samples=cell.samples))
    return out
