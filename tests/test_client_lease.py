"""Unit tests of the lease state machine and pool, the deadline watcher and the handles, on an injected clock.

Behaviour against a real coordinator is tested elsewhere (test_locks.py, tests/faults/).
"""

from __future__ import annotations

import asyncio
import threading

import pytest

import fencepost.client as fc
from fencepost.client._leases.lease import Lease, LeasePool, margin_for
from fencepost.client._leases.deadlines import DeadlineWatcher
from fencepost.client.errors import REASON_DEADLINE

from .client_fakes import (
    NOT_HOLDER,
    LEASE_EXPIRED,
    FakeClock,
    join_callbacks,
    Parts,
)


# ---------------------------------------------------------------- the lease state machine


def test_lease_when_granted() -> None:
    """The first deadline is grant send time + granted TTL - margin (margin 10% of TTL, 0.1 s to 1 s)."""
    clock = FakeClock(100.0)
    assert Lease(1, 10, 100.0, clock=clock).deadline == pytest.approx(109.0)
    assert Lease(1, 2, 100.0, clock=clock).deadline == pytest.approx(101.8)
    assert Lease(1, 60, 100.0, clock=clock).deadline == pytest.approx(159.0)
    assert margin_for(0.5) == pytest.approx(0.1)


def test_on_ack_when_answers_arrive_out_of_order() -> None:
    """An ack moves the deadline to its keepalive's send time + TTL - margin, and never backwards."""
    clock = FakeClock(100.0)
    lease = Lease(1, 10, 100.0, clock=clock)
    assert lease.on_ack(105.0, 10)
    assert lease.deadline == pytest.approx(114.0)
    assert lease.on_ack(103.0, 10)  # a late answer to an older keepalive
    assert lease.deadline == pytest.approx(114.0)
    assert lease.on_ack(99.0, 10)  # an answer to a keepalive sent before the grant
    assert lease.deadline == pytest.approx(114.0)
    clock.now = 110.0
    assert lease.remaining() == pytest.approx(4.0)


@pytest.mark.parametrize("ttl_seconds", [0, -1])
def test_on_ack_when_ttl_is_not_positive(ttl_seconds: int) -> None:
    """An ack with ttl <= 0 reports the lease gone and does not extend the deadline."""
    lease = Lease(1, 10, 100.0, clock=FakeClock(100.0))
    assert not lease.on_ack(105.0, ttl_seconds)
    assert lease.deadline == pytest.approx(109.0)


def test_lease_when_deadline_passes() -> None:
    """Past the deadline remaining() is 0 and expired() is true, on the injected clock only."""
    clock = FakeClock(100.0)
    lease = Lease(1, 10, 100.0, clock=clock)
    clock.now = 108.99
    assert not lease.expired() and lease.remaining() == pytest.approx(0.01)
    clock.now = 109.0
    assert lease.expired() and lease.remaining() == 0.0


def test_mark_lost_when_called_twice() -> None:
    """mark_lost reports True once and keeps the first reason; a lost lease ignores acks."""
    lease = Lease(1, 10, 100.0, clock=FakeClock(100.0))
    assert lease.mark_lost(REASON_DEADLINE)
    assert not lease.mark_lost(LEASE_EXPIRED)
    assert lease.lost_reason == REASON_DEADLINE
    assert not lease.on_ack(200.0, 10)
    assert lease.remaining() == 0.0


async def test_pool_lose_when_lease_has_holds() -> None:
    """Losing a lease drops it from the pool, stops its keepalives and loses each hold once, with its reason."""
    parts = Parts()
    lease = parts.lease()
    a, b = parts.hold(lease, "a", 5), parts.hold(lease, "b", 6)
    parts.stream.renewals.add(lease)
    assert parts.stream.renewals.due(parts.clock.now) == [lease]
    assert parts.pool.lose(lease, REASON_DEADLINE)
    assert not parts.pool.lose(lease, LEASE_EXPIRED)
    assert parts.pool.live(10) is None and parts.pool.get(77) is None and parts.pool.holds() == []
    assert (a.lost_reason, b.lost_reason) == (REASON_DEADLINE, REASON_DEADLINE)
    assert parts.stream.renewals.due(parts.clock.now) == [] and parts.stream.renewals.delay(parts.clock.now) is None
    parts.stream.outbox = outbox = asyncio.Queue()
    parts.stream.send_keepalives([lease])
    assert outbox.empty() and parts.stream.pending == {}


def test_pool_expire_when_one_deadline_passed() -> None:
    """expire() loses the leases past their deadline (reason DEADLINE) and returns the time to the next one."""
    clock = FakeClock(0.0)
    pool = LeasePool(clock)
    short, long = Lease(1, 2, 0.0, clock=clock), Lease(2, 10, 0.0, clock=clock)
    pool.add(2, short)
    pool.add(10, long)
    assert pool.expire() == pytest.approx(1.8)
    assert not short.lost
    clock.now = 1.8
    assert pool.expire() == pytest.approx(9.0 - 1.8)
    assert short.lost_reason == REASON_DEADLINE and not long.lost
    assert pool.leases() == [long]


