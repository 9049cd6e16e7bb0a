"""Control-plane replicas (active-active): versions that never go backwards when a node re-homes, one
gRPC target over every replica for DLB's services, and every replica in each Envoy's bootstrap."""

from __future__ import annotations

import pytest
from test_xds_protocol import snap

from dlb.config.model import HostPort
from dlb.envoy.ads_bootstrap import XDS_CLUSTER, ads_bootstrap
from dlb.xds import SnapshotCache
from dlb.xds.cache import version_stamp
from dlb.xds.client import grpc_target


def test_versions_order_by_time_within_and_across_replicas() -> None:
    a = SnapshotCache()
    v1 = a.set_snapshot("n", snap())
    v2 = a.set_snapshot("n", snap(clusters=("c1", "c3")))
    assert v1 < v2 and version_stamp(v1) is not None
    b = SnapshotCache()
    assert a.set_snapshot("m", snap()) < b.set_snapshot("m", snap(clusters=("c2",)))  # made later, sorts later


def test_a_node_rehoming_with_a_newer_version_gets_a_later_one_and_never_an_older() -> None:
    old, new = SnapshotCache(), SnapshotCache()
    stale = old.set_snapshot("n", snap())  # the surviving replica's snapshot was made first ...
    held = new.set_snapshot("n", snap(clusters=("c1", "c3")))  # ... the dead one's later: the node holds that
    assert stale < held
    old.resume("n", held)
    after = old.get_snapshot("n")
    assert after is not None and after.version > held
    # Same content: nothing rebuilt, and a client holding an older (or foreign) version changes nothing.
    old.resume("n", stale)
    old.resume("n", "not-ours")
    assert old.get_snapshot("n").version == after.version  # type: ignore[union-attr]


def test_services_get_one_grpc_target_over_every_replica() -> None:
    assert grpc_target("127.0.0.1:18000") == "127.0.0.1:18000"
    assert grpc_target("xds.dlb.svc:18000") == "xds.dlb.svc:18000"
    assert grpc_target("127.0.0.1:1, 10.0.0.2:2") == "ipv4:127.0.0.1:1,10.0.0.2:2"
    assert grpc_target("[::1]:1,[::2]:2") == "ipv6:[::1]:1,[::2]:2"
    with pytest.raises(ValueError, match="one DNS name that resolves to every replica"):
        grpc_target("cp-0.dlb:1,cp-1.dlb:1")


def test_every_envoy_bootstrap_names_every_replica_and_health_checks_them() -> None:
    boot = ads_bootstrap("leaf", "a", [HostPort("127.0.0.1", 1), HostPort("127.0.0.1", 2)], 9901)
    cluster = next(c for c in boot["static_resources"]["clusters"] if c["name"] == XDS_CLUSTER)
    ports = [e["endpoint"]["address"]["socket_address"]["port_value"] for e in cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]]
    assert ports == [1, 2] and cluster["type"] == "STATIC"
    assert cluster["health_checks"][0]["grpc_health_check"] == {}
