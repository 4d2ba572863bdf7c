"""Acquire when the lease is declared lost while the Acquire call is in flight."""

from __future__ import annotations

import asyncio

from etcd3aio import Etcd3Client

from fencepost.client import AsyncLockClient
from fencepost.client.errors import REASON_DEADLINE

from .conftest import describe_waiters_is, list_keys, wait_for


async def test_acquire_when_lease_lost_while_waiting(
    address: str, stub: object, etcd_client: Etcd3Client, prefix: str
) -> None:
    """A grant that arrives after the local lease was declared lost is given back, and acquire retries on a new lease."""
    async with AsyncLockClient(address) as holder_client, AsyncLockClient(address) as waiter_client:
        held = await holder_client.acquire("x", ttl=5)
        waiting = asyncio.ensure_future(waiter_client.acquire("x", ttl=5, timeout=10))
        await wait_for(lambda: describe_waiters_is(stub, "x", 1), 5, what="the waiter queued")  # type: ignore[arg-type]
        # As if its keepalives went unanswered: the client's lease pool declares the lease lost.
        (old_lease,) = waiter_client._leases.leases()
        waiter_client._leases.lose(old_lease, REASON_DEADLINE)
        await held.release()
        handle = await asyncio.wait_for(waiting, 10)
        assert handle.lease_id != old_lease.lease_id
        assert handle.is_valid()
        assert handle.token > held.token
        # The grant made to the lost lease was released: only the new hold is left.
        await wait_for(lambda: _only_key_of(etcd_client, prefix, handle.lease_id), 5, what="old key released")
        await handle.release()


async def _only_key_of(etcd: Etcd3Client, prefix: str, lease_id: int) -> bool:
    keys = await list_keys(etcd, prefix)
    return [k.rsplit(b"/", 1)[1] for k in keys] == [f"{lease_id:016x}".encode()]


async def test_acquire_with_timeout_0_tries_once(address: str) -> None:
    """``acquire(timeout=0)`` makes one try: granted when the lock is free, LockTimeout naming the holder when
    it is held. Its calls still get the usual time to be answered (before, a budget of 0 s failed them with
    misleading errors: an etcd timeout, "held by this client"; found by a fresh-user trial)."""
    from fencepost.client import LockClient, LockTimeout

    async with AsyncLockClient(address) as client, AsyncLockClient(address) as other:
        for i in range(5):
            handle = await client.acquire(f"free/{i}", ttl=5, timeout=0)
            assert handle.token > 0
            await handle.release()
        tiny = await client.acquire("free/tiny", ttl=5, timeout=0.0001)
        await tiny.release()
        held = await client.acquire("held", ttl=5)
        try:
            await other.acquire("held", ttl=5, timeout=0)
            raise AssertionError("granted a held lock")
        except LockTimeout as err:
            assert err.reason == "ACQUIRE_TIMEOUT" and err.name == "held"
            assert f"token {held.token}" in str(err)
        await held.release()

    def sync() -> None:
        with LockClient(address) as client:
            handle = client.acquire("sync/free", ttl=5, timeout=0)
            assert handle.token > 0
            handle.release()

    await asyncio.to_thread(sync)
