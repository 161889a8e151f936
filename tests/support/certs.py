"""Throwaway certificates for TLS tests: a CA, a server cert for 127.0.0.1, a client cert.

They carry what strict verification (Python 3.13's default ``VERIFY_X509_STRICT``)
expects of a real CA's: key usages, basic constraints on every certificate, and Subject
and Authority Key Identifiers."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pem:
    cert: Path
    key: Path


_NO_USAGE = {
    "digital_signature": False,
    "content_commitment": False,
    "key_encipherment": False,
    "data_encipherment": False,
    "key_agreement": False,
    "key_cert_sign": False,
    "crl_sign": False,
    "encipher_only": False,
    "decipher_only": False,
}
_CA_USAGE = x509.KeyUsage(**{**_NO_USAGE, "key_cert_sign": True, "crl_sign": True})
_LEAF_USAGE = x509.KeyUsage(**{**_NO_USAGE, "digital_signature": True})


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write(
    directory: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> Pem:
    cert_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return Pem(cert_path, key_path)


def make_pki(directory: Path) -> tuple[Pem, Pem, Pem]:
    """(ca, server, client) PEM files in ``directory``."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("busmq test CA"))
        .issuer_name(_name("busmq test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(_CA_USAGE, critical=True)
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_key_id = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())

    def leaf(
        common_name: str, san: list[x509.GeneralName], *purposes: x509.ObjectIdentifier
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(san), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_LEAF_USAGE, critical=True)
            .add_extension(x509.ExtendedKeyUsage(list(purposes)), critical=False)
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .add_extension(ca_key_id, critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        return cert, key

    server = leaf(
        "localhost",
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
        ExtendedKeyUsageOID.SERVER_AUTH,
        ExtendedKeyUsageOID.CLIENT_AUTH,  # Redis also presents it as a client (replication)
    )
    client = leaf("busmq test client", [x509.DNSName("client")], ExtendedKeyUsageOID.CLIENT_AUTH)
    return (
        _write(directory, "ca", ca, ca_key),
        _write(directory, "server", *server),
        _write(directory, "client", *client),
    )
