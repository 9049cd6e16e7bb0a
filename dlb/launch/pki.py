"""A short-lived CA and per-component certificates for one host: ``dlb up``'s per-run mTLS, the tests and
``dlb bench hostile --tls`` (docs/security.md).

``Pki(dir)`` makes a CA; ``issue(name, uris)`` a certificate signed by it for 127.0.0.1/localhost with
the given URI SANs (DLB identities ``spiffe://dlb/...``), written as ``<name>.pem`` / ``<name>-key.pem``
so a config's ``tls.cert: <dir>/{identity}.pem`` finds them. Keys are unencrypted and live two days: a
run's, not a deployment's (deployments bring their own CA). Needs the ``cryptography`` package.
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from dlb.errors import DlbError

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
except ImportError as exc:  # pragma: no cover - the test extra installs it
    raise DlbError("generating certificates needs the 'cryptography' package: pip install cryptography") from exc


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


class Pki:
    def __init__(self, folder: Path, name: str = "dlb-test-ca") -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(_name(name))
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=2))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                                  key_encipherment=False, data_encipherment=False, key_agreement=False,
                                                  encipher_only=False, decipher_only=False), critical=True)
                     .sign(self.key, hashes.SHA256()))
        self.ca_path = folder / f"{name}.pem"
        self.ca_path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, uris: tuple[str, ...] = ()) -> tuple[Path, Path]:
        """``(cert, key)`` paths of a new leaf certificate (server and client use) with ``uris`` as URI SANs."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        sans: list[x509.GeneralName] = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        sans += [x509.UniformResourceIdentifier(u) for u in uris]
        cert = (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(self.cert.subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName(sans), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH, x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]),
                               critical=False)
                .sign(self.key, hashes.SHA256()))
        cert_path, key_path = self.folder / f"{name}.pem", self.folder / f"{name}-key.pem"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        return cert_path, key_path
