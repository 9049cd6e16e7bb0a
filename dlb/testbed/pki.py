"""The testbeds' certificates: a deployment's (control plane, a root and a leaf per cell) and the same
names from another CA, an attacker's (:class:`dlb.launch.pki.Pki` makes both)."""

from __future__ import annotations

from pathlib import Path

from dlb.config.model import TlsFiles
from dlb.config.tls import identity_name, spiffe_id
from dlb.launch.pki import Pki

__all__ = ["Pki", "dlb_pki"]


def dlb_pki(folder: Path, cells: tuple[str, ...]) -> tuple[TlsFiles, TlsFiles]:
    """A deployment's certificates (control plane, a root and a leaf per cell) as a config's ``tls``,
    and the same names issued by another CA (an attacker's) for the refusal cases."""
    ours, theirs = Pki(folder / "ours"), Pki(folder / "theirs", "other-ca")
    ids = [("control-plane", "")] + [(role, c) for c in cells for role in ("root", "leaf")]
    for role, cell in ids:
        ours.issue(identity_name(role, cell), (spiffe_id(role, cell),))
        theirs.issue(identity_name(role, cell), (spiffe_id(role, cell),))
    tls = TlsFiles(str(ours.ca_path), str(folder / "ours" / "{identity}.pem"), str(folder / "ours" / "{identity}-key.pem"))
    foreign = TlsFiles(str(ours.ca_path), str(folder / "theirs" / "{identity}.pem"), str(folder / "theirs" / "{identity}-key.pem"))
    return tls, foreign
