"""Ownership of leases (issue 9): only the caller that granted a lease may renew, revoke, acquire with or
release on it; anyone else gets PERMISSION_DENIED / NOT_LEASE_OWNER and nothing changes. Against a real etcd,
real coordinators (one or two replicas on one etcd), without TLS and with mTLS (trustme certificates)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import trustme

from fencepost.client import AsyncLockClient, PermissionDenied, TlsConfig
from fencepost.client.errors import from_rpc_error
from fencepost.client.v1 import lock_pb2, lock_pb2_grpc
from fencepost.client.v1.details import ErrorReason, reason_name
from fencepost.client.v1.keys import LEASE_SECRET_METADATA
from fencepost.coordinator.admission.identity import identity_of_pem
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.process.embedded import EmbeddedEtcd
from fencepost.coordinator.process.tls import ServerTls

from .conftest import error_info
from .tls_helpers import install_server_cert, open_channel

NOT_LEASE_OWNER = reason_name(ErrorReason.NOT_LEASE_OWNER)


async def started(etcd: EmbeddedEtcd, prefix: str, tls: ServerTls | None = None) -> Coordinator:
    coordinator = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix, tls=tls)
    await asyncio.wait_for(coordinator.start(), 20)
    return coordinator


@pytest.fixture
async def replicas(etcd: EmbeddedEtcd, prefix: str) -> AsyncIterator[tuple[Coordinator, Coordinator]]:
    """Two coordinator replicas on one etcd and one prefix, plaintext."""
    one = await started(etcd, prefix)
    two = await started(etcd, prefix)
    try:
        yield one, two
    finally:
        await asyncio.gather(one.stop(0), two.stop(0))


def assert_denied(err: grpc.aio.AioRpcError, lease_id: int) -> None:
    """PERMISSION_DENIED with ErrorInfo NOT_LEASE_OWNER naming ``lease_id``; the client's PermissionDenied."""
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED, err
    info = error_info(err)
    assert info is not None and info.reason == NOT_LEASE_OWNER and info.metadata["lease_id"] == str(lease_id)
    mapped = from_rpc_error(err)
    assert isinstance(mapped, PermissionDenied) and mapped.lease_id == lease_id


async def denied(call: Any, lease_id: int) -> None:
    """``call`` (an awaitable gRPC call) fails with NOT_LEASE_OWNER for ``lease_id``."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert_denied(info.value, lease_id)


async def keepalive_denied(stub: lock_pb2_grpc.LockServiceStub, lease_id: int, secret: str = "") -> None:
    """A KeepAlive stream whose keepalive for ``lease_id`` (with ``secret``) is refused: the stream ends so."""
    stream = stub.KeepAlive()
    await stream.write(lock_pb2.KeepAliveRequest(keepalive=lock_pb2.LeaseKeepAlive(lease_id=lease_id, request_id=1),
                                                 lease_secret=secret))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await asyncio.wait_for(stream.read(), 10)
    assert_denied(info.value, lease_id)


async def the_sequence(a: AsyncLockClient, c: lock_pb2_grpc.LockServiceStub, name: str) -> None:
    """The done-when sequence: A acquires; C reads A's lease and token from Describe and tries Release,
    LeaseRevoke and KeepAlive on A's lease: each refused, and A still holds."""
    held = await a.acquire(name, ttl=30.0, timeout=5.0)
    seen = await c.Describe(lock_pb2.DescribeRequest(name=name), timeout=5)
    assert seen.held and seen.holder.lease_id == held.lease_id and seen.holder.token == held.token
    lease, token = seen.holder.lease_id, seen.holder.token
    await denied(c.Release(lock_pb2.ReleaseRequest(name=name, lease_id=lease, token=token), timeout=5), lease)
    await denied(c.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease), timeout=5), lease)
    await keepalive_denied(c, lease)
    after = await c.Describe(lock_pb2.DescribeRequest(name=name), timeout=5)
    assert after.held and after.holder.lease_id == lease and after.holder.token == token
    assert held.is_valid()
    await held.release()


async def test_sequence_when_another_caller_uses_a_lease_without_its_secret(coordinator: Coordinator) -> None:
    """C's Release, LeaseRevoke and KeepAlive on A's lease are refused (NOT_LEASE_OWNER); A still holds."""
    async with AsyncLockClient(coordinator.address) as a, grpc.aio.insecure_channel(coordinator.address) as chan:
        await the_sequence(a, lock_pb2_grpc.LockServiceStub(chan), "acct:7")


