"""The gRPC LockService servicer: a thin adapter onto the lock and lease modules.

Each RPC makes one call into ``lock.LockManager`` or ``lease.Leases``;
errors leave through one decorator that turns a ``FencepostError`` into its
gRPC status with an ``ErrorInfo`` detail (see ``errors``).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from fencepost.client.errors import FencepostError, ResourceExhausted
from fencepost.client.v1 import lock_pb2, lock_pb2_grpc
from fencepost.client.v1.details import ErrorReason, reason_name
from fencepost.client.v1.keys import Keys

from .errors import reason_of, shutting_down, to_status
from .lease import Leases
from .lock import Holder, LockManager
from .lock_metrics import LOCK_HELD, NO_METRICS, LockMetrics
from .stream import KeepAliveStream
from .validate import wait_seconds
from .watch import DeleteWatcher

R = TypeVar("R")


def _statuses(method: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
    """Turn a FencepostError raised by ``method`` into its gRPC status (and count the refusal)."""

    @functools.wraps(method)
    async def wrapper(self: LockService, request: Any, context: grpc.aio.ServicerContext) -> R:
        try:
            return await method(self, request, context)
        except FencepostError as exc:
            await self._refuse(context, exc)
            raise  # unreachable: abort raises

    return wrapper


def _holder(holder: Holder | None) -> lock_pb2.Holder | None:
    return lock_pb2.Holder(lease_id=holder.lease_id, token=holder.token) if holder else None


class LockService(lock_pb2_grpc.LockServiceServicer):
    """Implements fencepost.v1.LockService (see proto/fencepost/v1/lock.proto).

    Args:
        leases: lease grant/revoke/keepalive.
        locks: the lock algorithm.
        watcher: the shared deletion watcher.
        keys: the key layout.
        max_streams: most KeepAlive streams served at once.
        metrics: counts grants, releases, refusals and keepalives.
    """

    def __init__(self, leases: Leases, locks: LockManager, watcher: DeleteWatcher, keys: Keys,
                 *, max_streams: int = 10_000, metrics: LockMetrics = NO_METRICS) -> None:
        self._leases = leases
        self._metrics = metrics
        self._locks = locks
        self._watcher = watcher
        self._keys = keys
        self._max_streams = max_streams
        self._streams = 0
        self.closing = asyncio.Event()

    def enter_graceful_shutdown(self) -> None:
        """Refuse new KeepAlive streams and end the open ones with UNAVAILABLE / SHUTTING_DOWN."""
        self.closing.set()

    async def _refuse(self, context: grpc.aio.ServicerContext, exc: FencepostError) -> None:
        """End the call with ``exc``'s status (this raises), counted in ``fencepost_refusals_total``."""
        status = to_status(exc)
        self._metrics.refused(reason_name(reason_of(exc)))
        await context.abort_with_status(status)

    @_statuses
    async def LeaseGrant(self, request: lock_pb2.LeaseGrantRequest, context: grpc.aio.ServicerContext
                         ) -> lock_pb2.LeaseGrantResponse:
        lease_id, ttl = await self._leases.grant(request.ttl_seconds)
        return lock_pb2.LeaseGrantResponse(lease_id=lease_id, ttl_seconds=ttl)

    @_statuses
    async def LeaseRevoke(self, request: lock_pb2.LeaseRevokeRequest, context: grpc.aio.ServicerContext
                          ) -> lock_pb2.LeaseRevokeResponse:
        return lock_pb2.LeaseRevokeResponse(found=await self._leases.revoke(request.lease_id))

    @_statuses
    async def Acquire(self, request: lock_pb2.AcquireRequest, context: grpc.aio.ServicerContext
                      ) -> lock_pb2.AcquireResponse:
        started = time.perf_counter()
        wait = wait_seconds(request.wait_ms, request.wait_forever)
        result = await self._locks.acquire(request.name, request.lease_id, wait)
        if result.acquired:
            self._metrics.granted(time.perf_counter() - started)
        else:
            self._metrics.refused(LOCK_HELD)
        return lock_pb2.AcquireResponse(acquired=result.acquired, token=result.token, holder=_holder(result.holder))

    @_statuses
    async def Release(self, request: lock_pb2.ReleaseRequest, context: grpc.aio.ServicerContext
                      ) -> lock_pb2.ReleaseResponse:
        revision = await self._locks.release(request.name, request.lease_id, request.token)
        self._metrics.released()
        return lock_pb2.ReleaseResponse(revision=revision)

    @_statuses
    async def Describe(self, request: lock_pb2.DescribeRequest, context: grpc.aio.ServicerContext
                       ) -> lock_pb2.DescribeResponse:
        d = await self._locks.describe(request.name)
        return lock_pb2.DescribeResponse(
            held=d.holder is not None, holder=_holder(d.holder), ttl_remaining_seconds=d.ttl_remaining_seconds,
            ttl_seconds=d.ttl_seconds, waiter_count=d.waiter_count,
            waiters=[_holder(w) for w in d.waiters], revision=d.revision,
        )

    async def KeepAlive(self, request_iterator: AsyncIterable[lock_pb2.KeepAliveRequest],
                        context: grpc.aio.ServicerContext) -> AsyncIterator[lock_pb2.KeepAliveResponse]:
        if self.closing.is_set():
            await self._refuse(context, shutting_down())
        if self._streams >= self._max_streams:
            await self._refuse(context, ResourceExhausted(
                f"more than {self._max_streams} streams", reason=reason_name(ErrorReason.TOO_MANY_STREAMS)))
        self._streams += 1
        stream = KeepAliveStream(self._leases, self._locks, self._watcher, self._keys.contender,
                                 metrics=self._metrics)
        try:
            async for response in stream.serve(request_iterator, self.closing):
                yield response
        finally:
            self._streams -= 1
        if self.closing.is_set():
            await self._refuse(context, shutting_down())
