"""The ``tls`` section's checks: PEM files readable and of the right kind, and a certificate and key
that complete a mutual TLS handshake against the CA (else a component starts and fails every handshake)."""

from __future__ import annotations

import os
from typing import Any

from dlb.config.checker import Checker, config_dir
from dlb.config.model import TLS_IDENTITY_PLACEHOLDER, Config, TlsFiles

#: What each ``tls`` file must hold (a PEM block of this kind), and why a person would set it.
_TLS_PEM = {"ca": ("CERTIFICATE", "the CA certificate every DLB component's certificate chains to"),
            "cert": ("CERTIFICATE", "this component's certificate (chain)"),
            "key": ("PRIVATE KEY", "this component's private key")}


def check_tls(ck: Checker, raw: Any, source: str) -> TlsFiles | None:
    """``tls: {ca, cert, key}``: PEM paths, relative ones from the config file's folder.

    ``cert`` and ``key`` may hold ``{identity}`` (one config, a certificate per component); such a
    path is checked when the component starts (``dlb.config.tls.load_identity``), a plain one here.
    """
    problems_before = len(ck.problems)
    m = ck.mapping(raw, "tls", tuple(_TLS_PEM), required=tuple(_TLS_PEM))
    base = config_dir(source)
    paths: dict[str, str] = {}
    for key, (kind, _) in _TLS_PEM.items():
        v = ck.string(m, key, "tls", None)
        if not v:
            if isinstance(m.get(key), str):  # a wrong type was reported by ck.string already
                ck.err(f"tls.{key}", "must be a file path")
            continue
        path = os.path.join(base, os.path.expanduser(v))
        rest = v.replace(TLS_IDENTITY_PLACEHOLDER, "")
        if "{" in rest or "}" in rest:
            ck.err(f"tls.{key}", f"{v!r}: the only placeholder is {TLS_IDENTITY_PLACEHOLDER}")
            continue
        if key == "ca" and TLS_IDENTITY_PLACEHOLDER in v:
            ck.err("tls.ca", f"{v!r}: one CA for every component (no {TLS_IDENTITY_PLACEHOLDER})")
            continue
        if TLS_IDENTITY_PLACEHOLDER not in v:
            reason = pem_problem(path, kind)
            if reason:
                ck.err(f"tls.{key}", reason)
        paths[key] = path
    if len(paths) < len(_TLS_PEM):
        return None
    if (TLS_IDENTITY_PLACEHOLDER in paths["cert"]) != (TLS_IDENTITY_PLACEHOLDER in paths["key"]):
        ck.err("tls.key", f"tls.cert and tls.key must both hold {TLS_IDENTITY_PLACEHOLDER} or neither")
    elif TLS_IDENTITY_PLACEHOLDER not in paths["cert"] and len(ck.problems) == problems_before:
        for field_path, reason in tls_pair_problems(paths["ca"], paths["cert"], paths["key"]):
            ck.err(field_path, reason)
    return TlsFiles(ca=paths["ca"], cert=paths["cert"], key=paths["key"])


def tls_pair_problems(ca: str, cert: str, key: str) -> list[tuple[str, str]]:
    """``(field, reason)`` for a certificate and key that are each a readable PEM file but do not work
    together: the key is not the certificate's, or the certificate does not verify against ``ca``
    (another CA's, expired, wrong key usage). Without this check such a component starts and then
    fails every handshake (or, on grpc.aio, reports a port it "could not bind").

    Checked the way a peer would: an in-memory mutual TLS handshake of the certificate with itself,
    both sides trusting only ``ca`` (stdlib ``ssl``, no network, no hostname check).
    """
    import ssl  # only configs with a tls section pay for it

    def ctx(side: int) -> ssl.SSLContext:
        c = ssl.SSLContext(side)
        c.load_cert_chain(cert, key)
        c.load_verify_locations(ca)
        c.check_hostname = False
        c.verify_mode = ssl.CERT_REQUIRED
        return c

    try:
        server, client = ctx(ssl.PROTOCOL_TLS_SERVER), ctx(ssl.PROTOCOL_TLS_CLIENT)
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            return [("tls.key", f"{key}: not the private key of tls.cert {cert}")]
        return [("tls.cert", f"{cert} with tls.key {key} and tls.ca {ca}: cannot be loaded: {exc.reason or exc}")]
    bios = [ssl.MemoryBIO() for _ in range(4)]
    s = server.wrap_bio(bios[0], bios[1], server_side=True)
    c = client.wrap_bio(bios[2], bios[3])
    done = [False, False]
    try:
        for _ in range(16):
            for i, side in enumerate((c, s)):
                if not done[i]:
                    try:
                        side.do_handshake()
                        done[i] = True
                    except ssl.SSLWantReadError:
                        pass
            bios[0].write(bios[3].read())
            bios[2].write(bios[1].read())
            if all(done):
                s.write(b"x")  # TLS 1.3: the server learns the client certificate's verdict on the first record
                bios[2].write(bios[1].read())
                c.write(b"x")
                bios[0].write(bios[3].read())
                s.read(1)
                return []
    except ssl.SSLCertVerificationError as exc:
        return [("tls.cert", f"{cert}: does not verify against tls.ca {ca}: {exc.verify_message}")]
    except ssl.SSLError as exc:
        return [("tls.cert", f"{cert}: a mutual TLS handshake with it and tls.ca {ca} fails: {exc.reason or exc}")]
    return [("tls.cert", f"{cert}: a mutual TLS handshake with it and tls.ca {ca} does not complete")]


def pem_problem(path: str, kind: str) -> str | None:
    """Why ``path`` is not a readable PEM file holding a ``kind`` block, or None if it is."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(1 << 20)
    except OSError as exc:
        return f"{path}: cannot read: {exc.strerror or exc}"
    if f"-----BEGIN {kind}-----".encode() not in head and not (kind == "PRIVATE KEY" and b"PRIVATE KEY-----" in head):
        return f"{path}: no PEM {kind} block in it"
    return None


def plaintext_warning(cfg: Config) -> str | None:
    """Where DLB's gRPC listens beyond loopback without ``tls``, or None.

    Why a warning: plaintext is fine on one host or a closed network, but anyone who reaches these ports can
    read every cell's configuration (by claiming its node) or answer as a leaf; say it where it is decided."""
    if cfg.tls is not None:
        return None
    ports = [("services.control_plane.xds", cfg.services.control_plane.xds)]
    for i, c in enumerate(cfg.cells):
        if c.runs_dlb_leaf:
            ports.append((f"cells[{i}].leaf.probe", c.leaf.probe))
    exposed = [f for f, hp in ports if not hp.loopback]
    if not exposed:
        return None
    return (f"{cfg.source}: no tls section, and {', '.join(exposed[:4])}{' ...' if len(exposed) > 4 else ''} listen(s) beyond "
            "loopback in plaintext: anyone who reaches them can read the fleet's config or answer as a leaf; set tls "
            "(docs/security.md)")
