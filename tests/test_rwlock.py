"""Read-write locks (``acquire(..., read=True)``, Acquire with LOCK_MODE_READ) against a real etcd and coordinator.

Readers hold together, a writer (any plain Acquire) excludes them and waits for
them, a waiting writer blocks later readers, FIFO otherwise, tokens order every
write after every earlier grant, a timeout or a cancellation leaves no key, a
reader's lost lease is reported, and a stream of readers does not starve a
writer.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from etcd3aio import Etcd3Client

from fencepost.client import AsyncLockClient, InvalidArgument, LockClient, LockHeld, LockTimeout
from fencepost.client.v1 import lock_pb2

from .conftest import assert_invalid_field, describe, describe_waiters_is, list_keys, wait_for
from .owned_stub import OwnedStub

#: A reader's hold in the starvation test, in seconds.
READ_HOLD_SECONDS = 0.5
#: Readers of the starvation test (the issue's figure).
READERS = 16


def _queued(stub: OwnedStub, name: str, n: int):  # type: ignore[no-untyped-def]
    return lambda: describe_waiters_is(stub, name, n)  # type: ignore[arg-type]


def _holding(stub: OwnedStub, name: str, n: int):  # type: ignore[no-untyped-def]
    async def holders() -> bool:
        return len((await describe(stub, name)).holders) == n  # type: ignore[arg-type]
    return holders


async def test_readers_share_a_writer_waits_and_blocks_later_readers(address: str, stub: OwnedStub,
                                                                     etcd_client: Etcd3Client, prefix: str) -> None:
    """Three readers hold at once; a writer waits for all of them; a reader after the waiting writer waits for
    it; the writer's token is above every reader's, and the late reader's above the writer's."""
    clients = [AsyncLockClient(address) for _ in range(5)]
    try:
        readers = [await c.acquire("ledger", ttl=5, timeout=10, read=True) for c in clients[:3]]
        assert len({r.token for r in readers}) == 3 and all(r.is_valid() for r in readers)
        assert len(await list_keys(etcd_client, prefix)) == 3
        writer = asyncio.ensure_future(clients[3].acquire("ledger", ttl=5, timeout=30))
        await wait_for(_queued(stub, "ledger", 1), 10, what="the writer queued behind the readers")
        late = asyncio.ensure_future(clients[4].acquire("ledger", ttl=5, timeout=30, read=True))
        await wait_for(_queued(stub, "ledger", 2), 10, what="the late reader queued")
        with pytest.raises(LockHeld):  # a try-once reader is refused too: the writer is waiting
            await clients[4].try_acquire("ledger", ttl=6, read=True)
        for r in readers[:2]:
            await r.release()
        await wait_for(_holding(stub, "ledger", 1), 10, what="two readers gone")
        assert not writer.done() and not late.done()  # one reader still holds
        await readers[2].release()
        w = await asyncio.wait_for(writer, 10)
        assert w.token > max(r.token for r in readers)
        assert not late.done()
        await w.release()
        lr = await asyncio.wait_for(late, 10)
        assert lr.token > w.token
        await lr.release()
        assert await list_keys(etcd_client, prefix) == []
    finally:
        for c in clients:
            await c.close()


async def test_plain_acquire_excludes_readers(address: str, stub: OwnedStub, etcd_client: Etcd3Client,
                                              prefix: str) -> None:
    """A plain Acquire is a writer: a try-once reader is refused with its holder and leaves no key; a waiting
    reader is granted at its release with a larger token; a release of the read hold as a write is refused."""
    async with AsyncLockClient(address) as wc, AsyncLockClient(address) as rc:
        held = await wc.acquire("doc", ttl=5)
        with pytest.raises(LockHeld) as caught:
            await rc.try_acquire("doc", ttl=5, read=True)
        assert caught.value.holder_token == held.token and caught.value.holder_lease_id == held.lease_id
        assert len(await list_keys(etcd_client, prefix)) == 1
        waiting = asyncio.ensure_future(rc.acquire("doc", ttl=5, timeout=30, read=True))
        await wait_for(lambda: _count(etcd_client, prefix, 2), 10, what="the reader queued")
        assert not waiting.done()
        await held.release()
        reader = await asyncio.wait_for(waiting, 10)
        assert reader.token > held.token
        with pytest.raises(grpc.RpcError) as caught_release:  # the reader's hold is not the lease's write hold
            await stub.Release(lock_pb2.ReleaseRequest(name="doc", lease_id=reader.lease_id, token=reader.token),
                               timeout=5, metadata=(("fencepost-lease-secret", reader.lease_secret),))
        assert caught_release.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert reader.is_valid()
        await reader.release()
        assert await list_keys(etcd_client, prefix) == []


async def _count(etcd: Etcd3Client, prefix: str, n: int) -> bool:
    return len(await list_keys(etcd, prefix)) == n


async def test_fifo_and_tokens(address: str, stub: OwnedStub) -> None:
    """Writer, reader, writer, reader, queued in that order, are granted in that order, one writer or the
    readers before the next writer at a time, each token above every earlier one."""
    clients = [AsyncLockClient(address) for _ in range(4)]
    try:
        w1 = await clients[0].acquire("q", ttl=5)
        order = [asyncio.ensure_future(clients[1].acquire("q", ttl=5, timeout=30, read=True))]
        await wait_for(_queued(stub, "q", 1), 10, what="r1 queued")
        order.append(asyncio.ensure_future(clients[2].acquire("q", ttl=5, timeout=30)))
        await wait_for(_queued(stub, "q", 2), 10, what="w2 queued")
        order.append(asyncio.ensure_future(clients[3].acquire("q", ttl=5, timeout=30, read=True)))
        await wait_for(_queued(stub, "q", 3), 10, what="r2 queued")
        tokens = [w1.token]
        await w1.release()
        for step in order:
            handle = await asyncio.wait_for(step, 10)
            assert all(not later.done() for later in order[order.index(step) + 1:])
            tokens.append(handle.token)
            await handle.release()
        assert tokens == sorted(tokens) and len(set(tokens)) == 4
    finally:
        for c in clients:
            await c.close()


async def test_timeout_and_cancel_leave_no_key(address: str, etcd_client: Etcd3Client, prefix: str) -> None:
    """A reader's wait that times out, and one that is cancelled, leave no key (only the writer's)."""
    async with AsyncLockClient(address) as wc, AsyncLockClient(address) as rc:
        held = await wc.acquire("t", ttl=5)
        with pytest.raises(LockTimeout):
            await rc.acquire("t", ttl=5, timeout=0.3, read=True)
        assert len(await list_keys(etcd_client, prefix)) == 1
        waiting = asyncio.ensure_future(rc.acquire("t", ttl=5, timeout=30, read=True))
        await wait_for(lambda: _count(etcd_client, prefix, 2), 10, what="the reader queued")
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await wait_for(lambda: _count(etcd_client, prefix, 1), 10, what="the cancelled reader's key withdrawn")
        await held.release()


async def test_reader_lease_loss(address: str, stub: OwnedStub) -> None:
    """Revoking a reader's lease reports the loss on its handle, cancels its cancel_on_lost task, and lets the
    waiting writer in with a larger token."""
    async with AsyncLockClient(address) as rc, AsyncLockClient(address) as wc:
        reader = await rc.acquire("lost", ttl=5, read=True)
        work = asyncio.ensure_future(asyncio.Event().wait())
        reader.cancel_on_lost(work)  # type: ignore[arg-type]
        writer = asyncio.ensure_future(wc.acquire("lost", ttl=5, timeout=30))
        await wait_for(_queued(stub, "lost", 1), 10, what="the writer queued")
        await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=reader.lease_id), timeout=5,
                               metadata=(("fencepost-lease-secret", reader.lease_secret),))
        await asyncio.wait_for(reader.lost.wait(), 10)
        assert reader.lost_reason in ("LEASE_EXPIRED", "NOT_HOLDER")
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(work, 10)
        w = await asyncio.wait_for(writer, 10)
        assert w.token > reader.token
        await w.release()


async def test_reader_hold_ended_by_deletion(address: str, etcd_client: Etcd3Client, prefix: str) -> None:
    """Deleting a reader's key (an operator) ends its hold with NOT_HOLDER through the stream's hold watch."""
    async with AsyncLockClient(address) as rc:
        reader = await rc.acquire("del", ttl=5, read=True)
        (key,) = await list_keys(etcd_client, prefix)
        assert key.endswith(f"/r{reader.lease_id:016x}".encode())
        assert etcd_client.kv is not None
        await etcd_client.kv.delete(key, timeout=5)
        await asyncio.wait_for(reader.lost.wait(), 10)
        assert reader.lost_reason == "NOT_HOLDER"


async def test_bad_mode_and_read_with_lock_delay(stub: OwnedStub, address: str) -> None:
    """An unknown mode is INVALID_ARGUMENT naming ``mode``; a read Acquire with a lock-delay names
    ``lock_delay_seconds`` (the client refuses it before any call)."""
    lease = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=5), timeout=5)
    with pytest.raises(grpc.RpcError) as caught:
        await stub.Acquire(lock_pb2.AcquireRequest(name="m", lease_id=lease.lease_id, mode=7), timeout=5)
    assert_invalid_field(caught.value, "mode")
    with pytest.raises(grpc.RpcError) as caught:
        await stub.Acquire(lock_pb2.AcquireRequest(name="m", lease_id=lease.lease_id, mode=lock_pb2.LOCK_MODE_READ,
                                                   lock_delay_seconds=5), timeout=5)
    assert_invalid_field(caught.value, "lock_delay_seconds")
    async with AsyncLockClient(address) as client:
        with pytest.raises(InvalidArgument):
            await client.acquire("m", ttl=5, read=True, lock_delay=2)


async def test_describe_and_list_mark_readers(address: str, stub: OwnedStub) -> None:
    """Describe of a read-held lock lists every reader holding it as a holder, marked ``read`` (the first as
    ``holder``), and a waiting writer and the reader behind it as waiters; ListLocks counts the readers as
    holders, not waiters, and marks the reading holder; a plain lock's holder is not marked."""
    async with AsyncLockClient(address) as a, AsyncLockClient(address) as b, AsyncLockClient(address) as w, \
            AsyncLockClient(address) as c:
        ra = await a.acquire("d", ttl=5, read=True)
        rb = await b.acquire("d", ttl=5, read=True)
        writer = asyncio.ensure_future(w.acquire("d", ttl=5, timeout=30))
        await wait_for(_queued(stub, "d", 1), 10, what="the writer queued")
        late = asyncio.ensure_future(c.acquire("d", ttl=5, timeout=30, read=True))
        await wait_for(_queued(stub, "d", 2), 10, what="a reader queued behind the writer")
        d = await describe(stub, "d")  # type: ignore[arg-type]
        assert d.held and d.holder.read and d.holder.lease_id == ra.lease_id and d.holder.token == ra.token
        assert [(h.lease_id, h.token, h.read) for h in d.holders] == [(ra.lease_id, ra.token, True),
                                                                       (rb.lease_id, rb.token, True)]
        assert d.waiter_count == 2 and [x.read for x in d.waiters] == [False, True]
        listed = await stub.ListLocks(lock_pb2.ListLocksRequest(prefix="d"), timeout=5)
        assert [(lock.name, lock.holder.read, lock.holder_count, lock.waiter_count)
                for lock in listed.locks] == [("d", True, 2, 2)]
        info = await a.describe("d")
        assert info.readers == (ra.lease_id, rb.lease_id) and info.waiter_count == 2
        assert info.waiting_readers == (late_lease := info.waiting_readers[0],) and late_lease not in info.readers
        assert [(lock.holder_reads, lock.holder_count) for lock in await a.list_locks("d")] == [(True, 2)]
        server = await stub.ServerInfo(lock_pb2.ServerInfoRequest(), timeout=5)
        assert (server.contender_keys, server.held_locks, server.waiters) == (4, 1, 2)
        await ra.release()
        await rb.release()
        hw = await asyncio.wait_for(writer, 10)
        assert (await a.describe("d")).readers == ()
        d = await describe(stub, "d")  # type: ignore[arg-type]
        assert d.holder.lease_id == hw.lease_id and not d.holder.read and len(d.holders) == 1
        assert [(lock.holder_count, lock.waiter_count) for lock in await a.list_locks("d")] == [(1, 1)]
        await hw.release()
        await (await asyncio.wait_for(late, 10)).release()


