"""Mutual TLS on DLB's gRPC channels and per-node authorisation on the control plane (docs/security.md).

Certificates come from a CA the test makes (tests/tls_certs.py); a second CA stands in for an
attacker's. Every server here is the real one on 127.0.0.1 (grpc.aio or DLB's HTTP/2 transport):
a client without a certificate, or with one from the other CA, is refused at the handshake; a
certificate from the right CA that claims another (role, cell) on the control plane is refused with
PERMISSION_DENIED and counted.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
import yaml
from aiohttp import ClientSession
from bounded_wait import until_in_loop
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from test_tls_unit import _doc, _node

from dlb.config import config_from_dict, load_config
from dlb.config.model import TlsFiles
from dlb.config.tls import load_identity
from dlb.config.tls_live import component_identity
from dlb.control_plane.service import ControlPlane
from dlb.ext_proc.protocol import ExtProcServer
from dlb.probe.client import ProbeClient, ProbeTiming
from dlb.probe.target import ProbeTarget
from dlb.proto import probe_pb2, probe_pb2_grpc
from dlb.testbed.pki import dlb_pki
from dlb.xds import types

pytestmark = pytest.mark.timeout(60)

ADS = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
PROCESS = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Our CA with a certificate per identity (as ``{identity}.pem``), and another CA's for the same names."""
    d = tmp_path_factory.mktemp("pki")
    tls, foreign = dlb_pki(d, ("a", "b"))
    return {"dir": d, "tls": tls, "foreign": foreign}


# --- the control plane: authentication and per-node authorisation ----------------------------------


async def _ads_first(target: str, creds: grpc.ChannelCredentials | None, node: base_pb2.Node, type_url: str,
                     names: tuple[str, ...] = ()) -> discovery_pb2.DiscoveryResponse | grpc.StatusCode:
    """The first response of an ADS stream for one type, or the status code that ended it."""
    channel = grpc.aio.insecure_channel(target) if creds is None else grpc.aio.secure_channel(target, creds)
    async with channel:
        call = channel.stream_stream(ADS, request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
                                     response_deserializer=discovery_pb2.DiscoveryResponse.FromString)

        async def requests():
            yield discovery_pb2.DiscoveryRequest(node=node, type_url=type_url, resource_names=list(names))
            await asyncio.sleep(30)

        stream = call(requests(), timeout=10)
        try:
            async for resp in stream:
                stream.cancel()
                return resp
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    raise AssertionError("stream ended without a response")


@pytest.mark.parametrize("xds_transport", ["h2", "grpc"])
def test_control_plane_refuses_strangers_and_other_identities(pki, xds_transport: str) -> None:
    asyncio.run(_control_plane_scenario(pki, xds_transport))


async def _control_plane_scenario(pki, xds_transport: str) -> None:
    tls: TlsFiles = pki["tls"]
    cfg = config_from_dict(_doc({"ca": tls.ca, "cert": tls.cert, "key": tls.key}))
    cp = ControlPlane(cfg, probe=False, flow_loop=False, xds_transport=xds_transport)
    xds_port, status_port = await cp.start("127.0.0.1:0", "127.0.0.1:0")
    target = f"127.0.0.1:{xds_port}"
    root_a = load_identity(tls, "root-a").channel_credentials()
    leaf_a = load_identity(tls, "leaf-a").channel_credentials()
    try:
        # Its own snapshot: served.
        got = await _ads_first(target, root_a, _node("dlb-root", "a"), types.CLUSTER)
        assert isinstance(got, discovery_pb2.DiscoveryResponse) and got.resources
        got = await _ads_first(target, leaf_a, _node("dlb-leaf", "a"), types.CLUSTER)
        assert isinstance(got, discovery_pb2.DiscoveryResponse)
        # Claiming another cell's, or a root's, resources with a leaf certificate: denied, counted.
        assert await _ads_first(target, leaf_a, _node("dlb-leaf", "b"), types.CLUSTER) \
            == grpc.StatusCode.PERMISSION_DENIED
        assert await _ads_first(target, leaf_a, _node("dlb-root", "a"), types.CLUSTER) == grpc.StatusCode.PERMISSION_DENIED
        assert cp.server.status.streams_denied == 2
        assert "dlb-leaf/b" not in {ns.cluster + "/" for ns in cp.server.status.nodes.values()}  # never became a node
        # No certificate, or one from another CA (even naming root/a): no TLS session at all.
        assert await _ads_first(target, None, _node("dlb-root", "a"), types.CLUSTER) == grpc.StatusCode.UNAVAILABLE
        other_ca = load_identity(pki["foreign"], "root-a").channel_credentials()
        assert await _ads_first(target, other_ca, _node("dlb-root", "a"), types.CLUSTER) == grpc.StatusCode.UNAVAILABLE
        async with ClientSession() as http, http.get(f"http://127.0.0.1:{status_port}/metrics") as r:
            assert "dlb_xds_streams_denied_total 2.0" in await r.text()
    finally:
        await cp.stop()


