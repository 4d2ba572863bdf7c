"""Semaphores with a fencing token per permit slot, against a real etcd and an in-process coordinator."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sqlite3
import sys

import grpc
import pytest
from etcd3aio import Etcd3Client

from fencepost.client import AsyncLockClient, LockClient, LockHeld, LockTimeout, NotHolder, PermitsMismatch
from fencepost.client import InvalidArgument, StaleTokenError
from fencepost.client.errors import from_rpc_error
from fencepost.client.v1 import kinds, lock_pb2
from fencepost.client.v1.keys import Keys
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.recipes.lock import LockManager
from fencepost.coordinator.recipes.semaphore import Semaphores

from .conftest import assert_invalid_field, cli_env, count_keys, error_info, list_keys, wait_for
from .owned_stub import OwnedStub, secret_metadata


def _public_keys(keys: list[bytes], prefix: str) -> list[bytes]:
    """The lock keys that are not the semaphore's persistent permits record."""
    return [k for k in keys if not k.endswith(b"/permits")]


async def test_three_permits_five_contenders_fifo_slots_and_tokens(address: str, prefix: str,
                                                                   etcd_client: Etcd3Client) -> None:
    """N = 3, 5 contenders: 3 hold slots 0..2 at once, the others wait first come, first served, and each
    hand-off of a slot gets a token larger than that slot's previous one."""
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(AsyncLockClient(address)) for _ in range(5)]
        sems = [c.semaphore("pool", permits=3) for c in clients]
        first = [await s.acquire(timeout=5) for s in sems[:3]]
        assert sorted(h.slot for h in first) == [0, 1, 2]
        assert len({h.lease_id for h in first}) == 3
        order: list[int] = []
        granted: dict[int, object] = {}

        async def wait(i: int) -> None:
            h = await sems[i].acquire(timeout=20)
            order.append(i)
            granted[i] = h

        w3 = asyncio.create_task(wait(3))
        await wait_for(lambda: _waiters(sems[0], 1), 10, what="contender 3 queued")
        w4 = asyncio.create_task(wait(4))
        await wait_for(lambda: _waiters(sems[0], 2), 10, what="contender 4 queued")
        info = await sems[0].describe()
        assert info.permits == 3 and [h.slot for h in info.holders] == [0, 1, 2]
        assert {h.token for h in info.holders} == {h.token for h in first}
        assert not order  # at most 3 held
        # Holders leave in any order: slot 1's holder first; the first waiter gets slot 1.
        by_slot = {h.slot: h for h in first}
        await by_slot[1].release()
        await asyncio.wait_for(w3, 10)
        assert order == [3]
        h3 = granted[3]
        assert h3.slot == 1 and h3.token > by_slot[1].token  # type: ignore[attr-defined]
        assert not w4.done()
        await by_slot[2].release()
        await asyncio.wait_for(w4, 10)
        assert order == [3, 4]
        h4 = granted[4]
        assert h4.slot == 2 and h4.token > by_slot[2].token  # type: ignore[attr-defined]
        info = await sems[0].describe()
        assert [(h.slot, h.lease_id) for h in info.holders] == [(0, first[0].lease_id if first[0].slot == 0 else
                                                                  by_slot[0].lease_id), (1, h3.lease_id),
                                                                 (2, h4.lease_id)]  # type: ignore[attr-defined]
        assert info.waiter_count == 0
        for h in (by_slot[0], h3, h4):
            await h.release()  # type: ignore[attr-defined]
        assert _public_keys(await list_keys(etcd_client, prefix), prefix) == []


async def _waiters(sem: object, n: int) -> bool:
    return (await sem.describe()).waiter_count == n  # type: ignore[attr-defined]


