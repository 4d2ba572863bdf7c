"""Lock-delay (AcquireRequest.lock_delay_seconds) against a real etcd: after a hold is lost, the next grant waits.

The delay is measured from the moment the coordinator's deletion watcher saw
the lost holder's key deleted (the end of the hold as the coordinator knows
it), or, where the coordinator runs in another process, from just before the
test revoked the holder's lease (which is no later than that deletion).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import signal
import sys
import time
from typing import Any

import grpc
import pytest
from etcd3aio import Etcd3Client

from fencepost.client import AsyncLockClient, InvalidArgument, LockHeld
from fencepost.client.cli import common, flags
from fencepost.client.v1 import lock_pb2
from fencepost.client.v1.keys import Keys
from fencepost.coordinator.recipes.lock_delay import delay_range

from .cli_helpers import cli_argv, holding
from .conftest import CoordinatorProcess, assert_invalid_field, cli_env, describe_waiters_is, wait_for
from .owned_stub import OwnedStub

DELAY = 2
#: etcd expires leases on a timer (every 500 ms) and the grant needs a few round trips: the sane upper bound.
SLACK = 2.0


def _seen_deleted(coordinator: Any, key: bytes) -> asyncio.Future[float]:
    """A future set to the monotonic time at which the coordinator's watcher sees ``key`` deleted."""
    seen: asyncio.Future[float] = asyncio.get_running_loop().create_future()

    def on_delete(revision: int | None) -> None:
        if revision is not None and not seen.done():
            seen.set_result(time.monotonic())

    coordinator.watcher.subscribe(key, on_delete)
    return seen


async def _delay_keys(etcd_client: Etcd3Client, prefix: str, name: str) -> list[bytes]:
    """The lock-delay keys of lock ``name`` in etcd (record and wait)."""
    keys = Keys(prefix)
    start = delay_range(keys, keys.lock_prefix(name))
    assert etcd_client.kv is not None
    resp = await etcd_client.kv.get(start, start[:-1] + b'"', keys_only=True, timeout=5)  # '"' follows '!'
    return [kv.key for kv in resp.kvs]


async def _revoke(etcd_client: Etcd3Client, lease_id: int) -> None:
    assert etcd_client.lease is not None
    await etcd_client.lease.revoke(lease_id, timeout=5)


async def test_waiter_after_a_revoked_holder_is_granted_no_earlier_than_the_delay(
    coordinator: Any, address: str, prefix: str, etcd_client: Etcd3Client, stub: OwnedStub
) -> None:
    """A queued waiter is granted no earlier than the holder's lease revoke (as the coordinator saw it) + delay."""
    async with AsyncLockClient(address) as a, AsyncLockClient(address) as b:
        held = await a.acquire("revoked", ttl=10.0, timeout=5.0, lock_delay=DELAY)
        assert len(await _delay_keys(etcd_client, prefix, "revoked")) == 1  # the record of this hold
        # Another lock, whose key sorts before "revoked"'s ("-" < "/") but its delay keys after ("!" < "-").
        other = await b.acquire("revoked-z", ttl=10.0, timeout=5.0)
        assert await _listed(stub) == {"revoked": held.lease_id, "revoked-z": other.lease_id}  # its own record
        waiter = asyncio.create_task(b.acquire("revoked", ttl=10.0, timeout=15.0))
        await wait_for(lambda: describe_waiters_is(stub, "revoked", 1), 10, what="the waiter")
        seen = _seen_deleted(coordinator, Keys(prefix).contender("revoked", held.lease_id))
        await _revoke(etcd_client, held.lease_id)
        await seen
        # While the delay runs, Describe shows no holder (the waiter is not granted yet) and the waiter queued.
        await wait_for(lambda: _delay_running(etcd_client, prefix, "revoked"), 10, what="the delay to start")
        during = await stub.Describe(lock_pb2.DescribeRequest(name="revoked"), timeout=5)
        assert not during.held and not during.HasField("holder") and during.waiter_count == 1, during
        assert [w.lease_id for w in during.waiters] != [held.lease_id] and len(during.waiters) == 1
        # ListLocks agrees: "revoked" is not held, its waiter waits, the delay runs.
        assert await _listed(stub) == {"revoked": 0, "revoked-z": other.lease_id}
        listed = {lock.name: lock for lock in (await stub.ListLocks(lock_pb2.ListLocksRequest(), timeout=5)).locks}
        assert not listed["revoked"].HasField("holder") and listed["revoked"].waiter_count == 1
        assert listed["revoked"].lock_delay_seconds == DELAY and 0 < listed["revoked"].lock_delay_remaining_ms
        assert (listed["revoked-z"].lock_delay_seconds, listed["revoked-z"].lock_delay_remaining_ms) == (0, 0)
        granted = await asyncio.wait_for(waiter, 15)
        waited = time.monotonic() - await seen
        assert DELAY <= waited <= DELAY + SLACK, waited
        assert granted.token > held.token
        assert await _delay_keys(etcd_client, prefix, "revoked") == []  # the wait ended, b recorded no delay
        assert await _listed(stub) == {"revoked": granted.lease_id, "revoked-z": other.lease_id}
        await granted.release()
        await other.release()


