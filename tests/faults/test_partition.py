"""F02 and F03: the holder's connection to the coordinator is partitioned.

Holder A reaches the in-process coordinator through a :class:`Proxy`; B
talks to it directly. F02 blackholes A's connection both ways (no FIN, no
RST), F03 drops only what the coordinator sends to A while A's keepalives
still reach etcd. In both, A must declare the loss from its own clock (send
time of its last acknowledged keepalive + TTL), B must get a larger token
only after that, and a storage guard must refuse A's late write.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from typing import Any

import pytest
from etcd3aio import Etcd3Client

from fencepost.client import AsyncLockClient, AsyncLockHandle, FencepostError, LeaseLost
from fencepost.client import StaleTokenError as ClientStaleTokenError
from fencepost.client.v1 import lock_pb2_grpc

from ..conftest import describe, describe_waiters_is, wait_for
from .conftest import SOAK, log_figure
from tests.harness.proxy import Direction, Proxy

#: The lock TTL of both cases: 2 s in CI, 4 s (the case's figure) in the soak profile.
T = 4.0 if SOAK else 2.0
#: Slack for scheduling on a loaded 2-core machine (the case's e is 0.5 s).
SLACK = 0.5
#: A's per-call connection budget: no call may hang longer than this (+ slack).
A_CONNECT_TIMEOUT = 2.0


class Storage:
    """One fenced SQLite row, guarded by fencepost.client.fencing.SqlGuard (inline fallback)."""

    def __init__(self) -> None:
        self.conn = sqlite3.connect(":memory:", isolation_level=None)
        self.conn.execute("CREATE TABLE rows (id TEXT PRIMARY KEY, value TEXT, fencing_token INTEGER)")
        self.conn.execute("INSERT INTO rows VALUES ('r', 'init', NULL)")
        try:
            from fencepost.client.fencing import SqlGuard
        except ImportError:  # the guards are not built yet: the same single statement, inline
            self.guard: Any = None
        else:
            self.guard = SqlGuard(self.conn, "rows", "id")

    def write(self, token: int, value: str) -> None:
        """Write ``value`` with ``token``; raises StaleTokenError when the row holds a larger token."""
        if self.guard is not None:
            self.guard.update("r", token, {"value": value})
            return
        cur = self.conn.execute(
            "UPDATE rows SET value = ?, fencing_token = ? WHERE id = ? "
            "AND (fencing_token IS NULL OR fencing_token <= ?)", (value, token, "r", token))
        if cur.rowcount != 1:
            raise ClientStaleTokenError("stale token", name="r", token=token)

    def value(self) -> tuple[str, int]:
        row = self.conn.execute("SELECT value, fencing_token FROM rows WHERE id = 'r'").fetchone()
        return row[0], row[1]


async def _lost_at(handle: AsyncLockHandle) -> float:
    """Monotonic time at which ``handle.lost`` was set."""
    await handle.lost.wait()
    return time.monotonic()


async def _timed(coro: Any) -> tuple[float, BaseException | None]:
    """Run ``coro``; return (seconds it took, what it raised or None)."""
    start = time.monotonic()
    try:
        await coro
    except BaseException as exc:  # noqa: BLE001 - returned to the test
        return time.monotonic() - start, exc
    return time.monotonic() - start, None


async def _granted_at(coro: Any) -> tuple[AsyncLockHandle, float]:
    """Await an acquire; return its handle and the monotonic time it returned."""
    handle = await coro
    return handle, time.monotonic()


async def _wait_ack(handle: AsyncLockHandle, timeout: float = 5.0) -> None:
    """Wait until a keepalive of ``handle``'s lease is acknowledged (its deadline moves)."""
    first = handle.deadline
    await wait_for(lambda: handle.deadline > first, timeout, interval=0.01, what="a keepalive ack")


