"""What one xDS client can make the control plane keep, log or show is bounded (issue 14 row 6).

Measured before: 50 ADS streams with 1 MB node ids and one stream subscribing 5,000 bogus type URLs x
100 names kept +188 MB and +107 MB after disconnect, wrote 100 MB of logs, and made ``/metrics`` 201 MB
and ``/status`` 86 MB. Each test drives the real gRPC server with the plain xds-protos stubs.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import grpc

from dlb.xds import Snapshot, SnapshotCache, StatusServer, XdsServer, types
from dlb.xds.server import LogBudget
from dlb.xds.status import StatusRegistry
from dlb.xds.testing import eds_cluster

CDS = types.CLUSTER


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@contextlib.asynccontextmanager
async def server(status: StatusRegistry | None = None) -> AsyncIterator[tuple[XdsServer, grpc.aio.Channel, StatusServer]]:
    cache = SnapshotCache()
    cache.set_snapshot("n1", Snapshot.build([eds_cluster("c1")], extra_types=[CDS]))
    xds = XdsServer(cache, status=status)
    port = await xds.start()
    http = StatusServer(xds.status)
    await http.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 64 << 20)])
    try:
        yield xds, channel, http
    finally:
        await channel.close()
        await http.stop()
        await xds.stop(None)


def test_rejection_logs_are_rate_limited_and_count_what_they_drop() -> None:
    clock = Clock()
    budget = LogBudget(per_s=1.0, burst=3, clock=clock)
    assert [budget.allow() for _ in range(10)] == [True] * 3 + [False] * 7
    clock.now += 1.0
    assert budget.allow() and budget.take_suppressed() == 7 and not budget.allow()
