"""Envoy and DLB resources built from the config."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from envoy.config.bootstrap.v3 import bootstrap_pb2
from envoy.extensions.clusters.aggregate.v3 import cluster_pb2 as aggregate_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from google.protobuf import json_format

from dlb.config import load_config
from dlb.config import resources as dr
from dlb.control_plane import envoy_resources as er
from dlb.envoy import bootstrap as envoy_bootstrap
from dlb.proto import resources_pb2

EXAMPLE = Path(__file__).resolve().parents[2] / "envoy_configs" / "dlb.example.yaml"


@pytest.fixture(scope="module")
def cfg():
    return load_config(EXAMPLE)


def to_static(rs: er.ResourceSet) -> bootstrap_pb2.Bootstrap.StaticResources:
    """Inverse of from_bootstrap: EDS clusters get their assignments back, RDS becomes inline."""
    cla = {c.cluster_name: c for c in rs.endpoints}
    routes = {r.name: r for r in rs.routes}
    out = bootstrap_pb2.Bootstrap.StaticResources()
    for c in rs.clusters:
        c2 = out.clusters.add()
        c2.CopyFrom(c)
        if c.name in cla:
            c2.ClearField("eds_cluster_config")
            c2.type = c2.STATIC
            c2.load_assignment.CopyFrom(cla[c.name])
    for lis in rs.listeners:
        l2 = out.listeners.add()
        l2.CopyFrom(lis)
        for chain in l2.filter_chains:
            for f in chain.filters:
                hcm = hcm_pb2.HttpConnectionManager()
                f.typed_config.Unpack(hcm)
                name = hcm.rds.route_config_name
                hcm.ClearField("rds")
                hcm.route_config.CopyFrom(routes[name])
                f.typed_config.Pack(hcm)
    return out


@pytest.mark.parametrize("role", ["root", "leaf"])
def test_dynamic_resources_round_trip_to_the_static_bootstrap(cfg, role) -> None:
    for cell in cfg.cell_names:
        if role == "root":
            boot = envoy_bootstrap.root_bootstrap(cfg, cell, admin_port=0, native_flow=True)
            rs = er.root_resources(cfg, cell)
        else:
            boot = envoy_bootstrap.leaf_bootstrap(cfg, cell, admin_port=0, emulate_wan=False, access_log=True)
            rs = er.leaf_resources(cfg, cell)
        want = bootstrap_pb2.Bootstrap.StaticResources()
        # The root token's secret stays in the Envoy's own bootstrap: xDS never carries it.
        json_format.ParseDict({k: v for k, v in boot["static_resources"].items() if k != "secrets"}, want)
        assert to_static(rs) == want
        assert all(c.type == c.EDS for c in rs.clusters if c.name.startswith("cell-") and ".or." not in c.name)  # not the aggregates
        assert len(rs.routes) == 1 and len(rs.listeners) == 1


def test_flow_weights_land_on_the_flow_route_only(cfg) -> None:
    rs = er.root_resources(cfg, "us-east1", {"embed": np.array([0.7, 0.2999, 0.0001])})
    routes = {r.name: r for r in rs.routes[0].virtual_hosts[0].routes}
    flow = {w.name: w.weight.value for w in routes["embed-fallback"].route.weighted_clusters.clusters}
    # Each cell with its fallback (the embed endpoint runs natively: test_native_flow_retries_once_on_each_cells_fallback).
    assert flow == {"cell-us-east1.or.us-west1": 7000, "cell-us-west1.or.us-east1": 2999, "cell-eu-west1.or.us-east1": 1}
    disc = {w.name: w.weight.value for w in routes["llama-8b-fallback"].route.weighted_clusters.clusters}
    # Discrete endpoints keep the replica-weighted fail-open split (3, 2, 2 servers), each cell with its fallback.
    assert disc == {"cell-us-east1.or.us-west1": 3, "cell-us-west1.or.us-east1": 2, "cell-eu-west1.or.us-east1": 2}
    # A zero weight drops the cluster from the route; residency violations are refused.
    rs = er.root_resources(cfg, "us-east1", {"embed": np.array([1.0, 0.0, 0.0])})
    routes = {r.name: r for r in rs.routes[0].virtual_hosts[0].routes}
    assert [w.name for w in routes["embed-fallback"].route.weighted_clusters.clusters] == ["cell-us-east1.or.us-west1"]
    with pytest.raises(ValueError, match="allowed"):
        er.root_resources(cfg, "eu-west1", {"embed": np.array([0.5, 0.0, 0.5])})
    with pytest.raises(ValueError, match="not a flow endpoint"):
        er.root_resources(cfg, "us-east1", {"llama-8b": np.array([1.0, 0.0, 0.0])})


def test_native_flow_retries_once_on_each_cells_fallback(cfg) -> None:
    """A native flow route weights aggregates (cell, fallback) and retries once on the fallback, on the
    bootstrap and over xDS alike; the fallback is the allowed cell nearest the root, never a forbidden one."""
    # From us-east1: us-west1 is 62 ms round trip, eu-west1 76 ms; from the others the root's own cell is nearest.
    assert envoy_bootstrap.flow_fallbacks(cfg, "us-east1") == {"us-east1": "us-west1", "us-west1": "us-east1", "eu-west1": "us-east1"}
    assert envoy_bootstrap.flow_fallbacks(cfg, "eu-west1") == {}  # residency: it may send to itself only
    rs = er.root_resources(cfg, "us-east1")
    clusters = {c.name: c for c in rs.clusters}
    route = next(r for r in rs.routes[0].virtual_hosts[0].routes if r.name == "embed-fallback").route
    names = [w.name for w in route.weighted_clusters.clusters]
    assert names == ["cell-us-east1.or.us-west1", "cell-us-west1.or.us-east1", "cell-eu-west1.or.us-east1"]
    for name in names:
        agg = aggregate_pb2.ClusterConfig()
        clusters[name].cluster_type.typed_config.Unpack(agg)
        first, fb = name.split(".or.")
        assert list(agg.clusters) == [first, "cell-" + fb]
    policy = route.retry_policy
    assert (policy.retry_on, policy.num_retries.value, list(policy.retriable_status_codes)) == (envoy_bootstrap.CROSS_CELL_RETRY_ON, 1, [503, 429])
    assert policy.retry_priority.name == envoy_bootstrap.PREVIOUS_PRIORITIES
    # The control plane's weights keep the names, and every name is a cluster of the set.
    for x in ([0.0, 0.4, 0.6], [1.0, 0.0, 0.0]):
        rs = er.root_resources(cfg, "us-east1", {"embed": np.array(x)})
        route = next(r for r in rs.routes[0].virtual_hosts[0].routes if r.name == "embed-fallback").route
        assert {w.name for w in route.weighted_clusters.clusters} <= set(names) and route.retry_policy.retry_priority.name
    # One allowed cell: nothing to retry on, the bare cell.
    eu = next(r for r in er.root_resources(cfg, "eu-west1").routes[0].virtual_hosts[0].routes if r.name == "embed-fallback").route
    assert [w.name for w in eu.weighted_clusters.clusters] == ["cell-eu-west1"] and not eu.HasField("retry_policy")
    # An ext_proc endpoint's fail-open route (its root service down, slow or undecided) retries the same way.
    disc = next(r for r in rs.routes[0].virtual_hosts[0].routes if r.name == "llama-8b-fallback").route
    assert [w.name for w in disc.weighted_clusters.clusters] == names and disc.retry_policy == policy


def test_a_root_of_native_flow_only_has_just_the_aggregates_its_route_names(cfg) -> None:
    """No ext_proc, so no pairs for picks: one aggregate per allowed cell, each named by the route."""
    only = replace(cfg, endpoints=tuple(ep for ep in cfg.endpoints if ep.name == "embed"))
    rs = er.root_resources(only, "us-east1")
    aggregates = sorted(c.name for c in rs.clusters if ".or." in c.name)
    route = rs.routes[0].virtual_hosts[0].routes[-1].route
    assert aggregates == sorted(w.name for w in route.weighted_clusters.clusters) and len(aggregates) == 3
    assert "dlb_root_ext_proc" not in {c.name for c in rs.clusters}


def test_check_references_rejects_dangling_routes(cfg) -> None:
    rs = er.root_resources(cfg, "us-east1")
    bad = er.ResourceSet(rs.listeners, rs.routes, tuple(c for c in rs.clusters if c.name != "cell-us-west1"), rs.endpoints)
    with pytest.raises(ValueError, match="cell-us-west1"):
        er.check_references(bad)


def test_dlb_resources_round_trip(cfg) -> None:
    for ep in cfg.endpoints:
        policy, prior, by_cell = dr.policy_from_pb(dr.routing_policy(cfg, ep))
        assert policy == ep.policy.to_core(cfg.probe, ep.timeout_s)
        assert prior == ep.latency_prior.to_core() and by_cell == ep.cell_priors()
    topo = dr.topology_from_pb(dr.topology(cfg))
    want = cfg.topology()
    assert topo.names == want.names
    np.testing.assert_allclose(topo.tau, want.tau)
    np.testing.assert_array_equal(topo.allowed, want.allowed)
    x = dr.weights_from_pb(dr.flow_weights("embed", "us-east1", topo.names, np.array([0.5, 0.5, 0.0])), topo.names)
    np.testing.assert_allclose(x, [0.5, 0.5, 0.0])


def test_invalid_dlb_resources_are_rejected() -> None:
    with pytest.raises(dr.ResourceError, match="mechanism"):
        dr.policy_from_pb(resources_pb2.RoutingPolicy(endpoint="e"))
    bad = resources_pb2.RoutingPolicy(endpoint="e", mechanism=1, cost=2)
    bad.latency_prior.a_s = -1
    with pytest.raises(dr.ResourceError, match="latency_prior"):
        dr.policy_from_pb(bad)
    t = resources_pb2.Topology()
    t.cells.add(name="a", replicas=1)
    with pytest.raises(dr.ResourceError, match="rows"):
        dr.topology_from_pb(t)
    with pytest.raises(dr.ResourceError, match="unknown"):
        dr.weights_from_pb(resources_pb2.FlowWeights(endpoint="e", source_cell="a", weights={"zz": 1.0}), ("a",))


def test_a_root_with_only_native_flow_endpoints_has_no_ext_proc_filter(cfg) -> None:
    """Left in the chain and disabled per route, the ext_proc filter still ran its per-route lookup on
    every request (measured in research/bench/overhead-native.json); a root that never calls it has none."""
    def http_filters(rs: er.ResourceSet) -> list[str]:
        hcm = hcm_pb2.HttpConnectionManager()
        rs.listeners[0].filter_chains[0].filters[0].typed_config.Unpack(hcm)
        return [f.name for f in hcm.http_filters]

    mixed = er.root_resources(cfg, "us-east1")  # the example has a discrete endpoint too: the filter stays
    assert "envoy.filters.http.ext_proc" in http_filters(mixed)
    flow_only = replace(cfg, endpoints=tuple(ep for ep in cfg.endpoints if ep.policy.mechanism.value == "flow"))
    assert flow_only.endpoints and len(flow_only.endpoints) < len(cfg.endpoints)
    rs = er.root_resources(flow_only, "us-east1")
    assert http_filters(rs) == ["envoy.filters.http.credential_injector", "envoy.filters.http.router"]
    assert envoy_bootstrap.ROOT_EXT_PROC_CLUSTER not in {c.name for c in rs.clusters}
    for r in rs.routes[0].virtual_hosts[0].routes:
        assert "envoy.filters.http.ext_proc" not in r.typed_per_filter_config
