"""Multi-locks (AcquireAll, ReleaseAll; ``acquire_all``, ``lock_all``) against a real etcd and coordinator.

All or none, no key left by a try, a timeout or a cancellation (checked in
etcd), no deadlock whatever order callers give the names, one token per name
above its earlier ones, the loss of one name losing the whole multi-lock, and
transfers between accounts in a fenced SQL table.
"""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
import threading
import time
from pathlib import Path

import grpc
import pytest
from etcd3aio import Etcd3Client

from fencepost.client import AsyncLockClient, InvalidArgument, LeaseLost, LockClient, LockHeld, LockTimeout, NotHolder
from fencepost.client.fencing import SqlGuard
from fencepost.client.v1 import lock_pb2
from fencepost.client.v1.keys import Keys

from .conftest import assert_invalid_field, describe_waiters_is, error_info, list_keys, wait_for
from .owned_stub import secret_metadata

#: The transfers test's run, in seconds: a few in the suite; the issue's 60 s with FENCEPOST_SOAK=1.
SOAK = os.environ.get("FENCEPOST_SOAK") == "1"
TRANSFER_SECONDS = 60.0 if SOAK else 4.0


async def _keys_of(etcd: Etcd3Client, prefix: str, lease_id: int) -> list[bytes]:
    """The lock keys of lease ``lease_id`` under ``prefix``."""
    return [k for k in await list_keys(etcd, prefix) if k.endswith(f"/{lease_id:016x}".encode())]


async def test_try_once_takes_all_or_none(address: str, stub: object, etcd_client: Etcd3Client, prefix: str) -> None:
    """With one name held by another lease, a try-once multi-lock takes nothing and leaves no key; a waiting one
    gets every name once the holder releases, each token above the old holder's."""
    async with AsyncLockClient(address) as holder_client, AsyncLockClient(address) as client:
        held = await holder_client.acquire("acct:2", ttl=5)
        with pytest.raises(LockHeld) as caught:
            await client.try_acquire_all(["acct:1", "acct:2", "acct:3"], ttl=5)
        assert caught.value.name == "acct:2" and caught.value.holder_token == held.token
        keys = await list_keys(etcd_client, prefix)
        assert len(keys) == 1 and keys[0].endswith(f"/{held.lease_id:016x}".encode())  # only the holder's
        with pytest.raises(LockTimeout):
            await client.acquire_all(["acct:1", "acct:2"], ttl=5, timeout=0)
        assert len(await list_keys(etcd_client, prefix)) == 1

        waiting = asyncio.ensure_future(client.acquire_all(["acct:3", "acct:2", "acct:1"], ttl=5, timeout=30))
        await wait_for(lambda: describe_waiters_is(stub, "acct:2", 1), 10,  # type: ignore[arg-type]
                       what="the multi-lock queued")
        assert not waiting.done()
        await held.release()
        handle = await asyncio.wait_for(waiting, 10)
        assert set(handle.tokens) == {"acct:1", "acct:2", "acct:3"}
        assert all(token > held.token for token in handle.tokens.values())
        assert handle.token_for("acct:2") == handle.tokens["acct:2"]
        assert handle.is_valid()
        assert len(await _keys_of(etcd_client, prefix, handle.lease_id)) == 3
        again = await holder_client.acquire("acct:9", ttl=5)  # a later grant of any name is above these
        assert again.token > handle.token_for("acct:1")
        await again.release()
        await handle.release()
        assert handle.released and await list_keys(etcd_client, prefix) == []
        with pytest.raises(NotHolder):
            await handle.release()