async def test_sync_read_lock(address: str) -> None:
    """The sync client's ``lock(..., read=True)``: two readers at once, then a try-once writer refused."""
    await asyncio.to_thread(_sync_read_lock, address)


def _sync_read_lock(address: str) -> None:
    with LockClient(address) as a, LockClient(address) as b, LockClient(address) as w:
        with a.lock("s", ttl=5, read=True) as ha, b.lock("s", ttl=5, read=True) as hb:
            assert ha.is_valid() and hb.is_valid() and ha.token != hb.token
            with pytest.raises(LockHeld):
                w.try_acquire("s", ttl=5)
        with w.lock("s", ttl=5, timeout=10) as hw:
            assert hw.token > max(ha.token, hb.token)


async def test_reader_stream_does_not_starve_a_writer(address: str) -> None:
    """16 readers each holding READ_HOLD_SECONDS again and again, always one holding: a writer that asks is
    granted within a few read holds (the readers that come after it wait, none reads while it writes), and every
    reader is then granted again after it."""
    stop = asyncio.Event()
    started = [asyncio.Event() for _ in range(READERS)]
    after_writer = [asyncio.Event() for _ in range(READERS)]
    written = asyncio.Event()
    reading = [0]  # readers between their grant and their release's call: never more than hold the lock
    clients = [AsyncLockClient(address) for _ in range(READERS + 1)]

    async def read(i: int) -> None:
        while not stop.is_set():
            handle = await clients[i].acquire("stream", ttl=5, timeout=60, read=True)
            if written.is_set():
                after_writer[i].set()
            started[i].set()
            reading[0] += 1
            await asyncio.sleep(READ_HOLD_SECONDS * (0.5 + i / READERS))  # staggered: the holds overlap
            reading[0] -= 1
            await handle.release()

    tasks = [asyncio.ensure_future(read(i)) for i in range(READERS)]
    try:
        for e in started:
            await asyncio.wait_for(e.wait(), 30)
        asked = time.monotonic()
        writer = await clients[READERS].acquire("stream", ttl=5, timeout=30)
        waited = time.monotonic() - asked
        during = [reading[0]]
        written.set()
        print(f"writer waited {waited:.3f} s behind {READERS} readers holding up to "
              f"{1.5 * READ_HOLD_SECONDS:.2f} s each")
        await asyncio.sleep(READ_HOLD_SECONDS)  # the writer's own hold: no reader is granted meanwhile
        during.append(reading[0])
        await writer.release()
        assert during == [0, 0], during
        for e in after_writer:
            await asyncio.wait_for(e.wait(), 30)
        assert waited < 4 * 1.5 * READ_HOLD_SECONDS + 2.0, waited  # a few longest read holds, and slack
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        for c in clients:
            await c.close()


async def test_withdraw_of_a_reader(stub: OwnedStub, etcd_client: Etcd3Client, prefix: str) -> None:
    """Withdraw with LOCK_MODE_READ deletes a reader's key and says it held, also when it is not the first
    contender; without the mode it finds no key of that lease (a writer's) and leaves the reader's."""
    read = lock_pb2.LOCK_MODE_READ
    leases = [(await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10), timeout=5)).lease_id
              for _ in range(2)]
    for lease_id in leases:
        granted = await stub.Acquire(lock_pb2.AcquireRequest(name="wd", lease_id=lease_id, mode=read), timeout=5)
        assert granted.acquired
    plain = await stub.Withdraw(lock_pb2.WithdrawRequest(name="wd", lease_id=leases[1]), timeout=5)
    assert not plain.found and len(await list_keys(etcd_client, prefix)) == 2
    withdrawn = await stub.Withdraw(lock_pb2.WithdrawRequest(name="wd", lease_id=leases[1], mode=read), timeout=5)
    assert withdrawn.found and withdrawn.held
    assert [k.endswith(f"/r{leases[0]:016x}".encode()) for k in await list_keys(etcd_client, prefix)] == [True]
