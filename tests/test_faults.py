"""Faults: frozen and killed holders, a restarted coordinator."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import grpc
import pytest

from fencepost.client import AsyncLockClient
from fencepost.client.v1 import lock_pb2, lock_pb2_grpc

from .conftest import CoordinatorProcess, describe, describe_waiters_is, error_info, wait_for
from .owned_stub import OwnedStub

# A lock holder in its own OS process: acquires, prints its grant, then reports
# (once each) when is_valid() turns false and when the lost event fires.
HOLDER = r"""
import sys, time
from fencepost.client import LockClient

address, name, ttl = sys.argv[1], sys.argv[2], float(sys.argv[3])
with LockClient(address) as client:
    h = client.acquire(name, ttl=ttl, timeout=10.0)
    print(f"ACQUIRED token={h.token} lease={h.lease_id} ttl={h.ttl}", flush=True)
    invalid = lost = False
    while not (invalid and lost):
        if not invalid and not h.is_valid():
            invalid = True
            print("INVALID", flush=True)
        if not lost and h.lost.is_set():
            lost = True
            print(f"LOST reason={h.lost_reason}", flush=True)
        time.sleep(0.02)
    print("DONE", flush=True)
    time.sleep(3600)
"""

ACQUIRED = r"ACQUIRED token=(\d+) lease=(\d+)"


async def test_frozen_holder_loses_the_lock_to_a_waiter(
    address: str, stub: lock_pb2_grpc.LockServiceStub, spawn: Any
) -> None:
    """A holder frozen with SIGSTOP past its TTL loses the lock; after SIGCONT it learns so and cannot release."""
    ttl = 2.0
    child = spawn(HOLDER, address, "frozen", str(ttl))
    match = await child.await_line(ACQUIRED, 20)
    old_token, old_lease = int(match.group(1)), int(match.group(2))
    async with AsyncLockClient(address) as client:
        waiter = asyncio.create_task(client.acquire("frozen", ttl=10.0, timeout=20.0))
        try:
            await wait_for(lambda: describe_waiters_is(stub, "frozen", 1), 10, what="the waiter")
            child.signal(signal.SIGSTOP)
            frozen_at = time.monotonic()
            h = await asyncio.wait_for(waiter, 15)
            granted_after = time.monotonic() - frozen_at
            assert h.token > old_token
            assert h.lease_id != old_lease
            assert granted_after >= ttl - 1.0, granted_after  # not before the lease could expire
            # Stay frozen past the TTL in any case, then wake the holder up.
            await asyncio.sleep(max(0.0, ttl + 0.5 - (time.monotonic() - frozen_at)))
            child.signal(signal.SIGCONT)
            await child.await_line(r"^INVALID", 5)
            await child.await_line(r"^LOST", 5)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Release(
                    lock_pb2.ReleaseRequest(name="frozen", lease_id=old_lease, token=old_token), timeout=5
                )
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            detail = error_info(info.value)
            assert detail is not None
            assert detail.reason in {"LEASE_EXPIRED", "NOT_HOLDER", "STALE_TOKEN"}
            desc = await describe(stub, "frozen")
            assert desc.held and desc.holder.token == h.token
            assert h.is_valid()
            await h.release()
        finally:
            waiter.cancel()
            await asyncio.gather(waiter, return_exceptions=True)


async def test_killed_holder_lock_passes_within_ttl_plus_one_second(
    address: str, stub: lock_pb2_grpc.LockServiceStub, spawn: Any
) -> None:
    """The lock of a SIGKILLed holder goes to the waiter within TTL + 1 s of the kill."""
    ttl = 2.0
    child = spawn(HOLDER, address, "killed", str(ttl))
    match = await child.await_line(ACQUIRED, 20)
    old_token = int(match.group(1))
    async with AsyncLockClient(address) as client:
        waiter = asyncio.create_task(client.acquire("killed", ttl=10.0, timeout=20.0))
        try:
            await wait_for(lambda: describe_waiters_is(stub, "killed", 1), 10, what="the waiter")
            killed_at = time.monotonic()
            child.kill()
            h = await asyncio.wait_for(waiter, 10)
            elapsed = time.monotonic() - killed_at
            assert h.token > old_token
            assert elapsed <= ttl + 1.0, f"granted {elapsed:.2f} s after the kill"
            await h.release()
        finally:
            waiter.cancel()
            await asyncio.gather(waiter, return_exceptions=True)


async def test_coordinator_restart_keeps_the_lock_and_its_token(
    coordinator_process: CoordinatorProcess,
) -> None:
    """After a coordinator restart on the same port the client still holds the lock with the same token, and
    its keepalives flow through the new process (a keepalive sent after the restart is acknowledged)."""
    ttl = 8.0  # room for a restart on a loaded machine: the hold is lost if the gap exceeds the TTL
    address = await asyncio.to_thread(coordinator_process.start)
    async with AsyncLockClient(address) as client:
        h = await client.acquire("restart", ttl=ttl, timeout=5.0)
        async with grpc.aio.insecure_channel(address) as chan:
            before = await describe(OwnedStub(chan), "restart")
        assert before.held and before.holder.token == h.token and before.holder.lease_id == h.lease_id

        code = await asyncio.to_thread(coordinator_process.terminate)
        assert code == 0, f"coordinator exited with {code} on SIGTERM"
        again = await asyncio.to_thread(coordinator_process.start)
        assert again == address
        restarted_at = time.monotonic()

        # The hold's deadline is the send time of its last acknowledged keepalive + TTL - margin: once that
        # send time is after the restart, the new process renews the lease.
        await wait_for(lambda: h.deadline + h.margin - ttl > restarted_at or h.lost.is_set(), 2 * ttl,
                       what="a keepalive sent after the restart to be acknowledged")
        assert h.is_valid(), f"the handle lost its lease across the restart ({h.lost_reason})"
        assert not h.lost.is_set()
        async with grpc.aio.insecure_channel(address) as chan:
            after = await describe(OwnedStub(chan), "restart")
        assert after.held
        assert after.holder.token == h.token and after.holder.lease_id == h.lease_id
        await h.release()
