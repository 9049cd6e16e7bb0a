"""Mutual TLS on DLB's own gRPC channels, and who a peer is (docs/security.md).

Each DLB component (the control plane, a cell's root, a cell's leaf — service and Envoy alike) has
one certificate signed by the deployment's CA, whose URI SAN names it:
``spiffe://dlb/control-plane``, ``spiffe://dlb/root/<cell>``, ``spiffe://dlb/leaf/<cell>``. Why a
URI SAN rather than a DNS name: the identity is a role and a cell, not a host (a root and a leaf of
different cells may share a host), and SPIFFE's form is what Envoy and gRPC already surface
(``peer_spiffe_id``); servers may add DNS/IP SANs for the address clients dial, which gRPC checks.

Every server that has TLS on requires a client certificate from the CA (authentication); the
control plane also authorises: a node may only read its own (role, cell) snapshot — the identity in
its certificate, not the node id it claims, decides (:func:`node_admission`).
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc
from envoy.config.core.v3 import base_pb2

from dlb.config.loader import ConfigError, Problem, pem_problem
from dlb.config.model import TlsFiles

SPIFFE_PREFIX = "spiffe://dlb/"
#: One client's question "has my certificate been renewed since I last asked?": new channel credentials, or None.
Renewal = Callable[[], "grpc.ChannelCredentials | None"]
CONTROL_PLANE = "control-plane"
ROLES = ("root", "leaf")
#: xDS node.cluster of each role: the tier half of the control plane's snapshot key ``<cluster>/<cell>``.
NODE_CLUSTER = {"root": "dlb-root", "leaf": "dlb-leaf"}


def identity_name(role: str, cell: str = "") -> str:
    """What ``{identity}`` in ``tls.cert``/``tls.key`` becomes: ``control-plane``, ``root-<cell>``, ``leaf-<cell>``."""
    if role == CONTROL_PLANE:
        return CONTROL_PLANE
    if role not in ROLES or not cell:
        raise ValueError(f"identity of role {role!r} cell {cell!r}: role is control-plane, root or leaf (with a cell)")
    return f"{role}-{cell}"


def spiffe_id(role: str, cell: str = "") -> str:
    """The URI SAN a component's certificate carries."""
    identity_name(role, cell)  # validates
    return SPIFFE_PREFIX + (CONTROL_PLANE if role == CONTROL_PLANE else f"{role}/{cell}")


@dataclass(frozen=True)
class Identity:
    """One component's PEM material, read once at start (gRPC takes bytes, Envoy and ssl take the paths)."""

    ca_path: str
    cert_path: str
    key_path: str
    ca: bytes
    cert: bytes
    key: bytes

    def server_credentials(self) -> grpc.ServerCredentials:
        """grpc.aio server side: our certificate; clients must present one from the CA."""
        return grpc.ssl_server_credentials([(self.key, self.cert)], root_certificates=self.ca, require_client_auth=True)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """grpc.aio client side: trust only the CA, present our certificate."""
        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert)

    def renewal(self) -> Renewal:
        """Read once: never renewed."""
        return lambda: None

    def server_ssl_context(self) -> ssl.SSLContext:
        """The same policy for DLB's own HTTP/2 transport (asyncio): client certificate required, ALPN h2."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert_path, self.key_path)
        ctx.load_verify_locations(cadata=self.ca.decode("ascii", "replace"))
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.set_alpn_protocols(["h2"])
        return ctx


def load_identity(tls: TlsFiles, identity: str, source: str = "<config>") -> Identity:
    """Read the CA and ``identity``'s certificate and key; a missing or wrong file is a ConfigError
    naming the field and the file (``{identity}`` paths are first checked here, at the component's start)."""
    paths = {"ca": tls.ca, "cert": tls.cert_for(identity), "key": tls.key_for(identity)}
    kinds = {"ca": "CERTIFICATE", "cert": "CERTIFICATE", "key": "PRIVATE KEY"}
    problems = [Problem(source, f"tls.{k}", reason) for k, p in paths.items() if (reason := pem_problem(p, kinds[k]))]
    if problems:
        raise ConfigError(problems)
    return load_identity_files(paths["ca"], paths["cert"], paths["key"])


def load_identity_files(ca: str, cert: str, key: str) -> Identity:
    """The three files as they are now (OSError if one is gone)."""
    data = []
    for p in (ca, cert, key):
        with open(p, "rb") as fh:
            data.append(fh.read())
    return Identity(ca, cert, key, *data)


class TlsIdentity(Protocol):
    """What a service needs of its identity: :class:`Identity` (read once) or
    :class:`dlb.config.tls_live.LiveIdentity` (follows renewals)."""

    def server_credentials(self) -> grpc.ServerCredentials: ...

    def channel_credentials(self) -> grpc.ChannelCredentials: ...

    def server_ssl_context(self) -> ssl.SSLContext: ...

    def renewal(self) -> Renewal: ...


# --- who the peer is ---------------------------------------------------------------------------

AuthContext = Mapping[str, Sequence[bytes]]


def peer_ids(auth: AuthContext) -> tuple[str, ...]:
    """The DLB identities (``spiffe://dlb/...`` URI SANs) a gRPC peer's verified certificate carries.

    gRPC lists every SAN of the certificate it verified under ``x509_subject_alternative_name`` and
    URI SANs under ``peer_uri`` (older builds: only the former); a plaintext peer has neither.
    """
    out: list[str] = []
    for key in ("peer_uri", "x509_subject_alternative_name", "peer_spiffe_id"):
        for v in auth.get(key, ()):
            s = v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
            if s.startswith(SPIFFE_PREFIX) and s not in out:
                out.append(s)
    return tuple(out)


def node_key_of(spiffe: str) -> str | None:
    """The control plane's snapshot key (``dlb-root/<cell>``, ``dlb-leaf/<cell>``) a certificate's
    identity may read; None for the control plane's own identity or anything else."""
    rest = spiffe.removeprefix(SPIFFE_PREFIX)
    role, _, cell = rest.partition("/")
    if role not in ROLES or not cell or "/" in cell:
        return None
    return f"{NODE_CLUSTER[role]}/{cell}"


def node_admission(node_key: Callable[[base_pb2.Node], str]) -> Callable[[base_pb2.Node, AuthContext], str | None]:
    """For :class:`dlb.xds.XdsServer`: refuse a stream (returns why) unless the node's snapshot key
    — the (role, cell) it claims — is one its client certificate names."""

    def admit(node: base_pb2.Node, auth: AuthContext) -> str | None:
        ids = peer_ids(auth)
        allowed = {k for k in map(node_key_of, ids) if k is not None}
        key = node_key(node)
        if key.partition("#")[0] in allowed:  # a leaf replica (``dlb-leaf/<cell>#k``) is its cell's leaf
            return None
        shown = ", ".join(ids[:4]) or "no DLB identity (spiffe://dlb/... URI SAN)"
        return f"node claims {key[:120]!r} but its certificate names {shown[:400]}"

    return admit
