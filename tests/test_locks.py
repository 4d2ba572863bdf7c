"""Lock behaviour against a real etcd and an in-process coordinator."""

from __future__ import annotations

import asyncio
import contextlib
import time

import grpc
import pytest
from etcd3aio import Etcd3Client

from fencepost.client import AsyncLockClient, LockClient, LockHeld, LockTimeout, NotHolder, StaleTokenError
from fencepost.client.errors import from_rpc_error
from fencepost.client.v1 import lock_pb2, lock_pb2_grpc

from .conftest import count_keys, describe, describe_waiters_is, error_info, lease_ids, list_keys, wait_for
from .owned_stub import adopt


async def test_successive_holders_get_strictly_larger_tokens(address: str) -> None:
    """Each new holder of a name gets a fencing token larger than the previous holder's."""
    tokens: list[int] = []
    async with AsyncLockClient(address) as first, AsyncLockClient(address) as second:
        for i in range(6):
            client = first if i % 2 == 0 else second
            h = await client.acquire("tokens", ttl=10.0, timeout=5.0)
            tokens.append(h.token)
            await h.release()
    assert all(t > 0 for t in tokens)
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), tokens


async def test_waiters_are_granted_in_arrival_order(address: str, stub: lock_pb2_grpc.LockServiceStub) -> None:
    """Five queued waiters are granted first come, first served, each with a larger token."""
    name = "fifo"
    granted: list[tuple[int, int]] = []
    tasks: list[asyncio.Task[None]] = []
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(AsyncLockClient(address)) for _ in range(6)]
        holder = await clients[0].acquire(name, ttl=10.0, timeout=5.0)

        async def wait_then_release(index: int) -> None:
            h = await clients[index].acquire(name, ttl=10.0, timeout=30.0)
            granted.append((index, h.token))
            await asyncio.sleep(0.02)
            await h.release()

        for i in range(1, 6):
            tasks.append(asyncio.create_task(wait_then_release(i)))

            await wait_for(lambda n=i: describe_waiters_is(stub, name, n), 10, what=f"waiter {i} to be queued")
        desc = await describe(stub, name)
        assert desc.held and desc.holder.token == holder.token
        assert len(desc.waiters) == 5
        await holder.release()
        try:
            await asyncio.wait_for(asyncio.gather(*tasks), 20)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    assert [i for i, _ in granted] == [1, 2, 3, 4, 5]
    tokens = [holder.token] + [t for _, t in granted]
    assert tokens == sorted(tokens) and len(set(tokens)) == 6, tokens


async def test_try_acquire_on_held_lock_raises_lock_held_and_leaves_no_key(
    address: str, prefix: str, etcd_client: Etcd3Client
) -> None:
    """try_acquire on a held lock raises LockHeld naming the holder, reason LOCK_HELD (also when this client
    holds it), and queues nothing in etcd."""
    async with AsyncLockClient(address) as a, AsyncLockClient(address) as b:
        h = await a.acquire("held", ttl=10.0, timeout=5.0)
        assert await count_keys(etcd_client, prefix) == 1
        with pytest.raises(LockHeld) as info:
            await b.try_acquire("held", ttl=10.0)
        assert info.value.holder_token == h.token
        assert info.value.holder_lease_id == h.lease_id
        assert info.value.name == "held"
        assert info.value.reason == "LOCK_HELD" and "reason=LOCK_HELD" in str(info.value)
        with pytest.raises(LockHeld) as here:
            await a.try_acquire("held", ttl=10.0)
        assert here.value.reason == "LOCK_HELD"
        assert await count_keys(etcd_client, prefix) == 1
        await h.release()
        assert await count_keys(etcd_client, prefix) == 0
        h2 = await b.try_acquire("held", ttl=10.0)
        assert h2.token > h.token
        await h2.release()


async def test_acquire_that_times_out_raises_lock_timeout_and_leaves_no_key(
    address: str, prefix: str, etcd_client: Etcd3Client
) -> None:
    """A blocking acquire past its timeout raises LockTimeout on time and removes its waiter key."""
    async with AsyncLockClient(address) as a, AsyncLockClient(address) as b:
        h = await a.acquire("slow", ttl=10.0, timeout=5.0)
        started = time.monotonic()
        with pytest.raises(LockTimeout):
            await b.acquire("slow", ttl=10.0, timeout=0.5)
        elapsed = time.monotonic() - started
        assert 0.4 <= elapsed <= 1.0, elapsed
        assert await count_keys(etcd_client, prefix) == 1
        await h.release()
        assert await count_keys(etcd_client, prefix) == 0


