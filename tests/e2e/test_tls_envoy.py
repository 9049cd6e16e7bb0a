"""The real path with mutual TLS on: a root Envoy configured only over ADS, every gRPC hop authenticated.

Control plane (xDS over mTLS, per-node authorisation on) → root Envoy of cell ``a`` (bootstrap from
``ads_bootstrap(tls=…)``; its ext_proc cluster pushed over xDS with an UpstreamTlsContext) → the root
ext_proc on DLB's HTTP/2 transport over TLS → a cell picked from probes that went over mTLS to the
leaves' probe servers; the root service follows the control plane over an mTLS xDS stream. Stand-in
leaves answer with their cell's name. Every request must be answered by a leaf *and* have been decided
by the ext_proc (the handler counts them; Envoy's fail-open would also answer 200 without it).
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
from aiohttp import ClientSession, ClientTimeout
from bounded_wait import until, until_in_loop
from leaf_stub import StaticProbe
from service_fixtures import CellPorts

from dlb.config import load_config
from dlb.config.model import HostPort
from dlb.config.tls import load_identity
from dlb.envoy.ads_bootstrap import ads_bootstrap
from dlb.envoy.root_token import token_secret
from dlb.ext_proc.protocol import ExtProcServer
from dlb.ext_proc.root import RootService
from dlb.ext_proc.root_xds import ProbeManager, RootXdsSync, config_probes, probe_targets
from dlb.probe.client import ProbeTiming
from dlb.procutil import free_port
from dlb.service.ports import add_port
from dlb.testbed.pki import dlb_pki

pytestmark = [pytest.mark.envoy, pytest.mark.timeout(120)]


def test_root_envoy_path_over_mtls(tmp_path: Path, make_config, control_plane, envoy, leaves) -> None:
    asyncio.run(_scenario(tmp_path, make_config, control_plane, envoy, leaves))


async def _scenario(tmp: Path, make_config, control_plane, start_envoy, leaves) -> None:
    import grpc

    from dlb.proto import probe_pb2_grpc

    tls, _ = dlb_pki(tmp, ("a", "b"))
    leaf_ports = {n: free_port() for n in "ab"}
    probe_ports = {n: free_port() for n in "ab"}
    root_port, ext_proc_port, admin_port = free_port(), free_port(), free_port()
    cfg = load_config(make_config(
        {n: CellPorts(leaf=leaf_ports[n], probe=probe_ports[n]) for n in "ab"},
        [{"name": "gen", "match": {"prefix": "/"}, "policy": {"mechanism": "discrete"}}],
        roots={"a": {"address": root_port, "ext_proc": ext_proc_port}}, network={"one_way_ms": {"a": {"b": 10}}},
        tls={"ca": tls.ca, "cert": tls.cert, "key": tls.key}))
    assert cfg.tls is not None

    # Stopped in reverse order of start: the Envoy, the root's xDS sync, probes and ext_proc, the control
    # plane, the probe servers, the stand-in leaves.
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(leaves(leaf_ports))
        for n, rif in (("a", 1.0), ("b", 0.0)):
            s = grpc.aio.server()
            probe_pb2_grpc.add_ProbeServicer_to_server(StaticProbe(n, rif), s)
            add_port(s, f"127.0.0.1:{probe_ports[n]}", load_identity(tls, f"leaf-{n}"))
            await s.start()
            stack.push_async_callback(s.stop, 0)

        running = await stack.enter_async_context(control_plane(cfg))
        cp, xds_port = running.cp, running.xds_port

        root_id = load_identity(tls, "root-a")
        service = RootService.from_config(cfg, "a", seed=1)
        calls = [0]

        def handle(message: bytes) -> tuple[bytes, bool]:
            calls[0] += 1
            return service.handle(message)

        server = ExtProcServer("h2", handle, tls=root_id)
        await server.bind(f"127.0.0.1:{ext_proc_port}")
        stack.push_async_callback(server.stop, 0)
        probes = ProbeManager(service, ProbeTiming(period_s=0.02, timeout_s=1.0, backoff_max_s=0.1), "a", tls=root_id)
        stack.push_async_callback(probes.stop)
        await probes.retarget(probe_targets(cfg.topology(), "a", config_probes(cfg), False))
        sync = RootXdsSync(service, f"127.0.0.1:{xds_port}", "a", probes)
        stack.push_async_callback(sync.stop)
        await sync.start()

        boot = ads_bootstrap("root", "a", HostPort("127.0.0.1", xds_port), admin_port, node_id="root-a-tls", tls=cfg.tls,
                             token=token_secret(cfg))
        envoy = await stack.enter_async_context(start_envoy(boot, name="root"))
        # The root service's own xDS stream (mTLS, its certificate's identity) delivered the policy.
        await until_in_loop(lambda: not sync.client.subscriptions or sync.client.connected.is_set(), "the root's xDS stream",
                            timeout=20)
        assert sync.client.connected.is_set()
        # Probes over mTLS reach both leaves.
        client = service.probe_client
        assert client is not None
        await until_in_loop(lambda: all(st.ok >= 3 for st in client.stats.values()), "3 probes to each leaf", timeout=20)
        assert all(st.ok >= 3 and st.available for st in client.stats.values()), client.stats

        # Envoy has its listener (LDS/RDS/CDS over mTLS) once a request is answered by a leaf.
        async def answered_by_a_leaf() -> bool:
            return set(await _send(root_port, 1)) <= {"a", "b"}

        await until_in_loop(answered_by_a_leaf, "a request answered by a leaf", timeout=20, period=0.2)
        before = calls[0]
        got = await _send(root_port, 40)
        assert sum(got.get(c, 0) for c in "ab") == 40, got
        # Every request was decided by the ext_proc over TLS (fail-open would also answer 200).
        assert calls[0] - before >= 40
        stats = envoy.stats("ssl")
        assert int(stats.get("cluster.dlb_xds.ssl.handshake", "0")) >= 1, stats
        assert int(stats.get("cluster.dlb_root_ext_proc.ssl.handshake", "0")) >= 1, stats
        assert cp.server.status.streams_denied == 0
        assert {ns.node_id for ns in cp.server.status.nodes.values()} >= {"root-a-tls"}


async def _send(port: int, n: int) -> dict[str, int]:
    out: dict[str, int] = {}
    async with ClientSession(timeout=ClientTimeout(total=10)) as s:
        for _ in range(n):
            async with s.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": "x"}) as r:
                key = await r.text() if r.status == 200 else f"status-{r.status}"
                out[key] = out.get(key, 0) + 1
    return out


def test_every_tls_bootstrap_is_accepted_by_envoy(tmp_path: Path) -> None:
    """Static root and leaf bootstraps (leaf ext_proc + access log to the agent) and ADS bootstraps with
    ``tls``: Envoy accepts each, and each cluster to a DLB service checks that service's own identity."""
    from dlb.config import config_from_dict
    from dlb.envoy.binary import validate
    from dlb.envoy.bootstrap import leaf_bootstrap, root_bootstrap, write_bootstrap

    tls, _ = dlb_pki(tmp_path / "pki", ("a",))
    cfg = config_from_dict({
        "version": 1,
        "cells": [{"name": "a", "leaf": {"address": f"127.0.0.1:{free_port()}", "probe": f"127.0.0.1:{free_port()}",
                                         "ext_proc": f"127.0.0.1:{free_port()}"},
                   "root": {"address": f"127.0.0.1:{free_port()}", "ext_proc": f"127.0.0.1:{free_port()}"},
                   "servers": [f"127.0.0.1:{free_port()}"]}],
        "endpoints": [{"name": "gen", "match": {"prefix": "/"}}],
        "tls": {"ca": tls.ca, "cert": tls.cert, "key": tls.key},
    })
    boots = {
        "root": root_bootstrap(cfg, "a", admin_port=free_port()),
        "leaf": leaf_bootstrap(cfg, "a", admin_port=free_port(), emulate_wan=False, access_log=True),
        "ads-root": ads_bootstrap("root", "a", HostPort("127.0.0.1", free_port()), free_port(), tls=cfg.tls, token=token_secret(cfg)),
        "ads-leaf": ads_bootstrap("leaf", "a", HostPort("127.0.0.1", free_port()), free_port(), tls=cfg.tls),
    }
    expect = {"root": {"dlb_root_ext_proc": "spiffe://dlb/root/a"},
              # the agent's access log is a local channel (a Unix socket: docs/security.md), not a TLS hop
              "leaf": {"dlb_leaf_ext_proc": "spiffe://dlb/leaf/a"},
              "ads-root": {"dlb_xds": "spiffe://dlb/control-plane"}, "ads-leaf": {"dlb_xds": "spiffe://dlb/control-plane"}}
    for name, boot in boots.items():
        sockets = {c["name"]: c["transport_socket"]["typed_config"]["common_tls_context"]
                   for c in boot["static_resources"]["clusters"] if "transport_socket" in c}
        assert {k: v["validation_context"]["match_typed_subject_alt_names"][0]["matcher"]["exact"] for k, v in sockets.items()} \
            == expect[name], name
        own = "leaf-a" if "leaf" in name else "root-a"
        assert all(v["tls_certificates"][0]["certificate_chain"]["filename"] == tls.cert_for(own) for v in sockets.values())
        path = write_bootstrap(boot, tmp_path / f"{name}.yaml")
        res = validate(path)
        assert res.returncode == 0, (name, res.stdout[-2000:], res.stderr[-2000:])