async def test_try_acquire_when_full_raises_lock_held_and_leaves_no_key(address: str, prefix: str,
                                                                       etcd_client: Etcd3Client) -> None:
    """try_acquire with every permit held raises LockHeld and queues nothing; acquire(timeout) withdraws its key."""
    async with AsyncLockClient(address) as a, AsyncLockClient(address) as b:
        h = await a.semaphore("one", permits=1).acquire(timeout=5)
        before = await list_keys(etcd_client, prefix)
        with pytest.raises(LockHeld) as info:
            await b.semaphore("one", permits=1).try_acquire()
        assert info.value.holder_lease_id == h.lease_id and info.value.holder_token == h.token
        assert info.value.reason == "LOCK_HELD"
        assert await list_keys(etcd_client, prefix) == before
        with pytest.raises(LockTimeout):
            await b.semaphore("one", permits=1).acquire(timeout=0.3)
        with pytest.raises(LockTimeout):  # timeout 0: one try
            await b.semaphore("one", permits=1).acquire(timeout=0)
        assert await list_keys(etcd_client, prefix) == before
        await h.release()
        permit = await b.semaphore("one", permits=1).try_acquire()
        assert permit.slot == 0 and permit.token > h.token
        await permit.release()


async def test_permits_mismatch_names_the_semaphores_permits(address: str) -> None:
    """Asking with another number of permits than the semaphore's first use fails with PermitsMismatch."""
    async with AsyncLockClient(address) as a, AsyncLockClient(address) as b:
        h = await a.semaphore("fixed", permits=2).acquire(timeout=5)
        with pytest.raises(PermitsMismatch) as info:
            await b.semaphore("fixed", permits=3).acquire(timeout=5)
        assert info.value.permits == 2 and info.value.name == "fixed"
        await h.release()
        with pytest.raises(PermitsMismatch):  # also once nobody holds it: fixed at first use
            await a.semaphore("fixed", permits=1).try_acquire()
        assert (await b.semaphore("fixed", permits=2).describe()).holders == ()


async def test_bad_input_names_the_field(stub: OwnedStub) -> None:
    """Each malformed field of the semaphore calls is refused INVALID_ARGUMENT naming it."""
    lease = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10), timeout=5)
    md = secret_metadata(lease.lease_id)
    cases = [
        ("AcquirePermit", lock_pb2.AcquirePermitRequest(name="", lease_id=lease.lease_id, permits=1), "name"),
        ("AcquirePermit", lock_pb2.AcquirePermitRequest(name="a\n", lease_id=lease.lease_id, permits=1), "name"),
        ("AcquirePermit", lock_pb2.AcquirePermitRequest(name="a", lease_id=0, permits=1), "lease_id"),
        ("AcquirePermit", lock_pb2.AcquirePermitRequest(name="a", lease_id=lease.lease_id, permits=0), "permits"),
        ("AcquirePermit", lock_pb2.AcquirePermitRequest(name="a", lease_id=lease.lease_id, permits=1001), "permits"),
        ("AcquirePermit", lock_pb2.AcquirePermitRequest(name="a", lease_id=lease.lease_id, permits=1, wait_ms=-1),
         "wait_ms"),
        ("AcquirePermit", lock_pb2.AcquirePermitRequest(name="a", lease_id=lease.lease_id, permits=1,
                                                        request_id="no spaces"), "request_id"),
        ("AcquirePermit", lock_pb2.AcquirePermitRequest(name="a", lease_id=lease.lease_id, permits=1,
                                                        request_id="x" * 65), "request_id"),
        ("ReleasePermit", lock_pb2.ReleasePermitRequest(name="a", lease_id=lease.lease_id, slot=-1, token=5), "slot"),
        ("ReleasePermit", lock_pb2.ReleasePermitRequest(name="a", lease_id=lease.lease_id, slot=1000, token=5),
         "slot"),
        ("ReleasePermit", lock_pb2.ReleasePermitRequest(name="a", lease_id=lease.lease_id, token=-3), "token"),
        ("ReleasePermit", lock_pb2.ReleasePermitRequest(name="", lease_id=lease.lease_id, token=3), "name"),
        ("DescribeSemaphore", lock_pb2.DescribeSemaphoreRequest(name="\x01q/a"), "name"),
    ]
    for method, request, field in cases:
        with pytest.raises(grpc.RpcError) as info:
            await getattr(stub, method)(request, timeout=5, metadata=md)
        assert_invalid_field(info.value, field)


