"""A lease asking for a read-write lock in the other mode than it holds or waits in is refused at once
(INVALID_ARGUMENT, field ``mode``), instead of waiting for itself until its timeout; nothing is left queued.

Real etcd and coordinator; the wire calls share one lease as one client's holds of one TTL do.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from etcd3aio import Etcd3Client

from fencepost.client import AsyncLockClient, InvalidArgument
from fencepost.client.v1 import lock_pb2

from .conftest import assert_invalid_field, describe_waiters_is, list_keys, wait_for
from .owned_stub import OwnedStub

READ, WRITE = lock_pb2.LOCK_MODE_READ, lock_pb2.LOCK_MODE_WRITE


async def _lease(stub: OwnedStub) -> int:
    return int((await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=30), timeout=5)).lease_id)


@pytest.mark.parametrize(("held", "asked", "wait_ms"), [(WRITE, READ, 20_000), (READ, WRITE, 20_000),
                                                          (WRITE, READ, 0), (READ, WRITE, 0)])
async def test_other_mode_of_the_same_lease_is_refused_at_once(stub: OwnedStub, etcd_client: Etcd3Client,
                                                               prefix: str, held: int, asked: int,
                                                               wait_ms: int) -> None:
    """Holding ``m`` (alone), the same lease asks for the other mode, waiting 20 s or trying once: refused
    naming ``mode`` well before the wait is out, and only the first hold's key is left."""
    lease = await _lease(stub)
    first = await stub.Acquire(lock_pb2.AcquireRequest(name="m", lease_id=lease, wait_ms=0, mode=held), timeout=5)
    assert first.acquired
    started = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Acquire(lock_pb2.AcquireRequest(name="m", lease_id=lease, wait_ms=wait_ms, mode=asked), timeout=30)
    assert time.monotonic() - started < 10
    assert_invalid_field(err.value, "mode")
    assert "no upgrade or downgrade" in (err.value.details() or "")
    assert len(await list_keys(etcd_client, prefix)) == 1
    await stub.Release(lock_pb2.ReleaseRequest(name="m", lease_id=lease, token=first.token, mode=held), timeout=5)


async def test_a_reader_behind_other_readers_is_refused_when_its_turn_comes(
        stub: OwnedStub, etcd_client: Etcd3Client, prefix: str) -> None:
    """Readers A, L, B hold together; L asks to write: it waits for B (after its own read in the queue), then is
    refused naming ``mode`` (not at its timeout); A's hold goes on."""
    a, lease, b = await _lease(stub), await _lease(stub), await _lease(stub)
    grants = [await stub.Acquire(lock_pb2.AcquireRequest(name="q", lease_id=x, wait_ms=0, mode=READ), timeout=5)
              for x in (a, lease, b)]
    assert all(g.acquired for g in grants)
    asking = asyncio.ensure_future(stub.Acquire(lock_pb2.AcquireRequest(name="q", lease_id=lease, wait_ms=60_000),
                                                timeout=70))
    await wait_for(lambda: describe_waiters_is(stub, "q", 1), 10, what="L's write queued behind B's read")
    await stub.Release(lock_pb2.ReleaseRequest(name="q", lease_id=b, token=grants[2].token, mode=READ), timeout=5)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await asyncio.wait_for(asking, 20)
    assert_invalid_field(err.value, "mode")
    assert len(await list_keys(etcd_client, prefix)) == 2  # A's and L's reads


async def test_one_client_asking_for_both_modes_under_one_ttl(address: str) -> None:
    """The client's holds of one TTL share a lease: a read of a name it writes is refused with InvalidArgument
    (field ``mode``) at once, not at its timeout."""
    async with AsyncLockClient(address) as client:
        w = await client.acquire("both", ttl=10)
        r = await client.acquire("other", ttl=10, read=True)
        assert (w.read, r.read) == (False, True) and " read " in repr(r) and " read " not in repr(w)
        await r.release()
        started = time.monotonic()
        with pytest.raises(InvalidArgument) as err:
            await client.acquire("both", ttl=10, timeout=20, read=True)
        assert err.value.field == "mode" and time.monotonic() - started < 10
        assert w.is_valid()
        await w.release()


async def test_release_in_the_wrong_mode_says_which_mode_it_holds(stub: OwnedStub) -> None:
    """A read hold released without mode READ (and a write hold with it) is NOT_HOLDER, its message naming the
    lock as the caller did (never the reader's internal name) and the mode the lease holds it in."""
    lease = await _lease(stub)
    for held, asked, words in ((READ, WRITE, "it holds it for reading"), (WRITE, READ, "it holds it for writing")):
        got = await stub.Acquire(lock_pb2.AcquireRequest(name="w", lease_id=lease, wait_ms=0, mode=held), timeout=5)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Release(lock_pb2.ReleaseRequest(name="w", lease_id=lease, token=got.token, mode=asked),
                               timeout=5)
        details = err.value.details() or ""
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and words in details, details
        assert "\\x01" not in details and "'w'" in details, details
        await stub.Release(lock_pb2.ReleaseRequest(name="w", lease_id=lease, token=got.token, mode=held), timeout=5)
    got = await stub.Acquire(lock_pb2.AcquireRequest(name="w", lease_id=lease, wait_ms=0, mode=READ), timeout=5)
    with pytest.raises(grpc.aio.AioRpcError) as err:  # a token it was not granted, of its read hold
        await stub.Release(lock_pb2.ReleaseRequest(name="w", lease_id=lease, token=got.token + 1, mode=READ),
                           timeout=5)
    assert "'w' for reading" in (err.value.details() or ""), err.value.details()
