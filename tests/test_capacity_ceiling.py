"""Past capacity, the parts that see the backlog as it forms and keep it from coming back (issue 23).

- The keepalive wait: how long keepalive messages waited before the
  coordinator read them, from the send time each carries (``sent_ms``). In
  unit tests with injected clocks (a sustained median enters the condition,
  a few slow messages do not), and against a real coordinator: a stream whose
  messages say they were sent half a second before they arrived (as messages
  left in gRPC's buffers would) makes it refuse LeaseGrant.
- The lease ceiling: learned on entering the condition (0.9 of the leases
  carried), LeaseGrant refused at it outside the condition while keepalives,
  streams and waits are served, raised by 10 % after a calm spell in which a
  grant was refused, not raised without demand, not raised back to where it
  tipped over for a minute.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import pytest
from prometheus_client import CollectorRegistry

import fencepost.client as fc
from fencepost.client.v1 import details, lock_pb2
from fencepost.coordinator.admission.capacity import (BACKOFF, CALM_WINDOWS, MIN_CEILING, RAISE, RAISE_SECONDS,
                                                       TIPPED_SECONDS, WINDOWS, Capacity)
from fencepost.coordinator.admission.limits import FLAGS, Limits
from fencepost.coordinator.admission.overload import LoopLag
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.process.embedded import EmbeddedEtcd
from fencepost.coordinator.telemetry.metrics import LockMetrics

from .conftest import wait_for
from .owned_stub import OwnedStub


class Clocks:
    """The wall clock of a unit test, advanced by hand (the loop thread's CPU clock stays idle)."""

    def __init__(self) -> None:
        self.wall = 0.0


class Carried:
    """The leases kept alive through the coordinator's streams, as the test sets them."""

    def __init__(self, kept: int = 0) -> None:
        self.kept = kept


def monitor(clocks: Clocks, carried: Carried | None = None, metrics: LockMetrics | None = None,
            **limits: float) -> Capacity:
    limits.setdefault("max_process_busy", 0)  # tests/test_capacity_process.py has the process's own
    capacity = Capacity(Limits(**limits), clock=lambda: clocks.wall, cpu_clock=lambda: 0.0, window=1.0)
    lag = LoopLag(ticks=1)
    kept = carried if carried is not None else Carried()
    if metrics is not None:
        capacity.follow(lag, metrics, kept=lambda: kept.kept)
    else:
        capacity.follow(lag, kept=lambda: kept.kept)
    return capacity


def windows(capacity: Capacity, clocks: Clocks, count: int = 1, waits: tuple[int, ...] = ()) -> None:
    """``count`` windows of 1 s, each with keepalive messages that waited ``waits`` (ms)."""
    for _ in range(count):
        for wait in waits:
            capacity.waited(wait)
        clocks.wall += 1.0
        capacity.tick()


def overload(capacity: Capacity, clocks: Clocks) -> None:
    """Enter the condition by the keepalive wait, then leave it (calm for CALM_WINDOWS windows)."""
    windows(capacity, clocks, count=WINDOWS, waits=(400,) * 20)
    assert capacity.overloaded
    windows(capacity, clocks, count=CALM_WINDOWS, waits=(1,) * 20)
    assert not capacity.overloaded


def test_keepalives_that_wait_to_be_read_enter_the_condition() -> None:
    """The median wait of a window's keepalive messages, sustained over WINDOWS windows, at --max-keepalive-wait
    (0.05 s) is past capacity; a minority of slow messages is not."""
    clocks = Clocks()
    capacity = monitor(clocks)
    windows(capacity, clocks, count=2 * WINDOWS, waits=(2,) * 60 + (3000,) * 40)
    assert not capacity.overloaded and capacity.keepalive_wait == pytest.approx(0.002)
    windows(capacity, clocks, count=WINDOWS - 1, waits=(2,) * 40 + (80,) * 60)
    assert not capacity.overloaded  # not sustained yet
    windows(capacity, clocks, waits=(2,) * 40 + (80,) * 60)
    assert capacity.overloaded and capacity.keepalive_wait == pytest.approx(0.08)
    with pytest.raises(fc.ResourceExhausted, match="keepalives wait 0.080 s to be read, --max-keepalive-wait 0.05"):
        capacity.admit("KeepAlive")
    assert FLAGS["max_keepalive_wait"] == "max-keepalive-wait" and Limits().max_keepalive_wait == 0.05
    off = monitor(clocks, max_keepalive_wait=0)
    windows(off, clocks, count=2 * WINDOWS, waits=(5000,) * 10)
    assert not off.overloaded


def test_the_lease_ceiling_is_learned_on_entering_the_condition() -> None:
    """No ceiling before the condition; on entering it, BACKOFF of the leases carried. Outside the condition a
    LeaseGrant is refused at the ceiling (OVERLOADED, RetryInfo), everything else is admitted; below it, served."""
    clocks = Clocks()
    carried = Carried(kept=1000)
    capacity = monitor(clocks, carried)
    capacity.admit("LeaseGrant", lease=True)
    assert capacity.ceiling is None
    overload(capacity, clocks)
    assert capacity.ceiling == int(BACKOFF * 1000) == 900
    with pytest.raises(fc.ResourceExhausted) as refused:
        capacity.admit("LeaseGrant", lease=True)
    assert refused.value.reason == "OVERLOADED" and refused.value.retry_delay == 1.0
    assert "at its lease ceiling (900 leases" in refused.value.message
    capacity.admit("KeepAlive")
    capacity.admit("Acquire")
    carried.kept = 899
    capacity.admit("LeaseGrant", lease=True)


def test_leases_just_granted_count_as_carried_until_their_renewals_start() -> None:
    """A lease granted counts for RAISE_SECONDS (its renewals may not have reached the coordinator yet); the
    ceiling never goes below MIN_CEILING."""
    clocks = Clocks()
    capacity = monitor(clocks)
    for _ in range(150):
        capacity.granted()
    assert capacity.carried == 150
    windows(capacity, clocks, count=WINDOWS, waits=(400,) * 20)
    assert capacity.overloaded and capacity.ceiling == int(BACKOFF * 150)
    windows(capacity, clocks, count=int(RAISE_SECONDS))
    assert capacity.carried == 0
    quiet = monitor(clocks)
    windows(quiet, clocks, count=WINDOWS, waits=(400,) * 20)
    assert quiet.ceiling == MIN_CEILING


def test_the_lease_ceiling_rises_after_a_calm_spell_with_demand() -> None:
    """After RAISE_SECONDS of calm in which a grant was refused at the ceiling, it rises by RAISE; without a
    refusal it stays; for TIPPED_SECONDS after tipping over it never rises above BACKOFF of what was carried
    then (no ratchet into overload); entering the condition again sets it to BACKOFF of what is carried (or of
    itself, if less)."""
    clocks = Clocks()
    carried = Carried(kept=500)
    capacity = monitor(clocks, carried)
    overload(capacity, clocks)  # tipped over at 500 carried
    assert capacity.ceiling == 450
    carried.kept = 300  # leases ended meanwhile
    windows(capacity, clocks, count=int(RAISE_SECONDS) + 2)
    assert capacity.ceiling == 450  # no grant asked: no demand seen
    carried.kept = 450
    with pytest.raises(fc.ResourceExhausted):
        capacity.admit("LeaseGrant", lease=True)
    windows(capacity, clocks, count=int(RAISE_SECONDS))
    assert capacity.ceiling == 450  # at BACKOFF of where it tipped over, until TIPPED_SECONDS have passed
    windows(capacity, clocks, count=int(TIPPED_SECONDS))
    assert capacity.ceiling == int(450 * RAISE) + 1 == 496
    with pytest.raises(fc.ResourceExhausted):
        carried.kept = 496
        capacity.admit("LeaseGrant", lease=True)
    windows(capacity, clocks, count=int(RAISE_SECONDS))
    assert capacity.ceiling == int(496 * RAISE) + 1
    carried.kept = 1200  # leases kept here that were granted elsewhere
    windows(capacity, clocks, count=WINDOWS, waits=(400,) * 20)
    assert capacity.overloaded and capacity.ceiling == int(BACKOFF * (int(496 * RAISE) + 1))


@pytest.mark.parametrize("behind", ["loop", "etcd", "etcd-busy"])
def test_a_lag_that_is_etcds_refuses_newcomers_but_sets_no_ceiling(behind: str) -> None:
    """Past --max-lag because the event loop runs late: the ceiling is learned. Because the oldest keepalive
    forwarded to etcd waits (a stalled disk or member) while the process had CPU to spare: newcomers are refused
    all the same, the ceiling is not lowered (the leases carried did not cause it). The same wait while the
    process used SPARE_BUSY or more of each second (its keepalives queue here to go to etcd): the ceiling."""
    clocks = Clocks()
    process = {"cpu": 0.0}
    etcd_wait = 0.0 if behind == "loop" else 0.8
    lag = LoopLag(ticks=1, waiting=lambda: etcd_wait)
    capacity = Capacity(Limits(), clock=lambda: clocks.wall, cpu_clock=lambda: 0.0, window=1.0,
                        process_clock=lambda: process["cpu"])
    capacity.follow(lag, kept=lambda: 1000)
    clocks.wall += 1.0
    process["cpu"] += 0.95 if behind == "etcd-busy" else 0.3
    capacity.tick()  # one window: the process's CPU in it
    lag.tick(0.8 if behind == "loop" else 0.0)
    assert capacity.overloaded
    with pytest.raises(fc.ResourceExhausted, match="0.800 s behind, --max-lag 0.5"):
        capacity.admit("LeaseGrant", lease=True)
    assert capacity.ceiling == (None if behind == "etcd" else 900)


def test_the_wait_and_the_ceiling_are_metrics() -> None:
    """fencepost_keepalive_wait_seconds follows the figure; fencepost_lease_ceiling is 0 until learned."""
    registry = CollectorRegistry()
    clocks = Clocks()
    capacity = monitor(clocks, Carried(kept=500), LockMetrics(registry))
    windows(capacity, clocks, count=1, waits=(30,) * 10)
    assert registry.get_sample_value("fencepost_lease_ceiling") == 0.0
    windows(capacity, clocks, count=WINDOWS, waits=(200,) * 10)
    assert registry.get_sample_value("fencepost_keepalive_wait_seconds") == pytest.approx(0.2)
    assert registry.get_sample_value("fencepost_lease_ceiling") == 450.0


# ---------------------------------------------------------------- against a real coordinator


@pytest.fixture
async def coordinator(etcd: EmbeddedEtcd, prefix: str) -> AsyncIterator[Coordinator]:
    """A coordinator whose capacity monitor closes a window every 0.1 s (its loop's CPU never counts)."""
    coord = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix,
                        capacity=Capacity(Limits(max_loop_busy=0), window=0.1))
    await asyncio.wait_for(coord.start(), 20)
    try:
        yield coord
    finally:
        await asyncio.wait_for(coord.stop(grace=0), 20)