def test_whole_data_plane_over_mtls(tmp_path: Path) -> None:
    """``dlb serve root|leaf`` and static Envoy bootstraps with ``tls``: requests cross root Envoy →
    root ext_proc (h2, TLS) → leaf Envoy → leaf ext_proc (h2, TLS) → server, the leaf Envoy's access
    log reaches the agent over mTLS (completions counted), and the root probes the leaves over mTLS."""
    from dlb.testbed.stack import CellSpec, metric_value, request, start_data_plane

    tls, _ = dlb_pki(tmp_path / "pki", ("a", "b"))
    endpoint = {"name": "chat", "match": {"prefix": "/v1/"}, "policy": {"mechanism": "discrete", "cost": "rif"}}
    plane = start_data_plane([CellSpec("a"), CellSpec("b")], "a", endpoint, one_way_ms={"a": {"b": 1}}, emulate_wan=False,
                             tls={"ca": tls.ca, "cert": tls.cert, "key": tls.key})
    try:
        host, port = plane.root_url
        with contextlib.suppress(AssertionError):  # the assertion below says what the requests got
            until(lambda: request(host, port, timeout=10)[0] == 200, "a 200 from the root", timeout=30, period=0.2)
        picked = [request(host, port, timeout=10)[1].get("x-dlb-server") for _ in range(20)]
        assert all(picked), picked  # every request got a server picked by a leaf ext_proc (over TLS)
        root = plane.root_metrics()
        assert sum(metric_value(root, "dlb_root_decisions_total", endpoint="chat", cell=c) or 0 for c in "ab") >= 20, root
        # Both leaves probed over mTLS: the first request needs only one usable cell, and a probe to the other may
        # still be in its start-up backoff (a leaf that was not listening yet), so wait a bounded while.
        until(lambda: all((metric_value(plane.root_metrics(), "dlb_root_probes_total", cell=c) or 0) > 0 for c in "ab"),
              "both leaves probed", timeout=10, period=0.1)
        until(lambda: sum(metric_value(plane.leaf_metrics(c), "dlb_leaf_completed_total") or 0 for c in "ab") >= 20,
              "20 completions counted: the access log reached the agents (over their Unix sockets)", timeout=10, period=0.1)
        assert plane.root_envoy is not None
        stats = plane.root_envoy.stats("ssl.handshake")
        assert int(stats.get("cluster.dlb_root_ext_proc.ssl.handshake", "0")) >= 1, stats
        for c in "ab":
            s = plane.leaf_envoys[c].stats("ssl.handshake")
            assert int(s.get("cluster.dlb_leaf_ext_proc.ssl.handshake", "0")) >= 1, s
    finally:
        plane.close()
