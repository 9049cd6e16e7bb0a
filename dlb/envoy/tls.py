"""Envoy's side of DLB's mutual TLS: the transport socket of a cluster that reaches a DLB gRPC service.

The Envoy of (role, cell) presents the same certificate as the DLB service of that role and cell
(``tls.cert`` with ``{identity}`` = ``root-<cell>``/``leaf-<cell>``, see :mod:`dlb.config.tls`), trusts
only the config's CA, and checks the server's identity (its ``spiffe://dlb/...`` URI SAN) — Envoy
does no hostname check by default, so without the SAN match any certificate of the CA would pass.

Envoy reads certificates named in a cluster once. With ``tls.envoy_sds`` (a pod's mounted Secret) the
cluster names SDS files instead (:func:`sds_files`, a ConfigMap mounted there), whose secrets name the
Secret's files with a ``watched_directory``: Envoy reloads them when the kubelet swaps the mount, and
keeps the pair it has (``sds.<name>.key_rotation_failed``) when the new one does not load.
"""

from __future__ import annotations

import os
from typing import Any

from dlb.config.model import TlsFiles

TLS_SOCKET = "envoy.transport_sockets.tls"
UPSTREAM_TLS_CONTEXT = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
SECRET_TYPE = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
#: SDS file name -> the secret it holds (one secret per file: Envoy's file SDS takes exactly one).
SDS_CERT, SDS_CA = "tls-certificate.yaml", "validation-context.yaml"
CERT_SECRET, CA_SECRET = "dlb-tls-certificate", "dlb-tls-ca"


def sds_files(tls: TlsFiles) -> dict[str, dict[str, Any]]:
    """The SDS files (name -> content) for ``tls.envoy_sds``: one Secret each, watching the Secret mount."""
    watched = {"path": os.path.dirname(tls.cert)}
    cert = {"name": CERT_SECRET, "tls_certificate": {"certificate_chain": {"filename": tls.cert},
                                                     "private_key": {"filename": tls.key}, "watched_directory": watched}}
    ca = {"name": CA_SECRET, "validation_context": {"trusted_ca": {"filename": tls.ca},
                                                    "watched_directory": {"path": os.path.dirname(tls.ca)}}}
    return {SDS_CERT: {"resources": [{"@type": SECRET_TYPE, **cert}]}, SDS_CA: {"resources": [{"@type": SECRET_TYPE, **ca}]}}


def _sds_ref(folder: str, file: str, name: str) -> dict[str, Any]:
    return {"name": name, "sds_config": {"path_config_source": {"path": os.path.join(folder, file), "watched_directory": {"path": folder}},
                                         "resource_api_version": "V3"}}


def upstream_tls(tls: TlsFiles, identity: str, server_spiffe: str) -> dict[str, Any]:
    """``transport_socket`` for a cluster to a DLB gRPC server whose certificate names ``server_spiffe``."""
    san = [{"san_type": "URI", "matcher": {"exact": server_spiffe}}]
    if tls.envoy_sds:
        common = {"alpn_protocols": ["h2"],
                  "tls_certificate_sds_secret_configs": [_sds_ref(tls.envoy_sds, SDS_CERT, CERT_SECRET)],
                  "combined_validation_context": {"default_validation_context": {"match_typed_subject_alt_names": san},
                                                  "validation_context_sds_secret_config": _sds_ref(tls.envoy_sds, SDS_CA, CA_SECRET)}}
        return {"name": TLS_SOCKET, "typed_config": {"@type": UPSTREAM_TLS_CONTEXT, "common_tls_context": common}}
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
                    "match_typed_subject_alt_names": san,
                },
            },
        },
    }
