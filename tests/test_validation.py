"""Bad requests: INVALID_ARGUMENT naming the field, nothing written, the coordinator keeps serving."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from etcd3aio import Etcd3Client

from fencepost.client import AsyncLockClient, InvalidArgument, LockClient
from fencepost.client.v1 import lock_pb2, lock_pb2_grpc

from .conftest import assert_invalid_field, count_keys, error_info, lease_ids

BAD_NAMES = {
    "empty": "",
    "300 bytes": "x" * 300,
    # Under the coordinator's message size limit (64 KiB); a larger request is refused by gRPC
    # itself, RESOURCE_EXHAUSTED (test_limits.py).
    "60 KiB": "y" * (60 * 1024),
    "NUL byte": "a\x00b",
    "newline": "a\nb",
}
BAD_TTLS = [0, -1, -(2**40), 86_401, 2**40]


@pytest.fixture
async def lease(stub: lock_pb2_grpc.LockServiceStub) -> AsyncIterator[int]:
    """A valid lease id, revoked after the test."""
    resp = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=30), timeout=5)
    try:
        yield resp.lease_id
    finally:
        await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=resp.lease_id), timeout=5)


async def assert_still_serving(stub: lock_pb2_grpc.LockServiceStub, lease: int) -> None:
    """A normal acquire and release work."""
    got = await stub.Acquire(lock_pb2.AcquireRequest(name="still-ok", lease_id=lease), timeout=5)
    assert got.acquired and got.token > 0
    await stub.Release(lock_pb2.ReleaseRequest(name="still-ok", lease_id=lease, token=got.token), timeout=5)


@pytest.mark.parametrize("name", list(BAD_NAMES.values()), ids=list(BAD_NAMES))
async def test_bad_name_is_invalid_argument(
    stub: lock_pb2_grpc.LockServiceStub, lease: int, prefix: str, etcd_client: Etcd3Client, name: str
) -> None:
    """Acquire, Release and Describe reject a bad name with INVALID_ARGUMENT naming "name" and write nothing."""
    calls = [
        lambda: stub.Acquire(lock_pb2.AcquireRequest(name=name, lease_id=lease), timeout=5),
        lambda: stub.Acquire(lock_pb2.AcquireRequest(name=name, lease_id=lease, wait_ms=1000), timeout=5),
        lambda: stub.Release(lock_pb2.ReleaseRequest(name=name, lease_id=lease, token=1), timeout=5),
        lambda: stub.Describe(lock_pb2.DescribeRequest(name=name), timeout=5),
    ]
    for call in calls:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call()
        assert_invalid_field(info.value, "name")
    assert await count_keys(etcd_client, prefix) == 0
    await assert_still_serving(stub, lease)
    assert await count_keys(etcd_client, prefix) == 0


@pytest.mark.parametrize("ttl", BAD_TTLS)
async def test_bad_ttl_is_invalid_argument(
    stub: lock_pb2_grpc.LockServiceStub, etcd_client: Etcd3Client, ttl: int
) -> None:
    """LeaseGrant rejects TTLs <= 0 or above 86400 s with INVALID_ARGUMENT naming "ttl_seconds", granting nothing."""
    before = await lease_ids(etcd_client)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=ttl), timeout=5)
    assert_invalid_field(info.value, "ttl_seconds")
    assert not (await lease_ids(etcd_client)) - before
    ok = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=5), timeout=5)
    assert ok.lease_id > 0 and ok.ttl_seconds >= 5
    await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=ok.lease_id), timeout=5)


@pytest.mark.parametrize(
    ("wait_ms", "wait_forever"),
    [(-1, False), (-(2**40), False), (86_400_001, False), (2**40, False), (1000, True)],
)
async def test_bad_wait_is_invalid_argument(
    stub: lock_pb2_grpc.LockServiceStub,
    lease: int,
    prefix: str,
    etcd_client: Etcd3Client,
    wait_ms: int,
    wait_forever: bool,
) -> None:
    """Acquire rejects a negative or huge wait_ms (or wait_ms with wait_forever) naming "wait_ms"."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Acquire(
            lock_pb2.AcquireRequest(name="w", lease_id=lease, wait_ms=wait_ms, wait_forever=wait_forever),
            timeout=5,
        )
    assert_invalid_field(info.value, "wait_ms")
    assert await count_keys(etcd_client, prefix) == 0
    await assert_still_serving(stub, lease)