# --- ext_proc (both transports) and the probe service ---------------------------------------------


def _handle(message: bytes) -> tuple[bytes, bool]:
    ep.ProcessingRequest.FromString(message)
    return ep.ProcessingResponse(request_headers=ep.HeadersResponse()).SerializeToString(), False


async def _process(target: str, creds: grpc.ChannelCredentials | None) -> grpc.StatusCode | str:
    channel = grpc.aio.insecure_channel(target) if creds is None else grpc.aio.secure_channel(target, creds)
    async with channel:
        call = channel.stream_stream(PROCESS, request_serializer=ep.ProcessingRequest.SerializeToString,
                                     response_deserializer=ep.ProcessingResponse.FromString)

        async def one():
            yield ep.ProcessingRequest(request_headers=ep.HttpHeaders())

        try:
            async for resp in call(one(), timeout=10):
                return resp.WhichOneof("response")
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return "no reply"


@pytest.mark.parametrize("transport", ["h2", "grpc"])
def test_ext_proc_serves_only_clients_with_a_certificate_of_the_ca(pki, transport: str) -> None:
    async def scenario() -> None:
        tls: TlsFiles = pki["tls"]
        server = ExtProcServer(transport, _handle, tls=load_identity(tls, "root-a"))
        port = await server.bind("127.0.0.1:0")
        target = f"127.0.0.1:{port}"
        try:
            assert await _process(target, load_identity(tls, "root-b").channel_credentials()) == "request_headers"
            assert await _process(target, None) == grpc.StatusCode.UNAVAILABLE
            assert await _process(target, load_identity(pki["foreign"], "root-a").channel_credentials()) == grpc.StatusCode.UNAVAILABLE
            # A TLS client without a certificate of its own.
            anonymous = grpc.ssl_channel_credentials(root_certificates=Path(tls.ca).read_bytes())
            assert await _process(target, anonymous) == grpc.StatusCode.UNAVAILABLE
        finally:
            await server.stop(0)

    asyncio.run(scenario())


class _Probe(probe_pb2_grpc.ProbeServicer):
    async def Probe(self, request, context):
        return probe_pb2.ProbeResponse(cell="a", rif=1.0, replicas=1)


def test_probe_client_speaks_mtls_to_a_leaf(pki) -> None:
    async def scenario() -> None:
        from dlb.service.ports import add_port

        tls: TlsFiles = pki["tls"]
        server = grpc.aio.server()
        probe_pb2_grpc.add_ProbeServicer_to_server(_Probe(), server)
        port = add_port(server, "127.0.0.1:0", load_identity(tls, "leaf-a"))
        await server.start()
        target = [ProbeTarget(0, "a", f"127.0.0.1:{port}")]
        timing = ProbeTiming(period_s=0.02, timeout_s=1.0, backoff_max_s=0.1)
        answers: list = []
        mtls = ProbeClient(target, lambda _t, r, _n: answers.append(r), timing,
                           credentials=load_identity(tls, "root-b").channel_credentials())
        plain = ProbeClient(target, lambda _t, r, _n: None, timing)
        for c in (mtls, plain):
            c.start()
        try:
            await until_in_loop(lambda: len(answers) >= 3 and plain.stats[(0, 0)].errors >= 3, "3 answers over mTLS, 3 plaintext failures",
                                period=0.02)
            assert len(answers) >= 3 and all(r is not None and r.cell == "a" for r in answers)
            assert plain.stats[(0, 0)].errors >= 3 and plain.stats[(0, 0)].ok == 0  # every plaintext probe failed
        finally:
            for c in (mtls, plain):
                await c.stop()
            await server.stop(0)

    asyncio.run(scenario())


