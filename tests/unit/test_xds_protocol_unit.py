"""xDS protocol behaviour of dlb.xds (docs/design.md §5) driven by a raw gRPC client (xds-protos stubs).

Here: the tests that run in-process (no sockets, no processes);
the others: ``tests/integration/test_xds_protocol.py``.
The rules and what the tests stand for: that file's docstring.
"""

from __future__ import annotations

import pytest
from test_xds_protocol import snap

from dlb.xds import Snapshot, SnapshotCache, SnapshotError
from dlb.xds.snapshot import Resource
from dlb.xds.testing import eds_cluster


def test_versions_unique_across_restarts_and_no_duplicate_names():
    """Versions are unique across restarts, a snapshot has no duplicate names, and delta versions are content hashes."""
    a, b = SnapshotCache(), SnapshotCache()
    assert a.set_snapshot("n", snap()) != b.set_snapshot("n", snap())
    with pytest.raises(SnapshotError, match="duplicate resource name 'c1'"):
        Snapshot.build([eds_cluster("c1"), eds_cluster("c1")])
    r1, r2 = Resource.from_message(eds_cluster("c1")), Resource.from_message(eds_cluster("c1"))
    assert r1.version == r2.version  # delta versions are content hashes
    assert Resource.from_message(eds_cluster("c1", 3)).version != r1.version


# --- delta --------------------------------------------------------------------------------------


def test_body_cache_shares_bodies_and_is_bounded_by_bytes():
    """Identical responses share one serialized body; the body cache is bounded in bytes and skips bodies over a quarter of it."""
    from dlb.xds.stream import BodyCache

    cache = BodyCache(capacity_bytes=100)
    built = []
    for key in ["a", "b", "a", "c"]:
        cache.get((key,), lambda k=key: built.append(k) or k.encode() * 20)  # 20 bytes each
    assert built == ["a", "b", "c"] and cache.hits == 1
    for i in range(10):
        cache.get((i,), lambda: b"x" * 20)
    assert cache._bytes <= 100
    cache.get(("huge",), lambda: b"y" * 60)  # > capacity/4: returned, not cached
    assert ("huge",) not in cache._items


def test_status_forgets_the_oldest_disconnected_nodes():
    """The status registry keeps a bounded number of disconnected nodes, forgetting the oldest first."""
    from dlb.xds.status import StatusRegistry

    reg = StatusRegistry(max_disconnected=2)
    for n in ["a", "b", "c"]:
        reg.stream_opened(n, "x")
    reg.stream_closed("a")
    reg.stream_closed("b")
    assert set(reg.nodes) == {"a", "b", "c"}
    reg.stream_closed("c")
    assert set(reg.nodes) == {"b", "c"}


def test_status_forgets_nodes_past_the_grace_period_and_keeps_a_reconnected_one():
    from dlb.xds.status import StatusRegistry

    now = [0.0]
    reg = StatusRegistry(grace_s=10.0, clock=lambda: now[0])
    for n in ["a", "b"]:
        reg.stream_opened(n, "x")
    reg.stream_closed("a")
    now[0] = 5.0
    reg.stream_closed("b")
    reg.stream_opened("a", "x")  # a came back within the grace period: not gone any more
    now[0] = 16.0
    reg.forget_gone()
    assert set(reg.nodes) == {"a"}  # b closed 11 s ago: forgotten; a is connected