async def test_release_semantics_and_idempotent_acquire(stub: OwnedStub, prefix: str,
                                                        etcd_client: Etcd3Client) -> None:
    """AcquirePermit again returns the same slot and token; ReleasePermit refuses a wrong token or slot (a slot
    not below the semaphore's permits: INVALID_ARGUMENT naming it), then
    releases (both keys in one Txn); token 0 withdraws and says whether anything was there."""
    lease = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10), timeout=5)
    md = secret_metadata(lease.lease_id)
    ask = lock_pb2.AcquirePermitRequest(name="idem", lease_id=lease.lease_id, permits=2)
    first = await stub.AcquirePermit(ask, timeout=5, metadata=md)
    again = await stub.AcquirePermit(ask, timeout=5, metadata=md)
    assert first.acquired and (again.slot, again.token) == (first.slot, first.token)
    assert len(_public_keys(await list_keys(etcd_client, prefix), prefix)) == 2  # queue key + slot key
    for slot, token, reason in ((first.slot, first.token - 1, "STALE_TOKEN"), (first.slot, first.token + 1, "NOT_HOLDER"),
                              (1, first.token, "NOT_HOLDER")):
        with pytest.raises(grpc.RpcError) as info:
            await stub.ReleasePermit(lock_pb2.ReleasePermitRequest(name="idem", lease_id=lease.lease_id, slot=slot,
                                                                   token=token), timeout=5, metadata=md)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert error_info(info.value).reason == reason  # type: ignore[union-attr]
    for slot in (2, 999):  # no such permit in a semaphore of 2: the slot is wrong, not the holder
        with pytest.raises(grpc.RpcError) as info:
            await stub.ReleasePermit(lock_pb2.ReleasePermitRequest(name="idem", lease_id=lease.lease_id, slot=slot,
                                                                   token=first.token), timeout=5, metadata=md)
        assert_invalid_field(info.value, "slot")
        assert "has 2 permits" in info.value.details()
        refused = from_rpc_error(info.value)
        assert isinstance(refused, InvalidArgument) and (refused.field, refused.name) == ("slot", "idem")
    released = await stub.ReleasePermit(lock_pb2.ReleasePermitRequest(
        name="idem", lease_id=lease.lease_id, slot=first.slot, token=first.token), timeout=5, metadata=md)
    assert released.revision > first.token
    assert _public_keys(await list_keys(etcd_client, prefix), prefix) == []
    with pytest.raises(grpc.RpcError) as info:  # a second release: the permit is gone
        await stub.ReleasePermit(lock_pb2.ReleasePermitRequest(
            name="idem", lease_id=lease.lease_id, slot=first.slot, token=first.token), timeout=5, metadata=md)
    assert isinstance(from_rpc_error(info.value), NotHolder)
    second = await stub.AcquirePermit(ask, timeout=5, metadata=md)
    assert second.slot == 0 and second.token > first.token
    withdrawn = await stub.ReleasePermit(lock_pb2.ReleasePermitRequest(name="idem", lease_id=lease.lease_id),
                                         timeout=5, metadata=md)
    assert withdrawn.found
    assert _public_keys(await list_keys(etcd_client, prefix), prefix) == []
    again_withdrawn = await stub.ReleasePermit(lock_pb2.ReleasePermitRequest(name="idem", lease_id=lease.lease_id),
                                               timeout=5, metadata=md)
    assert not again_withdrawn.found


