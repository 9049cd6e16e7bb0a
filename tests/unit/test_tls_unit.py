"""Mutual TLS on DLB's gRPC channels and per-node authorisation on the control plane (docs/security.md).

Here: the tests that run in-process (no sockets, no processes);
the others: ``tests/integration/test_tls.py``.
The rules and what the tests stand for: that file's docstring.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from envoy.config.core.v3 import base_pb2

from dlb.config import ConfigError, config_from_dict, load_config
from dlb.config.model import TlsFiles
from dlb.config.tls import load_identity, node_admission
from dlb.config.tls_live import component_identity
from dlb.control_plane.service import ControlPlane, dlb_node_key
from dlb.testbed.pki import dlb_pki

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Our CA with a certificate per identity (as ``{identity}.pem``), and another CA's for the same names."""
    d = tmp_path_factory.mktemp("pki")
    tls, foreign = dlb_pki(d, ("a", "b"))
    return {"dir": d, "tls": tls, "foreign": foreign}


def _doc(tls: dict[str, str] | None) -> dict:
    cells = [{"name": n, "leaf": {"address": f"127.0.0.1:{1000 + i}", "probe": f"127.0.0.1:{2000 + i}"},
              "root": {"address": f"127.0.0.1:{4000 + i}"}, "servers": [f"127.0.0.1:{3000 + i}"]} for i, n in enumerate("ab")]
    doc = {"version": 1, "cells": cells, "network": {"one_way_ms": {"a": {"b": 20}}},
           "endpoints": [{"name": "chat", "match": {"prefix": "/"}, "policy": {"mechanism": "discrete"}}]}
    if tls is not None:
        doc["tls"] = tls
    return doc


# --- the config section ----------------------------------------------------------------------------


def test_tls_section_resolves_paths_from_the_config_folder(pki, tmp_path: Path) -> None:
    d = pki["dir"] / "ours"
    (tmp_path / "certs").symlink_to(d)
    path = tmp_path / "dlb.yaml"
    path.write_text(yaml.safe_dump(_doc({"ca": "certs/dlb-test-ca.pem", "cert": "certs/{identity}.pem", "key": "certs/{identity}-key.pem"})))
    cfg = load_config(path)
    assert cfg.tls is not None and cfg.tls.ca == str(tmp_path / "certs" / "dlb-test-ca.pem")
    assert cfg.tls.cert_for("leaf-b") == str(tmp_path / "certs" / "leaf-b.pem")
    assert config_from_dict(_doc(None)).tls is None


def test_bad_tls_files_are_reported_with_field_and_file(pki, tmp_path: Path) -> None:
    d, theirs = pki["dir"] / "ours", pki["dir"] / "theirs"
    cases = {
        "missing file": ({"ca": str(tmp_path / "nope.pem"), "cert": str(d / "root-a.pem"), "key": str(d / "root-a-key.pem")},
                         "tls.ca", "nope.pem: cannot read"),
        "key as cert": ({"ca": str(d / "dlb-test-ca.pem"), "cert": str(d / "root-a-key.pem"), "key": str(d / "root-a-key.pem")},
                        "tls.cert", "root-a-key.pem: no PEM CERTIFICATE block"),
        "cert as key": ({"ca": str(d / "dlb-test-ca.pem"), "cert": str(d / "root-a.pem"), "key": str(d / "root-a.pem")},
                        "tls.key", "no PEM PRIVATE KEY block"),
        "other placeholder": ({"ca": str(d / "dlb-test-ca.pem"), "cert": str(d / "{cell}.pem"), "key": str(d / "{identity}-key.pem")},
                              "tls.cert", "the only placeholder is {identity}"),
        "missing key": ({"ca": str(d / "dlb-test-ca.pem"), "cert": str(d / "root-a.pem")}, "tls.key", "required"),
        # each file a fine PEM, but not together: the component would start and fail every handshake
        # (grpc.aio even said "could not bind (in use?)" for the mismatched key)
        "another cell's key": ({"ca": str(d / "dlb-test-ca.pem"), "cert": str(d / "root-a.pem"), "key": str(d / "root-b-key.pem")},
                               "tls.key", "root-b-key.pem: not the private key of tls.cert"),
        "another CA's cert": ({"ca": str(d / "dlb-test-ca.pem"), "cert": str(theirs / "root-a.pem"), "key": str(theirs / "root-a-key.pem")},
                              "tls.cert", "does not verify against tls.ca"),
    }
    for name, (tls, field, reason) in cases.items():
        with pytest.raises(ConfigError) as err:
            config_from_dict(_doc(tls))
        assert any(p.path == field and reason in p.reason for p in err.value.problems), (name, err.value.problems)


def test_an_identity_without_its_files_is_refused_at_start(pki) -> None:
    with pytest.raises(ConfigError) as err:
        load_identity(pki["tls"], "leaf-zz", "dlb.yaml")
    assert [p.path for p in err.value.problems] == ["tls.cert", "tls.key"]
    assert "leaf-zz.pem: cannot read" in str(err.value) and "dlb.yaml" in str(err.value)


