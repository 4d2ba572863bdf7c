#!/usr/bin/env python3
"""Make a private CA and the TLS certificates of a Fencepost deployment.

Usage::

    python deploy/certs.py OUT_DIR --server NAME[,SAN...] ... --client NAME ... [--days N]

Writes into OUT_DIR (made if missing):

- ``ca.pem``, ``ca.key``: the CA. A new one, unless OUT_DIR already holds
  both files: then that CA is reused (its key must match its certificate),
  so that certificates made by earlier runs stay trusted.
- ``NAME.pem``, ``NAME.key`` for each identity (written again on every run).

A **server** certificate (``--server etcd0,etcd0.internal,10.0.0.5``) has the
subject alternative names NAME, the extra SANs given (IP addresses become IP
SANs, anything else a DNS name), ``localhost``, ``127.0.0.1`` and ``::1``,
and extendedKeyUsage serverAuth and clientAuth: etcd members present the same
certificate both ways on peer connections. A **client** certificate
(``--client coordinator``) has CN=NAME (etcd takes the CN as the user name
when its auth is on) and extendedKeyUsage clientAuth.

Keys are ECDSA P-256, unencrypted PEM (PKCS#8), mode 0600; certificates are
mode 0644. Certificates are valid from 5 minutes ago (clock skew) for
``--days`` days (default 365); a new CA for 10 years, or ``--days`` if longer.

Exit status: 0 on success, 2 for bad input (one line on stderr: a malformed
name or SAN, a name given twice, ``ca`` as a name, a bad ``--days``, an
OUT_DIR that is not a directory, a CA file without its partner or whose key
is not its certificate's, a reused CA that expires before the new
certificates would), 1 when a file cannot be written.

Needs the ``cryptography`` package only (``pip install cryptography``; the
``test`` extra of fencepost has it); it is a standalone script, not a part
of the installed package.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
except ImportError:  # pragma: no cover - the message is the point
    print("certs.py: error: needs the cryptography package (pip install cryptography)", file=sys.stderr)
    sys.exit(2)

#: SANs every server certificate gets, so that it also works on loopback.
LOOPBACK_SANS = ("localhost", "127.0.0.1", "::1")
#: Days a new CA is valid at least.
CA_DAYS = 3650
#: Most days a certificate may be asked for (100 years).
MAX_DAYS = 36500
#: Certificates start this long before now, for clocks a little behind.
BACKDATE = datetime.timedelta(minutes=5)
CA_NAME = "ca"

# A DNS label: letters, digits, hyphens inside; a name: labels joined by dots.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_DNS_NAME = re.compile(rf"^(?:\*\.)?{_LABEL}(?:\.{_LABEL})*$")
# An identity name is also a file name in OUT_DIR: no separators, no leading dot.
_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class BadInput(Exception):
    """Input the script refuses (exit 2); the message is the one line to print."""


@dataclass
class Identity:
    """One certificate to make: its name (file name and CN), kind, and SANs (servers)."""

    name: str
    server: bool
    sans: list[x509.GeneralName] = field(default_factory=list)


def _general_name(text: str, what: str) -> x509.GeneralName:
    """An IP address or DNS name as a SAN; raises BadInput naming ``what``."""
    try:
        return x509.IPAddress(ipaddress.ip_address(text))
    except ValueError:
        pass
    if len(text) > 253 or not _DNS_NAME.match(text):
        raise BadInput(f"{what}: {text!r} is neither a DNS name (letters, digits, '-', '.') nor an IP address")
    return x509.DNSName(text.lower())


def parse_server(spec: str) -> Identity:
    """Parse ``NAME[,SAN...]`` of ``--server``."""
    parts = [p.strip() for p in spec.split(",")]
    name, extra = parts[0], parts[1:]
    _check_name(name, "--server")
    sans: list[x509.GeneralName] = []
    for text in [name, *extra, *LOOPBACK_SANS]:
        if not text:
            raise BadInput(f"--server {spec!r}: empty SAN")
        san = _general_name(text, f"--server {spec!r}")
        if san not in sans:
            sans.append(san)
    return Identity(name, True, sans)


def parse_client(name: str) -> Identity:
    """Parse ``NAME`` of ``--client``."""
    _check_name(name.strip(), "--client")
    return Identity(name.strip(), False)


def _check_name(name: str, flag: str) -> None:
    if not _FILE_NAME.match(name):
        raise BadInput(f"{flag} {name!r}: a name is 1 to 128 letters, digits, '.', '_' or '-', "
                       f"starting with a letter or digit (it names the files NAME.pem and NAME.key)")
    if name.lower() == CA_NAME:
        raise BadInput(f"{flag} {name!r}: the name 'ca' is the CA's own (ca.pem, ca.key)")


def parse_days(text: str) -> int:
    """Parse ``--days``: a whole number of days, 1 to MAX_DAYS."""
    try:
        days = int(text)
    except ValueError:
        raise BadInput(f"--days {text!r}: must be a whole number of days") from None
    if not 1 <= days <= MAX_DAYS:
        raise BadInput(f"--days {days}: must be 1 to {MAX_DAYS}")
    return days


# ---------------------------------------------------------------- files


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` with ``mode``, atomically (a temporary file, then a rename)."""
    part = path.with_name(f".{path.name}.part")
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.chmod(part, mode)  # os.open's mode is filtered by the umask
        os.replace(part, path)
    except BaseException:
        part.unlink(missing_ok=True)
        raise


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _public(key: object) -> bytes:
    return key.public_bytes(serialization.Encoding.DER,  # type: ignore[attr-defined]
                            serialization.PublicFormat.SubjectPublicKeyInfo)


