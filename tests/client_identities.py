"""Client identities for mTLS tests with an access policy: certificates signed by a trustme CA, written as
PEM files, with the channel credentials that present them.

- :data:`BILLING`: a SPIFFE ID, the URI SAN of :func:`spiffe_certificate`'s certificates;
- :data:`WORKER`: a DNS name, the only SAN of a plain trustme leaf;
- :func:`write_identity`: an :class:`Identity` from a certificate and key.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

import grpc
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

BILLING = "spiffe://example.org/billing"
WORKER = "worker.example"


@dataclass
class Identity:
    """A client certificate and key (PEM files) and the channel credentials that present them."""

    cert: Path
    key: Path
    credentials: grpc.ChannelCredentials


def spiffe_certificate(ca: trustme.CA, spiffe_id: str) -> tuple[bytes, bytes]:
    """An X.509-SVID-like client certificate signed by ``ca``: URI SAN ``spiffe_id``, plus a DNS SAN and a CN that
    the identity rule must pass over. trustme's issue_cert takes no URIs, so it is built with cryptography, signed
    by the trustme CA's key. Returns (certificate PEM, key PEM)."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem.bytes())
    ca_key = serialization.load_pem_private_key(ca.private_key_pem.bytes(), password=None)
    assert isinstance(ca_key, (ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey))
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "billing-cn")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("billing.example"),
                                                    x509.UniformResourceIdentifier(spiffe_id)]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def write_identity(ca: trustme.CA, directory: Path, label: str, cert_pem: bytes, key_pem: bytes) -> Identity:
    """Write ``cert_pem`` and ``key_pem`` as ``DIRECTORY/LABEL.pem`` and ``LABEL-key.pem``; returns the identity
    that presents them."""
    (directory / f"{label}.pem").write_bytes(cert_pem)
    (directory / f"{label}-key.pem").write_bytes(key_pem)
    return Identity(directory / f"{label}.pem", directory / f"{label}-key.pem",
                    grpc.ssl_channel_credentials(ca.cert_pem.bytes(), key_pem, cert_pem))
