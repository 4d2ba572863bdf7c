"""Unit tests of the transport and the client's lifecycle, without a coordinator.

Behaviour against a real coordinator is tested elsewhere (test_locks.py, tests/faults/).
"""

from __future__ import annotations

import asyncio
import socket

import pytest

import fencepost.client as fc
from fencepost.client._transport import Transport
from fencepost.client.handle import AsyncLockHandle
from fencepost.client.v1 import lock_pb2 as pb

from .client_fakes import (
    UNUSED_ADDRESS,
    NOT_HOLDER,
    Parts,
)


# ---------------------------------------------------------------- the transport


def refused_address() -> str:
    """A 127.0.0.1 address that refuses connections (a port bound, never listened on)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


async def test_call_when_fail_fast_and_every_address_refuses() -> None:
    """A fail-fast transport tries each address once and gives up well before its connect_timeout."""
    transport = Transport([refused_address(), refused_address()], connect_timeout=30.0, fail_fast=True)
    transport.open()
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        with pytest.raises(fc.Unavailable) as info:
            await transport.call("Describe", lambda _left: (pb.DescribeRequest(name="n"), 1.0), until=None,
                                 idempotent=True, name="n")
    finally:
        await transport.close()
    assert loop.time() - started < 15.0
    assert (info.value.name, info.value.reason, info.value.code) == ("n", None, None)
    with pytest.raises(fc.FencepostError, match="closed"):
        await transport.call("Describe", lambda _left: (pb.DescribeRequest(name="n"), 1.0), until=None,
                             idempotent=True)


# ---------------------------------------------------------------- the client


async def test_lock_when_cancel_on_lost_fires(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside lock(), a cancellation by cancel_on_lost surfaces as LeaseLost and the task is not left cancelling."""
    parts = Parts()
    handle = parts.hold(parts.lease())
    client = fc.AsyncLockClient(UNUSED_ADDRESS)

    async def fake_acquire(name: str, ttl: float = 10.0, timeout: float | None = None) -> AsyncLockHandle:
        return handle

    monkeypatch.setattr(client, "acquire", fake_acquire)
    with pytest.raises(fc.LeaseLost) as info:
        async with client.lock("a") as h:
            h.cancel_on_lost()
            asyncio.get_running_loop().call_soon(parts.pool.lose_hold, h, NOT_HOLDER)
            await asyncio.Event().wait()
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    assert info.value.reason == NOT_HOLDER and handle.released
    assert parts.transport.calls.empty()  # the server ended the hold: no Release is sent for it


async def test_connect_when_no_coordinator_listens() -> None:
    """connect() raises Unavailable after connect_timeout, leaves no task behind, and the client is closed."""
    client = fc.AsyncLockClient(UNUSED_ADDRESS, connect_timeout=0.3)
    with pytest.raises(fc.Unavailable):
        await client.connect()
    assert [t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("fencepost")] == []
    with pytest.raises(fc.FencepostError):
        await client.acquire("n")