async def test_keepalives_sent_long_before_they_are_read_make_the_coordinator_refuse_leases(
        coordinator: Coordinator) -> None:
    """A stream's first message sets its floor (clock offset + network); later ones that say they were sent
    500 ms before that floor allows (what waiting in gRPC's buffers looks like) make the coordinator past its
    capacity: LeaseGrant is refused OVERLOADED naming the wait, while the stream's keepalives are answered."""
    capacity = coordinator.capacity
    assert capacity is not None
    async with grpc.aio.insecure_channel(f"127.0.0.1:{coordinator.port}") as channel:
        stub = OwnedStub(channel)
        lease = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10))
        stream = stub.KeepAlive()
        offset = 123_456_789  # the client's clock has its own origin

        async def renew(request_id: int, waited_ms: int) -> None:
            sent = int(time.monotonic() * 1000) + offset - waited_ms
            await stream.write(lock_pb2.KeepAliveRequest(
                keepalive=lock_pb2.LeaseKeepAlive(lease_id=lease.lease_id, request_id=request_id),
                lease_secret=lease.lease_secret, sent_ms=sent))
            ack = await asyncio.wait_for(stream.read(), 10)
            assert ack.keepalive.request_id == request_id and ack.keepalive.ttl_seconds > 0

        await renew(1, 0)
        for request_id in range(2, 8):
            await renew(request_id, 0)
        assert not capacity.overloaded and capacity.keepalive_wait < 0.05
        request_id = 8
        started = time.monotonic()
        while not capacity.overloaded:
            assert time.monotonic() - started < 20, "never past capacity"
            await renew(request_id, 500)
            request_id += 1
        assert capacity.keepalive_wait >= 0.4
        with pytest.raises(grpc.aio.AioRpcError) as grant:
            await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10))
        status = details.parse(grant.value)
        assert (status.code, status.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "OVERLOADED"), grant.value
        assert "keepalives wait" in (grant.value.details() or "")
        await renew(request_id, 500)  # the admitted lease is still renewed
        await wait_for(lambda: not capacity.overloaded, 20, 0.02, "back within capacity")
        assert capacity.ceiling == MIN_CEILING  # 1 lease carried: the lowest ceiling
        again = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10))
        stream.cancel()
        for lease_id in (lease.lease_id, again.lease_id):
            await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease_id))
