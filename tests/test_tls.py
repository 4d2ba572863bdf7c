"""TLS on the coordinator's port, against a real etcd and real certificates (trustme): server TLS, client
certificates required or optional, and certificate reload without dropping established streams."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import trustme

from fencepost.client.v1 import lock_pb2, lock_pb2_grpc
from fencepost.coordinator.embedded import EmbeddedEtcd
from fencepost.coordinator.server import Coordinator
from fencepost.coordinator.tls import ServerTls, TlsFileError

from .tls_helpers import acquire_release, call_fails, client_credentials, install, install_server_cert, open_channel

# ---------------------------------------------------------------- certificates and channels


@pytest.fixture(scope="module")
def ca1() -> trustme.CA:
    """The CA of certificate A (the first server certificate) and of the good client certificates."""
    return trustme.CA()


@pytest.fixture(scope="module")
def ca2() -> trustme.CA:
    """The CA of certificate B (the server certificate after a reload), and of clients ca1 does not know."""
    return trustme.CA()


@pytest.fixture
def files(tmp_path: Path, ca1: trustme.CA) -> Path:
    """A directory with certificate A (from ca1) in cert.pem/key.pem and ca1 in client-ca.pem."""
    install_server_cert(ca1, tmp_path)
    ca1.cert_pem.write_to_path(tmp_path / "client-ca.pem")
    return tmp_path


async def started(etcd: EmbeddedEtcd, prefix: str, tls: ServerTls) -> Coordinator:
    coordinator = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix, tls=tls)
    await asyncio.wait_for(coordinator.start(), 20)
    return coordinator


@pytest.fixture
async def tls_coordinator(etcd: EmbeddedEtcd, prefix: str, files: Path) -> AsyncIterator[Coordinator]:
    """A coordinator with server TLS (certificate A), no client certificates."""
    coordinator = await started(etcd, prefix, ServerTls(files / "cert.pem", files / "key.pem"))
    try:
        yield coordinator
    finally:
        await coordinator.stop(0)


# ---------------------------------------------------------------- server TLS and mTLS


async def test_tls_when_the_client_trusts_the_servers_ca(tls_coordinator: Coordinator, ca1: trustme.CA,
                                                         ca2: trustme.CA) -> None:
    """Over TLS a full acquire/release works; a plaintext client and a client trusting another CA are refused."""
    first = await acquire_release(tls_coordinator.address, client_credentials(ca1), "over-tls")
    assert await acquire_release(tls_coordinator.address, client_credentials(ca1), "over-tls") > first
    assert await call_fails(tls_coordinator.address, None) == grpc.StatusCode.UNAVAILABLE
    assert await call_fails(tls_coordinator.address, client_credentials(ca2)) == grpc.StatusCode.UNAVAILABLE


async def test_mtls_when_client_certificates_are_required(etcd: EmbeddedEtcd, prefix: str, files: Path,
                                                          ca1: trustme.CA, ca2: trustme.CA) -> None:
    """With a client CA and require: no certificate and a certificate of another CA are refused at the handshake;
    a certificate of the client CA works."""
    tls = ServerTls(files / "cert.pem", files / "key.pem", client_ca=files / "client-ca.pem")
    assert tls.client_auth == "require"
    coordinator = await started(etcd, prefix, tls)
    try:
        assert await call_fails(coordinator.address, client_credentials(ca1)) == grpc.StatusCode.UNAVAILABLE
        assert await call_fails(coordinator.address, client_credentials(ca1, ca2)) == grpc.StatusCode.UNAVAILABLE
        assert await call_fails(coordinator.address, client_credentials(ca1, ca1)) is None
        await acquire_release(coordinator.address, client_credentials(ca1, ca1), "over-mtls")
    finally:
        await coordinator.stop(0)


async def test_mtls_when_client_certificates_are_optional(etcd: EmbeddedEtcd, prefix: str, files: Path,
                                                          ca1: trustme.CA, ca2: trustme.CA) -> None:
    """With a client CA and optional: a client without a certificate works, and so does one with a certificate
    (gRPC Python does not ask for it then: even one of another CA is not looked at)."""
    tls = ServerTls(files / "cert.pem", files / "key.pem", client_ca=files / "client-ca.pem",
                    require_client_cert=False)
    assert tls.client_auth == "optional"
    coordinator = await started(etcd, prefix, tls)
    try:
        await acquire_release(coordinator.address, client_credentials(ca1), "without-a-certificate")
        assert await call_fails(coordinator.address, client_credentials(ca1, ca1)) is None
        assert await call_fails(coordinator.address, client_credentials(ca1, ca2)) is None
        assert await call_fails(coordinator.address, None) == grpc.StatusCode.UNAVAILABLE  # still TLS
    finally:
        await coordinator.stop(0)


@pytest.mark.parametrize(("case", "role", "says"), [
    ("missing key", "key", "cannot be read"),
    ("key of another certificate", "key", "is not the private key of the certificate in"),
    ("client CA holds a key", "ca", "holds no certificate"),
    ("certificate is not PEM", "cert", "is not a PEM file"),
])
def test_server_tls_when_a_file_is_bad(case: str, role: str, says: str, files: Path, ca2: trustme.CA,
                                       etcd: EmbeddedEtcd) -> None:
    """Coordinator(tls=...) reads the files at once: a bad one raises TlsFileError naming it and what is wrong."""
    cert, key, client_ca = files / "cert.pem", files / "key.pem", files / "client-ca.pem"
    if case == "missing key":
        key = files / "nonexistent.pem"
    elif case == "key of another certificate":
        install(key, ca2.issue_cert("127.0.0.1").private_key_pem.bytes())
    elif case == "client CA holds a key":
        client_ca = key
    else:
        cert.write_bytes(b"\x30\x82 DER, not PEM")
    bad = {"cert": cert, "key": key, "ca": client_ca}[role]
    with pytest.raises(TlsFileError) as info:
        Coordinator([etcd.endpoint], listen="127.0.0.1:0", tls=ServerTls(cert, key, client_ca))
    assert info.value.role == role and info.value.path == str(bad)
    assert says in str(info.value) and str(bad) in str(info.value), str(info.value)


# ---------------------------------------------------------------- reload


async def test_reload_keeps_established_streams(tls_coordinator: Coordinator, files: Path, ca1: trustme.CA,
                                                ca2: trustme.CA) -> None:
    """Certificate A replaced by B (another CA) and reloaded: the KeepAlive stream opened under A still gets its
    keepalives acknowledged and its lock stays held; new connections need to trust B's CA."""
    address = tls_coordinator.address
    async with open_channel(address, client_credentials(ca1)) as channel:
        stub = lock_pb2_grpc.LockServiceStub(channel)
        lease = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10), timeout=10)
        got = await stub.Acquire(lock_pb2.AcquireRequest(name="held", lease_id=lease.lease_id, wait_ms=5000),
                                 timeout=10)
        stream = stub.KeepAlive()
        await stream.write(lock_pb2.KeepAliveRequest(keepalive=lock_pb2.LeaseKeepAlive(
            lease_id=lease.lease_id, request_id=1)))
        first = await asyncio.wait_for(stream.read(), 10)
        assert first.keepalive.request_id == 1 and first.keepalive.ttl_seconds > 0

        install_server_cert(ca2, files)
        assert tls_coordinator.reload_tls() is True

        assert await call_fails(address, client_credentials(ca1)) == grpc.StatusCode.UNAVAILABLE
        assert await call_fails(address, client_credentials(ca2)) is None
        await stream.write(lock_pb2.KeepAliveRequest(keepalive=lock_pb2.LeaseKeepAlive(
            lease_id=lease.lease_id, request_id=2)))
        second = await asyncio.wait_for(stream.read(), 10)
        assert second.keepalive.request_id == 2 and second.keepalive.ttl_seconds > 0
        async with open_channel(address, client_credentials(ca2)) as new:
            held = await lock_pb2_grpc.LockServiceStub(new).Describe(lock_pb2.DescribeRequest(name="held"),
                                                                     timeout=10)
        assert held.held and held.holder.lease_id == lease.lease_id and held.holder.token == got.token
        # The old connection still carries unary calls too.
        await stub.Release(lock_pb2.ReleaseRequest(name="held", lease_id=lease.lease_id, token=got.token),
                           timeout=10)
        await stream.done_writing()
        await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease.lease_id), timeout=10)


