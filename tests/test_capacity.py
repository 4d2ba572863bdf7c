"""Past capacity: a coordinator refuses newcomers (leases, streams, waits) and serves what it admitted.

The rule (coordinator/admission/capacity.py) in unit tests with injected
clocks: what enters the condition (a saturated loop, slow round trips that
most clients report, lag), what does not (one busy window, a pause, a few
slow clients), and the hysteresis. Then against a real etcd and real
coordinators: one made past capacity by its loop's CPU clock running as fast
as the wall clock (:class:`Saturation`, a constructor option of the monitor)
refuses LeaseGrant, a new KeepAlive stream and a new wait with
RESOURCE_EXHAUSTED / OVERLOADED + RetryInfo, while the lease it admitted is
kept alive, its holder releases and its waiter is granted; and a client
given two addresses gets its lock through the second.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import pytest
from prometheus_client import CollectorRegistry

import fencepost.client as fc
from fencepost.client import AsyncLockClient
from fencepost.client.v1 import details, lock_pb2
from fencepost.coordinator.admission.capacity import CALM_WINDOWS, LOW_MARK, RETRY_SECONDS, WINDOWS, Capacity
from fencepost.coordinator.admission.limits import FLAGS, Limits, limits_from_args
from fencepost.coordinator.admission.overload import LoopLag
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.process.embedded import EmbeddedEtcd
from fencepost.coordinator.telemetry.metrics import LockMetrics

from .conftest import wait_for
from .owned_stub import OwnedStub


class Clocks:
    """The wall clock and the loop thread's CPU clock of a unit test, advanced by hand."""

    def __init__(self) -> None:
        self.wall = 0.0
        self.cpu = 0.0

    def run(self, seconds: float, busy: float) -> None:
        """``seconds`` of wall time pass, ``busy`` of each spent on the loop thread's CPU."""
        self.wall += seconds
        self.cpu += seconds * busy


def monitor(clocks: Clocks, **limits: float) -> Capacity:
    return Capacity(Limits(**limits), clock=lambda: clocks.wall, cpu_clock=lambda: clocks.cpu, window=1.0)


def windows(capacity: Capacity, clocks: Clocks, busy: float, count: int = 1, rtts: tuple[int, ...] = ()) -> None:
    """``count`` windows of 1 s at ``busy``, each with ``rtts`` reported (ms)."""
    for _ in range(count):
        for rtt in rtts:
            capacity.reported(rtt)
        clocks.run(1.0, busy)
        capacity.tick()


def test_capacity_when_the_loop_stays_saturated_refuses_newcomers() -> None:
    """A loop busy at every one of the last windows is past capacity: admit raises OVERLOADED with RetryInfo 1 s."""
    clocks = Clocks()
    capacity = monitor(clocks)
    windows(capacity, clocks, busy=0.95, count=WINDOWS - 1)
    assert not capacity.overloaded
    capacity.admit("LeaseGrant")
    windows(capacity, clocks, busy=0.95)
    assert capacity.overloaded and capacity.busy == pytest.approx(0.95)
    with pytest.raises(fc.ResourceExhausted) as refused:
        capacity.admit("LeaseGrant")
    assert refused.value.reason == "OVERLOADED" and refused.value.retry_delay == RETRY_SECONDS == 1.0
    assert "--max-loop-busy 0.9" in refused.value.message


def test_capacity_when_one_window_is_busy_refuses_nothing() -> None:
    """A burst of work (one busy window among calm ones) does not count: the figure is the smallest of the last."""
    clocks = Clocks()
    capacity = monitor(clocks)
    for _ in range(3):
        windows(capacity, clocks, busy=0.3, count=WINDOWS - 1)
        windows(capacity, clocks, busy=1.0)
        assert not capacity.overloaded


def test_capacity_when_paused_refuses_nothing() -> None:
    """A pause (SIGSTOP, a stalled machine) leaves the loop idle: a long window with little CPU, and the round
    trips of one window after it are slow; neither counts."""
    clocks = Clocks()
    capacity = monitor(clocks)
    windows(capacity, clocks, busy=0.5, count=WINDOWS)
    clocks.run(10.0, busy=0.0)  # stopped for 10 s
    capacity.tick()
    windows(capacity, clocks, busy=0.5, rtts=(9000,) * 50)  # the keepalives caught in the pause
    windows(capacity, clocks, busy=0.5, count=WINDOWS, rtts=(2,) * 50)
    assert not capacity.overloaded and capacity.windows == 2 * WINDOWS + 2


