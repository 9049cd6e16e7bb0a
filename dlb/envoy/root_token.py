"""The secret a root Envoy shows a leaf Envoy so the leaf trusts its ``x-dlb-src-cell`` (issue 14 row 9).

A leaf's listener faces the network: anyone who reaches it could claim to come from another cell (and
get that cell's emulated WAN delay, or be counted as its demand by MNLB). Roots therefore add
``x-dlb-root-token`` with the deployment's secret; the leaf's WAN-delay filters match it, its routes
drop ``x-dlb-src-cell`` from a request without it, and it never reaches the servers or the access log.

The secret comes from ``root_token_file`` in the config. Without one it is derived from the cells'
names and addresses, so every renderer of one config (``dlb config bootstrap``, ``dlb up``, the control
plane) agrees without a setting: that stops a client that has not read the config, nothing more —
set ``root_token_file`` wherever the config is not itself secret. Pure: no I/O.
"""

from __future__ import annotations

import hashlib

from dlb.config.model import Config

_DERIVED_PREFIX = b"dlb-root-token/v1\n"


def root_token(cfg: Config) -> str:
    """The token roots of ``cfg`` send and its leaves require (``cfg.root_token`` or the derived one)."""
    if cfg.root_token:
        return cfg.root_token
    h = hashlib.sha256(_DERIVED_PREFIX)
    for c in cfg.cells:
        h.update(f"{c.name}\t{c.root.address}\t{c.leaf.address}\t{c.leaf.probe}\n".encode())
    return "derived-" + h.hexdigest()


def forgeable_token_warning(cfg: Config) -> str | None:
    """Why the root token is weak here, or None: no ``root_token_file`` while a leaf Envoy binds beyond loopback.

    Why a warning and not a problem: a derived token still stops a client that has not read the config,
    and a one-host or closed-network deployment needs no secret; but where clients can reach a leaf, anyone
    who has read the config (an example in a public repository) can claim a source cell. Every tool that
    starts or checks a deployment says so, in the same words.
    """
    if cfg.root_token:
        return None
    exposed = [c.name for c in cfg.cells if not c.leaf.bind.loopback]
    if not exposed:
        return None
    return (f"{cfg.source}: root_token_file is not set and the leaf Envoy of {', '.join(exposed)} listens beyond "
            "loopback: its root token is derived from the config, so anyone who has read the config can set "
            "x-dlb-src-cell there; set root_token_file (docs/security.md)")
