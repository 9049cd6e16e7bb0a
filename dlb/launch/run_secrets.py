"""What ``dlb up`` makes per run when the config brings none: a root token and (unless ``--insecure``)
a private CA with a certificate per component, handed to every child through the environment.

Why: left to the config, the defaults were a token derived from the config (anyone who read it could
claim a source cell) and plaintext gRPC between the control plane, roots and leaves. A one-host
``dlb up`` can make both itself: the files live in the run directory (keys 0600), the certificates
name 127.0.0.1/localhost and each component's identity (docs/security.md), and the config loader
takes them from ``DLB_ROOT_TOKEN_FILE`` / ``DLB_TLS_DIR`` only when the config names none.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from dlb.config.model import Config
from dlb.config.schema import ROOT_TOKEN_ENV, TLS_DIR_ENV


def generate_root_token(run_dir: Path) -> Path:
    """A fresh random root token in ``run_dir/root-token`` (mode 0600): one per run, never derived from the config."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = (run_dir / "root-token").resolve()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(secrets.token_urlsafe(32) + "\n")
    return path


def generate_pki(folder: Path, cfg: Config) -> Path | None:
    """A CA and a certificate per component of ``cfg`` in ``folder`` (keys 0600); None if the
    ``cryptography`` package is missing (then the run stays plaintext, said by the caller)."""
    from dlb.config.tls import identity_name, spiffe_id
    from dlb.errors import DlbError

    try:
        from dlb.launch.pki import Pki
    except (ImportError, DlbError):  # the module says which package is missing
        return None
    pki = Pki(folder.resolve(), "ca")
    ids = [("control-plane", "")] + [(role, c.name) for c in cfg.cells for role in ("root", "leaf")]
    for role, cell in ids:
        _, key = pki.issue(identity_name(role, cell), (spiffe_id(role, cell),))
        key.chmod(0o600)
    return pki.folder


def run_env(cfg: Config, run_dir: Path, insecure: bool) -> tuple[dict[str, str], list[str]]:
    """The environment every child gets for what ``cfg`` lacks, and a console line for each."""
    env: dict[str, str] = {}
    said: list[str] = []
    if cfg.root_token is None:
        env[ROOT_TOKEN_ENV] = str(generate_root_token(run_dir))
        said.append(f"root token generated in {env[ROOT_TOKEN_ENV]} (set root_token_file to use your own)")
    if cfg.tls is None and not insecure:
        folder = generate_pki(run_dir / "pki", cfg)
        if folder is None:
            said.append("warning: no mTLS (the cryptography package is missing); gRPC between components is plaintext")
        else:
            env[TLS_DIR_ENV] = str(folder)
            said.append(f"mTLS between the control plane, roots and leaves: CA and certificates in {folder} (--insecure: none)")
    elif cfg.tls is None:
        said.append("warning: --insecure: gRPC between the control plane, roots and leaves is plaintext (anyone who can "
                    "reach their ports can read the fleet's config or feed it state)")
    return env, said