def test_capacity_when_most_clients_report_slow_round_trips_refuses_newcomers() -> None:
    """The median of what clients report, sustained: most slow is past capacity, a few slow clients are not."""
    clocks = Clocks()
    capacity = monitor(clocks)
    windows(capacity, clocks, busy=0.5, count=WINDOWS, rtts=(3,) * 60 + (4000,) * 40)
    assert not capacity.overloaded and capacity.client_rtt == pytest.approx(0.003)
    windows(capacity, clocks, busy=0.5, count=WINDOWS, rtts=(3,) * 40 + (700,) * 60)
    assert capacity.overloaded and capacity.client_rtt == pytest.approx(0.7)
    with pytest.raises(fc.ResourceExhausted, match="clients' keepalive round trip 0.700 s, --max-client-rtt 0.5"):
        capacity.admit("KeepAlive")


def test_capacity_when_calm_again_leaves_only_below_the_low_mark() -> None:
    """Hysteresis: past capacity until every signal stayed below LOW_MARK of its mark for CALM_WINDOWS windows."""
    clocks = Clocks()
    capacity = monitor(clocks)
    windows(capacity, clocks, busy=1.0, count=WINDOWS)
    assert capacity.overloaded
    windows(capacity, clocks, busy=0.85, count=2 * WINDOWS)  # below the high mark, above the low one
    assert capacity.overloaded
    calm = LOW_MARK * 0.9 - 0.05
    windows(capacity, clocks, busy=calm, count=CALM_WINDOWS - 1)
    assert capacity.overloaded  # not calm for long enough yet
    windows(capacity, clocks, busy=0.85)  # one window above the low mark: calm starts again
    windows(capacity, clocks, busy=calm, count=CALM_WINDOWS - 1)
    assert capacity.overloaded
    windows(capacity, clocks, busy=calm)
    assert not capacity.overloaded
    capacity.admit("LeaseGrant")


def test_capacity_when_tipped_over_again_soon_stays_calm_longer() -> None:
    """Past capacity again within the calm period after it ended: the next exit needs twice the calm (up to
    MAX_CALM_SECONDS); after a calm as long as the last one, the base calm again."""
    clocks = Clocks()
    capacity = monitor(clocks)
    windows(capacity, clocks, busy=1.0, count=WINDOWS)
    windows(capacity, clocks, busy=0.1, count=CALM_WINDOWS)
    assert not capacity.overloaded
    windows(capacity, clocks, busy=1.0, count=WINDOWS)  # at once: the admissions tipped it over
    assert capacity.overloaded
    windows(capacity, clocks, busy=0.1, count=2 * CALM_WINDOWS - 1)
    assert capacity.overloaded
    windows(capacity, clocks, busy=0.1)
    assert not capacity.overloaded
    windows(capacity, clocks, busy=0.1, count=2 * CALM_WINDOWS)  # a long calm: the base calm again
    windows(capacity, clocks, busy=1.0, count=WINDOWS)
    windows(capacity, clocks, busy=0.1, count=CALM_WINDOWS)
    assert not capacity.overloaded


def test_capacity_when_lag_is_above_max_lag_refuses_newcomers() -> None:
    """The lag monitor's figure (already sustained: the smallest of its last measurements) above --max-lag."""
    clocks = Clocks()
    capacity = monitor(clocks)
    lag = LoopLag(ticks=2)
    capacity.follow(lag)
    lag.tick(0.8)
    lag.tick(0.7)
    assert capacity.overloaded
    with pytest.raises(fc.ResourceExhausted, match="0.700 s behind, --max-lag 0.5"):
        capacity.admit("Acquire")
    lag.tick(0.45)
    assert capacity.overloaded  # 0.45 > LOW_MARK * 0.5: not calm
    lag.tick(0.1)
    clocks.run(CALM_WINDOWS - 0.5, busy=0.1)
    lag.tick(0.1)
    assert capacity.overloaded  # calm, not for long enough yet
    clocks.run(0.5, busy=0.1)
    lag.tick(0.1)
    assert not capacity.overloaded