async def test_raw_acquire_timeout_is_deadline_exceeded_and_leaves_no_key(
    stub: lock_pb2_grpc.LockServiceStub, prefix: str, etcd_client: Etcd3Client
) -> None:
    """Acquire with wait_ms on a held lock fails DEADLINE_EXCEEDED/ACQUIRE_TIMEOUT and deletes its key."""
    a = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10), timeout=5)
    b = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10), timeout=5)
    try:
        got = await stub.Acquire(lock_pb2.AcquireRequest(name="raw", lease_id=a.lease_id), timeout=5)
        assert got.acquired and got.token > 0
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Acquire(lock_pb2.AcquireRequest(name="raw", lease_id=b.lease_id, wait_ms=300), timeout=5)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        detail = error_info(info.value)
        assert detail is not None and detail.reason == "ACQUIRE_TIMEOUT"
        assert await count_keys(etcd_client, prefix) == 1
        # Try once: not acquired, holder reported, nothing queued.
        tried = await stub.Acquire(lock_pb2.AcquireRequest(name="raw", lease_id=b.lease_id), timeout=5)
        assert not tried.acquired
        assert tried.holder.lease_id == a.lease_id and tried.holder.token == got.token
        assert await count_keys(etcd_client, prefix) == 1
        # Idempotent per (lease, name): the same token again.
        again = await stub.Acquire(lock_pb2.AcquireRequest(name="raw", lease_id=a.lease_id), timeout=5)
        assert again.acquired and again.token == got.token
        assert await count_keys(etcd_client, prefix) == 1
    finally:
        for lease in (a.lease_id, b.lease_id):
            await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease), timeout=5)
    assert await count_keys(etcd_client, prefix) == 0


async def test_cancelled_acquire_leaves_no_key(
    address: str, prefix: str, etcd_client: Etcd3Client
) -> None:
    """Cancelling a waiting acquire removes its waiter key from etcd."""
    async with AsyncLockClient(address) as a, AsyncLockClient(address) as b:
        h = await a.acquire("cancel", ttl=10.0, timeout=5.0)
        task = asyncio.create_task(b.acquire("cancel", ttl=10.0, timeout=30.0))

        async def two_keys() -> bool:
            return await count_keys(etcd_client, prefix) == 2

        await wait_for(two_keys, 10, what="the waiter key")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

        async def one_key() -> bool:
            return await count_keys(etcd_client, prefix) == 1

        await wait_for(one_key, 5, what="the waiter key to go")
        await h.release()
        # The lock is free for b again, with no ghost ahead of it.
        h2 = await b.acquire("cancel", ttl=10.0, timeout=2.0)
        assert h2.token > h.token
        await h2.release()


async def test_names_a_and_a_slash_b_are_independent(
    address: str, stub: lock_pb2_grpc.LockServiceStub
) -> None:
    """Locks "a" and "a/b" can be held at once by different clients."""
    async with AsyncLockClient(address) as one, AsyncLockClient(address) as two:
        ha = await one.try_acquire("a", ttl=10.0)
        hab = await two.try_acquire("a/b", ttl=10.0)
        hb = await two.try_acquire("a/", ttl=10.0)
        da, dab = await describe(stub, "a"), await describe(stub, "a/b")
        assert da.held and da.holder.lease_id == ha.lease_id and da.waiter_count == 0
        assert dab.held and dab.holder.lease_id == hab.lease_id and dab.waiter_count == 0
        assert ha.is_valid() and hab.is_valid() and hb.is_valid()
        await ha.release()
        assert (await describe(stub, "a/b")).held
        await hab.release()
        await hb.release()


async def test_release_with_wrong_token_or_lease_fails_precondition(
    stub: lock_pb2_grpc.LockServiceStub,
) -> None:
    """Release by a non-holder fails NOT_HOLDER, with an old token STALE_TOKEN, and the lock stays held."""
    a = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10), timeout=5)
    b = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10), timeout=5)
    try:
        first = await stub.Acquire(lock_pb2.AcquireRequest(name="rel", lease_id=a.lease_id), timeout=5)
        await stub.Release(lock_pb2.ReleaseRequest(name="rel", lease_id=a.lease_id, token=first.token), timeout=5)
        second = await stub.Acquire(lock_pb2.AcquireRequest(name="rel", lease_id=a.lease_id), timeout=5)
        assert second.token > first.token
        with pytest.raises(grpc.aio.AioRpcError) as stale:
            await stub.Release(
                lock_pb2.ReleaseRequest(name="rel", lease_id=a.lease_id, token=first.token), timeout=5
            )
        assert stale.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        detail = error_info(stale.value)
        assert detail is not None and detail.reason == "STALE_TOKEN"
        with pytest.raises(grpc.aio.AioRpcError) as other:
            await stub.Release(
                lock_pb2.ReleaseRequest(name="rel", lease_id=b.lease_id, token=second.token), timeout=5
            )
        assert other.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        detail = error_info(other.value)
        assert detail is not None and detail.reason == "NOT_HOLDER"
        desc = await describe(stub, "rel")
        assert desc.held and desc.holder.token == second.token
    finally:
        for lease in (a.lease_id, b.lease_id):
            await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease), timeout=5)


