"""Every xDS channel a DLB service opens caps gRPC's reconnect back-off at 1 s (a restarted control
plane is found within about a second, not gRPC's default of up to 120 s)."""

from __future__ import annotations

import numpy as np
from envoy.config.core.v3 import base_pb2

from dlb.core.topology import Topology
from dlb.ext_proc.root import RootService
from dlb.ext_proc.root_xds import ProbeManager, RootXdsSync
from dlb.probe.client import ProbeTiming
from dlb.xds.client import Backoff, XdsClient, xds_channel_options

CAPPED = ("grpc.initial_reconnect_backoff_ms", "grpc.min_reconnect_backoff_ms", "grpc.max_reconnect_backoff_ms")


def _check(options: list[tuple[str, int]]) -> None:
    opts = dict(options)
    for key in CAPPED:
        assert key in opts and 0 < opts[key] <= 1000, (key, opts.get(key))


def test_the_xds_client_caps_both_back_offs() -> None:
    client = XdsClient("127.0.0.1:1", base_pb2.Node(id="n"))
    _check(client.channel_options)
    assert client.backoff.maximum <= 1.0 and Backoff().maximum <= 1.0
    # A caller's own options are added to the defaults, not a replacement for them.
    custom = XdsClient("127.0.0.1:1", base_pb2.Node(id="n"), channel_options=[("grpc.keepalive_time_ms", 5000)])
    _check(custom.channel_options)
    assert dict(custom.channel_options)["grpc.keepalive_time_ms"] == 5000
    assert dict(xds_channel_options([("grpc.max_reconnect_backoff_ms", 500)]))["grpc.max_reconnect_backoff_ms"] == 500


def test_the_root_service_xds_channel_is_capped() -> None:
    svc = RootService(cell="a", cell_names=(), endpoints=[], responses=[], rng=np.random.default_rng(0))
    svc.configure(Topology.build(["a"], [1], [[0.0]]), [])
    sync = RootXdsSync(svc, "127.0.0.1:1", "a", ProbeManager(svc, ProbeTiming(), "a"))
    _check(sync.client.channel_options)


def test_envoy_ads_stream_back_off_is_capped() -> None:
    """Envoy's own xDS stream back-off (0.5 s growing to 30 s by default) is capped at 1 s too."""
    from dlb.config.model import HostPort
    from dlb.envoy.ads_bootstrap import ads_bootstrap

    boot = ads_bootstrap("leaf", "a", HostPort("127.0.0.1", 18000), 19000)
    grpc_service = boot["dynamic_resources"]["ads_config"]["grpc_services"][0]["envoy_grpc"]
    assert grpc_service["retry_policy"]["retry_back_off"]["max_interval"] == "1s"
