"""Cancelled and abandoned calls leave nothing behind (issue 14, items 1 to 3 and 10).

Each case is replayed ``FENCEPOST_CANCEL_ITERATIONS`` times (30 by default;
the closing note's counts come from a run with 200), with the cancellation
at a random moment around the event it races with. After every iteration the
state in etcd is checked, not only what the client says.
"""

from __future__ import annotations

import asyncio
import os
import random

import grpc
import pytest
from etcd3aio import Etcd3Client

from fencepost.client import AsyncLockClient
from fencepost.client.v1 import lock_pb2, lock_pb2_grpc

from fencepost.coordinator.etcd import EtcdClient
from fencepost.coordinator.process.embedded import EmbeddedEtcd
from fencepost.coordinator.recipes.lease import Leases

from .conftest import describe, describe_waiters_is, lease_ids, list_keys, wait_for
from .harness.proxy import Proxy

ITERATIONS = int(os.environ.get("FENCEPOST_CANCEL_ITERATIONS", "30"))


def _keys_of(keys: list[bytes], lease_id: int) -> list[bytes]:
    return [k for k in keys if k.endswith(f"/{lease_id:016x}".encode())]


async def test_cancelled_acquire_leaves_no_hold_and_no_wait(address: str, etcd_client: Etcd3Client,
                                                            prefix: str) -> None:
    """Item 1: an acquire cancelled around the moment it is granted leaves no key; a third client gets the lock."""
    rng = random.Random(1)
    outcomes = {"granted": 0, "cancelled": 0}
    async with AsyncLockClient(address) as a, AsyncLockClient(address) as b, AsyncLockClient(address) as c:
        for _ in range(ITERATIONS):
            held = await a.acquire("c", ttl=5)
            waiting = asyncio.ensure_future(b.acquire("c", ttl=5))
            await wait_for(lambda: _queued(etcd_client, prefix, 2), 5, what="b queued")
            await held.release()
            await asyncio.sleep(rng.uniform(0, 0.0015))  # the grant takes about this long
            waiting.cancel()
            try:
                handle = await waiting
            except asyncio.CancelledError:
                outcomes["cancelled"] += 1
                (lease,) = b._leases.leases()
                assert _keys_of(await list_keys(etcd_client, prefix), lease.lease_id) == []
                third = await c.try_acquire("c", ttl=5)  # LockHeld here was the bug
                await third.release()
            else:
                outcomes["granted"] += 1
                await handle.release()
    print(f"item 1: {ITERATIONS} iterations: {outcomes}, keys left 0, third client granted every time")
    assert outcomes["cancelled"] > 0, outcomes
    assert await list_keys(etcd_client, prefix) == []


async def _queued(etcd: Etcd3Client, prefix: str, n: int) -> bool:
    return len(await list_keys(etcd, prefix)) == n


async def test_acquire_cancelled_while_queued_is_withdrawn_at_once(address: str, etcd_client: Etcd3Client,
                                                                   prefix: str) -> None:
    """A queued acquire that is cancelled takes its key away before the cancellation completes."""
    async with AsyncLockClient(address) as a, AsyncLockClient(address) as b:
        held = await a.acquire("q", ttl=5)
        waiting = asyncio.ensure_future(b.acquire("q", ttl=5))
        await wait_for(lambda: _queued(etcd_client, prefix, 2), 5, what="b queued")
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert _keys_of(await list_keys(etcd_client, prefix), held.lease_id) == await list_keys(etcd_client, prefix)
        await held.release()


async def test_cancelled_release_is_not_a_loss(address: str, etcd_client: Etcd3Client, prefix: str) -> None:
    """Item 2: a release cancelled mid-call completes in the background; the hold is released, never lost."""
    rng = random.Random(2)
    cancelled = 0
    async with AsyncLockClient(address) as client:
        for _ in range(ITERATIONS):
            handle = await client.acquire("r", ttl=5)
            lost: list[object] = []
            handle.on_lost(lost.append)
            releasing = asyncio.ensure_future(handle.release())
            await asyncio.sleep(rng.uniform(0, 0.004))
            releasing.cancel()
            try:
                await releasing
            except asyncio.CancelledError:
                cancelled += 1
                # The call goes on: the hold is not lost; a second release() waits for the same call.
                assert handle.lost_reason is None
                if not handle.released:
                    await handle.release()
            assert handle.released and handle.lost_reason is None and lost == []
            assert await list_keys(etcd_client, prefix) == []
        print(f"item 2: {ITERATIONS} iterations, {cancelled} releases cancelled in flight, 0 reported lost")
        assert cancelled > 0
        # The slot is free again: the same name under the same lease is granted at once.
        again = await client.acquire("r", ttl=5, timeout=2)
        await again.release()


async def test_cancelled_lease_grant_leaves_no_lease(address: str, etcd_client: Etcd3Client) -> None:
    """Item 3: acquires cancelled during their lease grant or their wait leave no lease nobody knows."""
    rng = random.Random(3)
    async with AsyncLockClient(address) as holder_client:
        held = await holder_client.acquire("g", ttl=5)
        before = await lease_ids(etcd_client)
        for _ in range(ITERATIONS):
            async with AsyncLockClient(address) as client:
                await client.connect()
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(client.acquire("g", ttl=5), rng.uniform(0, 0.01))
                known = {lease.lease_id for lease in client._leases.leases()}
                assert await lease_ids(etcd_client) - before <= known
                unknown = 0
        print(f"item 3: {ITERATIONS} acquires cancelled by wait_for, leases left unknown to the client: {unknown}")
        await held.release()