async def test_sequence_across_two_replicas_and_failover(replicas: tuple[Coordinator, Coordinator]) -> None:
    """A on replica 1, C on replica 2: C refused; A's secret works on replica 2 (its calls after a failover)."""
    one, two = replicas
    async with AsyncLockClient(one.address) as a, grpc.aio.insecure_channel(two.address) as chan:
        c = lock_pb2_grpc.LockServiceStub(chan)
        await the_sequence(a, c, "acct:7")
        held = await a.acquire("acct:8", ttl=30.0, timeout=5.0)
        owner = ((LEASE_SECRET_METADATA, held.lease_secret),)
        # A fails over: with its secret, replica 2 serves it (keepalive, release, revoke).
        stream = c.KeepAlive()
        await stream.write(lock_pb2.KeepAliveRequest(
            keepalive=lock_pb2.LeaseKeepAlive(lease_id=held.lease_id, request_id=5), lease_secret=held.lease_secret))
        ack = await asyncio.wait_for(stream.read(), 10)
        assert ack.keepalive.request_id == 5 and ack.keepalive.ttl_seconds > 0
        stream.cancel()
        await c.Release(lock_pb2.ReleaseRequest(name="acct:8", lease_id=held.lease_id, token=held.token),
                        metadata=owner, timeout=5)
        assert not (await c.Describe(lock_pb2.DescribeRequest(name="acct:8"), timeout=5)).held


async def test_acquire_withdraw_and_secrets_when_not_the_owners(coordinator: Coordinator,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """Acquire and Withdraw with another's lease, a wrong secret, no secret and another lease's secret are all
    refused; the secret is in no Describe, ListLocks or log line, and the refusal is logged once."""
    caplog.set_level(logging.DEBUG, logger="fencepost")
    async with grpc.aio.insecure_channel(coordinator.address) as chan:
        stub = lock_pb2_grpc.LockServiceStub(chan)
        a = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=30), timeout=5)
        b = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=30), timeout=5)
        assert len(a.lease_secret) == 43 and a.lease_secret != b.lease_secret
        mine = ((LEASE_SECRET_METADATA, a.lease_secret),)
        try:
            got = await stub.Acquire(lock_pb2.AcquireRequest(name="n", lease_id=a.lease_id), metadata=mine, timeout=5)
            assert got.acquired
            for metadata in ((), ((LEASE_SECRET_METADATA, "x" * 43),), ((LEASE_SECRET_METADATA, b.lease_secret),)):
                await denied(stub.Acquire(lock_pb2.AcquireRequest(name="m", lease_id=a.lease_id),
                                          metadata=metadata, timeout=5), a.lease_id)
                await denied(stub.Withdraw(lock_pb2.WithdrawRequest(name="n", lease_id=a.lease_id),
                                           metadata=metadata, timeout=5), a.lease_id)
                await denied(stub.Release(lock_pb2.ReleaseRequest(name="n", lease_id=a.lease_id, token=got.token),
                                          metadata=metadata, timeout=5), a.lease_id)
            await keepalive_denied(stub, a.lease_id, b.lease_secret)
            described = await stub.Describe(lock_pb2.DescribeRequest(name="n"), timeout=5)
            listed = await stub.ListLocks(lock_pb2.ListLocksRequest(), timeout=5)
            assert described.holder.lease_id == a.lease_id and [lock.name for lock in listed.locks] == ["n"]
            for shown in (described, listed):
                assert a.lease_secret.encode() not in shown.SerializeToString()
            info = await stub.ServerInfo(lock_pb2.ServerInfoRequest(), timeout=5)
            assert info.contender_keys == 1 and info.held_locks == 1  # ownership records are not lock keys
            assert (await stub.Acquire(lock_pb2.AcquireRequest(name="m", lease_id=b.lease_id),
                                       metadata=((LEASE_SECRET_METADATA, b.lease_secret),), timeout=5)).acquired
        finally:
            for lease in (a, b):
                await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease.lease_id), timeout=5,
                                       metadata=((LEASE_SECRET_METADATA, lease.lease_secret),))
    text = "\n".join(record.getMessage() + repr(record.__dict__) for record in caplog.records)
    assert a.lease_secret not in text and b.lease_secret not in text
    refusals = [r for r in caplog.records if r.getMessage().startswith("Acquire refused: NOT_LEASE_OWNER")]
    assert len(refusals) == 3


async def test_gone_lease_when_anyone_asks_is_reported_as_before(coordinator: Coordinator) -> None:
    """A lease that is gone is reported as before, to anyone: LeaseRevoke found = false, Acquire LEASE_EXPIRED."""
    async with grpc.aio.insecure_channel(coordinator.address) as chan:
        stub = lock_pb2_grpc.LockServiceStub(chan)
        a = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=30), timeout=5)
        mine = ((LEASE_SECRET_METADATA, a.lease_secret),)
        assert (await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=a.lease_id), metadata=mine,
                                       timeout=5)).found
        assert not (await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=a.lease_id), timeout=5)).found
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Acquire(lock_pb2.AcquireRequest(name="n", lease_id=a.lease_id), timeout=5)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert error_info(info.value).reason == "LEASE_EXPIRED"  # type: ignore[union-attr]


async def test_lease_granted_straight_in_etcd_when_used_is_refused(coordinator: Coordinator,
                                                                   etcd_client: Any) -> None:
    """A live lease with no ownership record (granted around the coordinators) is nobody's: refused."""
    lease = await etcd_client.lease.grant(30, timeout=5)
    try:
        async with grpc.aio.insecure_channel(coordinator.address) as chan:
            stub = lock_pb2_grpc.LockServiceStub(chan)
            await denied(stub.Acquire(lock_pb2.AcquireRequest(name="n", lease_id=lease.ID), timeout=5), lease.ID)
    finally:
        await etcd_client.lease.revoke(lease.ID, timeout=5)


