"""The access log steers a cell, so only the cell's own Envoy may feed it (issue 14 row 5).

Here: the tests that run in-process (no sockets, no processes);
the others: ``tests/integration/test_leaf_als_channel.py``.
The rules and what the tests stand for: that file's docstring.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from envoy.data.accesslog.v3 import accesslog_pb2
from envoy.service.accesslog.v3 import als_pb2
from test_leaf_state import make

from dlb.config import ConfigError, config_from_dict
from dlb.ext_proc.leaf_als import LeafAccessLog
from dlb.procutil import free_port

pytestmark = pytest.mark.timeout(120)
START = accesslog_pb2.AccessLogType.Value("DownstreamStart")


def raw_config(**leaf: str) -> dict:
    return {"version": 1, "cells": [{"name": "a", "servers": [f"127.0.0.1:{free_port()}"],
                                     "leaf": {"address": f"127.0.0.1:{free_port()}", "probe": f"127.0.0.1:{free_port()}", **leaf}}],
            "endpoints": [{"name": "chat", "match": {"prefix": "/v1/"}, "policy": {"mechanism": "discrete", "cost": "rif"}}]}


def starts(n: int, prefix: str = "fake") -> als_pb2.StreamAccessLogsMessage:
    msg = als_pb2.StreamAccessLogsMessage(identifier=als_pb2.StreamAccessLogsMessage.Identifier(log_name="dlb-leaf"))
    for i in range(n):
        e = msg.http_logs.log_entry.add()
        e.common_properties.access_log_type = START
        e.request.request_id = f"{prefix}-{i}"
    return msg


def test_the_in_flight_table_is_bounded_and_counts_what_it_refuses() -> None:
    st = make(2, max_inflight=100)
    for i in range(250):
        st.start(0.0, f"x{i}", owner=7)
    assert st.rif == 100 and st.inflight_refused == 150
    st.pick(0.0, "own")  # a pick of the agent's own is refused too when full: the cell is saturated anyway
    assert st.drop_owner(7, 1.0) == 100 and st.rif == 0 and st.orphaned == 100
    assert all(s.rif == 0 for s in st.servers)


def test_records_opened_by_one_stream_survive_another_stream_ending() -> None:
    st = make(2)
    st.start(0.0, "a1", owner=1)
    st.start(0.0, "b1", owner=2)
    i = st.pick(0.0, "mine")  # the agent's own pick: no stream owns it
    assert st.drop_owner(1, 1.0) == 1 and set(st.inflight) == {"b1", "mine"} and st.servers[i].rif == 1


def test_the_agents_picks_are_forgotten_when_the_leaf_envoys_last_log_stream_ends() -> None:
    """With a leaf ext_proc Envoy logs no request starts, so the agent's picks belong to no log stream.
    Seen under ``dlb up``: a ``kill -9`` of the leaf Envoy under load left the idle cell at RIF 3 (its
    servers 2 and 1) for ``max_age_s`` (900 s); the pick avoided one server and roots saw the cell busy.
    When the Envoy's last log stream ends its picks go; while one of its streams is open they stay."""
    st = make(2)
    als = LeafAccessLog(st, clock=lambda: 1.0)

    async def envoy_worker(gone: asyncio.Event) -> AsyncIterator[als_pb2.StreamAccessLogsMessage]:
        yield starts(0)
        await gone.wait()

    async def run() -> None:
        first, second = asyncio.Event(), asyncio.Event()
        a = asyncio.create_task(als.StreamAccessLogs(envoy_worker(first), None))
        b = asyncio.create_task(als.StreamAccessLogs(envoy_worker(second), None))
        await asyncio.sleep(0)
        for i in range(5):
            st.pick(1.0, f"r{i}", 4000)
        first.set()
        await a
        assert st.rif == 5  # the Envoy still logs on another stream: its picks can still complete
        b.cancel()  # the Envoy is gone: grpc.aio cancels the handler of its stream
        await b
        assert st.rif == 0 and st.orphaned == 5
        assert all(s.rif == 0 and s.tokens == pytest.approx(0.0) for s in st.servers)
        st.pick(2.0, "after", 4000)  # the restarted Envoy's picks count as before
        assert st.rif == 1

    asyncio.run(run())


@pytest.mark.parametrize("bad", ["10.0.0.1:9000", "0.0.0.0:9000", "unix:relative.sock", "example.com:1", "nonsense"])
def test_an_access_log_address_reachable_from_the_network_is_refused(bad: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict(raw_config(access_log=bad))
    assert any(p.path == "cells[0].leaf.access_log" for p in info.value.problems), info.value
