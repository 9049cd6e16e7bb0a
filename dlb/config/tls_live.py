"""A component's certificate that follows its files, so a renewal takes effect without a restart.

cert-manager renews a ``kubernetes.io/tls`` Secret and the kubelet swaps the pod's mount (a new
``..data`` directory, then one atomic rename of the symlink), but a certificate read at start stays in
memory until the pod restarts. :class:`LiveIdentity` looks at its three files before each new TLS
handshake (three ``stat`` calls; the files are read again only when one changed) and hands the new pair
to gRPC (:func:`grpc.dynamic_ssl_server_credentials`' fetcher), to DLB's HTTP/2 transport (an
``ssl`` server-name callback that swaps the connection's context) and to clients, which make a new
channel for their next connection (:meth:`LiveIdentity.renewal`).

A pair that does not work — half written, a key that is not the certificate's, another CA's — is not
used: the component keeps serving with the pair it has, logs the problem once per state of the files,
and counts it (``<service>_tls_reload_failures``). Connections already open keep their session.
"""

from __future__ import annotations

import os
import ssl
import threading
from dataclasses import dataclass
from typing import Any

import grpc

from dlb.config.loader import ConfigError, Problem
from dlb.config.model import TlsFiles
from dlb.config.tls import SPIFFE_PREFIX, Identity, Renewal, identity_name, load_identity, load_identity_files, spiffe_id
from dlb.config.tls_check import tls_pair_problems
from dlb.log import get_logger

log = get_logger("dlb.tls")

#: What identifies a state of the three files: (device, inode, mtime, size) of each, symlinks followed.
Stamp = tuple[tuple[int, int, int, int], ...]


@dataclass
class ReloadCounts:
    """Process-wide: every live identity of a service counts here (one scrape per service)."""

    reloads: int = 0
    failures: int = 0

    def families(self, prefix: str) -> list[Any]:
        from prometheus_client.core import CounterMetricFamily

        return [CounterMetricFamily(f"{prefix}_tls_reloads", "Certificate renewals applied",
                                    value=self.reloads),
                CounterMetricFamily(f"{prefix}_tls_reload_failures",
                                    "Certificate renewals refused (old pair kept)",
                                    value=self.failures)]


COUNTS = ReloadCounts()


def _stamp(paths: tuple[str, ...]) -> Stamp | None:
    try:
        sts = [os.stat(p) for p in paths]
    except OSError:
        return None
    return tuple((s.st_dev, s.st_ino, s.st_mtime_ns, s.st_size) for s in sts)


