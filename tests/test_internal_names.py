"""Elections and semaphores are locks with internal names (client/v1/kinds.py): they never show up as locks.

The holds are made by calling the coordinator's LockManager with the internal
names directly, as the election and semaphore services do; then the listings
a caller or an operator sees are checked: ListLocks (and so ``fencepost
locks``), Describe, ServerInfo's counts, ListSessions' holds and waits, and
the lock metrics' labels.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from fencepost.client.v1 import kinds, lock_pb2
from fencepost.coordinator.recipes.sessions import list_sessions, shown
from fencepost.coordinator.telemetry.metrics import LockMetrics

from .conftest import assert_invalid_field, wait_for
from .owned_stub import OwnedStub
from .test_admin import pki, policed  # noqa: F401  (fixtures: a coordinator with mTLS and an access policy)
from .tls_helpers import open_channel

ELECTION = kinds.election_lock("e")
QUEUE = kinds.semaphore_queue("s")
SLOT = kinds.semaphore_slot("s", 0)


async def _lease(stub: OwnedStub) -> int:
    return int((await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=30), timeout=5)).lease_id)


async def test_elections_and_semaphores_are_not_listed_described_or_counted_as_locks(
    coordinator: Any, stub: OwnedStub
) -> None:
    """With a lock, an election (leader and candidate) and a semaphore permit held, only the lock is a lock."""
    locks = coordinator.locks
    holder, leader, candidate, permit = [await _lease(stub) for _ in range(4)]
    assert (await stub.Acquire(lock_pb2.AcquireRequest(name="a", lease_id=holder), timeout=5)).acquired
    assert (await locks.acquire(ELECTION, leader, 0.0)).acquired
    waiting = asyncio.create_task(locks.acquire(ELECTION, candidate, None))
    try:
        assert (await locks.acquire(QUEUE, permit, 0.0)).acquired
        assert (await locks.acquire(SLOT, permit, 0.0)).acquired

        async def candidate_queued() -> bool:
            return (await locks.describe(ELECTION)).waiter_count == 1

        await wait_for(candidate_queued, 10, what="the election's candidate")

        listed = await stub.ListLocks(lock_pb2.ListLocksRequest(), timeout=5)
        assert [lock.name for lock in listed.locks] == ["a"]
        assert not listed.next_page_token
        paged = await stub.ListLocks(lock_pb2.ListLocksRequest(page_size=1), timeout=5)
        assert [lock.name for lock in paged.locks] == ["a"]

        for internal in (ELECTION, QUEUE, SLOT):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Describe(lock_pb2.DescribeRequest(name=internal), timeout=5)
            assert_invalid_field(info.value, "name")

        info_resp = await stub.ServerInfo(lock_pb2.ServerInfoRequest(), timeout=5)
        assert (info_resp.contender_keys, info_resp.held_locks, info_resp.waiters) == (1, 1, 0)

        page = await list_sessions(locks.etcd, coordinator.keys, 0, "")
        seen = {s.lease_id: (s.holds, s.waits) for s in page.sessions}
        assert seen[holder] == (["a"], [])
        assert seen[leader] == (["election:e"], [])
        assert seen[candidate] == ([], ["election:e"])
        assert seen[permit] == (["semaphore:s#0"], [])
    finally:
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)


def test_sessions_show_elections_and_semaphores_by_kind() -> None:
    """A semaphore queue place is a wait unless the lease holds a permit of it; other internal names are hidden."""
    assert shown(["b", "a", SLOT, ELECTION], [QUEUE, "c"]) == (["a", "b", "election:e", "semaphore:s#0"], ["c"])
    assert shown([QUEUE], []) == ([], ["semaphore:s"])
    assert shown([], [QUEUE, kinds.semaphore_slot("s", 2)]) == ([], ["semaphore:s#2"])
    assert shown([kinds.semaphore_permits_record("s")], []) == ([], [])


def test_lock_metrics_label_elections_and_semaphores_by_their_own_names() -> None:
    """Elections' and semaphores' holds count under the prefix of the election's or semaphore's name, as a
    lock of that name would (the trial's `--metrics-name-prefix jobs/` with an election jobs/e)."""
    metrics = LockMetrics(CollectorRegistry(), ["e", "s", "jobs/"])
    assert metrics.prefix_of("jobs/x") == "jobs/"
    assert (metrics.prefix_of(ELECTION), metrics.prefix_of(QUEUE), metrics.prefix_of(SLOT)) == ("e", "s", "s")
    assert metrics.prefix_of(kinds.election_lock("jobs/e")) == "jobs/"
    assert metrics.prefix_of(kinds.semaphore_slot("jobs/s", 1)) == "jobs/"
    assert metrics.prefix_of(kinds.election_lock("other")) == ""
    with pytest.raises(ValueError):
        LockMetrics(CollectorRegistry(), [kinds.INTERNAL])


async def test_admin_revoke_refuses_an_internal_name(policed: Any, pki: Any) -> None:
    """AdminRevoke names a lock: an election's internal name is INVALID_ARGUMENT and its leader keeps its lease."""
    async with open_channel(policed.address, pki.operator.credentials) as channel, \
            open_channel(policed.address, pki.billing.credentials) as billing:
        operator = OwnedStub(channel)
        leader = await _lease(OwnedStub(billing))
        # The lock algorithm is called directly (the Acquire RPC refuses internal names): it hands out tokens only
        # once the coordinator has read its token record, which start() leaves running (the RPCs wait for it).
        await policed.locks.tokens.ready()
        assert (await policed.locks.acquire(ELECTION, leader, 0.0)).acquired
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await operator.AdminRevoke(lock_pb2.AdminRevokeRequest(name=ELECTION), timeout=10)
        assert_invalid_field(info.value, "name")
        assert await policed.locks.lease_alive(leader)
        assert (await policed.locks.describe(ELECTION)).holder.lease_id == leader
