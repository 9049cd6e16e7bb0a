"""The access log steers a cell, so only the cell's own Envoy may feed it (issue 14 row 5).

Here: the tests that run in-process (no sockets, no processes);
the others: ``tests/integration/test_leaf_als_channel.py``.
The rules and what the tests stand for: that file's docstring.
"""

from __future__ import annotations

import pytest
from envoy.data.accesslog.v3 import accesslog_pb2
from envoy.service.accesslog.v3 import als_pb2
from test_leaf_state import make

from dlb.config import ConfigError, config_from_dict
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


@pytest.mark.parametrize("bad", ["10.0.0.1:9000", "0.0.0.0:9000", "unix:relative.sock", "example.com:1", "nonsense"])
def test_an_access_log_address_reachable_from_the_network_is_refused(bad: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict(raw_config(access_log=bad))
    assert any(p.path == "cells[0].leaf.access_log" for p in info.value.problems), info.value