async def test_timeout_and_cancel_leave_no_key(address: str, stub: object, etcd_client: Etcd3Client,
                                               prefix: str) -> None:
    """A multi-lock wait that times out, and one that is cancelled, leave no key of any of their names."""
    async with AsyncLockClient(address) as holder_client, AsyncLockClient(address) as client:
        held = await holder_client.acquire("b", ttl=5)
        with pytest.raises(LockTimeout):
            await client.acquire_all(["a", "b", "c"], ttl=5, timeout=0.3)
        owners = [k.rsplit(b"/", 1)[1] for k in await list_keys(etcd_client, prefix)]
        assert owners == [f"{held.lease_id:016x}".encode()]

        waiting = asyncio.ensure_future(client.acquire_all(["c", "b", "a"], ttl=5, timeout=30))
        await wait_for(lambda: describe_waiters_is(stub, "b", 1), 10,  # type: ignore[arg-type]
                       what="the multi-lock queued")
        assert len(await list_keys(etcd_client, prefix)) == 4  # a, b (held + ours), c
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await wait_for(lambda: _count_is(etcd_client, prefix, 1), 10, what="the cancelled multi-lock's keys gone")
        await held.release()


async def _count_is(etcd: Etcd3Client, prefix: str, n: int) -> bool:
    return len(await list_keys(etcd, prefix)) == n


async def test_server_deletes_every_key_of_an_abandoned_call(address: str, stub: object, etcd_client: Etcd3Client,
                                                             prefix: str) -> None:
    """Without any client clean-up: an AcquireAll whose gRPC call is cancelled while it waits, and one whose wait
    runs out, leave no key (the coordinator deletes them all in one Txn)."""
    raw = stub
    holder = await raw.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10))  # type: ignore[attr-defined]
    await raw.Acquire(lock_pb2.AcquireRequest(name="y", lease_id=holder.lease_id))  # type: ignore[attr-defined]
    lease = await raw.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10))  # type: ignore[attr-defined]
    request = lock_pb2.AcquireAllRequest(names=["x", "y", "z"], lease_id=lease.lease_id, wait_forever=True)
    secret = secret_metadata(lease.lease_id, None)
    call = raw.AcquireAll(request, metadata=secret)  # type: ignore[attr-defined]
    await wait_for(lambda: describe_waiters_is(stub, "y", 1), 10, what="AcquireAll queued")  # type: ignore
    assert len(await _keys_of(etcd_client, prefix, lease.lease_id)) == 3
    call.cancel()
    await wait_for(lambda: _lease_has_no_key(etcd_client, prefix, lease.lease_id), 10, what="every key deleted")

    timed = lock_pb2.AcquireAllRequest(names=["x", "y", "z"], lease_id=lease.lease_id, wait_ms=200)
    with pytest.raises(grpc.RpcError) as caught:
        await raw.AcquireAll(timed, metadata=secret, timeout=10)  # type: ignore[attr-defined]
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert await _keys_of(etcd_client, prefix, lease.lease_id) == []
    free = lock_pb2.AcquireAllRequest(names=["x", "z"], lease_id=lease.lease_id)
    granted = await raw.AcquireAll(free, metadata=secret, timeout=10)  # type: ignore[attr-defined]
    assert granted.acquired and len(set(granted.tokens)) == 1
    again = await raw.AcquireAll(free, metadata=secret, timeout=10)  # type: ignore[attr-defined]
    assert list(again.tokens) == list(granted.tokens)  # idempotent per (lease, names)
    withdrawn = await raw.ReleaseAll(  # type: ignore[attr-defined]
        lock_pb2.ReleaseAllRequest(names=["z", "x"], lease_id=lease.lease_id), metadata=secret, timeout=10)
    assert withdrawn.found == 2 and await _keys_of(etcd_client, prefix, lease.lease_id) == []


async def _lease_has_no_key(etcd: Etcd3Client, prefix: str, lease_id: int) -> bool:
    return await _keys_of(etcd, prefix, lease_id) == []


