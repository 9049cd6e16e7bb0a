"""The testbeds' certificates: a deployment's (control plane, a root and a leaf per cell) and the same
names from another CA, an attacker's (:class:`dlb.launch.pki.Pki` makes both)."""

from __future__ import annotations

from pathlib import Path

from dlb.config.model import TlsFiles
from dlb.config.tls import identity_name, spiffe_id
from dlb.launch.pki import Pki

__all__ = ["Pki", "SecretDir", "dlb_pki"]


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


class SecretDir:
    """A ``kubernetes.io/tls`` Secret as the kubelet mounts it: ``ca.crt``, ``tls.crt``, ``tls.key`` are
    symlinks into ``..data``, a symlink to a folder per version; :meth:`publish` writes a new folder and
    renames a new ``..data`` over the old one (one atomic step, what a cert-manager renewal looks like)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self._versions = 0

    @property
    def tls(self) -> TlsFiles:
        return TlsFiles(str(self.folder / "ca.crt"), str(self.folder / "tls.crt"), str(self.folder / "tls.key"))

    def publish(self, ca: bytes, cert: bytes, key: bytes) -> None:
        self._versions += 1
        version = self.folder / f"..v{self._versions}"
        version.mkdir()
        for name, data in (("ca.crt", ca), ("tls.crt", cert), ("tls.key", key)):
            (version / name).write_bytes(data)
        tmp = self.folder / "..data_tmp"
        tmp.symlink_to(version.name)
        tmp.rename(self.folder / "..data")
        for name in ("ca.crt", "tls.crt", "tls.key"):
            if not (self.folder / name).is_symlink():
                (self.folder / name).symlink_to(f"..data/{name}")