def test_pool_close_when_holds_are_live() -> None:
    """Closing the pool marks every hold released, without signalling a loss."""
    parts = Parts()
    handle = parts.hold(parts.lease())
    parts.pool.close()
    assert handle.released and not handle.lost.is_set()
    assert parts.pool.leases() == []


# ---------------------------------------------------------------- the deadline watcher


async def test_deadline_watcher_when_woken_past_a_deadline() -> None:
    """The watcher loses a lease whose deadline has passed on the injected clock once it looks again."""
    parts = Parts(FakeClock(0.0))
    lease = parts.lease(ttl=2)
    handle = parts.hold(lease)
    watcher = DeadlineWatcher(parts.pool)
    running = asyncio.ensure_future(watcher.run())
    try:
        parts.clock.now = 1.8
        watcher.wake()
        await asyncio.wait_for(handle.lost.wait(), 5)
        assert (handle.lost_reason, lease.lost_reason) == (REASON_DEADLINE, REASON_DEADLINE)
    finally:
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running


# ---------------------------------------------------------------- handles


async def test_on_lost_when_lost_by_several_paths() -> None:
    """The loss is signalled once: one reason, one callback call."""
    parts = Parts()
    lease = parts.lease()
    handle = parts.hold(lease)
    calls: list[str | None] = []
    handle.on_lost(lambda h: calls.append(h.lost_reason))
    parts.pool.lose_hold(handle, REASON_DEADLINE)
    parts.pool.lose_hold(handle, LEASE_EXPIRED)
    parts.pool.lose(lease, NOT_HOLDER)
    join_callbacks()
    assert calls == [REASON_DEADLINE]
    assert handle.lost.is_set() and handle.lost_reason == REASON_DEADLINE
    assert handle.valid_for() == 0.0 and not handle.is_valid()
    with pytest.raises(fc.LeaseLost) as info:
        handle.check()
    assert (info.value.reason, info.value.name, info.value.lease_id) == (REASON_DEADLINE, "a", 77)


async def test_on_lost_when_callback_blocks() -> None:
    """A callback that blocks runs in its own thread and does not block the loop or other callbacks."""
    parts = Parts()
    handle = parts.hold(parts.lease())
    unblock = threading.Event()
    second = threading.Event()
    handle.on_lost(lambda h: unblock.wait(10))
    handle.on_lost(lambda h: second.set())
    parts.pool.lose_hold(handle, REASON_DEADLINE)
    assert await asyncio.to_thread(second.wait, 5)
    unblock.set()
    join_callbacks()


async def test_on_lost_when_registered_after_the_loss() -> None:
    """A callback registered after the loss is called at once."""
    parts = Parts()
    handle = parts.hold(parts.lease())
    parts.pool.lose_hold(handle, LEASE_EXPIRED)
    called = threading.Event()
    handle.on_lost(lambda h: called.set())
    assert await asyncio.to_thread(called.wait, 5)


async def test_on_lost_when_released_before_the_loss() -> None:
    """A released handle never signals a loss, and check() raises NotHolder."""
    parts = Parts()
    lease = parts.lease()
    handle = parts.hold(lease)
    called = threading.Event()
    handle.on_lost(lambda h: called.set())
    parts.pool.finish_release(handle)
    parts.pool.lose_hold(handle, REASON_DEADLINE)
    join_callbacks()
    assert not called.is_set() and not handle.lost.is_set()
    assert handle.valid_for() == 0.0
    with pytest.raises(fc.NotHolder) as info:
        handle.check()
    assert info.value.reason == NOT_HOLDER


async def test_cancel_on_lost_when_hold_is_lost() -> None:
    """cancel_on_lost cancels the registered task when the hold is lost."""
    parts = Parts()
    handle = parts.hold(parts.lease())
    task = asyncio.ensure_future(asyncio.Event().wait())
    handle.cancel_on_lost(task)
    parts.pool.lose_hold(handle, REASON_DEADLINE)
    with pytest.raises(asyncio.CancelledError):
        await task


def test_check_when_local_deadline_passed_before_the_watcher_ran() -> None:
    """check() raises LeaseLost(reason DEADLINE) as soon as the clock passes the deadline."""
    parts = Parts(FakeClock(0.0))
    handle = parts.hold(parts.lease())
    handle.check()
    assert handle.valid_for() == pytest.approx(9.0)
    parts.clock.now = 9.5
    with pytest.raises(fc.LeaseLost) as info:
        handle.check()
    assert info.value.reason == REASON_DEADLINE
