"""The leaf's ``dlb.v1.Probe`` service: roots and the control plane poll it; the answer is built from
memory (no I/O), so a probe never waits on the cell it describes.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc

from dlb.ext_proc.leaf_state import LeafState
from dlb.probe.codec import model_message
from dlb.proto import probe_pb2


class LeafProbe:
    """The ``dlb.v1.Probe`` servicer of one leaf (register it with ``add_ProbeServicer_to_server``)."""

    def __init__(self, state: LeafState, completed_by_source: dict[str, int], envoy_ok: Callable[[], bool],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.state = state
        #: The access log's per-source completion counts (the same dict, read at each answer).
        self.completed_by_source = completed_by_source
        #: Whether this cell's leaf Envoy accepts connections (:meth:`LeafBackground.envoy_check_loop`).
        self.envoy_ok = envoy_ok
        self.clock = clock
        self.answered = 0

    async def Probe(self, request: probe_pb2.ProbeRequest, context) -> probe_pb2.ProbeResponse:
        self.answered += 1
        if not self.envoy_ok():
            # The control path is up but the data path is not: roots must not send here.
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"leaf Envoy of cell {self.state.cell} is unreachable")
        return self.snapshot(self.clock())

    def snapshot(self, now: float) -> probe_pb2.ProbeResponse:
        st = self.state
        est = st.estimator
        return probe_pb2.ProbeResponse(
            cell=st.cell, rif=float(st.rif), replicas=st.replicas, healthy_replicas=st.healthy_replicas(now),
            model=model_message(est.params, est.confidence, len(est)),
            error_rate=st.errors.rate(now), timestamp_unix_ns=time.time_ns(), completed=st.completed,
            errors=st.failed, waiting=st.waiting(), completed_by_source=self.completed_by_source,
            capacity=st.capacity(now), kv_usage=st.kv_usage(),
        )
