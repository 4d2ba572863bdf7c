"""The client's leases are bounded: idle ones are revoked (issue 14, item 4).

A lease is idle when no hold and no acquire uses it. The client revokes it
after ``idle_lease_timeout`` seconds, or at once when more than
``max_idle_leases`` are idle. Checked against etcd's own list of leases.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from etcd3aio import Etcd3Client

from fencepost.client import AsyncLockClient, InvalidArgument, LockClient, ResourceExhausted
from fencepost.coordinator.admission.limits import Limits
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.process.embedded import EmbeddedEtcd

from .conftest import lease_ids, wait_for


async def _gone(etcd: Etcd3Client, leases: set[int]) -> bool:
    return not (await lease_ids(etcd) & leases)


async def test_distinct_ttls_keep_at_most_max_idle_leases(address: str, etcd_client: Etcd3Client) -> None:
    """100 acquire/release with TTLs 1 to 100 s: never more than max_idle_leases idle leases (8), all gone later."""
    before = await lease_ids(etcd_client)
    async with AsyncLockClient(address, idle_lease_timeout=1.0) as client:
        for ttl in range(1, 101):
            handle = await client.acquire("many", ttl=ttl)
            await handle.release()
            assert client.lease_count <= 8 + 1  # the cap applies at once (the +1: retired, revoke in flight)
        await wait_for(lambda: client.lease_count <= 8, 5, what="the cap")
        mine = await lease_ids(etcd_client) - before
        await wait_for(lambda: _at_most(etcd_client, before, 8), 5, what="etcd keeps at most 8 of them")
        # After the idle timeout, none is left, in the client or in etcd.
        await wait_for(lambda: client.lease_count == 0, 5, what="idle leases retired")
        await wait_for(lambda: _gone(etcd_client, mine), 5, what="idle leases revoked in etcd")


async def _at_most(etcd: Etcd3Client, before: set[int], n: int) -> bool:
    return len(await lease_ids(etcd) - before) <= n


@pytest.fixture
async def one_waiter(etcd: EmbeddedEtcd, prefix: str) -> AsyncIterator[Coordinator]:
    """A coordinator that lets one Acquire at a time wait (``--max-waiters 1``)."""
    coordinator = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix, limits=Limits(max_waiters=1))
    await asyncio.wait_for(coordinator.start(), 20)
    try:
        yield coordinator
    finally:
        await asyncio.wait_for(coordinator.stop(grace=0), 20)


async def test_refused_acquires_leave_no_lease_renewed_forever(one_waiter: Coordinator,
                                                               etcd_client: Etcd3Client) -> None:
    """Acquires refused with TOO_MANY_WAITERS: their leases are idle, then revoked."""
    address = one_waiter.address
    async with AsyncLockClient(address) as holder_client, AsyncLockClient(address) as queued_client, \
            AsyncLockClient(address, idle_lease_timeout=0.5) as client:
        held = await holder_client.try_acquire("busy", ttl=30)  # trying once is not waiting
        queued = asyncio.ensure_future(queued_client.acquire("busy", ttl=30))  # the one wait allowed
        await wait_for(lambda: _waiters_are(holder_client, "busy", 1), 10, what="the one waiting acquire")
        # every waiting acquire is refused
        for ttl in range(5, 10):
            with pytest.raises(ResourceExhausted):
                await client.acquire("busy", ttl=ttl)
        granted = {lease.lease_id for lease in client._leases.leases()}
        assert len(granted) == 5
        await wait_for(lambda: client.lease_count == 0, 5, what="the refused acquires' leases retired")
        await wait_for(lambda: _gone(etcd_client, granted), 5, what="and revoked")
        await held.release()
        await (await queued).release()


async def _waiters_are(client: AsyncLockClient, name: str, n: int) -> bool:
    return (await client.describe(name)).waiter_count == n


async def test_a_lease_in_use_is_never_retired(address: str, etcd_client: Etcd3Client) -> None:
    """A lease with a hold, or with an acquire waiting, stays while idle ones around it are retired."""
    async with AsyncLockClient(address) as other, AsyncLockClient(address, idle_lease_timeout=0.2) as client:
        held = await client.acquire("held", ttl=5)
        blocker = await other.acquire("queue", ttl=5)
        waiting = asyncio.ensure_future(client.acquire("queue", ttl=6))
        idle = await client.acquire("idle", ttl=7)
        await idle.release()
        idle_lease = idle.lease_id
        await wait_for(lambda: _gone(etcd_client, {idle_lease}), 5, what="the idle lease revoked")
        assert held.is_valid() and held.lease_id in await lease_ids(etcd_client)
        assert not waiting.done()
        await blocker.release()
        handle = await asyncio.wait_for(waiting, 5)  # its lease was kept while it waited
        assert handle.is_valid()
        await handle.release()
        await held.release()


async def test_max_idle_leases_zero_revokes_at_once(address: str, etcd_client: Etcd3Client) -> None:
    """max_idle_leases=0: a lease is revoked as soon as its last hold is released."""
    async with AsyncLockClient(address, max_idle_leases=0) as client:
        handle = await client.acquire("once", ttl=5)
        await handle.release()
        await wait_for(lambda: _gone(etcd_client, {handle.lease_id}), 5, what="the lease revoked")
        assert client.lease_count == 0
        again = await client.acquire("once", ttl=5)  # a new lease
        assert again.lease_id != handle.lease_id and again.is_valid()
        await again.release()


def test_sync_client_lease_count(coordinator_process: Any) -> None:
    """The sync client shows the pool's size too."""
    with LockClient(coordinator_process.start(), max_idle_leases=1) as client:
        with client.lock("a", ttl=5), client.lock("b", ttl=6):
            assert client.lease_count == 2
        assert client.lease_count <= 2


@pytest.mark.parametrize("kwargs, field", [
    ({"idle_lease_timeout": 0}, "idle_lease_timeout"),
    ({"idle_lease_timeout": float("inf")}, "idle_lease_timeout"),
    ({"idle_lease_timeout": "5"}, "idle_lease_timeout"),
    ({"max_idle_leases": -1}, "max_idle_leases"),
    ({"max_idle_leases": 1001}, "max_idle_leases"),
    ({"max_idle_leases": 2.0}, "max_idle_leases"),
    ({"max_idle_leases": True}, "max_idle_leases"),
])
def test_idle_lease_arguments(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        AsyncLockClient("127.0.0.1:1", **kwargs)
    assert err.value.field == field
