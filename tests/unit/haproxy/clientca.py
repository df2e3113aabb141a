"""A certificate authority for tests of mutual TLS: it issues client certificates and revokes them."""

from __future__ import annotations

import datetime

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

NOW = datetime.datetime.now(datetime.UTC)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def pem_of(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _key_pem(key) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


class Authority:
    """A CA that issues client certificates and revokes them."""

    def __init__(self, common_name: str = "Test Clients CA"):
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = _name(common_name)
        self.cert = (
            self._builder(self.name, self.key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.revoked: list[int] = []

    def _builder(self, subject: x509.Name, public_key) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.name)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(NOW - datetime.timedelta(minutes=5))
            .not_valid_after(NOW + datetime.timedelta(days=2))
        )

    def issue(self, common_name: str) -> tuple[x509.Certificate, str]:
        key = ec.generate_private_key(ec.SECP256R1())
        return self._builder(_name(common_name), key.public_key()).sign(self.key, hashes.SHA256()), _key_pem(key)

    def crl(self, revoked: list[x509.Certificate] = ()) -> str:
        builder = (
            x509.CertificateRevocationListBuilder()
            .issuer_name(self.name)
            .last_update(NOW - datetime.timedelta(minutes=5))
            .next_update(NOW + datetime.timedelta(days=2))
        )
        for cert in revoked:
            entry = x509.RevokedCertificateBuilder().serial_number(cert.serial_number).revocation_date(NOW).build()
            builder = builder.add_revoked_certificate(entry)
        return builder.sign(self.key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM).decode()