async def _listed(stub: OwnedStub) -> dict[str, int]:
    """ListLocks' locks (one page): name -> holder lease."""
    page = await stub.ListLocks(lock_pb2.ListLocksRequest(prefix=""), timeout=5)
    return {lock.name: lock.holder.lease_id for lock in page.locks}


async def _delay_running(etcd_client: Etcd3Client, prefix: str, name: str) -> bool:
    """Whether the lock-delay of ``name`` runs: its wait key (on a lease of its own) exists."""
    return any(key.endswith(b"!wait") for key in await _delay_keys(etcd_client, prefix, name))


async def test_clean_release_grants_the_next_holder_at_once(
    address: str, prefix: str, etcd_client: Etcd3Client, stub: OwnedStub
) -> None:
    """Release of a hold with a lock-delay hands the lock on at once and leaves no delay state behind."""
    async with AsyncLockClient(address) as a, AsyncLockClient(address) as b:
        held = await a.acquire("clean", ttl=10.0, timeout=5.0, lock_delay=3)
        waiter = asyncio.create_task(b.acquire("clean", ttl=10.0, timeout=10.0, lock_delay=3))
        await wait_for(lambda: describe_waiters_is(stub, "clean", 1), 10, what="the waiter")
        started = time.monotonic()
        await held.release()
        granted = await asyncio.wait_for(waiter, 10)
        assert time.monotonic() - started < 1.0
        assert len(await _delay_keys(etcd_client, prefix, "clean")) == 1  # b's own record
        await granted.release()
        assert await _delay_keys(etcd_client, prefix, "clean") == []
        again = await a.try_acquire("clean", ttl=10.0)  # no delay after a clean release
        await again.release()


async def test_withdraw_of_a_hold_is_a_clean_end(
    address: str, prefix: str, etcd_client: Etcd3Client, stub: OwnedStub
) -> None:
    """Withdraw of a hold with a lock-delay deletes its record: the next try-once is granted."""
    lease = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10), timeout=5)
    got = await stub.Acquire(lock_pb2.AcquireRequest(name="withdrawn", lease_id=lease.lease_id,
                                                     lock_delay_seconds=5), timeout=5)
    assert got.acquired
    assert len(await _delay_keys(etcd_client, prefix, "withdrawn")) == 1
    gone = await stub.Withdraw(lock_pb2.WithdrawRequest(name="withdrawn", lease_id=lease.lease_id), timeout=5)
    assert gone.held
    assert await _delay_keys(etcd_client, prefix, "withdrawn") == []
    other = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10), timeout=5)
    tried = await stub.Acquire(lock_pb2.AcquireRequest(name="withdrawn", lease_id=other.lease_id), timeout=5)
    assert tried.acquired


async def test_try_acquire_during_the_delay_is_refused_without_a_holder(
    address: str, prefix: str, etcd_client: Etcd3Client
) -> None:
    """With nobody waiting, the first Acquire after the loss starts the delay: try-once is refused (no holder)
    and a blocking acquire is granted no earlier than that first try + the delay."""
    async with AsyncLockClient(address) as a, AsyncLockClient(address) as b:
        held = await a.acquire("idle", ttl=10.0, timeout=5.0, lock_delay=DELAY)
        await _revoke(etcd_client, held.lease_id)
        first_try = time.monotonic()
        with pytest.raises(LockHeld) as info:
            await b.try_acquire("idle", ttl=10.0)
        assert info.value.holder_lease_id == 0 and info.value.holder_token == 0
        assert "lock-delay" in str(info.value)
        assert len(await _delay_keys(etcd_client, prefix, "idle")) == 1  # the wait, on its own lease
        with pytest.raises(LockHeld) as again:
            await b.try_acquire("idle", ttl=10.0)
        cli = common.acquire_error(again.value, "idle", 0.0, [address])  # what fencepost acquire --try says
        assert cli.exit_code == common.EXIT_HELD and "lock-delay" in str(cli) and "is held" not in str(cli), cli
        granted = await b.acquire("idle", ttl=10.0, timeout=10.0)
        waited = time.monotonic() - first_try
        assert DELAY <= waited <= DELAY + SLACK, waited
        assert granted.token > held.token
        await granted.release()


async def test_sigkilled_holder_process_delays_the_next_grant(
    coordinator: Any, address: str, prefix: str, spawn: Any, stub: OwnedStub
) -> None:
    """A holder process killed with SIGKILL: its lease expires after its TTL, then the next grant waits the delay."""
    child = spawn(
        "import sys, time\n"
        "from fencepost.client import LockClient\n"
        "with LockClient(sys.argv[1]) as client:\n"
        "    h = client.acquire('killed', ttl=2, timeout=10, lock_delay=2)\n"
        "    print('held', h.lease_id, h.token, flush=True)\n"
        "    time.sleep(60)\n",
        address,
    )
    match = await child.await_line(r"held (\d+) (\d+)", 20)
    lease_id, token = int(match.group(1)), int(match.group(2))
    async with AsyncLockClient(address) as b:
        waiter = asyncio.create_task(b.acquire("killed", ttl=10.0, timeout=15.0))
        await wait_for(lambda: describe_waiters_is(stub, "killed", 1), 10, what="the waiter")
        seen = _seen_deleted(coordinator, Keys(prefix).contender("killed", lease_id))
        child.kill()
        granted = await asyncio.wait_for(waiter, 15)
        waited = time.monotonic() - await seen
        assert 2 <= waited <= 2 + SLACK, waited
        assert granted.token > token
        await granted.release()


