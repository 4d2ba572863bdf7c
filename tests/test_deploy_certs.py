"""deploy/certs.py: the CA and certificates of the deployments, run as the script it is."""

from __future__ import annotations

import ipaddress
import ssl
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.conftest import REPO

SCRIPT = REPO / "deploy" / "certs.py"


def certs(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """Run ``python deploy/certs.py ARGS``."""
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=60)


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def sans(cert: x509.Certificate) -> set[str]:
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(n.value) for n in names}


def usages(cert: x509.Certificate) -> set[x509.ObjectIdentifier]:
    return set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def test_certs_writes_a_ca_and_each_identity(tmp_path: Path) -> None:
    """Server certificates carry NAME, the extra SANs and loopback, serverAuth+clientAuth; clients CN=NAME, clientAuth; keys 0600."""
    out = tmp_path / "tls"
    done = certs(out, "--server", "etcd0,etcd0.internal,10.0.0.5", "--client", "coordinator", "--days", "30")
    assert done.returncode == 0, done.stderr
    for name in ("ca", "etcd0", "coordinator"):
        assert stat.S_IMODE((out / f"{name}.key").stat().st_mode) == 0o600, name
        assert (out / f"{name}.pem").is_file()
    server, client, ca = load(out / "etcd0.pem"), load(out / "coordinator.pem"), load(out / "ca.pem")
    assert sans(server) == {"etcd0", "etcd0.internal", "localhost", str(ipaddress.ip_address("10.0.0.5")),
                            "127.0.0.1", "::1"}
    assert usages(server) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert client.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "coordinator"
    assert usages(client) == {ExtendedKeyUsageOID.CLIENT_AUTH}
    assert 29 <= (server.not_valid_after_utc - server.not_valid_before_utc).days <= 30
    for cert in (server, client):
        assert cert.issuer == ca.subject
        cert.verify_directly_issued_by(ca)
    # OpenSSL takes each certificate with its key, and the CA as a trust root.
    ctx = ssl.create_default_context(cafile=str(out / "ca.pem"))
    ctx.load_cert_chain(out / "etcd0.pem", out / "etcd0.key")


def test_certs_reuses_the_ca_in_out_dir(tmp_path: Path) -> None:
    """A second run keeps ca.pem and ca.key and signs its new certificates with them."""
    assert certs(tmp_path, "--client", "a").returncode == 0
    ca_pem, ca_key = (tmp_path / "ca.pem").read_bytes(), (tmp_path / "ca.key").read_bytes()
    done = certs(tmp_path, "--server", "b")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "ca.pem").read_bytes() == ca_pem and (tmp_path / "ca.key").read_bytes() == ca_key
    load(tmp_path / "b.pem").verify_directly_issued_by(load(tmp_path / "ca.pem"))
    load(tmp_path / "a.pem").verify_directly_issued_by(load(tmp_path / "ca.pem"))


@pytest.mark.parametrize("args, says", [
    (["--server", "a/b"], "names the files"),
    (["--server", "ok,bad_san"], "neither a DNS name"),
    (["--server", "a,,b"], "empty SAN"),
    (["--client", "ca"], "the CA's own"),
    (["--client", "x", "--server", "x"], "given twice"),
    (["--days", "0"], "must be 1 to"),
    (["--days", "ten"], "whole number"),
])
def test_certs_when_input_is_bad_exits_2(tmp_path: Path, args: list[str], says: str) -> None:
    """Bad input exits 2 with one line naming the problem, and writes nothing."""
    done = certs(tmp_path / "out", *args)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert says in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "out").exists()


def test_certs_when_the_ca_is_incomplete_or_mismatched_exits_2(tmp_path: Path) -> None:
    """A ca.pem without ca.key, or a ca.key of another CA, is refused rather than replaced."""
    assert certs(tmp_path / "one").returncode == 0
    assert certs(tmp_path / "two").returncode == 0
    (tmp_path / "one" / "ca.key").write_bytes((tmp_path / "two" / "ca.key").read_bytes())
    done = certs(tmp_path / "one", "--client", "a")
    assert done.returncode == 2 and "is not the private key" in done.stderr, done.stderr
    (tmp_path / "two" / "ca.key").unlink()
    done = certs(tmp_path / "two", "--client", "a")
    assert done.returncode == 2 and "does not" in done.stderr, done.stderr
    assert not (tmp_path / "two" / "a.pem").exists()
