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
