"""Certificates for the client's TLS tests, from trustme, written to PEM files.

``pki`` (module scope) gives a CA and everything signed by it, another CA
with a client certificate of its own, an expired server certificate, and
a server certificate for another name only; :meth:`Pki.server` turns one
into ``grpc.ServerCredentials`` (mTLS with ``client_ca``).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import trustme

#: The only name in :attr:`Pki.named` (the other server certificates carry localhost, 127.0.0.1 and ::1).
OTHER_NAME = "fencepost.test"


@dataclass
class Pair:
    """A certificate and its key, as PEM files."""

    cert: str
    key: str
    leaf: trustme.LeafCert


class Pki:
    """Two CAs and the certificates of the tests, in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.ca = trustme.CA()
        self.other_ca = trustme.CA()
        self.ca_file = self._write("ca.pem", self.ca.cert_pem.bytes())
        self.other_ca_file = self._write("other-ca.pem", self.other_ca.cert_pem.bytes())
        self.good = self._pair("server", self.ca.issue_cert("localhost", "127.0.0.1", "::1"))
        past = datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc)
        self.expired = self._pair("expired", self.ca.issue_cert(
            "localhost", "127.0.0.1", not_before=past, not_after=past + datetime.timedelta(days=30)))
        self.named = self._pair("named", self.ca.issue_cert(OTHER_NAME))
        self.client = self._pair("client", self.ca.issue_cert("client@fencepost.test"))
        self.other_client = self._pair("other-client", self.other_ca.issue_cert("client@fencepost.test"))

    def _write(self, name: str, data: bytes) -> str:
        path = self.dir / name
        path.write_bytes(data)
        return str(path)

    def _pair(self, name: str, leaf: trustme.LeafCert) -> Pair:
        chain = b"".join(blob.bytes() for blob in leaf.cert_chain_pems)
        return Pair(self._write(f"{name}.pem", chain), self._write(f"{name}-key.pem", leaf.private_key_pem.bytes()),
                    leaf)

    def server(self, pair: Pair | None = None, *, client_ca: trustme.CA | None = None) -> grpc.ServerCredentials:
        """Server credentials with ``pair`` (the good certificate by default); requiring a client certificate
        signed by ``client_ca`` when given."""
        pair = pair or self.good
        return grpc.ssl_server_credentials(
            [(pair.leaf.private_key_pem.bytes(), b"".join(b.bytes() for b in pair.leaf.cert_chain_pems))],
            root_certificates=client_ca.cert_pem.bytes() if client_ca else None,
            require_client_auth=client_ca is not None)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pki]:
    """The test certificates, made once per test module."""
    yield Pki(tmp_path_factory.mktemp("pki"))
