"""No token at or below T after ``admin recover-tokens --above T``, not even before a coordinator's next record check.

The recovery deletes every lock key and raises the token floor in one Txn; a
coordinator that was serving learns the new floor at its next read of the
token record (the health monitor's, every second). Every Txn that may create
a contender key compares the record's mod revision with the one the floor in
use was read from (:mod:`fencepost.coordinator.recipes.floor_guard`): a key
is never created under a floor that is no longer in force. The health
monitor's interval is made an hour here, so that no check runs between the
recovery and the grants: without the compare, each grant got the old floor
(tokens <= T).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

import fencepost.client as fc
from fencepost.client.v1.keys import Keys
from fencepost.coordinator.etcd import EtcdClient
from fencepost.coordinator.process import health
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.process.embedded import EmbeddedEtcd
from fencepost.coordinator.recipes.tokens import TokenFloor, recover

from .conftest import wait_for
from .etcd_restore import SERVING, health_is

#: T above the level the shared etcd is at (its revision plus the floor 0): the old floor gives tokens <= T.
ABOVE = 10**6


@pytest.fixture
async def serving(etcd: EmbeddedEtcd, prefix: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Coordinator]:
    """A serving coordinator whose health monitor has checked the token record once and will not again (an hour)."""
    monkeypatch.setattr(health, "HEALTH_INTERVAL", 3600.0)
    coordinator = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix)
    await asyncio.wait_for(coordinator.start(), 20)
    try:
        await wait_for(lambda: health_is(coordinator.address, SERVING), 10, 0.05, "health SERVING (the first check)")
        yield coordinator
    finally:
        await asyncio.wait_for(coordinator.stop(0), 20)


async def recovered(etcd: EmbeddedEtcd, prefix: str, floor: TokenFloor) -> int:
    """Run ``recover-tokens --above T`` from another etcd client; T, once it is above the old floor's reach."""
    layer = EtcdClient([etcd.endpoint])
    try:
        done = await recover(layer, Keys(prefix), ABOVE)
    finally:
        await layer.close()
    assert done.revision + floor.floor < ABOVE < done.lowest_token, (done, floor.floor)
    assert floor.floor == 0  # the coordinator has not read the record since
    return ABOVE


async def test_grants_when_tokens_were_recovered_since_the_last_record_check(
        etcd: EmbeddedEtcd, prefix: str, serving: Coordinator) -> None:
    """A lock (try once and waited for), a semaphore permit and a leadership granted right after a recovery,
    before any record check, all get tokens above T, strictly increasing per name."""
    assert serving.tokens is not None
    async with fc.AsyncLockClient(serving.address) as client:
        before = await client.acquire("x", ttl=10.0, timeout=5.0)  # serving, never refused
        await before.release()
        above = await recovered(etcd, prefix, serving.tokens)

        first = await client.try_acquire("x", ttl=10.0)
        waited = asyncio.ensure_future(client.acquire("x", ttl=20.0, timeout=10.0))  # another lease: queued
        await wait_for(lambda: serving.locks is not None and serving.locks.waiting == 1, 5, 0.01, "the queued acquire")
        await first.release()
        second = await waited
        permit = await client.semaphore("s", 2).acquire(timeout=5.0)
        leadership = await client.campaign("e", b"leader", timeout=5.0)
        granted = {"lock": first.token, "lock after a wait": second.token, "permit": permit.token,
                   "leadership": leadership.token}
        assert min(granted.values()) > above, (granted, above)
        assert before.token < first.token < second.token, granted
        assert serving.tokens.floor > 0  # adopted by the grant whose compare failed, not by the health monitor
        for handle in (second, permit):
            await handle.release()
        await leadership.resign()