# ---------------------------------------------------------------- mTLS identities


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
async def mtls(etcd: EmbeddedEtcd, prefix: str, tmp_path: Path, ca: trustme.CA) -> AsyncIterator[Coordinator]:
    """A coordinator requiring client certificates of ``ca``."""
    install_server_cert(ca, tmp_path)
    ca.cert_pem.write_to_path(tmp_path / "client-ca.pem")
    coordinator = await started(etcd, prefix, ServerTls(tmp_path / "cert.pem", tmp_path / "key.pem",
                                                        client_ca=tmp_path / "client-ca.pem"))
    try:
        yield coordinator
    finally:
        await coordinator.stop(0)


def credentials(ca: trustme.CA, identity: str) -> grpc.ChannelCredentials:
    leaf = ca.issue_cert(identity)
    return grpc.ssl_channel_credentials(ca.cert_pem.bytes(), leaf.private_key_pem.bytes(),
                                        b"".join(pem.bytes() for pem in leaf.cert_chain_pems))


async def test_mtls_when_the_identity_owns_the_lease(mtls: Coordinator, ca: trustme.CA, tmp_path: Path) -> None:
    """With mTLS, the certificate identity owns the lease: another connection with a certificate of the same
    identity acts on it without the secret; a certificate of another identity is refused (and the sequence
    holds)."""
    a_cert = ca.issue_cert("a.pay.example.org")
    a_files = [tmp_path / "a.pem", tmp_path / "a-key.pem"]
    a_files[0].write_bytes(b"".join(pem.bytes() for pem in a_cert.cert_chain_pems))
    a_files[1].write_bytes(a_cert.private_key_pem.bytes())
    tls = TlsConfig(ca=str(tmp_path / "client-ca.pem"), cert=str(a_files[0]), key=str(a_files[1]))
    async with AsyncLockClient(mtls.address, tls=tls) as a:
        async with open_channel(mtls.address, credentials(ca, "c.pay.example.org")) as chan:
            await the_sequence(a, lock_pb2_grpc.LockServiceStub(chan), "acct:7")
        held = await a.acquire("acct:9", ttl=30.0, timeout=5.0)
        same = ca.issue_cert("a.pay.example.org")  # the same identity, another certificate
        creds = grpc.ssl_channel_credentials(ca.cert_pem.bytes(), same.private_key_pem.bytes(),
                                             b"".join(pem.bytes() for pem in same.cert_chain_pems))
        async with open_channel(mtls.address, creds) as chan:
            stub = lock_pb2_grpc.LockServiceStub(chan)
            await stub.Release(lock_pb2.ReleaseRequest(name="acct:9", lease_id=held.lease_id, token=held.token),
                               timeout=5)  # no secret: the identity is enough
        async with open_channel(mtls.address, credentials(ca, "other.example.org")) as chan:
            stub = lock_pb2_grpc.LockServiceStub(chan)
            await denied(stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=held.lease_id), timeout=5),
                         held.lease_id)
            # ... unless it presents the secret, which works with any identity.
            assert (await stub.Acquire(lock_pb2.AcquireRequest(name="acct:10", lease_id=held.lease_id),
                                       metadata=((LEASE_SECRET_METADATA, held.lease_secret),), timeout=5)).acquired


# ---------------------------------------------------------------- identity_of_pem


@pytest.mark.parametrize(("names", "common_name", "identity"), [
    (["spiffe://example.org/a", "https://example.org/b"], None, "spiffe://example.org/a"),
    (["https://example.org/b", "spiffe://example.org/a"], None, "spiffe://example.org/a"),
    (["https://example.org/b"], None, "https://example.org/b"),
    (["svc.example.org"], None, "svc.example.org"),
    ([], "only-a-cn", "only-a-cn"),
])
def test_identity_of_pem_when_the_certificate_names(names: list[str], common_name: str | None,
                                                    identity: str) -> None:
    """The identity rule: the SPIFFE URI, else the first URI SAN, else the first DNS SAN, else the CN."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)] if common_name else [])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now)
               .not_valid_after(now + datetime.timedelta(days=1)))
    if names:
        sans = [x509.UniformResourceIdentifier(n) if "://" in n else x509.DNSName(n) for n in names]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    pem = builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)
    assert identity_of_pem(pem) == identity


def test_lease_secrets_never_start_with_a_dash() -> None:
    """A secret is passed on the command line (``release --lease-secret SECRET``): one starting with ``-`` would
    read as an option (found by a fresh-user trial: 1 secret in 64)."""
    from fencepost.coordinator.admission.ownership import new_secret

    secrets = [new_secret() for _ in range(2000)]
    assert not any(s.startswith("-") for s in secrets)
    assert len(set(secrets)) == 2000 and all(len(s) == 43 for s in secrets)
