"""A renewed certificate takes effect without a restart (dlb/config/tls_live.py).

The identity's files are a Kubernetes-style Secret mount (``..data`` symlink swap, dlb.testbed.pki.SecretDir).
Each server is the real one on 127.0.0.1 (grpc.aio and DLB's HTTP/2 transport): after a renewal a new
connection presents the new certificate (its serial, read from a real TLS handshake), a stream opened
before keeps working, and a pair that does not work (a key that is not the certificate's) is refused:
the old certificate stays in use and the refusal is counted once.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from pathlib import Path

import grpc
import pytest
from bounded_wait import until_in_loop
from cryptography import x509
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from dlb.config import tls_live
from dlb.config.tls import load_identity_files
from dlb.config.tls_live import component_identity
from dlb.ext_proc.protocol import ExtProcServer
from dlb.probe.client import ProbeClient, ProbeTiming
from dlb.probe.target import ProbeTarget
from dlb.proto import probe_pb2, probe_pb2_grpc
from dlb.service.ports import add_port
from dlb.testbed.pki import Pki, SecretDir

pytestmark = pytest.mark.timeout(60)

PROCESS = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"


def _serial(cert: Path | bytes) -> int:
    return x509.load_pem_x509_certificate(cert if isinstance(cert, bytes) else cert.read_bytes()).serial_number


def _peer_serial(port: int, ca: Path, client: tuple[Path, Path]) -> int:
    """The serial of the certificate the server presents to a new connection (a full mutual TLS handshake)."""
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.load_cert_chain(*client)
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, ctx.wrap_socket(raw, server_hostname="localhost") as tls:
        return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True)).serial_number


def _handle(message: bytes) -> tuple[bytes, bool]:
    ep.ProcessingRequest.FromString(message)
    return ep.ProcessingResponse(request_headers=ep.HeadersResponse()).SerializeToString(), False


@pytest.mark.parametrize("transport", ["h2", "grpc"])
def test_a_renewed_certificate_is_presented_to_new_connections_without_a_restart(tmp_path: Path, transport: str) -> None:
    pki = Pki(tmp_path / "pki")
    first, renewed, other = (pki.issue(n, ("spiffe://dlb/root/a",)) for n in ("first", "renewed", "other"))
    client = pki.issue("client", ("spiffe://dlb/root/b",))
    ca = pki.ca_path.read_bytes()
    secret = SecretDir(tmp_path / "dlb-tls")
    secret.publish(ca, first[0].read_bytes(), first[1].read_bytes())

    async def scenario() -> None:
        tls = component_identity(secret.tls, "root", "a")
        assert tls is not None
        server = ExtProcServer(transport, _handle, tls=tls)
        port = await server.bind("127.0.0.1:0")
        creds = grpc.ssl_channel_credentials(ca, client[1].read_bytes(), client[0].read_bytes())
        channel = grpc.aio.secure_channel(f"127.0.0.1:{port}", creds, options=[("grpc.ssl_target_name_override", "localhost")])
        sent: asyncio.Queue[ep.ProcessingRequest | None] = asyncio.Queue()

        async def requests():
            while (msg := await sent.get()) is not None:
                yield msg

        try:
            call = channel.stream_stream(PROCESS, request_serializer=ep.ProcessingRequest.SerializeToString,
                                         response_deserializer=ep.ProcessingResponse.FromString)(requests(), timeout=30)
            await sent.put(ep.ProcessingRequest(request_headers=ep.HttpHeaders()))
            assert (await call.read()).WhichOneof("response") == "request_headers"
            assert await asyncio.to_thread(_peer_serial, port, pki.ca_path, client) == _serial(first[0])

            secret.publish(ca, renewed[0].read_bytes(), renewed[1].read_bytes())
            assert await asyncio.to_thread(_peer_serial, port, pki.ca_path, client) == _serial(renewed[0])
            # The stream opened before the renewal goes on, on its connection.
            await sent.put(ep.ProcessingRequest(request_headers=ep.HttpHeaders()))
            assert (await call.read()).WhichOneof("response") == "request_headers"

            # A pair that does not work (another certificate's key): refused, the renewed pair stays.
            failures = tls_live.COUNTS.failures
            secret.publish(ca, other[0].read_bytes(), renewed[1].read_bytes())
            for _ in range(3):
                assert await asyncio.to_thread(_peer_serial, port, pki.ca_path, client) == _serial(renewed[0])
            assert tls_live.COUNTS.failures == failures + 1  # once per state of the files, not per handshake
            # ... until a working pair arrives.
            secret.publish(ca, other[0].read_bytes(), other[1].read_bytes())
            assert await asyncio.to_thread(_peer_serial, port, pki.ca_path, client) == _serial(other[0])
            await sent.put(None)
        finally:
            await channel.close()
            await server.stop(0)

    asyncio.run(scenario())


class _Probe(probe_pb2_grpc.ProbeServicer):
    """A leaf's probe service that notes the serial of each caller's client certificate."""

    def __init__(self) -> None:
        self.callers: list[int] = []

    async def Probe(self, request, context):
        self.callers.append(_serial(context.auth_context()["x509_pem_cert"][0]))
        return probe_pb2.ProbeResponse(cell="a", rif=1.0, replicas=1)


def test_a_renewed_client_certificate_is_presented_by_the_probes_next_connection(tmp_path: Path) -> None:
    """A root's probe channel to a leaf keeps the pair it was made with; after a renewal the probe client
    makes a new channel, so the leaf sees the renewed client certificate without a restart."""
    pki = Pki(tmp_path / "pki")
    first, renewed = (pki.issue(n, ("spiffe://dlb/root/b",)) for n in ("first", "renewed"))
    leaf = pki.issue("leaf", ("spiffe://dlb/leaf/a",))
    ca = pki.ca_path.read_bytes()
    secret = SecretDir(tmp_path / "dlb-tls")
    secret.publish(ca, first[0].read_bytes(), first[1].read_bytes())

    async def scenario() -> None:
        server, probe = grpc.aio.server(), _Probe()
        probe_pb2_grpc.add_ProbeServicer_to_server(probe, server)
        port = add_port(server, "127.0.0.1:0", load_identity_files(str(pki.ca_path), str(leaf[0]), str(leaf[1])))
        await server.start()
        tls = component_identity(secret.tls, "root", "b")
        assert tls is not None
        client = ProbeClient([ProbeTarget(0, "a", f"127.0.0.1:{port}")], lambda _t, _r, _n: None,
                             ProbeTiming(period_s=0.02, timeout_s=5.0, backoff_max_s=0.1),
                             credentials=tls.channel_credentials(), renewal=tls.renewal)
        client.start()
        try:
            await until_in_loop(lambda: len(probe.callers) >= 2, "two probes with the first certificate")
            assert set(probe.callers) == {_serial(first[0])}
            secret.publish(ca, renewed[0].read_bytes(), renewed[1].read_bytes())
            await until_in_loop(lambda: probe.callers[-1] == _serial(renewed[0]), "a probe with the renewed certificate")
        finally:
            await client.stop()
            await server.stop(0)

    asyncio.run(scenario())


@pytest.mark.parametrize("transport", ["h2", "grpc"])
def test_the_xds_client_reconnects_with_a_renewed_certificate(tmp_path: Path, transport: str) -> None:
    """The xDS stream opened before a renewal goes on (it gets the next update); the reconnect after the
    control plane restarts presents the renewed client certificate (a channel keeps its pair otherwise)."""
    from google.protobuf import struct_pb2

    from dlb.xds import Snapshot, SnapshotCache, XdsServer
    from dlb.xds.client import Backoff, XdsClient
    from dlb.xds.testing import node

    policy = "type.googleapis.com/google.protobuf.Struct"
    pki = Pki(tmp_path / "pki")
    first, renewed = (pki.issue(n, ("spiffe://dlb/root/a",)) for n in ("first", "renewed"))
    cp = load_identity_files(str(pki.ca_path), *map(str, pki.issue("cp", ("spiffe://dlb/control-plane",))))
    secret = SecretDir(tmp_path / "dlb-tls")
    secret.publish(pki.ca_path.read_bytes(), first[0].read_bytes(), first[1].read_bytes())
    callers: list[int] = []

    def admit(_node, auth) -> None:
        callers.append(_serial(auth["x509_pem_cert"][0]))

    def snapshot(gain: float) -> Snapshot:
        s = struct_pb2.Struct()
        s.update({"gain": gain})
        return Snapshot.from_types({policy: [("p", s)]})

    async def scenario() -> None:
        cache = SnapshotCache()
        tls_args = {"credentials": cp.server_credentials()} if transport == "grpc" else {"ssl_context": cp.server_ssl_context()}
        server = XdsServer(cache, admission=admit, transport=transport, **tls_args)
        port = await server.start()
        tls = component_identity(secret.tls, "root", "a")
        assert tls is not None
        client = XdsClient(f"127.0.0.1:{port}", node("root-1", "a"), backoff=Backoff(initial=0.05, maximum=0.2),
                           channel_options=[("grpc.ssl_target_name_override", "localhost")],
                           credentials=tls.channel_credentials(), renewed=tls.renewal())
        sub = client.subscribe(policy, struct_pb2.Struct, lambda resources: None)
        server2 = None
        async with client:
            v1 = cache.set_snapshot("root-1", snapshot(1.0))
            await until_in_loop(lambda: sub.version == v1, "v1 over the first stream")
            secret.publish(pki.ca_path.read_bytes(), renewed[0].read_bytes(), renewed[1].read_bytes())
            v2 = cache.set_snapshot("root-1", snapshot(2.0))
            await until_in_loop(lambda: sub.version == v2, "v2 over the stream opened before the renewal")
            assert set(callers) == {_serial(first[0])}
            await server.stop(None)
            server2 = XdsServer(cache, admission=admit, transport=transport, **tls_args)
            await server2.start(f"127.0.0.1:{port}")
            await until_in_loop(lambda: len(callers) >= 2 and client.connected.is_set(), "a reconnect")
            assert callers[-1] == _serial(renewed[0])
        if server2 is not None:
            await server2.stop(None)

    asyncio.run(asyncio.wait_for(scenario(), 50))