def test_capacity_when_a_mark_is_0_ignores_its_signal() -> None:
    """0 turns a signal off: a saturated loop, slow round trips and lag, each with its mark 0, refuse nothing."""
    clocks = Clocks()
    capacity = monitor(clocks, max_loop_busy=0, max_client_rtt=0, max_lag=0)
    lag = LoopLag(ticks=1)
    capacity.follow(lag)
    for _ in range(2 * WINDOWS):
        capacity.reported(5000)
        clocks.run(1.0, busy=1.0)
        lag.tick(3.0)
    assert not capacity.overloaded


def test_capacity_figures_are_metrics() -> None:
    """fencepost_loop_busy_ratio, fencepost_keepalive_client_rtt_seconds and fencepost_overloaded follow the
    figures; OVERLOADED is a reason of fencepost_refusals_total from the start."""
    registry = CollectorRegistry()
    metrics = LockMetrics(registry)
    clocks = Clocks()
    capacity = monitor(clocks)
    lag = LoopLag(metrics)
    capacity.follow(lag, metrics)
    assert registry.get_sample_value("fencepost_overloaded") == 0.0
    for _ in range(WINDOWS):
        for _ in range(10):
            capacity.reported(120)
        clocks.run(1.0, busy=0.97)
        lag.tick(0.0)
    assert registry.get_sample_value("fencepost_overloaded") == 1.0
    assert registry.get_sample_value("fencepost_loop_busy_ratio") == pytest.approx(0.97)
    assert registry.get_sample_value("fencepost_keepalive_client_rtt_seconds") == pytest.approx(0.12)
    assert registry.get_sample_value("fencepost_refusals_total", {"reason": "OVERLOADED"}) == 0.0


def test_capacity_marks_are_limit_flags() -> None:
    """--max-loop-busy (0 to 1) and --max-client-rtt (seconds) are limit flags, on by default."""
    assert (FLAGS["max_loop_busy"], FLAGS["max_client_rtt"]) == ("max-loop-busy", "max-client-rtt")
    assert (Limits().max_loop_busy, Limits().max_client_rtt) == (0.9, 0.5)

    class Args:
        max_loop_busy = "0.75"
        max_client_rtt = "0.2"

    parsed = limits_from_args(Args())  # type: ignore[arg-type]
    assert (parsed.max_loop_busy, parsed.max_client_rtt) == (0.75, 0.2)
    with pytest.raises(ValueError, match="--max-loop-busy is 1.5; must be 0 to 1"):
        Limits(max_loop_busy=1.5)
    with pytest.raises(ValueError, match="--max-client-rtt"):
        Limits(max_client_rtt=-1)


# ---------------------------------------------------------------- against real coordinators


class Saturation:
    """The CPU clock of a coordinator's loop thread as the test sets it: running as fast as the wall clock
    (``on``: the loop looks saturated, past capacity within WINDOWS windows) or stopped (idle)."""

    def __init__(self) -> None:
        self.on = False
        self._cpu = 0.0
        self._at = time.monotonic()

    def cpu(self) -> float:
        now = time.monotonic()
        if self.on:
            self._cpu += now - self._at
        self._at = now
        return self._cpu


async def started(etcd: EmbeddedEtcd, prefix: str, saturation: Saturation | None = None) -> Coordinator:
    """A coordinator on ``prefix``; with ``saturation``, its capacity monitor reads that CPU clock (0.1 s windows)."""
    capacity = Capacity(cpu_clock=saturation.cpu, window=0.1) if saturation is not None else None
    coord = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix, capacity=capacity)
    await asyncio.wait_for(coord.start(), 20)
    return coord


@pytest.fixture
def saturation() -> Saturation:
    return Saturation()


@pytest.fixture
async def busy(etcd: EmbeddedEtcd, prefix: str, saturation: Saturation) -> AsyncIterator[Coordinator]:
    """Coordinator A, whose loop the test makes look saturated."""
    coord = await started(etcd, prefix, saturation)
    try:
        yield coord
    finally:
        await asyncio.wait_for(coord.stop(grace=0), 20)


@pytest.fixture
async def spare(etcd: EmbeddedEtcd, prefix: str) -> AsyncIterator[Coordinator]:
    """Coordinator B, on the same etcd and prefix, within its capacity."""
    coord = await started(etcd, prefix)
    try:
        yield coord
    finally:
        await asyncio.wait_for(coord.stop(grace=0), 20)


async def past_capacity(coord: Coordinator, saturation: Saturation) -> None:
    saturation.on = True
    capacity = coord.capacity
    assert capacity is not None
    await wait_for(lambda: capacity.overloaded, 10, 0.01, "the coordinator past its capacity")


