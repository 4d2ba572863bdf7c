"""A lock-delay is visible (issue 25, item 8): ``ListLocks`` and ``fencepost locks`` list a name that a delay
holds back, with or without contenders, with its time left; the metrics count the running delays; the log
names a waiter's key as text."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from etcd3aio import Etcd3Client

from fencepost.client import AsyncLockClient, LockHeld
from fencepost.client.v1 import lock_pb2
from fencepost.client.v1.keys import Keys, prefix_end
from fencepost.coordinator.recipes import delay_census
from fencepost.coordinator.recipes.lock_delay import delay_range

from .cli_helpers import run_cli
from .conftest import describe_waiters_is, wait_for
from .metrics_scrape import scrape

DELAY = 40


@pytest.fixture(autouse=True)
async def _no_delay_left(etcd_client: Etcd3Client, prefix: str) -> AsyncIterator[None]:
    """After each test, its lock-delay keys go (a lost hold's record is on no lease: nothing else ends it)."""
    yield
    assert etcd_client.kv is not None
    start = Keys(prefix).prefix + b"!delay!"
    await etcd_client.kv.delete(start, prefix_end(start), timeout=5)


async def _revoke(etcd_client: Etcd3Client, lease_id: int) -> None:
    assert etcd_client.lease is not None
    await etcd_client.lease.revoke(lease_id, timeout=5)


async def _listed(stub: Any, prefix: str = "", page_size: int = 0) -> list[Any]:
    """Every LockInfo of a listing, page after page."""
    locks: list[Any] = []
    token = ""
    while True:
        page = await stub.ListLocks(lock_pb2.ListLocksRequest(prefix=prefix, page_size=page_size, page_token=token),
                                    timeout=10)
        locks += page.locks
        token = page.next_page_token
        if not token:
            return locks


async def _hidden(address: str, etcd_client: Etcd3Client, name: str, *, start: bool) -> int:
    """A hold of ``name`` with a 40 s lock-delay whose lease is revoked; with ``start``, a try-once acquire then
    starts the delay (refused: nobody waits). Returns the lost hold's token."""
    async with AsyncLockClient(address) as holder:
        held = await holder.acquire(name, ttl=20, timeout=5, lock_delay=DELAY)
        await _revoke(etcd_client, held.lease_id)
    if start:
        async with AsyncLockClient(address) as other:
            with pytest.raises(LockHeld):
                await other.try_acquire(name, ttl=10)
    return held.token


async def test_list_locks_when_a_delay_hides_a_name_without_contenders_lists_it(
        address: str, stub: Any, etcd_client: Etcd3Client) -> None:
    """A name whose holder was lost with a 40 s lock-delay, nobody waiting: listed with no holder, the delay
    pending (-1) until an acquire starts it, then running with its time left; a held lock with a delay of its own
    is listed once, held; every page size lists each name once; the prefix filters the delayed names too."""
    async with AsyncLockClient(address) as client:
        held = await client.acquire("d/held", ttl=20, timeout=5, lock_delay=5)  # its own record: held, no delay
        await _hidden(address, etcd_client, "d/pending", start=False)
        await _hidden(address, etcd_client, "d/running", start=True)
        await _hidden(address, etcd_client, "e/other", start=True)
        listed = await _listed(stub, "d/")
        assert [lock.name for lock in listed] == ["d/held", "d/pending", "d/running"], listed
        by_name = {lock.name: lock for lock in listed}
        assert by_name["d/held"].holder.lease_id == held.lease_id
        assert (by_name["d/held"].lock_delay_seconds, by_name["d/held"].lock_delay_remaining_ms) == (0, 0)
        for name in ("d/pending", "d/running"):
            lock = by_name[name]
            assert not lock.HasField("holder") and lock.waiter_count == 0 and lock.lock_delay_seconds == DELAY
            assert (lock.ttl_remaining_seconds, lock.ttl_seconds, lock.held_seconds) == (-1, 0, -1)
        assert by_name["d/pending"].lock_delay_remaining_ms == -1
        assert 0 < by_name["d/running"].lock_delay_remaining_ms <= DELAY * 1000
        for size in (1, 2, 3):
            assert [lock.name for lock in await _listed(stub, "d/", size)] == ["d/held", "d/pending", "d/running"]
        assert [lock.name for lock in await _listed(stub, "", 1)] == ["d/held", "d/pending", "d/running",
                                                                      "e/other"]
        # The client's HeldLock says so too.
        found = {lock.name: lock for lock in await client.list_locks("d/")}
        assert found["d/running"].held_back and found["d/running"].holder_lease_id == 0
        assert 0 < (found["d/running"].lock_delay_remaining or 0) <= DELAY
        assert found["d/pending"].held_back and found["d/pending"].lock_delay_remaining is None
        assert not found["d/held"].held_back and found["d/held"].lock_delay == 0
        await held.release()


async def test_locks_command_when_a_delay_hides_a_name_shows_its_time_left(
        address: str, stub: Any, etcd_client: Etcd3Client) -> None:
    """`fencepost locks` shows a name under a running lock-delay, with a waiter queued, as held back with the
    delay's time left (table and JSON); `fencepost status NAME` shows the delay and its time left."""
    await _hidden(address, etcd_client, "t/x", start=False)
    async with AsyncLockClient(address) as waiter:
        waiting = asyncio.create_task(waiter.acquire("t/x", ttl=20, timeout=60))
        try:
            await wait_for(lambda: describe_waiters_is(stub, "t/x", 1), 10, what="the waiter")
            table = await run_cli("locks", "t/", "--address", address)
            as_json = await run_cli("locks", "t/", "--json", "--address", address)
            status = await run_cli("status", "t/x", "--address", address)
        finally:
            waiting.cancel()
    assert table.rc == 0, table
    lines = table.out.splitlines()
    assert lines[0].split()[-1] == "LOCK-DELAY", table.out
    row = lines[1].split()
    assert row[:6] == ["t/x", "-", "-", "-", "-", "1"] and row[-3:-1] == ["left", "of"], table.out
    assert row[-1] == f"{DELAY}s" and 0 < float(row[-4].rstrip("s")) <= DELAY, table.out
    assert lines[2].startswith("0 held, 1 held back by a lock-delay, etcd revision "), table.out
    entry = json.loads(as_json.out)["locks"][0]
    assert entry["name"] == "t/x" and entry["holder_lease_id"] is None and entry["token"] is None
    assert entry["waiter_count"] == 1 and entry["lock_delay_seconds"] == DELAY
    assert 0 < entry["lock_delay_remaining_ms"] <= DELAY * 1000
    assert "t/x: not held" in status.out and f"s left of {DELAY} s (held back;" in status.out, status.out


@pytest.fixture
async def metered(etcd: Any, prefix: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    """A coordinator with metrics whose lock-delay census runs every 0.1 s."""
    from fencepost.coordinator.process.coordinator import Coordinator

    monkeypatch.setattr(delay_census, "CENSUS_SECONDS", 0.1)
    coord = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix, metrics_listen="127.0.0.1:0")
    await asyncio.wait_for(coord.start(), 20)
    try:
        yield coord
    finally:
        await asyncio.wait_for(coord.stop(grace=0), 20)


async def test_metrics_when_a_delay_runs_count_it_and_its_time_left(metered: Any, etcd_client: Etcd3Client) -> None:
    """``fencepost_lock_delays`` counts the running delays (not a pending one, nor a held lock's record) and
    ``fencepost_lock_delay_remaining_seconds`` gives the longest time left; both return to 0 when it ends."""
    address = metered.address

    async def gauges() -> tuple[float | None, float | None]:
        found = await scrape(metered.metrics_address)
        return found.value("fencepost_lock_delays"), found.value("fencepost_lock_delay_remaining_seconds")

    async with AsyncLockClient(address) as client:
        held = await client.acquire("m/held", ttl=20, timeout=5, lock_delay=5)
        await _hidden(address, etcd_client, "m/pending", start=False)
        await wait_for(lambda: _is(gauges, (0.0, 0.0)), 10, what="the census to run")
        await _hidden(address, etcd_client, "m/running", start=True)
        await wait_for(lambda: _counted(gauges), 10, what="the running delay to be counted")
        running, left = await gauges()
        assert running == 1 and 0 < (left or 0) <= DELAY
        assert etcd_client.kv is not None  # the wait ends (as when etcd expires its lease): deleted here
        keys = Keys(metered.keys.prefix.decode())
        await etcd_client.kv.delete(delay_range(keys, keys.lock_prefix("m/running")) + b"wait", timeout=5)
        await wait_for(lambda: _is(gauges, (0.0, 0.0)), 10, what="the gauges back to 0")
        await held.release()


async def _is(gauges: Any, want: tuple[float, float]) -> bool:
    return bool(await gauges() == want)


async def _counted(gauges: Any) -> bool:
    return bool((await gauges())[0] == 1)


async def test_waiter_withdrawn_later_is_logged_by_name_not_bytes(
        address: str, stub: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A waiting Acquire whose call is cancelled has its key withdrawn 2 s later: the log line names the lock as
    text and the lease in hex, never a bytes repr of the key."""
    caplog.set_level(logging.DEBUG, logger="fencepost.coordinator.recipes.waiters")
    async with AsyncLockClient(address) as holder:
        held = await holder.acquire("log/é x", ttl=20, timeout=5)
        lease = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=20), timeout=5)
        call = stub.Acquire(lock_pb2.AcquireRequest(name="log/é x", lease_id=lease.lease_id, wait_ms=60_000),
                            timeout=60)
        await wait_for(lambda: describe_waiters_is(stub, "log/é x", 1), 10, what="the waiter")
        call.cancel()
        # 2 s later, plus the etcd Txn: bounded well inside the waiter lease's 20 s TTL only on a quiet machine,
        # so this waits longer; a withdrawal that never happens still fails below (no "withdrew" line).
        await wait_for(lambda: describe_waiters_is(stub, "log/é x", 0), 30, what="the key withdrawn")
        await held.release()
    lines = [r.getMessage() for r in caplog.records if r.name.endswith("waiters")]
    assert any(f"lease {lease.lease_id:#x} for lock 'log/é x'" in m for m in lines), lines
    assert not any("b'" in m or "%C3" in m for m in lines), lines