class LiveIdentity:
    """:class:`Identity`'s credentials, following the files; thread-safe (gRPC calls the fetcher from
    its own threads, the HTTP/2 transport from the event loop)."""

    def __init__(self, first: Identity, counts: ReloadCounts = COUNTS) -> None:
        self._paths = (first.ca_path, first.cert_path, first.key_path)
        self._current = first
        self._stamp = _stamp(self._paths)
        self._refused: Stamp | None = None
        self._lock = threading.Lock()
        self._counts = counts
        self.generation = 0
        self._ctx: tuple[int, ssl.SSLContext] | None = None

    @property
    def current(self) -> Identity:
        self.refresh()
        return self._current

    def refresh(self) -> bool:
        """Take changed files into use if they hold a working pair; True when the pair changed."""
        with self._lock:
            stamp = _stamp(self._paths)
            if stamp is None or stamp in (self._stamp, self._refused):
                return False  # unchanged, already refused, or a file missing mid-swap: look again next time
            try:
                new = load_identity_files(*self._paths)
                problems = [reason for _, reason in tls_pair_problems(*self._paths)]
            except OSError as exc:
                problems = [str(exc)]
            if _stamp(self._paths) != stamp:
                return False  # written to while we read: the next handshake looks again
            if problems:
                self._refused = stamp
                self._counts.failures += 1
                log.warning("tls_reload_refused", cert=self._paths[1], problem=problems[0][:300],
                            keeping="the certificate in use")
                return False
            self._current, self._stamp, self._refused = new, stamp, None
            self.generation += 1
            self._counts.reloads += 1
        log.info("tls_reloaded", cert=self._paths[1], generation=self.generation)
        return True

    # --- the three consumers -------------------------------------------------------------------

    def server_credentials(self) -> grpc.ServerCredentials:
        """grpc.aio server side: the pair in use at each handshake; clients must present one from the CA."""
        handed = [self.generation]

        def fetch() -> grpc.ServerCertificateConfiguration | None:
            self.refresh()
            if handed[0] == self.generation:
                return None  # gRPC keeps the configuration it has
            handed[0] = self.generation
            return _grpc_config(self._current)

        return grpc.dynamic_ssl_server_credentials(_grpc_config(self._current), fetch, require_client_authentication=True)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """grpc.aio client side, with the pair in use now (a channel keeps what it was made with)."""
        return self.current.channel_credentials()

    def renewal(self) -> Renewal:
        """For one client that keeps a channel: credentials of the renewed pair once per renewal (it then
        makes a new channel for its next connection), else None."""
        handed = [self.generation]

        def renewed() -> grpc.ChannelCredentials | None:
            self.refresh()
            if handed[0] == self.generation:
                return None
            handed[0] = self.generation
            return self._current.channel_credentials()

        return renewed

    def server_ssl_context(self) -> ssl.SSLContext:
        """DLB's HTTP/2 transport: the listener's context, whose callback gives each new connection the
        context of the pair in use (OpenSSL calls it for every ClientHello, with or without SNI)."""
        ctx = self._current.server_ssl_context()
        ctx.sni_callback = self._pick_context
        return ctx

    def _pick_context(self, conn: ssl.SSLObject, _name: str | None, _ctx: ssl.SSLContext) -> None:
        self.refresh()
        if self.generation == 0:
            return
        if self._ctx is None or self._ctx[0] != self.generation:
            try:
                self._ctx = (self.generation, self._current.server_ssl_context())
            except (OSError, ssl.SSLError):
                return  # swapped again since the check: this connection gets the listener's pair
        conn.context = self._ctx[1]


def _grpc_config(ident: Identity) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration([(ident.key, ident.cert)], root_certificates=ident.ca)


def component_identity(tls: TlsFiles | None, role: str, cell: str = "", source: str = "<config>") -> LiveIdentity | None:
    """The identity of one component of a config, or None when the config has no ``tls`` section;
    it follows its files (:mod:`dlb.config.tls_live`), so a renewed certificate needs no restart.

    Unlike :func:`load_identity` (which also builds the attackers' credentials of the tests and the
    hostile bench), the certificate must work: its key and a chain to ``tls.ca``, or a ConfigError
    naming the field and the files."""
    if tls is None:
        return None
    ident = load_identity(tls, identity_name(role, cell), source)
    problems = tls_pair_problems(ident.ca_path, ident.cert_path, ident.key_path)
    if problems:
        raise ConfigError([Problem(source, f, reason) for f, reason in problems])
    wrong = identity_problem(ident.cert, spiffe_id(role, cell))
    if wrong:
        raise ConfigError([Problem(source, "tls.cert", f"{ident.cert_path}: {wrong}")])
    return LiveIdentity(ident)


def identity_problem(cert_pem: bytes, expected: str) -> str | None:
    """Why a certificate cannot serve as ``expected`` (its URI SANs lack it), or None.

    Why at start: peers judge a component by that SAN (Envoys check the control plane's; the control plane
    authorises nodes by theirs). A control plane started with a leaf's pair ran silently while every Envoy
    refused it with an opaque "remote connection failure" in its own log."""
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        uris = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        uris = []
    except ValueError as exc:
        return f"cannot be read: {exc}"
    if expected in uris:
        return None
    named = ", ".join(u for u in uris if u.startswith(SPIFFE_PREFIX)) or "no spiffe://dlb/ identity"
    return f"names {named}, not {expected}: each component presents its own identity (docs/security.md)"
