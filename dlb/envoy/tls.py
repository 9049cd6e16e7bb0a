"""Envoy's side of DLB's mutual TLS: the transport socket of a cluster that reaches a DLB gRPC service.

The Envoy of (role, cell) presents the same certificate as the DLB service of that role and cell
(``tls.cert`` with ``{identity}`` = ``root-<cell>``/``leaf-<cell>``, see :mod:`dlb.config.tls`), trusts
only the config's CA, and checks the server's identity (its ``spiffe://dlb/...`` URI SAN) — Envoy
does no hostname check by default, so without the SAN match any certificate of the CA would pass.
"""

from __future__ import annotations

from typing import Any

from dlb.config.model import TlsFiles

TLS_SOCKET = "envoy.transport_sockets.tls"
UPSTREAM_TLS_CONTEXT = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"


def upstream_tls(tls: TlsFiles, identity: str, server_spiffe: str) -> dict[str, Any]:
    """``transport_socket`` for a cluster to a DLB gRPC server whose certificate names ``server_spiffe``."""
    return {
        "name": TLS_SOCKET,
        "typed_config": {
            "@type": UPSTREAM_TLS_CONTEXT,
            "common_tls_context": {
                "alpn_protocols": ["h2"],  # gRPC; DLB's HTTP/2 transport offers only h2
                "tls_certificates": [{"certificate_chain": {"filename": tls.cert_for(identity)},
                                      "private_key": {"filename": tls.key_for(identity)}}],
                "validation_context": {
                    "trusted_ca": {"filename": tls.ca},
                    "match_typed_subject_alt_names": [{"san_type": "URI", "matcher": {"exact": server_spiffe}}],
                },
            },
        },
    }
