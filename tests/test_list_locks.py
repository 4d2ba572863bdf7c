"""ListLocks against a real etcd and an in-process coordinator: fields, pages, prefix, bad requests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest

from fencepost.client import AsyncLockClient, AsyncLockHandle, HeldLock, InvalidArgument, LockClient
from fencepost.client.v1 import lock_pb2, lock_pb2_grpc
from fencepost.client.v1.keys import Hold
from fencepost.coordinator.recipes.listing import MAX_PAGE_SIZE, GrantTimes, decode_page_token, encode_page_token

from .conftest import assert_invalid_field, describe_waiters_is, wait_for


async def _list(stub: lock_pb2_grpc.LockServiceStub, **fields: object) -> lock_pb2.ListLocksResponse:
    return await stub.ListLocks(lock_pb2.ListLocksRequest(**fields), timeout=5)


@contextlib.asynccontextmanager
async def _held(address: str, names: list[str]) -> AsyncIterator[list[AsyncLockHandle]]:
    """Hold each of ``names`` from one client (one lease)."""
    async with AsyncLockClient(address) as client:
        yield [await client.acquire(name, ttl=30.0, timeout=5.0) for name in names]


async def test_list_locks_reports_holder_token_ttl_held_for_and_waiters(
    address: str, stub: lock_pb2_grpc.LockServiceStub
) -> None:
    """Two held locks, one with a waiter: each entry's holder, token, TTLs, held_seconds and waiter count."""
    async with _held(address, ["jobs/a", "jobs/b"]) as (a, b), AsyncLockClient(address) as other:
        waiter = asyncio.create_task(other.acquire("jobs/a", ttl=30.0, timeout=30.0))
        try:
            await wait_for(lambda: describe_waiters_is(stub, "jobs/a", 1), 10, what="one waiter on jobs/a")
            resp = await _list(stub)
            assert [lock.name for lock in resp.locks] == ["jobs/a", "jobs/b"]
            first, second = resp.locks
            assert (first.holder.lease_id, first.holder.token, first.waiter_count) == (a.lease_id, a.token, 1)
            assert (second.holder.lease_id, second.holder.token, second.waiter_count) == (b.lease_id, b.token, 0)
            for lock in resp.locks:
                assert lock.ttl_seconds >= 30
                assert 0 < lock.ttl_remaining_seconds <= lock.ttl_seconds
                assert 0 <= lock.held_seconds < 30  # granted by this coordinator
            assert resp.revision >= max(a.token, b.token)
            assert resp.next_page_token == ""
        finally:
            waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiter


async def test_list_locks_pages_are_one_snapshot(address: str, stub: lock_pb2_grpc.LockServiceStub) -> None:
    """Five locks in pages of two: 2 + 2 + 1, every page at the first page's revision, even after a change."""
    names = [f"page-{i}" for i in range(5)]
    async with _held(address, names) as handles:
        first = await _list(stub, page_size=2)
        assert [lock.name for lock in first.locks] == names[:2]
        assert first.next_page_token
        await handles[4].release()  # after the first page: the listing still shows it
        async with _held(address, ["page-9"]):
            second = await _list(stub, page_size=2, page_token=first.next_page_token)
            third = await _list(stub, page_size=2, page_token=second.next_page_token)
            fresh = await _list(stub)
    assert [lock.name for lock in second.locks] == names[2:4]
    assert [lock.name for lock in third.locks] == names[4:]
    assert third.next_page_token == ""
    assert first.revision == second.revision == third.revision
    assert [lock.name for lock in fresh.locks] == [*names[:4], "page-9"]
    assert fresh.revision > first.revision


async def test_list_locks_filters_by_name_prefix(address: str, stub: lock_pb2_grpc.LockServiceStub) -> None:
    """A prefix lists only names that start with it: 'a/' lists 'a/x' and 'a/y', not 'a', 'ab' or 'b/x'."""
    async with _held(address, ["a", "a/x", "a/y", "ab", "b/x", "100%"]):
        by_prefix = {p: [lock.name for lock in (await _list(stub, prefix=p)).locks]
                     for p in ("a/", "a", "b", "100%", "zzz")}
    assert by_prefix["a/"] == ["a/x", "a/y"]
    assert sorted(by_prefix["a"]) == ["a", "a/x", "a/y", "ab"]
    assert by_prefix["b"] == ["b/x"]
    assert by_prefix["100%"] == ["100%"]
    assert by_prefix["zzz"] == []


