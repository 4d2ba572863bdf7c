"""Lock-delay bounded and visible (issue 25): ``--max-lock-delay`` and a policy rule's bound refuse a longer
delay; Describe shows a running or pending delay and its time left; AdminEndLockDelay ends it, audited."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from etcd3aio import Etcd3Client

from fencepost.client import AsyncLockClient, InvalidArgument
from fencepost.client.v1 import lock_pb2, lock_pb2_grpc

from .cli_helpers import run_cli
from .conftest import assert_invalid_field, wait_for

POLICY = """
[[allow]]
anonymous = true
actions = ["acquire", "release", "describe", "admin"]
names = ["long/*"]

[[allow]]
anonymous = true
actions = ["acquire", "release", "describe", "admin"]
names = ["short/*"]
max_lock_delay_seconds = 2
"""


@pytest.fixture
async def bounded(etcd: Any, prefix: str) -> AsyncIterator[tuple[str, Any]]:
    """A coordinator with --max-lock-delay 40 and POLICY; its address and a raw stub."""
    from fencepost.coordinator.admission.access import Policy
    from fencepost.coordinator.admission.limits import Limits
    from fencepost.coordinator.process.coordinator import Coordinator

    coordinator = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix,
                              policy=Policy.from_text(POLICY), limits=Limits(max_lock_delay=40))
    await asyncio.wait_for(coordinator.start(), 20)
    address = f"127.0.0.1:{coordinator.port}"
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            yield address, lock_pb2_grpc.LockServiceStub(channel)
    finally:
        await asyncio.wait_for(coordinator.stop(grace=0), 20)


async def _acquire(stub: Any, lease_id: int, name: str, delay: int) -> Any:
    return await stub.Acquire(lock_pb2.AcquireRequest(name=name, lease_id=lease_id, lock_delay_seconds=delay),
                              timeout=10)


async def test_acquire_when_lock_delay_above_its_bound_is_refused(bounded: tuple[str, Any]) -> None:
    """A lock-delay above --max-lock-delay (40 s), or above a policy rule's lower bound (2 s on short/*), is
    refused with INVALID_ARGUMENT naming lock_delay_seconds; one at the bound is granted."""
    address, stub = bounded
    async with AsyncLockClient(address) as client:
        lease = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10), timeout=10)
        for name, delay in (("long/a", 41), ("long/a", 3600), ("short/a", 3)):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await _acquire(stub, lease.lease_id, name, delay)
            assert_invalid_field(caught.value, "lock_delay_seconds")
            assert str(delay) in (caught.value.details() or "")
        with pytest.raises(InvalidArgument) as refused:  # the client's own path (its KeepAlive stream)
            await client.acquire("short/b", ttl=10, timeout=5, lock_delay=3)
        assert refused.value.field == "lock_delay_seconds"
        for name, delay in (("long/a", 40), ("short/a", 2)):
            held = await client.acquire(name, ttl=10, timeout=5, lock_delay=delay)
            await held.release()


async def test_admin_end_lock_delay_when_a_waiter_waits_out_a_long_delay(
        bounded: tuple[str, Any], etcd_client: Etcd3Client, caplog: pytest.LogCaptureFixture) -> None:
    """A hold with a 40 s lock-delay whose lease is revoked: Describe shows the delay pending (-1), then
    running with its time left once a waiter came; AdminEndLockDelay ends it, the waiter is granted at once,
    Describe shows none, a second call ends nothing; each call is audited; the log names the lock as text."""
    address, stub = bounded
    caplog.set_level(logging.INFO)
    async with AsyncLockClient(address) as holder, AsyncLockClient(address) as waiter:
        held = await holder.acquire("long/x", ttl=10, timeout=5, lock_delay=40)
        assert etcd_client.lease is not None
        await etcd_client.lease.revoke(held.lease_id, timeout=5)
        pending = await stub.Describe(lock_pb2.DescribeRequest(name="long/x"), timeout=10)
        assert not pending.held and (pending.lock_delay_seconds, pending.lock_delay_remaining_ms) == (40, -1)
        waiting = asyncio.create_task(waiter.acquire("long/x", ttl=10, timeout=60))

        async def running() -> bool:
            d = await stub.Describe(lock_pb2.DescribeRequest(name="long/x"), timeout=10)
            return d.lock_delay_remaining_ms > 0

        await wait_for(running, 15, what="the delay to run")
        d = await stub.Describe(lock_pb2.DescribeRequest(name="long/x"), timeout=10)
        assert not d.held and d.lock_delay_seconds == 40 and 0 < d.lock_delay_remaining_ms <= 40_000
        assert not waiting.done()
        started = time.monotonic()
        ended = await stub.AdminEndLockDelay(lock_pb2.AdminEndLockDelayRequest(name="long/x"), timeout=10)
        assert ended.ended and 0 < ended.lock_delay_remaining_ms <= 40_000
        granted = await asyncio.wait_for(waiting, 20)
        assert time.monotonic() - started < 20  # well before the 40 s delay
        after = await stub.Describe(lock_pb2.DescribeRequest(name="long/x"), timeout=10)
        assert after.held and after.holder.lease_id == granted.lease_id and after.lock_delay_remaining_ms == 0
        again = await stub.AdminEndLockDelay(lock_pb2.AdminEndLockDelayRequest(name="long/x"), timeout=10)
        assert not again.ended
        assert (await stub.Describe(lock_pb2.DescribeRequest(name="long/x"), timeout=10)).held  # a live hold stays
        await granted.release()
    audits = [r.getMessage() for r in caplog.records if "admin end_lock_delay 'long/x'" in r.getMessage()]
    assert any(m.endswith(": ended") for m in audits) and any(m.endswith(": no_delay") for m in audits), audits
    started_lines = [r.getMessage() for r in caplog.records if "lock-delay of 40 s" in r.getMessage()]
    assert started_lines and all("lock 'long/x'" in m and "b'" not in m for m in started_lines), started_lines


async def test_admin_end_lock_delay_when_pending_frees_the_lock(bounded: tuple[str, Any],
                                                                  etcd_client: Etcd3Client) -> None:
    """A hold with a lock-delay lost with nobody waiting: `fencepost status` shows the pending delay, `fencepost
    admin end-lock-delay` drops it, and a try-once Acquire is granted at once."""
    address, stub = bounded
    async with AsyncLockClient(address) as holder, AsyncLockClient(address) as other:
        held = await holder.acquire("long/p", ttl=10, timeout=5, lock_delay=40)
        assert etcd_client.lease is not None
        await etcd_client.lease.revoke(held.lease_id, timeout=5)
        shown = await run_cli("status", "long/p", "--address", address)
        assert "not held" in shown.out and "lock-delay     40 s, starting at the next acquire" in shown.out, shown
        ended = await run_cli("admin", "end-lock-delay", "long/p", "--json", "--address", address)
        assert ended.rc == 0 and json.loads(ended.out)["ended"] is True, ended
        assert "lock-delay" not in (await run_cli("status", "long/p", "--address", address)).out
        got = await other.try_acquire("long/p", ttl=10)
        assert got.token > held.token
        await got.release()


async def test_admin_end_lock_delay_when_there_is_no_policy(stub: Any) -> None:
    """Without an access policy, AdminEndLockDelay is refused like every admin call."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.AdminEndLockDelay(lock_pb2.AdminEndLockDelayRequest(name="x"), timeout=10)
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