@pytest.mark.parametrize("lease_id", [0, -1, -(2**63)])
async def test_bad_lease_id_is_invalid_argument(
    stub: lock_pb2_grpc.LockServiceStub, prefix: str, etcd_client: Etcd3Client, lease_id: int
) -> None:
    """Acquire, Release and LeaseRevoke reject a lease id <= 0 naming "lease_id"."""
    calls = [
        lambda: stub.Acquire(lock_pb2.AcquireRequest(name="l", lease_id=lease_id), timeout=5),
        lambda: stub.Release(lock_pb2.ReleaseRequest(name="l", lease_id=lease_id, token=1), timeout=5),
        lambda: stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease_id), timeout=5),
    ]
    for call in calls:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call()
        assert_invalid_field(info.value, "lease_id")
    assert await count_keys(etcd_client, prefix) == 0


async def test_acquire_on_unknown_lease_is_lease_expired(
    stub: lock_pb2_grpc.LockServiceStub, prefix: str, etcd_client: Etcd3Client
) -> None:
    """Acquire with a well-formed lease id that etcd does not know fails FAILED_PRECONDITION/LEASE_EXPIRED."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Acquire(lock_pb2.AcquireRequest(name="ghost", lease_id=0x7EADBEEF12345), timeout=5)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    detail = error_info(info.value)
    assert detail is not None and detail.reason == "LEASE_EXPIRED"
    assert await count_keys(etcd_client, prefix) == 0
    revoked = await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=0x7EADBEEF12345), timeout=5)
    assert not revoked.found


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("", {}),
        ("n" * 300, {}),
        ("a\x00b", {}),
        ("ok", {"ttl": 0.0}),
        ("ok", {"ttl": -1.0}),
        ("ok", {"ttl": float(2**40)}),
        ("ok", {"timeout": -1.0}),
    ],
    ids=["empty-name", "long-name", "nul-name", "ttl-0", "ttl-negative", "ttl-huge", "timeout-negative"],
)
async def test_client_rejects_bad_arguments(
    address: str, prefix: str, etcd_client: Etcd3Client, name: str, kwargs: dict[str, float]
) -> None:
    """The client raises InvalidArgument for bad names, TTLs and timeouts, and stays usable."""
    async with AsyncLockClient(address) as client:
        with pytest.raises(InvalidArgument):
            await client.acquire(name, **{"ttl": 5.0, "timeout": 1.0, **kwargs})
        assert await count_keys(etcd_client, prefix) == 0
        h = await client.acquire("ok", ttl=5.0, timeout=2.0)
        assert h.token > 0
        await h.release()


@pytest.mark.parametrize("name", ["\ud800", "inv:\udcff"], ids=["lone-surrogate", "argv-byte-0xff"])
async def test_client_when_name_is_not_utf8(address: str, prefix: str, etcd_client: Etcd3Client, name: str) -> None:
    """A name that cannot be encoded as UTF-8 is InvalidArgument (field "name"), not a UnicodeEncodeError.

    Asyncio and sync clients, try_acquire, acquire and describe; the client stays usable.
    """
    async with AsyncLockClient(address) as client:
        for call in (lambda: client.try_acquire(name, ttl=5.0), lambda: client.acquire(name, ttl=5.0, timeout=1.0),
                     lambda: client.describe(name)):
            with pytest.raises(InvalidArgument) as info:
                await call()
            assert info.value.field == "name" and "UTF-8" in info.value.message
        assert (await client.describe("ok")).held is False

    def sync() -> None:
        with LockClient(address) as sync_client:
            for call in (lambda: sync_client.try_acquire(name, ttl=5.0), lambda: sync_client.describe(name)):
                with pytest.raises(InvalidArgument) as info:
                    call()
                assert info.value.field == "name"
            assert sync_client.describe("ok").held is False

    await asyncio.to_thread(sync)
    assert await count_keys(etcd_client, prefix) == 0


@pytest.mark.parametrize("name", list(BAD_NAMES.values()), ids=list(BAD_NAMES))
async def test_client_refuses_bad_names_as_the_coordinator_does(
    stub: lock_pb2_grpc.LockServiceStub, address: str, name: str
) -> None:
    """The client's own check of a bad name gives the coordinator's message, word for word."""
    with pytest.raises(grpc.aio.AioRpcError) as server:
        await stub.Describe(lock_pb2.DescribeRequest(name=name), timeout=5)
    async with AsyncLockClient(address) as client:
        with pytest.raises(InvalidArgument) as local:
            await client.describe(name)
    assert local.value.field == "name"
    assert local.value.message == server.value.details()