async def test_coordinator_revokes_a_lease_granted_after_its_call_was_cancelled(
        etcd: EmbeddedEtcd, etcd_client: Etcd3Client) -> None:
    """The coordinator's LeaseGrant cancelled while etcd grants: the lease etcd grants is revoked."""
    layer = EtcdClient([etcd.endpoint])
    leases = Leases(layer)
    try:
        before = await lease_ids(etcd_client)
        for _ in range(ITERATIONS):
            call = asyncio.ensure_future(leases.grant_or_revoke(30))
            await asyncio.sleep(0)  # the etcd LeaseGrant is sent, not answered
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
        await wait_for(lambda: _no_new_leases(etcd_client, before), 5, what="the orphan leases revoked")
    finally:
        await layer.close()


async def _no_new_leases(etcd: Etcd3Client, before: set[int]) -> bool:
    return not (await lease_ids(etcd) - before)


async def test_withdraw_rpc(stub: lock_pb2_grpc.LockServiceStub, etcd_client: Etcd3Client, prefix: str) -> None:
    """Withdraw deletes a hold or a wait, passes the lock on, and is idempotent."""
    grant = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10))
    other = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10))
    got = await stub.Acquire(lock_pb2.AcquireRequest(name="w", lease_id=grant.lease_id, wait_ms=0))
    assert got.acquired
    waiting = stub.Acquire(lock_pb2.AcquireRequest(name="w", lease_id=other.lease_id, wait_forever=True))
    await wait_for(lambda: describe_waiters_is(stub, "w", 1), 5, what="waiter queued")
    resp = await stub.Withdraw(lock_pb2.WithdrawRequest(name="w", lease_id=grant.lease_id))
    assert (resp.found, resp.held) == (True, True) and resp.revision > got.token
    granted = await asyncio.wait_for(waiting, 5)  # the next waiter is granted
    assert granted.acquired and granted.token > got.token
    again = await stub.Withdraw(lock_pb2.WithdrawRequest(name="w", lease_id=grant.lease_id))
    assert (again.found, again.held) == (False, False)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Withdraw(lock_pb2.WithdrawRequest(name="", lease_id=grant.lease_id))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    await stub.Withdraw(lock_pb2.WithdrawRequest(name="w", lease_id=other.lease_id))
    assert await list_keys(etcd_client, prefix) == []


async def test_raw_acquire_cancelled_is_withdrawn_by_the_coordinator(
        stub: lock_pb2_grpc.LockServiceStub, etcd_client: Etcd3Client, prefix: str) -> None:
    """A raw caller that cancels a waiting Acquire and never comes back: its key goes after the reattach time."""
    holder = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=30))
    waiter = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=30))
    assert (await stub.Acquire(lock_pb2.AcquireRequest(name="k", lease_id=holder.lease_id, wait_ms=0))).acquired
    call = stub.Acquire(lock_pb2.AcquireRequest(name="k", lease_id=waiter.lease_id, wait_forever=True))
    await wait_for(lambda: describe_waiters_is(stub, "k", 1), 5, what="waiter queued")
    call.cancel()
    # Kept for REATTACH_SECONDS (2 s), then withdrawn; the lease itself lives on (30 s).
    await wait_for(lambda: describe_waiters_is(stub, "k", 0), 6, what="the abandoned wait withdrawn")
    assert waiter.lease_id in await lease_ids(etcd_client)
    assert len(await list_keys(etcd_client, prefix)) == 1


async def test_waiter_keeps_its_place_when_its_connection_is_cut(address: str, stub: lock_pb2_grpc.LockServiceStub,
                                                                 etcd_client: Etcd3Client, prefix: str) -> None:
    """Item 10: a waiter whose connection is reset reconnects with the same key and revision (its place)."""
    proxy = Proxy(address).start()
    try:
        async with AsyncLockClient(address) as a, AsyncLockClient(proxy.address) as b, \
                AsyncLockClient(address) as c:
            held = await a.acquire("p", ttl=10)
            waiting = asyncio.ensure_future(b.acquire("p", ttl=10))
            await wait_for(lambda: describe_waiters_is(stub, "p", 1), 5, what="b queued")
            later = asyncio.ensure_future(c.acquire("p", ttl=10))
            await wait_for(lambda: describe_waiters_is(stub, "p", 2), 5, what="c queued")
            first = (await describe(stub, "p")).waiters[0]
            (key,) = _keys_of(await list_keys(etcd_client, prefix), first.lease_id)
            proxy.cut()  # RST: b's Acquire call fails; b's client calls again on a new connection
            # The new call writes the same key again (a new mod revision, the same create revision).
            await wait_for(lambda: _rewritten(etcd_client, key, first.token), 10, what="b's Acquire again")
            waiters = (await describe(stub, "p")).waiters
            assert [(w.lease_id, w.token) for w in waiters][0] == (first.lease_id, first.token)
            await held.release()
            handle = await asyncio.wait_for(waiting, 10)
            assert handle.token == first.token  # granted with the revision of its first key: it kept its place
            await handle.release()
            await (await asyncio.wait_for(later, 10)).release()
    finally:
        proxy.stop()


async def _rewritten(etcd: Etcd3Client, key: bytes, create_revision: int) -> bool:
    assert etcd.kv is not None
    kvs = (await etcd.kv.get(key, timeout=5)).kvs
    assert kvs and kvs[0].create_revision == create_revision, "the waiter key was deleted or replaced"
    return bool(kvs[0].mod_revision > create_revision)