@pytest.mark.parametrize(("fields", "field"), [
    ({"page_size": -1}, "page_size"),
    ({"page_size": MAX_PAGE_SIZE + 1}, "page_size"),
    ({"page_token": "not a token!"}, "page_token"),
    ({"page_token": encode_page_token(5, b"/elsewhere/x/")}, "page_token"),
    ({"prefix": "bad\nprefix"}, "prefix"),
    ({"prefix": "x" * 257}, "prefix"),
])
async def test_list_locks_when_request_is_bad_names_the_field(
    stub: lock_pb2_grpc.LockServiceStub, fields: dict[str, object], field: str
) -> None:
    """A page size outside 0..1000, a foreign or malformed token, or a bad prefix: INVALID_ARGUMENT naming it."""
    with pytest.raises(grpc.RpcError) as err:
        await _list(stub, **fields)
    assert_invalid_field(err.value, field)


async def test_list_locks_when_token_comes_from_another_prefix(
    address: str, stub: lock_pb2_grpc.LockServiceStub
) -> None:
    """A token of the listing of 'p/' used with prefix 'q/' is INVALID_ARGUMENT / page_token."""
    async with _held(address, ["p/1", "p/2"]):
        resp = await _list(stub, prefix="p/", page_size=1)
        with pytest.raises(grpc.RpcError) as err:
            await _list(stub, prefix="q/", page_size=1, page_token=resp.next_page_token)
    assert_invalid_field(err.value, "page_token")


async def test_client_list_locks_reads_every_page(address: str) -> None:
    """AsyncLockClient.list_locks with pages of 1 returns every lock as a HeldLock; a bad size raises."""
    async with _held(address, ["c/1", "c/2", "c/3"]) as handles, AsyncLockClient(address) as client:
        locks = await client.list_locks("c/", page_size=1)
        with pytest.raises(InvalidArgument) as bad:
            await client.list_locks(page_size=5000)
    assert [(lock.name, lock.token) for lock in locks] == [(h.name, h.token) for h in handles]
    assert all(isinstance(lock, HeldLock) and lock.holder_lease_id == handles[0].lease_id for lock in locks)
    assert len({lock.revision for lock in locks}) == 1
    assert bad.value.field == "page_size"


@pytest.mark.parametrize("bad_prefix", ["a\udcff", "a\x01", "x" * 257], ids=["surrogate", "control", "long"])
async def test_client_list_locks_when_prefix_is_bad_names_the_field(address: str, bad_prefix: str) -> None:
    """A prefix that cannot be sent (a lone surrogate), or one the server would refuse, raises InvalidArgument
    naming ``prefix`` from both clients, before any call."""
    async with AsyncLockClient(address) as client:
        with pytest.raises(InvalidArgument) as bad:
            await client.list_locks(bad_prefix)
    assert bad.value.field == "prefix"

    def sync() -> str | None:
        with LockClient(address) as sync_client, pytest.raises(InvalidArgument) as err:
            sync_client.list_locks(bad_prefix)
        return err.value.field

    assert await asyncio.to_thread(sync) == "prefix"


def test_page_token_round_trips_and_rejects_foreign_ranges() -> None:
    """A token decodes to its revision and start key inside the range; outside it, page_token is refused."""
    token = encode_page_token(42, b"/p/a%2Fb/")
    assert decode_page_token(token, b"/p/a", b"/p/b") == (42, b"/p/a%2Fb/")
    with pytest.raises(InvalidArgument) as err:
        decode_page_token(token, b"/p/c", b"/p/d")
    assert err.value.field == "page_token"


def test_grant_times_when_hold_is_unknown_or_regranted() -> None:
    """held_seconds counts from the first grant of a hold, is -1 for unknown holds, and drops the oldest."""
    now = [100.0]
    times = GrantTimes(capacity=2, clock=lambda: now[0])
    times.granted(Hold("n", 1, 10))
    now[0] = 103.5
    times.granted(Hold("n", 1, 10))  # idempotent re-grant: keeps its first time
    assert times.held_seconds(Hold("n", 1, 10)) == 3.5
    assert times.held_seconds(Hold("n", 1, 11)) == -1.0
    times.granted(Hold("m", 2, 12))
    times.granted(Hold("k", 3, 13))
    assert times.held_seconds(Hold("n", 1, 10)) == -1.0
