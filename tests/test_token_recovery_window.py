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
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest
from etcd3aio import Etcd3Client  # type: ignore[import-untyped]

import fencepost.client as fc
from fencepost.client.v1.etcd import rpc_pb2
from fencepost.client.v1.keys import Keys
from fencepost.coordinator.etcd import EtcdClient, Stubs
from fencepost.coordinator.process import health
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.process.embedded import EmbeddedEtcd
from fencepost.coordinator.recipes.lock import LockManager
from fencepost.coordinator.recipes.tokens import TokenFloor, recover
from fencepost.coordinator.recipes.watch import DeleteWatcher

from .conftest import list_keys, wait_for
from .etcd_restore import SERVING, health_is
from .fake_etcd import rpc_error

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


# ---------------------------------------------------------------- the guard's branches, on the shared etcd


class Interposed:
    """The real etcd stubs; a step of the test runs around the next guarded Txn (one that compares the token
    record): before it is sent, or after etcd applied it, its answer then lost (UNAVAILABLE)."""

    def __init__(self, record: bytes) -> None:
        self.record = record
        self.before: Callable[[], Awaitable[None]] | None = None
        self.after: Callable[[], Awaitable[None]] | None = None
        self.guarded = 0  # guarded Txns sent
        self.batches = 0  # Txns of several guarded Txns (etcd/batch.py)
        self.batching = False  # whether the etcd layer batches lock Txns

    def factory(self, channel: grpc.aio.Channel) -> Stubs:
        real = Stubs.on(channel)
        return Stubs(kv=_Kv(self, real.kv), lease=real.lease, watch=real.watch, auth=real.auth,
                     maintenance=real.maintenance)


class _Kv:
    def __init__(self, plan: Interposed, real: Any) -> None:
        self._plan, self._real = plan, real

    def __getattr__(self, method: str) -> Any:
        return getattr(self._real, method)

    async def Txn(self, request: rpc_pb2.TxnRequest, **kwargs: Any) -> Any:  # noqa: N802 (etcd's method name)
        plan = self._plan
        nested = len(request.success) == 1 and request.success[0].WhichOneof("request") == "request_txn"
        if len(request.success) > 1 and all(op.WhichOneof("request") == "request_txn" for op in request.success):
            plan.batches += 1
        if not nested or [bytes(c.key) for c in request.compare] != [plan.record]:
            return await self._real.Txn(request, **kwargs)  # not a guarded Txn (a read, the record's own)
        plan.guarded += 1
        if plan.before is not None:
            await plan.before()
        answer = await self._real.Txn(request, **kwargs)
        if plan.after is not None:
            after, plan.after = plan.after, None
            await after()
            raise rpc_error(grpc.StatusCode.UNAVAILABLE)
        return answer


@pytest.fixture(params=[0, 64], ids=["alone", "batched"])
async def guarded(etcd: EmbeddedEtcd, prefix: str, request: pytest.FixtureRequest
                  ) -> AsyncIterator[tuple[Interposed, LockManager, int]]:
    """A lock module whose token floor has read the record, on etcd stubs that interpose; and a lease."""
    keys = Keys(prefix)
    stubs = Interposed(keys.token_record)
    layer = EtcdClient([etcd.endpoint], stubs=stubs.factory, batch_max=request.param)
    stubs.batching = request.param > 1
    floor = TokenFloor(layer, keys)
    layer.headers = floor
    locks = LockManager(layer, keys, DeleteWatcher(layer, keys), tokens=floor)
    try:
        await floor.ready()
        yield stubs, locks, (await layer.lease_grant(30))[0]
    finally:
        await locks.close()
        await layer.close()


async def touch_record(etcd_client: Etcd3Client, key: bytes) -> None:
    """Write the token record again as it is (what a coordinator publishing its mark does to its mod revision)."""
    stored = (await etcd_client.kv.get(key, timeout=5)).kvs[0].value
    await etcd_client.kv.put(key, stored, timeout=5)


@pytest.mark.parametrize("wait", [0.0, 5.0], ids=["try-once", "waiting"])
async def test_acquire_when_recovered_after_its_lost_grant_then_a_new_key_above_t(
        guarded: tuple[Interposed, LockManager, int], etcd: EmbeddedEtcd, prefix: str,
        etcd_client: Etcd3Client, wait: float) -> None:
    """A grant (or a waiting acquire's first write) applied just before a recovery, its answer lost: the
    read-back sees the record changed, the coordinator reads the record and sends again; the recovery deleted
    the first key, so a new key is granted with a token above T."""
    stubs, locks, lease = guarded

    async def recovery() -> None:
        layer = EtcdClient([etcd.endpoint])
        try:
            await recover(layer, Keys(prefix), ABOVE)
        finally:
            await layer.close()

    stubs.after = recovery
    result = await locks.acquire("x", lease, wait)
    assert result.acquired and result.token > ABOVE, result
    assert stubs.guarded == 2 and locks.tokens.floor > 0
    key = Keys(prefix).contender("x", lease)
    assert await list_keys(etcd_client, prefix) == [key]
    created = (await etcd_client.kv.get(key, timeout=5)).kvs[0].create_revision
    assert result.token == created + locks.tokens.floor


async def test_acquire_when_the_record_changes_after_its_lost_grant_then_the_same_key(
        guarded: tuple[Interposed, LockManager, int], prefix: str, etcd_client: Etcd3Client) -> None:
    """A grant applied, its answer lost, the record rewritten meanwhile with the same floor: the coordinator
    reads the record, sends again and finds its own key: one key, its token its create revision."""
    stubs, locks, lease = guarded
    record = Keys(prefix).token_record
    stubs.after = lambda: touch_record(etcd_client, record)
    result = await locks.acquire("x", lease, 0)
    key = Keys(prefix).contender("x", lease)
    assert await list_keys(etcd_client, prefix) == [key]
    assert result.acquired and result.token == (await etcd_client.kv.get(key, timeout=5)).kvs[0].create_revision
    assert stubs.guarded == 2 and locks.tokens.floor == 0


async def test_acquire_when_the_record_changes_before_each_send_then_unavailable(
        guarded: tuple[Interposed, LockManager, int], prefix: str, etcd_client: Etcd3Client) -> None:
    """The record changes again before the second send: UNAVAILABLE / ETCD_UNAVAILABLE (the client retries), and
    no key is left (neither Txn applied)."""
    stubs, locks, lease = guarded
    record = Keys(prefix).token_record
    stubs.before = lambda: touch_record(etcd_client, record)
    with pytest.raises(fc.Unavailable) as caught:
        await locks.acquire("x", lease, 0)
    assert caught.value.reason == "ETCD_UNAVAILABLE" and "changed twice" in caught.value.message
    assert stubs.guarded == 2
    assert await list_keys(etcd_client, prefix) == []


async def test_acquires_when_batched_after_a_recovery_then_all_above_t(
        guarded: tuple[Interposed, LockManager, int], etcd: EmbeddedEtcd, prefix: str) -> None:
    """Concurrent acquires of different locks right after a recovery, several sent as one etcd Txn: each is
    refused by its own compare, the record is read again, and every grant's token is above T."""
    stubs, locks, lease = guarded
    layer = EtcdClient([etcd.endpoint])
    try:
        await recover(layer, Keys(prefix), ABOVE)
    finally:
        await layer.close()
    names = [f"n{i}" for i in range(12)]
    results = await asyncio.gather(*(locks.acquire(name, lease, 0) for name in names))
    assert all(r.acquired and r.token > ABOVE for r in results), results
    assert (stubs.batches > 0) == stubs.batching
