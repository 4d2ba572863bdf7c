"""LeaseKeepAlive (issue 24): one keepalive without a stream, for the HTTP API and scripts. It renews the lease
as a keepalive on a stream does, only for the lease's owner, and says LEASE_EXPIRED once the lease is gone;
like a keepalive on an open stream it is served while the coordinator drains. Real etcd, real coordinator."""

from __future__ import annotations

import grpc
import pytest
from etcd3aio import Etcd3Client

from fencepost.client.v1 import lock_pb2, lock_pb2_grpc
from fencepost.coordinator.process.coordinator import Coordinator

from .conftest import assert_invalid_field, error_info
from .owned_stub import OwnedStub


async def test_lease_keepalive_renews_the_lease_in_etcd(stub: OwnedStub, etcd_client: Etcd3Client) -> None:
    """The answer is the TTL etcd reset the lease to, and etcd's TTL left is back at the granted TTL."""
    lease = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=30), timeout=5)
    assert etcd_client.lease is not None
    answer = await stub.LeaseKeepAlive(lock_pb2.LeaseKeepAliveRequest(lease_id=lease.lease_id), timeout=5)
    assert (answer.lease_id, answer.ttl_seconds) == (lease.lease_id, lease.ttl_seconds)
    left = await etcd_client.lease.time_to_live(lease.lease_id, timeout=5)
    assert lease.ttl_seconds - 1 <= left.TTL <= lease.ttl_seconds
    await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease.lease_id), timeout=5)


async def test_lease_keepalive_when_the_lease_is_gone_is_lease_expired(stub: OwnedStub) -> None:
    """A revoked lease: FAILED_PRECONDITION / LEASE_EXPIRED naming the lease."""
    lease = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=30), timeout=5)
    await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease.lease_id), timeout=5)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.LeaseKeepAlive(lock_pb2.LeaseKeepAliveRequest(lease_id=lease.lease_id), timeout=5)
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    info = error_info(raised.value)
    assert info is not None and info.reason == "LEASE_EXPIRED" and info.metadata["lease_id"] == str(lease.lease_id)


async def test_lease_keepalive_when_not_the_owner_is_refused(stub: OwnedStub, channel: grpc.aio.Channel) -> None:
    """Another caller (no secret, or a wrong one) gets PERMISSION_DENIED / NOT_LEASE_OWNER."""
    lease = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=30), timeout=5)
    other = lock_pb2_grpc.LockServiceStub(channel)
    for metadata in ((), (("fencepost-lease-secret", "not-its-secret"),)):
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await other.LeaseKeepAlive(lock_pb2.LeaseKeepAliveRequest(lease_id=lease.lease_id), metadata=metadata,
                                       timeout=5)
        assert raised.value.code() == grpc.StatusCode.PERMISSION_DENIED
        info = error_info(raised.value)
        assert info is not None and info.reason == "NOT_LEASE_OWNER"
    await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease.lease_id), timeout=5)


async def test_lease_keepalive_when_lease_id_is_bad_is_invalid_field(stub: OwnedStub) -> None:
    """lease_id 0 or negative: INVALID_ARGUMENT naming lease_id."""
    for lease_id in (0, -5):
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.LeaseKeepAlive(lock_pb2.LeaseKeepAliveRequest(lease_id=lease_id), timeout=5)
        assert_invalid_field(raised.value, "lease_id")


async def test_lease_keepalive_while_draining_is_served(coordinator: Coordinator, stub: OwnedStub) -> None:
    """While the coordinator drains, a new lease is refused (DRAINING) but a keepalive of a held one is served."""
    lease = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=30), timeout=5)
    assert await coordinator.drain(30) == "no_streams"
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=30), timeout=5)
    info = error_info(raised.value)
    assert info is not None and info.reason == "DRAINING"
    answer = await stub.LeaseKeepAlive(lock_pb2.LeaseKeepAliveRequest(lease_id=lease.lease_id), timeout=5)
    assert answer.ttl_seconds == lease.ttl_seconds
    await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease.lease_id), timeout=5)
