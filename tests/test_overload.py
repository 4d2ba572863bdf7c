"""Overload: while the coordinator's event loop runs late, new leases are refused and live ones kept alive.

The in-process coordinator shares the test's event loop, so blocking that
loop (``time.sleep`` in it) is exactly a coordinator that could not keep up
for that long. Real etcd.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
import pytest

from fencepost.client import AsyncLockClient
from fencepost.client.v1 import lock_pb2
from fencepost.coordinator.limits import FLAGS, Limits, limits_from_args
from fencepost.coordinator.overload import LoopLag

from .conftest import error_info, wait_for
from .owned_stub import OwnedStub


def test_the_lag_is_the_largest_lateness_in_the_window() -> None:
    lag = LoopLag(window=2.0)
    assert lag.seconds == 0.0
    now = time.monotonic()
    lag.record(0.3, now - 1.5)
    lag.record(0.1, now - 1.0)
    assert lag.seconds == 0.3  # the larger, older one still counts
    lag.record(0.5, now - 0.5)
    lag.record(0.0, now)
    assert lag.seconds == 0.5
    lag.record(0.0, now + 1.6)  # 0.5 was measured 2.1 s before: it no longer counts
    assert lag.seconds == 0.0


def test_max_loop_lag_is_a_limit_flag() -> None:
    assert FLAGS["max_loop_lag"] == "max-loop-lag" and Limits().max_loop_lag == 0.5

    class Args:
        max_loop_lag = "0.25"

    assert limits_from_args(Args()).max_loop_lag == 0.25  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="--max-loop-lag"):
        Limits(max_loop_lag=-1)


async def block(seconds: float) -> None:
    """Hold the event loop (and so the in-process coordinator) for ``seconds``; then let the lag be measured."""
    time.sleep(seconds)  # noqa: ASYNC251 - on purpose: an overloaded coordinator
    await asyncio.sleep(0.1)  # the lag monitor's next wake-up (every 0.05 s) records the lateness


async def test_new_leases_wait_while_the_loop_is_late_and_live_ones_are_kept(coordinator: Any,
                                                                             stub: OwnedStub) -> None:
    granted = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10))
    stream = stub.KeepAlive()
    await block(0.8)
    assert coordinator._service.loop_lag.seconds > 0.5
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10))
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    info = error_info(refused.value)
    assert info is not None and info.reason == "LIMIT_EXCEEDED" and info.metadata["limit"] == "max-loop-lag"
    assert "event loop runs" in (refused.value.details() or "")
    # The live lease is kept alive meanwhile: its keepalive is answered.
    await stream.write(lock_pb2.KeepAliveRequest(keepalive=lock_pb2.LeaseKeepAlive(
        lease_id=granted.lease_id, request_id=1)))
    ack = await asyncio.wait_for(stream.read(), 10)
    assert ack.keepalive.lease_id == granted.lease_id and ack.keepalive.ttl_seconds > 0
    stream.cancel()

    async def grants() -> bool:
        try:
            await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10))
            return True
        except grpc.aio.AioRpcError:
            return False

    await wait_for(grants, 10, 0.1, "LeaseGrant served again once the loop keeps up")


async def test_the_client_waits_out_an_overload_refusal(coordinator: Any, address: str) -> None:
    async with AsyncLockClient(address) as client:
        await block(0.8)
        started = time.monotonic()
        handle = await client.acquire("after-overload", ttl=10, timeout=15)
        assert handle.token > 0
        assert time.monotonic() - started >= 0.9  # refused first (RetryInfo 1 s), then granted
        await handle.release()