async def test_f02_silent_partition_of_the_holder(
    address: str, stub: lock_pb2_grpc.LockServiceStub, proxy_to: Any, request: pytest.FixtureRequest
) -> None:
    """F02: A's handle reports the loss by its last acked send + T, before B's grant; A's late write is refused."""
    proxy: Proxy = proxy_to(address)
    storage = Storage()
    async with AsyncLockClient(proxy.address, connect_timeout=A_CONNECT_TIMEOUT) as a, \
            AsyncLockClient(address) as b:
        ha = await a.acquire("f02", ttl=T, timeout=5)
        storage.write(ha.token, "A1")
        storage.write(ha.token, "A2")  # the same holder may write many times
        lost = asyncio.create_task(_lost_at(ha))
        b_task = asyncio.create_task(_granted_at(b.acquire("f02", ttl=T, timeout=30)))
        try:
            await wait_for(lambda: describe_waiters_is(stub, "f02", 1), 10, what="B waiting")
            await _wait_ack(ha)
            start = proxy.blackhole(Direction.BOTH)

            lost_at = await asyncio.wait_for(asyncio.shield(lost), 2 * T + 5)
            detect = lost_at - start
            # The deadline A used: send time of its last acknowledged keepalive + T - margin.
            last_acked_send = ha.deadline - ha.ttl + ha.margin
            assert ha.lost_reason == "DEADLINE", ha.lost_reason
            assert lost_at <= last_acked_send + ha.ttl + 0.1, (lost_at - last_acked_send)
            assert detect <= ha.ttl + 0.25, f"loss reported {detect:.2f} s after the blackhole (T = {ha.ttl})"
            assert not ha.is_valid()
            with pytest.raises(LeaseLost):
                ha.check()

            # No call on A's client hangs while the partition lasts.
            release_took, release_err = await _timed(ha.release())
            try_took, try_err = await _timed(a.try_acquire("f02-other", ttl=T))
            assert isinstance(release_err, LeaseLost), repr(release_err)
            assert release_took <= SLACK, release_took  # a lost hold is reported at once; the Release goes on in the background
            assert isinstance(try_err, FencepostError), repr(try_err)
            assert try_took <= A_CONNECT_TIMEOUT + SLACK, try_took

            hb, b_at = await asyncio.wait_for(b_task, 3 * T + 5)
            assert hb.token > ha.token
            assert lost_at < b_at, "B was granted before A knew it had lost the lock"
            storage.write(hb.token, "B")

            await asyncio.sleep(max(0.0, start + 3 * T - time.monotonic()))
            proxy.forward()
            healed_at = time.monotonic()
            with pytest.raises(ClientStaleTokenError):
                storage.write(ha.token, "A-late")
            assert storage.value() == ("B", hb.token)
            # The bytes A sent during the partition (a Release with tA) arrive now: B keeps the lock.
            ok = await a.try_acquire("f02-after", ttl=T)
            await ok.release()
            recovered = time.monotonic() - healed_at
            desc = await describe(stub, "f02")
            assert desc.held and desc.holder.token == hb.token
            assert hb.is_valid()
            await hb.release()
            log_figure(request, ttl=float(ha.ttl), loss_after_blackhole=detect,
                       loss_vs_last_acked_send=lost_at - last_acked_send,
                       b_granted_after_blackhole=b_at - start, b_after_loss=b_at - lost_at,
                       release_call=release_took, try_acquire_call=try_took, recovered_after_heal=recovered)
        finally:
            for task in (lost, b_task):
                task.cancel()
            await asyncio.gather(lost, b_task, return_exceptions=True)


async def _lease_gone(etcd_client: Etcd3Client, lease_id: int) -> bool:
    assert etcd_client.lease is not None
    resp = await etcd_client.lease.time_to_live(lease_id, timeout=2)
    return int(resp.TTL) < 0


async def test_f03_acks_lost_while_keepalives_flow(
    address: str, stub: lock_pb2_grpc.LockServiceStub, proxy_to: Any, etcd_client: Etcd3Client,
    request: pytest.FixtureRequest,
) -> None:
    """F03: A declares the loss by its deadline, stops renewing, etcd drops the lease within T + e; B then A again get larger tokens."""
    proxy: Proxy = proxy_to(address)
    async with AsyncLockClient(proxy.address, connect_timeout=A_CONNECT_TIMEOUT) as a, \
            AsyncLockClient(address) as b:
        ha = await a.acquire("f03", ttl=T, timeout=5)
        lost = asyncio.create_task(_lost_at(ha))
        b_task = asyncio.create_task(b.acquire("f03", ttl=T, timeout=30))
        a_again: asyncio.Task[AsyncLockHandle] | None = None
        try:
            await wait_for(lambda: describe_waiters_is(stub, "f03", 1), 10, what="B waiting")
            await _wait_ack(ha)
            start = proxy.blackhole(Direction.DOWN, drop=True)
            lost_at = await asyncio.wait_for(asyncio.shield(lost), 2 * T + 5)
            detect = lost_at - start
            assert ha.lost_reason == "DEADLINE", ha.lost_reason
            assert detect <= ha.ttl + 0.25, f"loss reported {detect:.2f} s after acks stopped (T = {ha.ttl})"

            # A's keepalives reached etcd until then; after the loss A sends none, so etcd drops the lease.
            await wait_for(lambda: _lease_gone(etcd_client, ha.lease_id), ha.ttl + 5, interval=0.05,
                           what="the lease to expire in etcd")
            gone_after = time.monotonic() - lost_at
            assert gone_after <= ha.ttl + SLACK, f"lease still in etcd {gone_after:.2f} s after the loss"

            await asyncio.sleep(max(0.0, start + 1.5 * T - time.monotonic()))
            proxy.forward()
            healed_at = time.monotonic()

            hb = await asyncio.wait_for(b_task, 2 * T + 5)
            assert hb.token > ha.token
            # The same client object acquires again: no stale "already held" from the lost hold.
            a_again = asyncio.create_task(a.acquire("f03", ttl=T, timeout=20))
            await wait_for(lambda: describe_waiters_is(stub, "f03", 1), 10, what="A waiting again")
            await hb.release()
            ha2 = await asyncio.wait_for(a_again, 10)
            assert ha2.token > hb.token
            assert ha2.lease_id != ha.lease_id
            reacquired = time.monotonic() - healed_at
            await ha2.release()
            log_figure(request, ttl=float(ha.ttl), loss_after_acks_stopped=detect,
                       lease_gone_after_loss=gone_after, reacquire_after_heal=reacquired,
                       reconnects=proxy.accepted - 1)
        finally:
            for task in (lost, b_task, a_again):
                if task is not None:
                    task.cancel()
            await asyncio.gather(*(t for t in (lost, b_task, a_again) if t is not None), return_exceptions=True)