@pytest.mark.parametrize("names", [[], ["a"], ["a", "a"], [f"n{i}" for i in range(33)], ["a", ""]])
async def test_acquire_all_when_names_are_bad(stub: object, names: list[str]) -> None:
    """Fewer than 2 names, a duplicate, more than 32, or a bad name: INVALID_ARGUMENT naming ``names``."""
    lease = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=5))  # type: ignore[attr-defined]
    with pytest.raises(grpc.RpcError) as caught:
        await stub.AcquireAll(  # type: ignore[attr-defined]
            lock_pb2.AcquireAllRequest(names=names, lease_id=lease.lease_id),
            metadata=secret_metadata(lease.lease_id, None), timeout=5)
    assert_invalid_field(caught.value, "names")
    assert "reason=" not in (caught.value.details() or ""), caught.value.details()  # an inner error's words


async def test_client_checks_names_before_any_call(address: str) -> None:
    """The client refuses bad names with InvalidArgument (field ``names``) before it connects."""
    client = AsyncLockClient(address)
    for names in (["a"], ["a", "a"], "ab", [f"n{i}" for i in range(33)], ["p", ""]):
        with pytest.raises(InvalidArgument) as caught:
            await client.acquire_all(names, ttl=5)
        assert caught.value.field == "names" and str(caught.value).count("reason=") == 1, str(caught.value)
    await client.close()


async def test_no_deadlock_in_opposite_orders(address: str, etcd_client: Etcd3Client, prefix: str) -> None:
    """Callers taking overlapping names in opposite and random orders, many rounds each: every round completes,
    and no two callers ever hold a shared name at once."""
    names = ["p", "q", "r", "s"]
    holding: dict[str, int] = {}
    overlaps: list[str] = []

    async def caller(index: int) -> int:
        rng = random.Random(index)
        done = 0
        async with AsyncLockClient(address) as client:
            for _ in range(25):
                picked = rng.sample(names, rng.randint(2, 4))
                if index % 2:
                    picked.reverse()
                async with client.lock_all(picked, ttl=5, timeout=20) as handle:
                    for name in picked:
                        if name in holding:
                            overlaps.append(name)
                        holding[name] = index
                    await asyncio.sleep(0)
                    assert handle.is_valid()
                    for name in picked:
                        del holding[name]
                done += 1
        return done

    results = await asyncio.wait_for(asyncio.gather(*(caller(i) for i in range(4))), 120)
    assert results == [25, 25, 25, 25] and overlaps == []
    assert await list_keys(etcd_client, prefix) == []


async def test_losing_one_name_loses_the_multilock(address: str, etcd_client: Etcd3Client, prefix: str) -> None:
    """A key of one name deleted (an operator's act): the whole handle is lost (``lost``, its cancel_on_lost task
    cancelled, its on_lost callback run, release raises LeaseLost), and the other names are released at once
    (each by its own token), not left held until the lease ends."""
    async with AsyncLockClient(address) as client:
        handle = await client.acquire_all(["m1", "m2", "m3"], ttl=5)
        sleeper = asyncio.ensure_future(asyncio.Event().wait())
        handle.cancel_on_lost(sleeper)
        told = threading.Event()
        handle.on_lost(lambda _h: told.set())
        key = Keys(prefix).contender("m2", handle.lease_id)
        await etcd_client.kv.delete(key, timeout=5)  # type: ignore[union-attr]
        await asyncio.wait_for(handle.lost.wait(), 10)
        assert handle.lost_reason is not None and not handle.is_valid() and handle.lost_name == "m2"
        with pytest.raises(asyncio.CancelledError):
            await sleeper
        assert await asyncio.to_thread(told.wait, 10)
        with pytest.raises(LeaseLost) as lost:
            await handle.release()
        assert lost.value.name == "m2", lost.value  # the name that went, not the first one
        await wait_for(lambda: _count_is(etcd_client, prefix, 0), 10, what="the other names released")


async def test_sync_lock_all(address: str) -> None:
    """The sync client: lock_all holds every name for the block and releases them all, its handle's deadline the
    lease's (TTL - margin ahead at most); try_acquire_all takes none of a set with a held name."""
    await asyncio.to_thread(_sync_lock_all, address)