async def test_lease_revoke_ends_the_hold_and_tells_the_holder(
    address: str, stub: lock_pb2_grpc.LockServiceStub
) -> None:
    """Revoking the holder's lease from outside passes the lock on and fires the handle's lost event."""
    async with AsyncLockClient(address) as a, AsyncLockClient(address) as b:
        h = await a.acquire("revoked", ttl=10.0, timeout=5.0)
        adopt(h)  # the test revokes it as its owner (the holder itself could)
        waiter = asyncio.create_task(b.acquire("revoked", ttl=10.0, timeout=10.0))
        await wait_for(lambda: describe_waiters_is(stub, "revoked", 1), 10, what="the waiter")
        found = await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=h.lease_id), timeout=5)
        assert found.found
        h2 = await asyncio.wait_for(waiter, 5)
        assert h2.token > h.token
        await asyncio.wait_for(h.lost.wait(), 5)
        assert not h.is_valid()
        await h2.release()


async def test_deleting_the_holder_key_tells_the_holder(
    address: str, prefix: str, etcd_client: Etcd3Client
) -> None:
    """An operator deleting the holder's key in etcd ends the hold, and the handle reports it lost."""
    async with AsyncLockClient(address) as a:
        h = await a.acquire("deleted", ttl=10.0, timeout=5.0)
        keys = await list_keys(etcd_client, prefix)
        assert len(keys) == 1
        assert etcd_client.kv is not None
        await etcd_client.kv.delete(keys[0], timeout=5)
        await asyncio.wait_for(h.lost.wait(), 5)
        assert not h.is_valid()


async def test_lock_context_manager_releases_on_exit(
    address: str, prefix: str, etcd_client: Etcd3Client
) -> None:
    """client.lock() holds the lock inside the block and releases it on exit."""
    async with AsyncLockClient(address) as client:
        async with client.lock("ctx", ttl=10.0, timeout=5.0) as h:
            assert h.is_valid() and h.token > 0 and h.name == "ctx"
            assert 0 < h.valid_for() <= 10.0
            h.check()
            assert await count_keys(etcd_client, prefix) == 1
        assert await count_keys(etcd_client, prefix) == 0


@pytest.mark.slow
async def test_many_acquire_release_cycles_leave_no_keys_or_leases(
    address: str, prefix: str, etcd_client: Etcd3Client
) -> None:
    """2,000 acquire/release cycles leave no lock keys and no leases once the client is closed."""
    before = await lease_ids(etcd_client)
    tokens: list[int] = []
    async with AsyncLockClient(address) as client:
        for i in range(2000):
            h = await client.acquire(f"cycle-{i % 7}", ttl=10.0, timeout=5.0)
            tokens.append(h.token)
            await h.release()
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    assert await count_keys(etcd_client, prefix) == 0
    leftover = await lease_ids(etcd_client) - before
    assert not leftover, f"leases left in etcd: {sorted(leftover)}"



async def test_sync_client_works_from_a_thread(address: str) -> None:
    """LockClient (the sync twin) acquires, reports LockHeld, and releases from a plain thread."""

    def work() -> None:
        with LockClient(address) as a, LockClient(address) as b:
            with a.lock("sync", ttl=5.0, timeout=5.0) as h:
                assert h.is_valid() and h.token > 0
                with pytest.raises(LockHeld):
                    b.try_acquire("sync", ttl=5.0)
            h2 = b.try_acquire("sync", ttl=5.0)
            assert h2.token > h.token
            h2.release()

    await asyncio.wait_for(asyncio.to_thread(work), 30)


async def test_release_refusals_carry_current_token_to_the_client(stub: lock_pb2_grpc.LockServiceStub) -> None:
    """STALE_TOKEN and NOT_HOLDER refusals reach the Python client's errors with the current token filled."""
    a = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10), timeout=5)
    b = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10), timeout=5)
    try:
        first = await stub.Acquire(lock_pb2.AcquireRequest(name="cur", lease_id=a.lease_id), timeout=5)
        await stub.Release(lock_pb2.ReleaseRequest(name="cur", lease_id=a.lease_id, token=first.token), timeout=5)
        second = await stub.Acquire(lock_pb2.AcquireRequest(name="cur", lease_id=a.lease_id), timeout=5)
        with pytest.raises(grpc.aio.AioRpcError) as stale:
            await stub.Release(lock_pb2.ReleaseRequest(name="cur", lease_id=a.lease_id, token=first.token), timeout=5)
        err = from_rpc_error(stale.value)
        assert isinstance(err, StaleTokenError)
        assert (err.reason, err.token, err.current_token) == ("STALE_TOKEN", first.token, second.token)
        with pytest.raises(grpc.aio.AioRpcError) as other:
            await stub.Release(lock_pb2.ReleaseRequest(name="cur", lease_id=b.lease_id, token=second.token), timeout=5)
        err = from_rpc_error(other.value)
        assert isinstance(err, NotHolder) and not isinstance(err, StaleTokenError)
        assert (err.reason, err.token, err.current_token) == ("NOT_HOLDER", second.token, second.token)
    finally:
        for lease in (a.lease_id, b.lease_id):
            await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease), timeout=5)