def overloaded(err: grpc.aio.AioRpcError) -> bool:
    """Whether ``err`` is RESOURCE_EXHAUSTED / OVERLOADED with a RetryInfo of 1 s."""
    status = details.parse(err)
    return (status.code, status.reason, status.retry_delay) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "OVERLOADED",
                                                                RETRY_SECONDS)


async def test_past_capacity_refuses_newcomers_and_serves_what_it_admitted(busy: Coordinator,
                                                                           saturation: Saturation) -> None:
    """Past capacity: LeaseGrant, a new KeepAlive stream and a new wait are refused (OVERLOADED + RetryInfo);
    the admitted lease's keepalives are answered, its holder releases, its waiter is granted, a try-once
    Acquire is served. Back within capacity, LeaseGrant is served again."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{busy.port}") as channel:
        stub = OwnedStub(channel)
        holder = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10))
        waiter = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10))
        stream = stub.KeepAlive()
        await stream.write(lock_pb2.KeepAliveRequest(
            keepalive=lock_pb2.LeaseKeepAlive(lease_id=holder.lease_id, request_id=1)))
        assert (await asyncio.wait_for(stream.read(), 10)).keepalive.ttl_seconds > 0  # the stream is admitted
        held = await stub.Acquire(lock_pb2.AcquireRequest(name="res", lease_id=holder.lease_id))
        assert held.acquired
        waiting = asyncio.ensure_future(stub.Acquire(lock_pb2.AcquireRequest(
            name="res", lease_id=waiter.lease_id, wait_ms=30_000), timeout=40))
        await wait_for(lambda: describe_waiters(stub, "res", 1), 10, 0.02, "the waiter queued")

        await past_capacity(busy, saturation)
        with pytest.raises(grpc.aio.AioRpcError) as grant:
            await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10))
        assert overloaded(grant.value), grant.value
        assert "past its capacity (event loop busy" in (grant.value.details() or "")
        newcomer = stub.KeepAlive()
        with pytest.raises(grpc.aio.AioRpcError) as opened:
            await asyncio.wait_for(newcomer.read(), 10)
        assert overloaded(opened.value), opened.value
        with pytest.raises(grpc.aio.AioRpcError) as wait:
            await stub.Acquire(lock_pb2.AcquireRequest(name="other", lease_id=holder.lease_id, wait_ms=1000))
        assert overloaded(wait.value), wait.value
        tried = await stub.Acquire(lock_pb2.AcquireRequest(name="res", lease_id=waiter.lease_id))  # try once
        assert not tried.acquired and tried.holder.lease_id == holder.lease_id

        await stream.write(lock_pb2.KeepAliveRequest(
            keepalive=lock_pb2.LeaseKeepAlive(lease_id=holder.lease_id, request_id=2), last_rtt_ms=3))
        ack = await asyncio.wait_for(stream.read(), 10)
        assert ack.keepalive.request_id == 2 and ack.keepalive.ttl_seconds > 0
        await stub.Release(lock_pb2.ReleaseRequest(name="res", lease_id=holder.lease_id, token=held.token))
        granted = await asyncio.wait_for(waiting, 20)
        assert granted.acquired and granted.token > held.token
        assert busy.capacity is not None and busy.capacity.overloaded  # all of it while past capacity

        saturation.on = False
        await wait_for(lambda: not busy.capacity.overloaded, 10, 0.01, "back within capacity")  # type: ignore[union-attr]
        again = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10))
        stream.cancel()
        for lease_id in (holder.lease_id, waiter.lease_id, again.lease_id):
            await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease_id))


async def describe_waiters(stub: OwnedStub, name: str, n: int) -> bool:
    return (await stub.Describe(lock_pb2.DescribeRequest(name=name), timeout=5)).waiter_count == n


async def test_a_client_refused_as_overloaded_gets_its_lock_through_the_next_address(
        busy: Coordinator, spare: Coordinator, saturation: Saturation) -> None:
    """A client given [A, B], A past its capacity: its LeaseGrant (and stream) go to B, and it gets its lock."""
    await past_capacity(busy, saturation)
    async with AsyncLockClient([f"127.0.0.1:{busy.port}", f"127.0.0.1:{spare.port}"]) as client:
        handle = await client.acquire("through-b", ttl=10, timeout=30)
        assert handle.token > 0 and handle.is_valid()
        await handle.release()
    assert busy.capacity is not None and busy.capacity.overloaded  # A refused all along: B granted it
