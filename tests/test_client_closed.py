"""close() while other threads or tasks are inside a call: every such call ends with FencepostError (issue 14, item 9).

Against a real etcd and coordinator. Before, a sync ``acquire`` blocked in
another thread ended with a bare ``concurrent.futures.CancelledError``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import pytest
from etcd3aio import Etcd3Client

from fencepost.client import AsyncLockClient, FencepostError, LockClient
from fencepost.client.v1 import lock_pb2_grpc

from .conftest import CoordinatorProcess, count_keys, describe_waiters_is, wait_for


async def test_sync_acquire_when_client_closed_from_another_thread(
    address: str, prefix: str, etcd_client: Etcd3Client, stub: lock_pb2_grpc.LockServiceStub
) -> None:
    """A sync acquire blocked in another thread ends with FencepostError("client is closed", name) and leaves no key."""
    async with AsyncLockClient(address) as holder:
        held = await holder.acquire("closing", ttl=10.0, timeout=5.0)
        client = LockClient(address)
        await asyncio.to_thread(client.connect)
        outcome: concurrent.futures.Future[BaseException | None] = concurrent.futures.Future()

        def blocked() -> None:
            try:
                client.acquire("closing", ttl=10.0, timeout=30.0)
            except BaseException as err:  # noqa: BLE001 - the test inspects it
                outcome.set_result(err)
            else:
                outcome.set_result(None)

        thread = threading.Thread(target=blocked, daemon=True)
        thread.start()
        await wait_for(lambda: describe_waiters_is(stub, "closing", 1), 10, what="the waiter key")
        await asyncio.to_thread(client.close)
        err = await asyncio.wait_for(asyncio.wrap_future(outcome), 10)
        assert isinstance(err, FencepostError), repr(err)
        assert err.message == "client is closed" and err.name == "closing"
        assert not isinstance(err, concurrent.futures.CancelledError)
        await wait_for(lambda: describe_waiters_is(stub, "closing", 0), 5, what="the waiter key to go")
        await held.release()
    assert await count_keys(etcd_client, prefix) == 0


async def test_sync_calls_when_client_closed_concurrently(address: str) -> None:
    """Calls racing with close() from other threads each return or raise FencepostError; none hangs."""
    client = LockClient(address)
    await asyncio.to_thread(client.connect)
    start = threading.Barrier(9)
    results: list[concurrent.futures.Future[object]] = [concurrent.futures.Future() for _ in range(8)]

    def caller(out: concurrent.futures.Future[object]) -> None:
        start.wait(10)
        try:
            for _ in range(50):
                client.describe("racing")
        except BaseException as err:  # noqa: BLE001 - the test inspects it
            out.set_result(err)
        else:
            out.set_result(None)

    threads = [threading.Thread(target=caller, args=(out,), daemon=True) for out in results]
    for thread in threads:
        thread.start()
    await asyncio.to_thread(start.wait, 10)
    await asyncio.to_thread(client.close)
    for out in results:
        err = await asyncio.wait_for(asyncio.wrap_future(out), 10)
        assert err is None or (isinstance(err, FencepostError) and err.message == "client is closed"), repr(err)


async def test_async_acquire_when_client_closed_from_another_task(
    address: str, prefix: str, etcd_client: Etcd3Client, stub: lock_pb2_grpc.LockServiceStub
) -> None:
    """An asyncio acquire waiting in another task ends with FencepostError("client is closed") and leaves no key."""
    async with AsyncLockClient(address) as holder:
        held = await holder.acquire("closing", ttl=10.0, timeout=5.0)
        client = AsyncLockClient(address)
        await client.connect()
        task = asyncio.create_task(client.acquire("closing", ttl=10.0, timeout=30.0))
        await wait_for(lambda: describe_waiters_is(stub, "closing", 1), 10, what="the waiter key")
        await client.close()
        with pytest.raises(FencepostError) as info:
            await asyncio.wait_for(task, 10)
        assert info.value.message == "client is closed" and info.value.name == "closing"
        await wait_for(lambda: describe_waiters_is(stub, "closing", 0), 5, what="the waiter key to go")
        await held.release()
    assert await count_keys(etcd_client, prefix) == 0


@pytest.mark.parametrize("steps", [0, 1, 2, 3, 5, 10])
async def test_async_calls_when_close_races_their_start(address: str, steps: int) -> None:
    """acquire, try_acquire and describe racing close() at any step end with FencepostError("client is closed", name).

    Closed during the lease grant, acquire raised Unavailable("connection closed during the call").
    """
    async with AsyncLockClient(address) as holder:
        held = await holder.acquire("raced", ttl=10.0, timeout=5.0)
        client = AsyncLockClient(address)
        await client.connect()
        tasks = {
            "raced": asyncio.create_task(client.acquire("raced", ttl=10.0, timeout=10.0)),
            "free": asyncio.create_task(client.try_acquire("free", ttl=10.0)),
            "other-ttl": asyncio.create_task(client.try_acquire("other-ttl", ttl=7.0)),
            "described": asyncio.create_task(client.describe("described")),
        }
        for _ in range(steps):
            await asyncio.sleep(0)  # let the calls run that many steps before close()
        await client.close()
        results = await asyncio.wait_for(asyncio.gather(*tasks.values(), return_exceptions=True), 10)
        for name, result in zip(tasks, results):
            if not isinstance(result, BaseException):
                continue  # finished before close(): fine (a grant is released by close)
            assert type(result) is FencepostError, (name, repr(result))
            assert result.message == "client is closed" and result.name == name, (name, str(result))
        await held.release()


async def _live_leases_under(etcd_client: Etcd3Client, prefix: str) -> set[int]:
    """The leases in etcd's own lease list with a key under ``prefix`` (their ownership record, their lock
    keys): the leases this test's coordinator granted that are still alive."""
    assert etcd_client.lease is not None
    listed = await etcd_client.lease.leases(timeout=5)
    alive = set()
    for lease in listed.leases:
        ttl = await etcd_client.lease.time_to_live(lease.ID, keys=True, timeout=5)
        if ttl.TTL > 0 and any(bytes(key).startswith(prefix.encode()) for key in ttl.keys):
            alive.add(int(lease.ID))
    return alive