def _sync_lock_all(address: str) -> None:
    with LockClient(address) as client, LockClient(address) as other:
        with client.lock_all(["s1", "s2"], ttl=5, timeout=5) as handle:
            assert set(handle.tokens) == {"s1", "s2"} and handle.is_valid()
            assert handle.margin == 0.5  # min(1, max(0.1, TTL / 10)), the lease's, as a lock handle's
            assert time.monotonic() < handle.deadline <= time.monotonic() + 5 - handle.margin
            with pytest.raises(LockHeld):
                other.try_acquire_all(["s2", "s3"], ttl=5)
        assert handle.released
        again = other.acquire_all(["s2", "s1"], ttl=5, timeout=5)
        assert again.token_for("s1") > handle.token_for("s1")
        held = client.try_acquire("s3", ttl=5)
        again.release()
        held.release()


def _transfers(address: str, db: Path, seconds: float, threads: int = 8, accounts: int = 4,
               timeout: float = 30.0) -> dict[str, float]:
    """``threads`` threads, each with its own LockClient, moving money between ``accounts`` accounts for
    ``seconds``; each transfer under lock_all in a random name order, each row written through a SqlGuard with
    its own name's token. Returns the figures."""
    names = [f"acct:{i}" for i in range(accounts)]
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE accounts (id TEXT PRIMARY KEY, balance BIGINT, fencing_token BIGINT)")
    conn.executemany("INSERT INTO accounts VALUES (?, 1000, 0)", [(n,) for n in names])
    conn.commit()
    conn.close()
    done = [0] * threads
    waits: list[float] = []
    errors: list[BaseException] = []
    stop = time.monotonic() + seconds

    def worker(index: int) -> None:
        rng = random.Random(index)
        db_conn = sqlite3.connect(db, timeout=30, check_same_thread=False)
        guard = SqlGuard(db_conn, "accounts", "id", commit=True)
        try:
            with LockClient(address) as client:
                while time.monotonic() < stop:
                    source, target = rng.sample(names, 2)
                    order = [source, target] if rng.random() < 0.5 else [target, source]
                    started = time.monotonic()
                    with client.lock_all(order, ttl=10, timeout=timeout) as handle:
                        waits.append(time.monotonic() - started)
                        rows = dict(db_conn.execute("SELECT id, balance FROM accounts WHERE id IN (?, ?)",
                                                    (source, target)).fetchall())
                        amount = rng.randint(1, 50)
                        guard.update(source, handle.token_for(source), {"balance": rows[source] - amount})
                        guard.update(target, handle.token_for(target), {"balance": rows[target] + amount})
                    done[index] += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            db_conn.close()

    workers = [threading.Thread(target=worker, args=(i,), name=f"transfer-{i}") for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(seconds + 4 * timeout)
    assert not any(w.is_alive() for w in workers), "a transfer thread hangs (deadlock?)"
    assert errors == [], errors
    conn = sqlite3.connect(db)
    total = conn.execute("SELECT SUM(balance) FROM accounts").fetchone()[0]
    conn.close()
    return {"transfers": sum(done), "max_wait_s": max(waits), "total": total, "expected": 1000 * accounts,
            "min_per_thread": min(done)}


async def test_transfers_conserve_balances(address: str, tmp_path: Path) -> None:
    """8 threads doing random transfers over 4 accounts with lock_all in random name orders (a few seconds; 60 s
    with FENCEPOST_SOAK=1): no deadlock, no timeout (each caller waits up to 30 s), balances conserved in the
    fenced table, every thread made progress."""
    figures = await asyncio.to_thread(_transfers, address, tmp_path / "bank.db", TRANSFER_SECONDS)
    print(f"\nmulti-lock transfers: {figures}")
    assert figures["total"] == figures["expected"]
    assert figures["transfers"] > 0 and figures["min_per_thread"] > 0
    assert figures["max_wait_s"] < 30.0


async def test_each_name_is_listed_and_counted(address: str, coordinator: object) -> None:
    """``list_locks`` (what ``fencepost locks`` prints) and ``describe`` (``fencepost status``) show each name of a
    multi-lock held by its lease with its token; each name's grant is counted as a lock's."""
    async with AsyncLockClient(address) as client:
        handle = await client.acquire_all(["l/1", "l/2"], ttl=5)
        listed = {lock.name: lock for lock in await client.list_locks("l/")}
        assert set(listed) == {"l/1", "l/2"}
        for name, lock in listed.items():
            assert (lock.holder_lease_id, lock.token) == (handle.lease_id, handle.token_for(name))
        described = await client.describe("l/2")
        assert described.held and described.holder_token == handle.token_for("l/2")
        await handle.release()
        assert not (await client.describe("l/1")).held


async def test_acquire_all_over_http(etcd: object, prefix: str) -> None:
    """The HTTP rows: POST /v1/locks:acquireAll grants every name (one token each), /v1/locks:releaseAll releases
    them; bad names are a 400 naming ``names``."""
    import aiohttp

    from fencepost.coordinator.process.coordinator import Coordinator

    coordinator = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix,  # type: ignore[attr-defined]
                              http_listen="127.0.0.1:0")
    await asyncio.wait_for(coordinator.start(), 20)
    try:
        base = f"http://{coordinator.http_address}"
        async with aiohttp.ClientSession() as session:
            async with session.post(base + "/v1/leases", json={"ttlSeconds": 10}) as answer:
                lease = await answer.json()
            headers = {"Fencepost-Lease-Secret": lease["leaseSecret"]}
            body = {"names": ["h1", "h2"], "leaseId": lease["leaseId"], "waitMs": 1000}
            async with session.post(base + "/v1/locks:acquireAll", json=body, headers=headers) as answer:
                granted = await answer.json()
            assert answer.status == 200 and granted["acquired"] is True and len(granted["tokens"]) == 2
            release = {"names": ["h2", "h1"], "leaseId": lease["leaseId"], "token": granted["tokens"][0]}
            async with session.post(base + "/v1/locks:releaseAll", json=release, headers=headers) as answer:
                assert answer.status == 200, await answer.text()
            bad = {"names": ["h1"], "leaseId": lease["leaseId"]}
            async with session.post(base + "/v1/locks:acquireAll", json=bad, headers=headers) as answer:
                refused = await answer.json()
            assert answer.status == 400 and refused["details"][0]["metadata"]["field"] == "names"
    finally:
        await asyncio.wait_for(coordinator.stop(grace=0), 20)


