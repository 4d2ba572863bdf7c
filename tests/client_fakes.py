"""Fakes and helpers of the client's unit tests: a hand-moved clock, a transport the test answers call by call."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import grpc.aio

from fencepost.client._leases.lease import Lease, LeasePool
from fencepost.client._recipes.holds import Holds
from fencepost.client._recipes.lock import LockRecipe
from fencepost.client._leases.stream import KeepAliveStream
from fencepost.client.tracing import Tracing
from fencepost.client.handle import AsyncLockHandle
from fencepost.client.v1 import details
from fencepost.client.v1 import lock_pb2 as pb
from fencepost.client.v1.details import ErrorReason, reason_name

# An address nothing listens on (the tests below never connect to it).
UNUSED_ADDRESS = "127.0.0.1:9"

NOT_HOLDER = reason_name(ErrorReason.NOT_HOLDER)
STALE_TOKEN = reason_name(ErrorReason.STALE_TOKEN)
LEASE_EXPIRED = reason_name(ErrorReason.LEASE_EXPIRED)


class FakeClock:
    """A monotonic clock moved by hand."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeTransport:
    """A transport whose every call waits for the test to answer it (see :func:`next_call`)."""

    connect_timeout = 5.0
    tracing = Tracing()  # the global provider: the API's default, so no spans

    def __init__(self) -> None:
        self.calls: asyncio.Queue[tuple[str, Any, asyncio.Future[Any]]] = asyncio.Queue()

    async def call(self, method: str, make: Callable[[float | None], tuple[Any, float | None]], *,
                   until: float | None, idempotent: bool, **_ids: object) -> Any:
        request, _timeout = make(None)
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        await self.calls.put((method, request, reply))
        return await reply


async def next_call(transport: FakeTransport, method: str) -> tuple[Any, asyncio.Future[Any]]:
    """The next call the code under test made: it must be ``method``; returns (request, reply future)."""
    got, request, reply = await asyncio.wait_for(transport.calls.get(), 5)
    assert got == method, (got, request)
    return request, reply


def failed_call(reason: int, message: str = "server said no", **metadata: str) -> grpc.aio.AioRpcError:
    """A failed call carrying the status the coordinator sends for ``reason`` (built by details.status_for)."""
    status = details.status_for(reason, message, metadata)
    return grpc.aio.AioRpcError(status.code, grpc.aio.Metadata(), grpc.aio.Metadata(*status.trailing_metadata),
                                details=status.details)


def join_callbacks() -> None:
    """Wait for every on_lost callback thread started so far (they are started synchronously)."""
    for thread in threading.enumerate():
        if thread.name == "fencepost-on-lost":
            thread.join(5)
            assert not thread.is_alive(), "an on_lost callback is still running"


class Parts:
    """A lease pool, a keepalive stream and the holds wired as the client wires them, over a FakeTransport."""

    def __init__(self, clock: FakeClock | None = None) -> None:
        self.clock = clock or FakeClock()
        self.transport = FakeTransport()
        self.pool = LeasePool(self.clock)
        self.tasks: list[asyncio.Task[Any]] = []
        self.stream = KeepAliveStream(self.transport, self.pool, fraction=1 / 3,  # type: ignore[arg-type]
                                      spawn=self.spawn)
        self.holds = Holds(self.transport, self.pool, self.stream, spawn=self.spawn,  # type: ignore[arg-type]
                           on_new_lease=lambda lease: None, state=lambda: "open")

    def spawn(self, coro: Awaitable[Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self.tasks.append(task)
        return task

    def lease(self, lease_id: int = 77, ttl: int = 10) -> Lease:
        """A live lease in the pool, as if granted now."""
        lease = Lease(lease_id, ttl, self.clock.now, clock=self.clock)
        self.pool.add(ttl, lease)
        return lease

    def hold(self, lease: Lease, name: str = "a", token: int = 5) -> AsyncLockHandle:
        """A live hold of ``name`` under ``lease``, as if just granted."""
        handle = AsyncLockHandle(name, lease, token, LockRecipe(self.holds, name).release)
        self.pool.add_hold(handle)
        return handle

    async def acquire(self, name: str = "a", *, token: int = 5, grant: bool = True) -> AsyncLockHandle:
        """Acquire ``name`` through the holds, answering its calls (and the LeaseGrant when ``grant``)."""
        acquiring = asyncio.ensure_future(self.holds.acquire(LockRecipe(self.holds, name), 10, None, try_once=False))
        if grant:
            _, reply = await next_call(self.transport, "LeaseGrant")
            reply.set_result(pb.LeaseGrantResponse(lease_id=77, ttl_seconds=10))
        request, reply = await next_call(self.transport, "Acquire")
        assert request.name == name
        reply.set_result(pb.AcquireResponse(acquired=True, token=token))
        return await asyncio.wait_for(acquiring, 5)


def ack(request_id: int, ttl_seconds: int = 10, lease_id: int = 77) -> pb.KeepAliveResponse:
    return pb.KeepAliveResponse(keepalive=pb.LeaseKeepAliveAck(lease_id=lease_id, request_id=request_id,
                                                               ttl_seconds=ttl_seconds))


def hold_ended(name: str, token: int, reason: int = ErrorReason.NOT_HOLDER, lease_id: int = 77) -> pb.KeepAliveResponse:
    return pb.KeepAliveResponse(hold_ended=pb.HoldEnded(name=name, lease_id=lease_id, token=token, reason=reason))