async def test_stale_token_after_reacquire(stub: OwnedStub) -> None:
    """Releasing an older permit's token of a slot the lease holds again under a newer one is STALE_TOKEN."""
    lease = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10), timeout=5)
    md = secret_metadata(lease.lease_id)
    ask = lock_pb2.AcquirePermitRequest(name="stale", lease_id=lease.lease_id, permits=1)
    old = await stub.AcquirePermit(ask, timeout=5, metadata=md)
    await stub.ReleasePermit(lock_pb2.ReleasePermitRequest(name="stale", lease_id=lease.lease_id, slot=0,
                                                           token=old.token), timeout=5, metadata=md)
    new = await stub.AcquirePermit(ask, timeout=5, metadata=md)
    with pytest.raises(grpc.RpcError) as info:
        await stub.ReleasePermit(lock_pb2.ReleasePermitRequest(name="stale", lease_id=lease.lease_id, slot=0,
                                                               token=old.token), timeout=5, metadata=md)
    err = from_rpc_error(info.value)
    assert isinstance(err, StaleTokenError) and err.current_token == new.token


async def test_semaphore_and_lock_of_one_name_are_independent(address: str) -> None:
    """Lock "x" and semaphore "x" do not exclude each other, even in one client under one lease."""
    async with AsyncLockClient(address) as a:
        lock = await a.acquire("x", timeout=5)
        permit = await a.semaphore("x", permits=1).try_acquire()
        assert permit.lease_id == lock.lease_id and permit.slot == 0
        await permit.release()
        await lock.release()


async def test_loss_is_signalled_on_lease_revoke(address: str, stub: OwnedStub) -> None:
    """Revoking a permit holder's lease signals its handle's loss (HoldEnded on the stream); the waiter gets the
    slot with a larger token."""
    async with AsyncLockClient(address) as a, AsyncLockClient(address) as b:
        h = await a.semaphore("lose", permits=1).acquire(timeout=5)
        waiter = asyncio.create_task(b.semaphore("lose", permits=1).acquire(timeout=20))
        await wait_for(lambda: _waiters(b.semaphore("lose", permits=1), 1), 10, what="waiter queued")
        await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=h.lease_id), timeout=5,
                               metadata=(("fencepost-lease-secret", h.lease_secret),))
        await asyncio.wait_for(h.lost.wait(), 10)
        assert h.lost_reason in ("LEASE_EXPIRED", "NOT_HOLDER")
        nxt = await asyncio.wait_for(waiter, 10)
        assert nxt.slot == 0 and nxt.token > h.token
        await nxt.release()


async def test_lease_revoke_removes_both_keys(stub: OwnedStub, prefix: str, etcd_client: Etcd3Client) -> None:
    """A permit's queue key and slot key share its lease: revoking it leaves nothing behind."""
    lease = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10), timeout=5)
    md = secret_metadata(lease.lease_id)
    await stub.AcquirePermit(lock_pb2.AcquirePermitRequest(name="gone", lease_id=lease.lease_id, permits=4),
                             timeout=5, metadata=md)
    assert len(_public_keys(await list_keys(etcd_client, prefix), prefix)) == 2
    await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease.lease_id), timeout=5, metadata=md)
    assert _public_keys(await list_keys(etcd_client, prefix), prefix) == []
    d = await stub.DescribeSemaphore(lock_pb2.DescribeSemaphoreRequest(name="gone"), timeout=5)
    assert d.permits == 4 and not d.holders and d.waiter_count == 0


async def test_cancelled_wait_leaves_no_key(address: str, prefix: str, etcd_client: Etcd3Client) -> None:
    """A waiting acquire that is cancelled is withdrawn: only the holder's keys remain."""
    async with AsyncLockClient(address) as a, AsyncLockClient(address) as b:
        h = await a.semaphore("cancel", permits=1).acquire(timeout=5)
        before = await count_keys(etcd_client, prefix)
        task = asyncio.create_task(b.semaphore("cancel", permits=1).acquire())
        await wait_for(lambda: _waiters(a.semaphore("cancel", permits=1), 1), 10, what="waiter queued")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await wait_for(lambda: _waiters(a.semaphore("cancel", permits=1), 0), 10, what="waiter withdrawn")
        assert await count_keys(etcd_client, prefix) == before
        await h.release()