async def test_delay_survives_a_coordinator_restart(
    coordinator_process: CoordinatorProcess, prefix: str, etcd_client: Etcd3Client
) -> None:
    """A coordinator killed and started again while the delay runs still holds the grant back until it ends."""
    delay = 6  # longer than a coordinator restart takes on a loaded 2-core machine (3 s was not, twice)
    address = coordinator_process.start()
    channel = grpc.aio.insecure_channel(address)
    try:
        stub = OwnedStub(channel)
        a = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=30), timeout=5)
        b = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=30), timeout=5)
        got = await stub.Acquire(lock_pb2.AcquireRequest(name="restart", lease_id=a.lease_id,
                                                         lock_delay_seconds=delay), timeout=5)
        assert got.acquired
        waiting = stub.Acquire(lock_pb2.AcquireRequest(name="restart", lease_id=b.lease_id, wait_ms=20_000),
                               timeout=25)
        keys = Keys(prefix)
        wait_key = delay_range(keys, keys.lock_prefix("restart")) + b"wait"

        async def delay_started() -> bool:
            return wait_key in await _delay_keys(etcd_client, prefix, "restart")

        revoked_at = time.monotonic()
        await _revoke(etcd_client, a.lease_id)
        await wait_for(delay_started, 10, what="the delay to start")
        coordinator_process.kill()
        with pytest.raises(grpc.aio.AioRpcError):
            await waiting
        await channel.close()
        address = await asyncio.to_thread(coordinator_process.start)
        assert time.monotonic() - revoked_at < delay, "the restart outlasted the delay: nothing was tested"
        channel = grpc.aio.insecure_channel(address)
        stub = OwnedStub(channel)
        again = await stub.Acquire(lock_pb2.AcquireRequest(name="restart", lease_id=b.lease_id, wait_ms=20_000),
                                   timeout=25)
        waited = time.monotonic() - revoked_at
        assert again.acquired and again.token > got.token
        assert delay <= waited <= delay + SLACK + 1.0, waited
    finally:
        await channel.close()


async def test_bad_lock_delay_is_invalid_argument(address: str, stub: OwnedStub) -> None:
    """lock_delay_seconds outside 0..3600 is INVALID_ARGUMENT naming the field; the clients check lock_delay."""
    lease = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10), timeout=5)
    for bad in (-1, 3601, 2**62):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Acquire(lock_pb2.AcquireRequest(name="bad", lease_id=lease.lease_id,
                                                       lock_delay_seconds=bad), timeout=5)
        assert_invalid_field(info.value, "lock_delay_seconds")
    async with AsyncLockClient(address) as client:
        for value in (-0.5, 3600.5, math.nan, math.inf):
            with pytest.raises(InvalidArgument) as err:
                await client.acquire("bad", ttl=10.0, timeout=1.0, lock_delay=value)
            assert err.value.field == "lock_delay"
        handle = await client.try_acquire("bad", ttl=10.0, lock_delay=0.2)  # rounded up to 1 s: allowed
        await handle.release()


async def test_cli_acquire_and_run_pass_lock_delay(address: str, prefix: str, etcd_client: Etcd3Client) -> None:
    """``fencepost acquire`` and ``fencepost run`` with --lock-delay record their hold's delay; a bad one exits 2."""
    async with holding("cli-delay", "--ttl", "5", "--lock-delay", "2", "--address", address) as holder:
        assert await holder.read_token() > 0
        assert len(await _delay_keys(etcd_client, prefix, "cli-delay")) == 1
        rc, _, err = await holder.finish(signal.SIGINT)
        assert rc == 0, err
    assert await _delay_keys(etcd_client, prefix, "cli-delay") == []

    run = await asyncio.create_subprocess_exec(
        *cli_argv("run", "run-delay", "--ttl", "5", "--lock-delay", "2", "--address", address, "--",
                  sys.executable, "-c", "import time; time.sleep(60)"),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=cli_env())
    try:
        async def recorded() -> bool:
            return len(await _delay_keys(etcd_client, prefix, "run-delay")) == 1

        await wait_for(recorded, 15, what="the run's lock-delay record")
        run.send_signal(signal.SIGTERM)  # forwarded to the command; run then releases
        await asyncio.wait_for(run.communicate(), 15)
    finally:
        if run.returncode is None:
            run.kill()
            await run.communicate()
    assert await _delay_keys(etcd_client, prefix, "run-delay") == []

    assert flags.parse_lock_delay("2.5") == 2.5
    for bad in ("-1", "3601", "nan", "soon"):
        with pytest.raises(argparse.ArgumentTypeError, match="lock-delay"):
            flags.parse_lock_delay(bad)