def test_served_leaf_and_root_speak_only_mtls(pki, tmp_path: Path) -> None:
    """``dlb serve leaf`` and ``dlb serve root`` with a ``tls`` config: the leaf's probe port and its
    HTTP/2 ext_proc, and the root's ext_proc, answer mTLS clients and refuse plaintext ones."""
    from dlb.procutil import free_port
    from dlb.testbed.process import ServiceProcess

    tls: TlsFiles = pki["tls"]
    doc = _doc({"ca": tls.ca, "cert": tls.cert, "key": tls.key})
    for c in doc["cells"]:
        c["leaf"] = {"address": f"127.0.0.1:{free_port()}", "probe": f"127.0.0.1:{free_port()}", "ext_proc": f"127.0.0.1:{free_port()}"}
        c["root"] = {"address": f"127.0.0.1:{free_port()}", "ext_proc": f"127.0.0.1:{free_port()}"}
    path = tmp_path / "dlb.yaml"
    path.write_text(yaml.safe_dump(doc))
    cfg = load_config(path)
    a = cfg.cell("a")
    leaf = ServiceProcess("leaf", "--config", str(path), "--cell", "a", "--metrics", "", "--envoy-check-period-ms", "0",
                          "--scrape-period-ms", "0")
    root = ServiceProcess("root", "--config", str(path), "--cell", "a", "--metrics", "")
    with leaf, root:
        async def scenario() -> None:
            mtls = load_identity(tls, "root-a").channel_credentials()
            for target in (str(a.leaf.ext_proc), str(a.root.ext_proc)):
                # An answer (the leaf has no usable server here and says so): the TLS session carried it.
                assert await _process(target, mtls) in ("request_headers", "immediate_response"), target
                assert await _process(target, None) == grpc.StatusCode.UNAVAILABLE, target
            for creds, want in ((mtls, "a"), (None, grpc.StatusCode.UNAVAILABLE)):
                channel = grpc.aio.insecure_channel(str(a.leaf.probe)) if creds is None else grpc.aio.secure_channel(str(a.leaf.probe), creds)
                async with channel:
                    try:
                        got = (await probe_pb2_grpc.ProbeStub(channel).Probe(probe_pb2.ProbeRequest(source_cell="a"), timeout=10)).cell
                    except grpc.aio.AioRpcError as exc:
                        got = exc.code()
                assert got == want

        asyncio.run(scenario())


def test_the_openssl_recipe_of_security_md_runs_in_sh_and_makes_working_certificates(tmp_path: Path) -> None:
    """docs/security.md's recipe, as written, under POSIX ``sh`` (it used ``${id/\\//-}`` and ``<(...)``,
    which dash rejects): every certificate it makes verifies against its CA with its own key."""
    import re
    import shutil
    import subprocess

    from dlb.config.loader import tls_pair_problems

    if shutil.which("openssl") is None:
        pytest.skip("no openssl on PATH")
    doc = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    (recipe,) = re.findall(r"```sh\n(openssl req -x509.*?)```", doc, re.DOTALL)
    subprocess.run(["sh", "-e", "-c", recipe], cwd=tmp_path, check=True, capture_output=True, timeout=60)
    for n in ("control-plane", "root-us-east1", "leaf-us-east1"):
        assert tls_pair_problems(str(tmp_path / "ca.pem"), str(tmp_path / f"{n}.pem"), str(tmp_path / f"{n}-key.pem")) == []
    cfg = _doc({"ca": "ca.pem", "cert": "{identity}.pem", "key": "{identity}-key.pem"})
    cfg["cells"] = [{"name": "us-east1", "leaf": {"address": "127.0.0.1:1000", "probe": "127.0.0.1:2000"},
                     "root": {"address": "127.0.0.1:4000"}, "servers": ["127.0.0.1:3000"]}]
    cfg["network"] = {}
    (tmp_path / "dlb.yaml").write_text(yaml.safe_dump(cfg))
    tls = load_config(tmp_path / "dlb.yaml").tls
    for role in ("root", "leaf"):
        assert component_identity(tls, role, "us-east1") is not None
    assert component_identity(tls, "control-plane") is not None