async def test_sync_client_semaphore(address: str) -> None:
    """The sync client: ``with sem as permit`` gives a slot and token; try_acquire raises LockHeld when full."""
    await asyncio.to_thread(_sync_semaphore, address)  # the coordinator runs on this test's loop


def _sync_semaphore(address: str) -> None:
    with LockClient(address) as a, LockClient(address) as b:
        sem = a.semaphore("sync", permits=1)
        with sem as permit:
            assert permit.slot == 0 and permit.token > 0
            with pytest.raises(LockHeld):
                b.semaphore("sync", permits=1).try_acquire()
            info = b.semaphore("sync", permits=1).describe()
            assert [(h.slot, h.token) for h in info.holders] == [(0, permit.token)]
        again = b.semaphore("sync", permits=1).acquire(timeout=5)
        assert again.token > permit.token
        again.release()


async def test_stale_permit_holders_write_is_refused_by_the_sql_guard(address: str) -> None:
    """Storage partitioned by slot, fenced per slot: after a slot changes hands, the old holder's write with its
    (smaller) token is refused by the SQL guard; a write to another slot's record is unaffected."""
    await asyncio.to_thread(_stale_write_refused, address)


def _stale_write_refused(address: str) -> None:
    from fencepost.client.fencing import SqlGuard  # noqa: PLC0415

    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE shards (id TEXT PRIMARY KEY, data TEXT, fencing_token BIGINT)")
    guard = SqlGuard(db, "shards", "id", commit=True)
    with LockClient(address) as a, LockClient(address) as b:
        old = a.semaphore("sql", permits=2).acquire(timeout=5)
        other = b.semaphore("sql", permits=2).acquire(timeout=5)
        assert {old.slot, other.slot} == {0, 1}
        guard.upsert(f"sql#{old.slot}", old.token, {"data": "from a"})
        guard.upsert(f"sql#{other.slot}", other.token, {"data": "from b"})
        old.release()  # (as if a's lease had expired during a pause)
        with LockClient(address) as c:
            new = c.semaphore("sql", permits=2).acquire(timeout=5)
            assert new.slot == old.slot and new.token > old.token
            guard.upsert(f"sql#{new.slot}", new.token, {"data": "from c"})
            with pytest.raises(StaleTokenError):
                guard.upsert(f"sql#{old.slot}", old.token, {"data": "late write from a"})
            guard.upsert(f"sql#{other.slot}", other.token, {"data": "b again"})  # another slot: its own tokens
            new.release()
        other.release()
    rows = dict(db.execute("SELECT id, data FROM shards"))
    assert rows == {f"sql#{old.slot}": "from c", f"sql#{other.slot}": "b again"}


# A command that prints its slot, token, lease id and lease secret, then waits to be stopped.
_SLOT_CHILD = ("import os, time; print(os.environ['FENCEPOST_SLOT'], os.environ['FENCEPOST_TOKEN'], "
               "os.environ['FENCEPOST_LEASE_ID'], os.environ['FENCEPOST_LEASE_SECRET'], flush=True); time.sleep(60)")