async def test_thirty_two_names_and_refused_releases(stub: object, etcd_client: Etcd3Client, prefix: str) -> None:
    """32 names (the most) in one Txn, try once and waiting; a ReleaseAll with a token the lease does not hold
    them under is refused (NOT_HOLDER / STALE_TOKEN) and deletes nothing; a lease with a key in only some of the
    names (a single Acquire) is refused, INVALID_ARGUMENT naming ``names``."""
    lease = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10))  # type: ignore[attr-defined]
    secret = secret_metadata(lease.lease_id, None)
    names = [f"many/{i:02d}" for i in range(32)]
    once = await stub.AcquireAll(lock_pb2.AcquireAllRequest(names=names, lease_id=lease.lease_id),  # type: ignore
                                 metadata=secret, timeout=10)
    assert once.acquired and len(once.tokens) == 32
    waited = await stub.AcquireAll(lock_pb2.AcquireAllRequest(  # type: ignore[attr-defined]
        names=list(reversed(names)), lease_id=lease.lease_id, wait_ms=5000), metadata=secret, timeout=10)
    assert list(waited.tokens) == list(once.tokens)  # the same grant again
    for token, reason in ((once.tokens[0] - 1, "STALE_TOKEN"), (once.tokens[0] + 1000, "NOT_HOLDER")):
        with pytest.raises(grpc.RpcError) as caught:
            await stub.ReleaseAll(lock_pb2.ReleaseAllRequest(  # type: ignore[attr-defined]
                names=names, lease_id=lease.lease_id, token=token), metadata=secret, timeout=10)
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        info = error_info(caught.value)
        assert info is not None and info.reason == reason
        assert len(await _keys_of(etcd_client, prefix, lease.lease_id)) == 32
    await stub.ReleaseAll(lock_pb2.ReleaseAllRequest(  # type: ignore[attr-defined]
        names=names, lease_id=lease.lease_id, token=once.tokens[0], request_id="rel-1"), metadata=secret, timeout=10)
    assert await _keys_of(etcd_client, prefix, lease.lease_id) == []
    await stub.ReleaseAll(lock_pb2.ReleaseAllRequest(  # type: ignore[attr-defined]
        names=names, lease_id=lease.lease_id, token=once.tokens[0], request_id="rel-1"), metadata=secret, timeout=10)
    await stub.Acquire(lock_pb2.AcquireRequest(name="many/00", lease_id=lease.lease_id))  # type: ignore
    with pytest.raises(grpc.RpcError) as caught:
        await stub.AcquireAll(lock_pb2.AcquireAllRequest(  # type: ignore[attr-defined]
            names=["many/00", "many/01"], lease_id=lease.lease_id, wait_ms=1000), metadata=secret, timeout=10)
    assert_invalid_field(caught.value, "names")
    assert len(await _keys_of(etcd_client, prefix, lease.lease_id)) == 1