def test_failed_tls_handshakes_do_not_use_up_the_connection_cap(pki) -> None:
    """Under TLS the listener's protocol factory runs at accept, but a connection whose handshake fails is
    never made nor lost: counted at accept, each failed handshake stayed in the server's connection set for
    good, and once the cap was reached every new connection (Envoy's too) was refused after its handshake.
    Here the cap is 2: five plaintext clients fail their handshakes, then an mTLS client is still served."""
    from dlb.transport.limits import H2Limits

    tls: TlsFiles = pki["tls"]

    async def scenario() -> None:
        server = ExtProcServer("h2", _handle, limits=H2Limits(max_connections=2), tls=load_identity(tls, "root-a"))
        port = await server.bind("127.0.0.1:0")
        try:
            for _ in range(5):
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")  # not a ClientHello: the handshake fails
                await writer.drain()
                writer.close()
            await asyncio.sleep(0.5)
            got = await _process(f"127.0.0.1:{port}", load_identity(tls, "root-a").channel_credentials())
            assert got in ("request_headers", "immediate_response"), got
            assert server.stats.connections_refused == 0
        finally:
            await server.stop()

    asyncio.run(scenario())


async def _read_until_closed(reader: asyncio.StreamReader, bound_s: float = 20.0) -> bytes:
    """Everything the server sends until it closes (the bound only fails a hung test; nothing is timed)."""
    out = b""
    while True:
        try:
            data = await asyncio.wait_for(reader.read(65536), bound_s)
        except ConnectionResetError:
            return out
        if not data:
            return out
        out += data


def test_tls_connections_count_against_the_cap_before_any_handshake(pki) -> None:
    """Issue 14 row 3 under mTLS: asyncio ran the TLS handshake before our protocol saw the connection,
    so connections that never sent a byte were bounded by nothing (20,000 of them: RSS 80 -> ~1000 MB,
    a 233-315 ms loop block). With TLS inside the transport the cap acts at accept: three silent
    connections fill a cap of 3, and a fourth gets in only by the oldest silent one being closed,
    counted, before any handshake."""
    from dlb.transport.limits import H2Limits

    tls: TlsFiles = pki["tls"]

    async def scenario() -> None:
        server = ExtProcServer("h2", _handle, limits=H2Limits(max_connections=3), tls=load_identity(tls, "root-a"))
        port = await server.bind("127.0.0.1:0")
        silent = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        try:
            # accepted a few per loop turn
            await until_in_loop(lambda: server.stats.open_connections == 3, "silent TLS connections counted from accept")
            silent.append(await asyncio.open_connection("127.0.0.1", port))
            assert await _read_until_closed(silent[0][0]) == b""
            await until_in_loop(lambda: server.stats.open_connections == 3, "the oldest silent connection gone")
            assert server.stats.connections_evicted == 1 and server.stats.connections_refused == 0
            assert server.stats.tls_failures == 0  # nobody got as far as a handshake
        finally:
            for _, w in silent:
                w.close()
            await server.stop()

    asyncio.run(scenario())


def test_a_tls_handshake_not_finished_in_time_is_a_counted_handshake_timeout(pki) -> None:
    """The handshake timeout covers the TLS handshake and the HTTP/2 preface after it: a client that sends
    half a ClientHello and stalls is closed and counted in ``handshake_timeouts`` (asyncio's own TLS
    timeout closed it without a count); garbage instead of a ClientHello is a counted ``tls_failures``."""
    import ssl

    from dlb.transport.limits import H2Limits

    tls: TlsFiles = pki["tls"]
    client = ssl.create_default_context(cafile=tls.ca)
    hello_in, hello_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    with pytest.raises(ssl.SSLWantReadError):
        client.wrap_bio(hello_in, hello_out, server_hostname="dlb").do_handshake()
    client_hello = hello_out.read()

    async def scenario() -> None:
        server = ExtProcServer("h2", _handle, limits=H2Limits(handshake_timeout_s=0.3), tls=load_identity(tls, "root-a"))
        port = await server.bind("127.0.0.1:0")
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(client_hello[: len(client_hello) // 2])
            assert await _read_until_closed(reader) == b""
            writer.close()
            assert server.stats.handshake_timeouts == 1 and server.stats.tls_failures == 0
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            await _read_until_closed(reader)  # a TLS alert, then the close
            writer.close()
            assert server.stats.tls_failures == 1
        finally:
            await server.stop()

    asyncio.run(scenario())
