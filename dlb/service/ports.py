"""Binding a grpc.aio server's port, plaintext or mutual TLS, with one error for every failure.

Why here: every gRPC service (root, leaf, control plane, benchmarks) binds the same way, and grpcio
reports a failed bind two ways (0 or RuntimeError) that callers should not each re-learn.
"""

from __future__ import annotations

from typing import Protocol

import grpc

from dlb.errors import BindError


class ServerIdentity(Protocol):
    """What :func:`add_port` needs of a TLS identity (:class:`dlb.config.tls.Identity` is one)."""

    def server_credentials(self) -> grpc.ServerCredentials: ...


def add_port(server: grpc.aio.Server, listen: str, tls: ServerIdentity | None) -> int:
    """Listen on ``listen`` (mutual TLS with ``tls``, else plaintext); the bound port, or :class:`BindError`."""
    try:
        port = server.add_insecure_port(listen) if tls is None else server.add_secure_port(listen, tls.server_credentials())
    except RuntimeError:  # grpcio >= 1.5x raises instead of returning 0
        port = 0
    if port == 0:
        raise BindError(listen, "gRPC could not bind it (in use?)")
    return port