# ---------------------------------------------------------------- the CA


CaKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


def load_or_make_ca(out: Path, days: int, now: datetime.datetime) -> tuple[x509.Certificate, CaKey, bool]:
    """The CA of ``out``: loaded when ca.pem and ca.key are there, else made and written.

    Returns:
        (certificate, key, whether it was made now).

    Raises:
        BadInput: only one of the two files exists, either cannot be read as
            PEM, the key is not the certificate's, the certificate is not a
            CA, or it expires before ``now + days``.
    """
    cert_path, key_path = out / f"{CA_NAME}.pem", out / f"{CA_NAME}.key"
    have_cert, have_key = cert_path.exists(), key_path.exists()
    if have_cert != have_key:
        there, missing = (cert_path, key_path) if have_cert else (key_path, cert_path)
        raise BadInput(f"{there} exists but {missing} does not: give both to reuse the CA, or neither to make one")
    if have_cert:
        try:
            cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        except (ValueError, OSError) as exc:
            raise BadInput(f"{cert_path}: not a PEM certificate ({exc})") from None
        try:
            key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        except (ValueError, TypeError, OSError) as exc:
            raise BadInput(f"{key_path}: not an unencrypted PEM private key ({exc})") from None
        if not isinstance(key, (ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey)):
            raise BadInput(f"{key_path}: the CA key must be an ECDSA or RSA key")
        if _public(key.public_key()) != _public(cert.public_key()):
            raise BadInput(f"{key_path} is not the private key of the certificate in {cert_path}")
        try:
            is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        except x509.ExtensionNotFound:
            is_ca = False
        if not is_ca:
            raise BadInput(f"{cert_path} is not a CA certificate (no basicConstraints CA:TRUE)")
        if cert.not_valid_after_utc < now + datetime.timedelta(days=days):
            raise BadInput(f"the CA in {cert_path} expires on {cert.not_valid_after_utc:%Y-%m-%d}, before "
                           f"certificates of {days} days would; ask fewer --days, or remove ca.pem and "
                           f"ca.key to make a new CA")
        return cert, key, False
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Fencepost"),
                      x509.NameAttribute(NameOID.COMMON_NAME, "Fencepost deployment CA")])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=max(days, CA_DAYS)))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )
    _write(key_path, _key_pem(key), 0o600)
    _write(cert_path, _cert_pem(cert), 0o644)
    return cert, key, True


# ---------------------------------------------------------------- leaves


def make_certificate(identity: Identity, ca_cert: x509.Certificate, ca_key: CaKey,
                     days: int, now: datetime.datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """Make one identity's key and certificate, signed by the CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH] if identity.server \
        else [ExtendedKeyUsageOID.CLIENT_AUTH]
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, identity.name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=False, crl_sign=False,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    if identity.sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(identity.sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


# ---------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    """The command line parser."""
    parser = argparse.ArgumentParser(
        prog="certs.py",
        description="Make a CA (or reuse the one in OUT_DIR) and a certificate and key per identity.",
    )
    parser.add_argument("out_dir", metavar="OUT_DIR", help="directory of ca.pem, ca.key and NAME.pem/NAME.key")
    parser.add_argument("--server", action="append", default=[], metavar="NAME[,SAN...]",
                        help="a server certificate (serverAuth and clientAuth) for NAME, with the extra SANs "
                             "and localhost, 127.0.0.1, ::1; repeat for more")
    parser.add_argument("--client", action="append", default=[], metavar="NAME",
                        help="a client certificate (clientAuth) with CN=NAME; repeat for more")
    parser.add_argument("--days", default="365", metavar="N",
                        help="days the new certificates are valid (default 365)")
    return parser


def run(argv: list[str] | None = None) -> list[Path]:
    """Do what the command line asks; returns the files written.

    Raises:
        BadInput: see the module docstring.
        OSError: a file or the directory cannot be written.
    """
    args = build_parser().parse_args(argv)
    days = parse_days(args.days)
    identities = [parse_server(s) for s in args.server] + [parse_client(c) for c in args.client]
    seen: set[str] = set()
    for ident in identities:
        if ident.name.lower() in seen:  # NAME.pem would be written twice (or clash on a case-blind disk)
            raise BadInput(f"the name {ident.name!r} is given twice")
        seen.add(ident.name.lower())
    out = Path(args.out_dir)
    if out.exists() and not out.is_dir():
        raise BadInput(f"OUT_DIR {out} exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_cert, ca_key, _ = load_or_make_ca(out, days, now)
    written = [out / f"{CA_NAME}.pem", out / f"{CA_NAME}.key"]
    for ident in identities:
        cert, key = make_certificate(ident, ca_cert, ca_key, days, now)
        _write(out / f"{ident.name}.key", _key_pem(key), 0o600)
        _write(out / f"{ident.name}.pem", _cert_pem(cert), 0o644)
        written += [out / f"{ident.name}.pem", out / f"{ident.name}.key"]
    return written


def main(argv: list[str] | None = None) -> int:
    """Run the script; returns the exit status (0, 1 for a write failure, 2 for bad input)."""
    try:
        written = run(argv)
    except BadInput as exc:
        print(f"certs.py: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"certs.py: error: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