async def test_reload_when_the_files_change_on_disk(tls_coordinator: Coordinator, files: Path, ca1: trustme.CA,
                                                    ca2: trustme.CA) -> None:
    """Without a SIGHUP, the next handshake after the files changed already uses the new certificate."""
    assert await call_fails(tls_coordinator.address, client_credentials(ca1)) is None
    install_server_cert(ca2, files)
    assert await call_fails(tls_coordinator.address, client_credentials(ca2)) is None
    assert await call_fails(tls_coordinator.address, client_credentials(ca1)) == grpc.StatusCode.UNAVAILABLE


def _reload_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "fencepost.coordinator" and r.levelno == logging.WARNING and "not reloaded" in r.getMessage()]


@pytest.mark.parametrize("how", ["reload_tls", "at the next handshake"])
@pytest.mark.parametrize("case", ["half-written certificate", "key of another certificate", "key removed"])
async def test_reload_when_the_new_files_are_bad(case: str, how: str, tls_coordinator: Coordinator, files: Path,
                                                 ca1: trustme.CA, ca2: trustme.CA,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """Bad new files keep certificate A in use, with one warning naming the file however many handshakes follow;
    once good files arrive they are used."""
    caplog.set_level(logging.INFO, logger="fencepost.coordinator")
    leaf = ca2.issue_cert("127.0.0.1")
    if case == "half-written certificate":
        bad = files / "cert.pem"
        install(bad, leaf.cert_chain_pems[0].bytes()[:400])
    elif case == "key of another certificate":
        bad = files / "key.pem"
        install(files / "cert.pem", leaf.cert_chain_pems[0].bytes())  # key.pem is still A's
    else:
        bad = files / "key.pem"
        bad.unlink()
    if how == "reload_tls":
        assert tls_coordinator.reload_tls() is False
    for _ in range(3):
        assert await call_fails(tls_coordinator.address, client_credentials(ca1)) is None
    warned = _reload_warnings(caplog)
    assert len(warned) == 1 and str(bad) in warned[0] and "the certificate in use stays" in warned[0], warned

    install_server_cert(ca2, files)
    assert await call_fails(tls_coordinator.address, client_credentials(ca2)) is None
    assert await call_fails(tls_coordinator.address, client_credentials(ca1)) == grpc.StatusCode.UNAVAILABLE
    assert len(_reload_warnings(caplog)) == 1


async def test_reload_tls_when_the_coordinator_has_no_tls(coordinator: Coordinator) -> None:
    """reload_tls on a plaintext coordinator is a RuntimeError, not a silent no-op."""
    assert coordinator.tls is None
    with pytest.raises(RuntimeError, match="without TLS"):
        coordinator.reload_tls()
