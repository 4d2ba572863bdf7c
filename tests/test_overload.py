"""Overload: while the coordinator stays behind (``--max-lag``), new leases are refused and live ones kept alive.

Overload is what lasts (coordinator/admission/overload.py): the figure is the smallest
of the last few measurements, so a single pause does not count. The
in-process coordinator shares the test's event loop: blocking that loop
once (``time.sleep`` in it) is a coordinator SIGSTOPped and continued; a
lasting backlog is made by telling the monitor that the oldest keepalive has
waited long (what thousands of keepalives queued for etcd look like: the
coordinator's overload monitor reads that age from :class:`Backlog`). Real etcd.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import pytest

from fencepost.client import AsyncLockClient
from fencepost.client.v1 import details, lock_pb2
from fencepost.coordinator.admission.limits import FLAGS, Limits, limits_from_args
from fencepost.coordinator.admission.overload import TICKS, LoopLag
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.process.embedded import EmbeddedEtcd

from .conftest import error_info, wait_for
from .owned_stub import OwnedStub


def test_overload_is_what_lasts() -> None:
    lag = LoopLag(ticks=3)
    assert lag.seconds == 0.0
    lag.tick(0.9)
    lag.tick(0.9)
    assert lag.seconds == 0.0  # not yet as many measurements as the figure needs
    lag.tick(0.7)
    assert lag.seconds == 0.7  # behind at each of the last three
    lag.tick(0.0)
    assert lag.seconds == 0.0  # caught up
    for _ in range(3):
        lag.tick(0.0)
    lag.tick(2.0)  # one pause (SIGSTOP and SIGCONT, a stall)
    assert lag.seconds == 0.0
    lag.record(0.6)  # an answer that waited 0.6 s to be sent counts in the next measurement
    lag.tick(0.0)
    lag.record(0.8)
    lag.tick(0.1)
    assert lag.seconds == 0.6


def test_max_lag_is_a_limit_flag() -> None:
    assert FLAGS["max_lag"] == "max-lag" and Limits().max_lag == 0.5

    class Args:
        max_lag = "0.25"

    assert limits_from_args(Args()).max_lag == 0.25  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="--max-lag"):
        Limits(max_lag=-1)


class Backlog:
    """The age of the oldest keepalive waiting for etcd, in seconds, as the test sets it."""

    seconds = 0.0


@pytest.fixture
def backlog() -> Backlog:
    return Backlog()


@pytest.fixture
async def coordinator(etcd: EmbeddedEtcd, prefix: str, backlog: Backlog) -> AsyncIterator[Coordinator]:
    """The in-process coordinator (as conftest's), its overload monitor reading the keepalive backlog from ``backlog``."""
    coord = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix,
                        loop_lag=LoopLag(waiting=lambda: backlog.seconds))
    await asyncio.wait_for(coord.start(), 20)
    try:
        yield coord
    finally:
        await asyncio.wait_for(coord.stop(grace=0), 20)


async def measured(lag: LoopLag) -> None:
    """Wait until the monitor has measured TICKS more times (it wakes every 0.05 s)."""
    until = lag.measurements + TICKS
    await wait_for(lambda: lag.measurements >= until, 10, 0.01, "the monitor's measurements")


async def test_a_single_pause_refuses_nothing(coordinator: Coordinator, stub: OwnedStub) -> None:
    """A coordinator stopped for a moment and continued (SIGSTOP, a stall) serves LeaseGrant at once."""
    time.sleep(0.8)  # noqa: ASYNC251 - on purpose: the coordinator (this loop) stalls once
    granted = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10))
    assert granted.lease_id > 0


async def test_new_leases_wait_while_behind_and_live_ones_are_kept(coordinator: Coordinator, backlog: Backlog,
                                                                   stub: OwnedStub) -> None:
    lag = coordinator.loop_lag
    assert lag is not None
    granted = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10))
    stream = stub.KeepAlive()
    backlog.seconds = 0.9  # the oldest keepalive has waited 0.9 s for etcd, at every measurement
    await measured(lag)
    assert lag.seconds == 0.9
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10))
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    info = error_info(refused.value)
    assert info is not None and info.reason == "OVERLOADED" and details.parse(refused.value).retry_delay == 1.0
    assert "past its capacity (0.900 s behind, --max-lag 0.5)" in (refused.value.details() or "")
    # The live lease is kept alive meanwhile: its keepalive is answered.
    await stream.write(lock_pb2.KeepAliveRequest(keepalive=lock_pb2.LeaseKeepAlive(
        lease_id=granted.lease_id, request_id=1)))
    ack = await asyncio.wait_for(stream.read(), 10)
    assert ack.keepalive.lease_id == granted.lease_id and ack.keepalive.ttl_seconds > 0
    stream.cancel()
    backlog.seconds = 0.0  # caught up: admitted again once calm lasted (coordinator/admission/capacity.py)
    capacity = coordinator.capacity
    assert capacity is not None
    await wait_for(lambda: not capacity.overloaded, 20, 0.02, "back within capacity")
    assert (await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10))).lease_id > 0


async def test_the_client_waits_out_an_overload_refusal(coordinator: Coordinator, backlog: Backlog,
                                                        address: str) -> None:
    lag = coordinator.loop_lag
    assert lag is not None
    async with AsyncLockClient(address) as client:
        backlog.seconds = 0.9
        await measured(lag)

        def caught_up() -> None:
            backlog.seconds = 0.0

        asyncio.get_running_loop().call_later(1.2, caught_up)
        started = time.monotonic()
        handle = await client.acquire("after-overload", ttl=10, timeout=15)
        assert handle.token > 0
        assert time.monotonic() - started >= 1.0  # refused (RetryInfo 1 s) until caught up, then granted
        await handle.release()


async def test_the_monitor_measures_a_keepalive_backlog() -> None:
    """Thousands of keepalives waiting for etcd (queued here, or a slow etcd) while every timer fires on time:
    the coordinator is behind all the same."""
    waited = 0.0
    lag = LoopLag(waiting=lambda: waited, interval=0.01)
    lag.start()
    try:
        await wait_for(lambda: lag.measurements >= TICKS, 5, 0.01, "the first measurements")
        assert lag.seconds < 0.5
        waited = 0.9
        await wait_for(lambda: lag.seconds >= 0.9, 5, 0.01, "the backlog measured")
    finally:
        await lag.close()