def test_a_wrong_type_in_tls_is_one_problem_per_field() -> None:
    """``ca: 5`` was reported twice: 'must be a string, got 5' and 'must be a file path'."""
    with pytest.raises(ConfigError) as err:
        config_from_dict(_doc({"ca": 5, "cert": ["a"], "key": ""}))
    assert [(p.path, p.reason) for p in err.value.problems] == [
        ("tls.ca", "must be a string, got 5"), ("tls.cert", "must be a string, got a list"), ("tls.key", "must be a file path")]


def test_a_component_refuses_a_certificate_that_cannot_work_at_start(pki) -> None:
    """``{identity}`` paths are checked at start: another CA's certificate or another identity's key is
    a ConfigError naming the field and the files, not a server that starts and fails every handshake."""
    assert component_identity(pki["tls"], "root", "a", "dlb.yaml") is not None
    with pytest.raises(ConfigError) as err:
        component_identity(pki["foreign"], "root", "a", "dlb.yaml")
    assert [p.path for p in err.value.problems] == ["tls.cert"]
    assert "theirs/root-a.pem: does not verify against tls.ca" in str(err.value) and "dlb.yaml" in str(err.value)
    t = pki["tls"]
    mixed = TlsFiles(t.ca, t.cert, t.key.replace("{identity}", "leaf-b"))
    with pytest.raises(ConfigError) as err:
        component_identity(mixed, "root", "a", "dlb.yaml")
    assert [p.path for p in err.value.problems] == ["tls.key"] and "not the private key of tls.cert" in str(err.value)


# --- the control plane: authentication and per-node authorisation ----------------------------------


def _node(cluster: str, cell: str, node_id: str = "n1") -> base_pb2.Node:
    return base_pb2.Node(id=node_id, cluster=cluster, locality=base_pb2.Locality(zone=cell))


def test_admission_takes_the_identity_from_the_certificate_not_the_node() -> None:
    admit = node_admission(dlb_node_key)
    leaf_a = {"peer_uri": [b"spiffe://dlb/leaf/a"]}
    assert admit(_node("dlb-leaf", "a", "anything"), leaf_a) is None
    assert "dlb-leaf/b" in (admit(_node("dlb-leaf", "b"), leaf_a) or "")
    assert admit(_node("dlb-root", "a"), leaf_a) is not None
    assert admit(_node("dlb-root", "a"), {}) is not None  # plaintext peer: no identity
    assert admit(_node("dlb-root", "a"), {"peer_uri": [b"spiffe://dlb/control-plane"]}) is not None
    assert admit(_node("dlb-root", "a/x"), {"peer_uri": [b"spiffe://dlb/root/a/x"]}) is not None


# --- ext_proc (both transports) and the probe service ---------------------------------------------


def test_services_refuse_to_start_without_their_certificate(pki, tmp_path: Path) -> None:
    tls: TlsFiles = pki["tls"]
    cfg = config_from_dict(_doc({"ca": tls.ca, "cert": str(tmp_path / "{identity}.pem"), "key": str(tmp_path / "{identity}-key.pem")}))
    with pytest.raises(ConfigError, match=r"control-plane\.pem: cannot read"):
        ControlPlane(cfg, probe=False, flow_loop=False)
    assert os.path.basename(tls.ca) == "dlb-test-ca.pem"


def test_the_tls_session_returns_every_record_however_the_bytes_are_cut(pki) -> None:
    """The transport's TLS layer (sans-I/O, memory BIOs) stops reading once nothing is buffered, to skip
    the read that only raises SSLWantReadError (4 vs 6-8 µs a message): three records in one chunk must
    all come out, and a record cut in two only once its second half arrives."""
    import ssl

    from dlb.transport.tls import TlsServerSession

    tls: TlsFiles = pki["tls"]
    ident = load_identity(tls, "leaf-a")
    client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_ctx.load_verify_locations(ident.ca_path)
    client_ctx.load_cert_chain(ident.cert_path, ident.key_path)
    client_ctx.check_hostname = False
    c_in, c_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_ctx.wrap_bio(c_in, c_out)
    server = TlsServerSession(load_identity(tls, "root-a").server_ssl_context())
    for _ in range(10):  # the handshake, bytes passed by hand
        try:
            client.do_handshake()
        except ssl.SSLWantReadError:
            pass
        assert server.receive(c_out.read()) == b""
        c_in.write(server.data_to_send())
        if server.handshake_done and client.version():
            break
    assert server.handshake_done
    for part in (b"one", b"two", b"three"):
        client.write(part)
    assert server.receive(c_out.read()) == b"onetwothree"
    client.write(b"x" * 5000)
    record = c_out.read()
    assert server.receive(record[:100]) == b""
    assert server.receive(record[100:]) == b"x" * 5000
    server.send(b"reply")
    c_in.write(server.data_to_send())
    assert client.read(100) == b"reply"