@pytest.mark.parametrize("moment", ["granting", "granted", "queued"])
async def test_close_during_a_blocked_acquire_leaves_no_lease(
    coordinator_process: CoordinatorProcess, prefix: str, etcd_client: Etcd3Client, moment: str
) -> None:
    """close() during a blocked acquire revokes every lease the client owns, including one granted while it
    closes (the acquire, its lease revoked, asks for a new one): 10 closes at each of three moments of the
    acquire (its LeaseGrant in flight, its lease granted, its wait queued), and etcd's lease list holds none
    of their leases right after each close (TTL 5 s: before, 3 of 30 were left until their TTL)."""
    address = await asyncio.to_thread(coordinator_process.start)  # its own process: the timing of production
    async with AsyncLockClient(address) as holder:
        held = await holder.acquire("blocked", ttl=10.0, timeout=5.0)
        before = await _live_leases_under(etcd_client, prefix)
        assert before == {held.lease_id}
        for _ in range(10):
            client = AsyncLockClient(address)
            await client.connect()
            acquiring = asyncio.ensure_future(client.acquire("blocked", ttl=5.0, timeout=30.0))
            if moment == "granting":
                await asyncio.sleep(0)  # one turn of the loop: the acquire has started (its LeaseGrant not yet answered)
            elif moment == "granted":
                await wait_for(lambda c=client: c.lease_count == 1, 10, 0.001, what="the lease granted")
            else:
                await wait_for(lambda: describe_waiters_is(holder_stub(holder), "blocked", 1), 10,
                               what="the waiter queued")
            await client.close()
            with pytest.raises(FencepostError):
                await asyncio.wait_for(acquiring, 10)
            assert await _live_leases_under(etcd_client, prefix) == before
        await held.release()


def holder_stub(client: AsyncLockClient) -> lock_pb2_grpc.LockServiceStub:
    return lock_pb2_grpc.LockServiceStub(client._transport.channel)