async def test_release_after_close_and_lock_all_loss(address: str, etcd_client: Etcd3Client, prefix: str) -> None:
    """A multi-lock's release after its client closed raises FencepostError; inside
    ``lock_all``, a cancellation by ``cancel_on_lost`` surfaces as LeaseLost."""
    from fencepost.client import FencepostError

    client = AsyncLockClient(address)
    handle = await client.acquire_all(["c1", "c2"], ttl=5)
    await client.close()
    assert handle.released or handle.lost_reason is not None  # the close's revoke may be heard first
    with pytest.raises(FencepostError):  # "client is closed" (or LeaseLost, when the revoke was heard)
        await handle.release()
    async with AsyncLockClient(address) as client:
        with pytest.raises(LeaseLost) as lost:
            async with client.lock_all(["c3", "c4"], ttl=5) as held:
                assert held.lease_secret and held.lease_secret == (await client.acquire("c5", ttl=5)).lease_secret
                held.cancel_on_lost()
                key = Keys(prefix).contender("c4", held.lease_id)
                await etcd_client.kv.delete(key, timeout=5)  # type: ignore[union-attr]
                await asyncio.Event().wait()  # cancelled by the loss
        assert lost.value.name == "c4", lost.value
        await wait_for(lambda: _count_is(etcd_client, prefix, 1), 10, what="c3 released (c5 held)")


async def test_docs_example_runs(address: str, tmp_path: Path) -> None:
    """The fenced transfer of docs/multilocks.md runs as written (address and file moved) and conserves money."""
    page = (Path(__file__).parent.parent / "docs" / "multilocks.md").read_text()
    code = page.split("```python\n", 1)[1].split("```", 1)[0]
    db = tmp_path / "bank.db"
    code = code.replace("127.0.0.1:7420", address).replace('"bank.db"', repr(str(db)))
    await asyncio.to_thread(exec, compile(code, "docs/multilocks.md", "exec"), {})
    conn = sqlite3.connect(db)
    rows = dict(conn.execute("SELECT id, balance FROM accounts").fetchall())
    conn.close()
    assert rows == {"acct:1": 995, "acct:2": 1005}
