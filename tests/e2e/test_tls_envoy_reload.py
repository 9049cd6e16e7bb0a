"""An Envoy configured with ``--tls-secret-dir`` presents a renewed certificate without a restart.

A real Envoy from the bootstrap ``dlb config xds-bootstrap --tls-secret-dir`` renders (its xDS cluster
takes its certificate through SDS files watching a Kubernetes-style Secret mount, dlb.testbed.pki.SecretDir)
dials a stand-in control plane on 127.0.0.1 that completes the mutual TLS handshake, notes the serial of
the client certificate and hangs up, so Envoy dials again and again. After the ``..data`` swap its next
connections present the renewed certificate; a pair that does not load is refused and counted by Envoy,
which keeps the pair it has. Against a real control plane, the xDS connection open at the renewal stays up.
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest
import yaml
from bounded_wait import until_in_loop
from cryptography import x509

from dlb.config.model import HostPort, TlsFiles
from dlb.config.schema import secret_dir_sds, secret_dir_tls
from dlb.config.tls import spiffe_id
from dlb.envoy.ads_bootstrap import ads_bootstrap
from dlb.envoy.tls import CERT_SECRET, sds_files
from dlb.procutil import free_port
from dlb.testbed.pki import Pki, SecretDir

pytestmark = [pytest.mark.envoy, pytest.mark.timeout(120)]
#: The xDS cluster's TLS context rebuilt from changed SDS secrets (a file reload counts here, not in sds.*.update_success).
UPDATES = "cluster.dlb_xds.client_ssl_socket_factory.ssl_context_update_by_sds"


def _serial(pem: bytes) -> int:
    return x509.load_pem_x509_certificate(pem).serial_number


def _mounted(tmp: Path, ca: bytes, pair: tuple[Path, Path]) -> tuple[SecretDir, TlsFiles]:
    """A pod's Secret mount holding ``pair`` and, beside it, the SDS files naming it (``--tls-secret-dir``)."""
    secret = SecretDir(tmp / "dlb-tls")
    secret.publish(ca, pair[0].read_bytes(), pair[1].read_bytes())
    tls = TlsFiles(**secret_dir_tls(str(secret.folder)), envoy_sds=secret_dir_sds(str(secret.folder)))
    Path(tls.envoy_sds).mkdir()
    for name, content in sds_files(tls).items():
        (Path(tls.envoy_sds) / name).write_text(yaml.safe_dump(content))
    return secret, tls


def test_envoy_presents_a_renewed_certificate_on_its_next_connection(tmp_path: Path, envoy) -> None:
    asyncio.run(_scenario(tmp_path, envoy))


async def _scenario(tmp: Path, start_envoy) -> None:
    pki = Pki(tmp / "pki")
    first, renewed, other = (pki.issue(n, (spiffe_id("leaf", "a"),)) for n in ("first", "renewed", "other"))
    server_cert = pki.issue("control-plane", (spiffe_id("control-plane"),))
    ca = pki.ca_path.read_bytes()
    secret, tls = _mounted(tmp, ca, first)

    # The stand-in control plane: every connection's client certificate, then the connection is closed.
    seen: list[int] = []
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(*server_cert)
    ctx.load_verify_locations(cadata=ca.decode())
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.set_alpn_protocols(["h2"])

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        seen.append(x509.load_der_x509_certificate(der).serial_number)
        writer.close()

    xds_port, admin_port = free_port(), free_port()
    server = await asyncio.start_server(accept, "127.0.0.1", xds_port, ssl=ctx)
    boot = ads_bootstrap("leaf", "a", HostPort("127.0.0.1", xds_port), admin_port, node_id="leaf-a-reload", tls=tls)
    boot["dynamic_resources"]["cds_config"] = {**boot["dynamic_resources"]["cds_config"], "initial_fetch_timeout": "0.2s"}
    boot["dynamic_resources"]["lds_config"] = {**boot["dynamic_resources"]["lds_config"], "initial_fetch_timeout": "0.2s"}
    try:
        async with start_envoy(boot, name="leaf") as proc:
            await until_in_loop(lambda: _serial(first[0].read_bytes()) in seen, "a connection with the first certificate", timeout=30)

            secret.publish(ca, renewed[0].read_bytes(), renewed[1].read_bytes())
            await until_in_loop(lambda: seen[-1] == _serial(renewed[0].read_bytes()), "a connection with the renewed certificate",
                                timeout=30)

            # Another certificate's key: Envoy refuses the pair, counts it, and goes on with the renewed one.
            secret.publish(ca, other[0].read_bytes(), renewed[1].read_bytes())
            failed = f"sds.{CERT_SECRET}.key_rotation_failed"
            await until_in_loop(lambda: int(proc.stats("sds").get(failed, "0")) >= 1, failed, timeout=30)
            count = len(seen)
            await until_in_loop(lambda: len(seen) >= count + 2, "two more connections", timeout=30)
            assert set(seen[count:]) == {_serial(renewed[0].read_bytes())}
    finally:
        server.close()
        await server.wait_closed()


def test_envoy_keeps_its_xds_connection_across_a_renewal(tmp_path: Path, make_config, control_plane, envoy) -> None:
    """A real control plane (mTLS, per-node authorisation) and a leaf Envoy whose Secret is renewed: the
    xDS connection opened before the renewal stays up (no new upstream connection, still connected)."""
    from service_fixtures import CellPorts

    from dlb.config import load_config

    async def scenario() -> None:
        pki = Pki(tmp_path / "pki")
        pki.issue("control-plane", (spiffe_id("control-plane"),))
        first, renewed = (pki.issue(n, (spiffe_id("leaf", "a"),)) for n in ("leaf-a", "renewed"))
        folder = tmp_path / "pki"
        cfg = load_config(make_config({"a": CellPorts()}, [{"name": "gen", "match": {"prefix": "/"}}],
                                      tls={"ca": str(pki.ca_path), "cert": str(folder / "{identity}.pem"),
                                           "key": str(folder / "{identity}-key.pem")}))
        ca = pki.ca_path.read_bytes()
        secret, files = _mounted(tmp_path, ca, first)
        async with control_plane(cfg) as running:
            boot = ads_bootstrap("leaf", "a", HostPort("127.0.0.1", running.xds_port), free_port(), node_id="leaf-a-keep", tls=files)
            async with envoy(boot, name="leaf") as proc:
                def stat(name: str) -> int:
                    return int(proc.stats(name).get(name, "0"))

                await until_in_loop(lambda: stat("control_plane.connected_state") == 1, "the xDS stream", timeout=30)
                opened = stat("cluster.dlb_xds.upstream_cx_total")
                updates = stat(UPDATES)
                secret.publish(ca, renewed[0].read_bytes(), renewed[1].read_bytes())
                await until_in_loop(lambda: stat(UPDATES) > updates, "Envoy to load the renewed pair", timeout=30)
                await asyncio.sleep(1.0)  # a dropped stream would reconnect within the 1-s back-off
                assert stat("control_plane.connected_state") == 1
                assert stat("cluster.dlb_xds.upstream_cx_total") == opened
                assert running.cp.server.status.streams_denied == 0

    asyncio.run(scenario())