async def _fencepost_run(address: str, *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fencepost.client.cli", "run", "--address", address, *args,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=cli_env())


async def test_cli_run_with_permits(address: str, stub: OwnedStub) -> None:
    """``fencepost run NAME --permits 2``: two commands run at once with slots 0 and 1 in FENCEPOST_SLOT; a third
    with --try exits 5 without running; another --permits exits 2; revoking a holder's lease stops its command
    (exit 3)."""
    procs = [await _fencepost_run(address, "cli-sem", "--ttl", "5", "--permits", "2", "--", sys.executable, "-c",
                                  _SLOT_CHILD) for _ in range(2)]
    try:
        grants = []
        for proc in procs:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), 30)
            slot, token, lease, secret = line.decode().split()
            grants.append((int(slot), int(token), int(lease), secret))
        assert sorted(g[0] for g in grants) == [0, 1]
        full = await _fencepost_run(address, "cli-sem", "--ttl", "5", "--permits", "2", "--try", "--", "true")
        _, err = await asyncio.wait_for(full.communicate(), 30)
        assert full.returncode == 5, err.decode()
        other = await _fencepost_run(address, "cli-sem", "--ttl", "5", "--permits", "3", "--try", "--", "true")
        _, err = await asyncio.wait_for(other.communicate(), 30)
        assert other.returncode == 2 and b"has 2 permits" in err, err.decode()
        _, _, lease, secret = grants[0]
        await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease), timeout=5,
                               metadata=(("fencepost-lease-secret", secret),))
        _, err = await asyncio.wait_for(procs[0].communicate(), 30)
        assert procs[0].returncode == 3, err.decode()
        assert b"lost" in err
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                await proc.communicate()


async def test_close_releases_permits_without_a_loss_notice(address: str) -> None:
    """Closing a client that holds a permit releases it (ReleasePermit) and signals no loss."""
    notices: list[object] = []
    async with AsyncLockClient(address) as watcher:
        async with AsyncLockClient(address) as a:
            permit = await a.semaphore("closing", permits=2).acquire(timeout=5)
            permit.on_lost(notices.append)
            assert len((await watcher.semaphore("closing", permits=2).describe()).holders) == 1
        assert permit.released and permit.lost_reason is None and not notices
        assert (await watcher.semaphore("closing", permits=2).describe()).holders == ()


async def test_deferred_withdrawal_of_an_abandoned_permit_unless_the_caller_came_back(
        coordinator: Coordinator, stub: OwnedStub, prefix: str, etcd_client: Etcd3Client) -> None:
    """A permit granted to a call that was cancelled is withdrawn (both keys) after the reattach time, unless an
    AcquirePermit of the same lease touched its queue key meanwhile (it then keeps the same slot and token)."""
    locks = coordinator.locks
    assert locks is not None and coordinator.watcher is not None
    # The semaphores of the coordinator's etcd, keys and token floor, with the reattach time shortened for the test.
    sems = Semaphores(LockManager(locks.etcd, coordinator.keys, coordinator.watcher, reattach_seconds=0.05,
                                  tokens=locks.tokens), coordinator.keys)

    async def deferred(name: str, lease_id: int, queue_mod: int) -> None:
        await sems.withdraw_later(name, lease_id, queue_mod)

    for came_back in (False, True):
        lease = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10), timeout=5)
        md = secret_metadata(lease.lease_id)
        ask = lock_pb2.AcquirePermitRequest(name=f"later-{came_back}", lease_id=lease.lease_id, permits=2)
        first = await stub.AcquirePermit(ask, timeout=5, metadata=md)
        qkey = Keys(prefix).contender(kinds.semaphore_queue(ask.name), lease.lease_id)
        queue_mod = (await etcd_client.kv.get(qkey, timeout=5)).kvs[0].mod_revision  # type: ignore[union-attr]
        if came_back:  # the caller's retry, after the claim it never heard of (mod revision taken before it)
            again = await stub.AcquirePermit(ask, timeout=5, metadata=md)
            assert (again.slot, again.token) == (first.slot, first.token)
        await deferred(ask.name, lease.lease_id, queue_mod)
        d = await stub.DescribeSemaphore(lock_pb2.DescribeSemaphoreRequest(name=ask.name), timeout=5)
        assert [(h.lease_id, h.slot, h.token) for h in d.holders] == (
            [(lease.lease_id, first.slot, first.token)] if came_back else []), came_back
        assert len(_public_keys(await list_keys(etcd_client, prefix), prefix)) == (2 if came_back else 0)
        await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease.lease_id), timeout=5, metadata=md)
