"""The semaphore RPCs: AcquirePermit, ReleasePermit, DescribeSemaphore, once admitted (:mod:`.rpcs`).

Each is one call into :class:`~..recipes.semaphore.Semaphores`, with the
grant's and the release's bookkeeping (:mod:`.grants`, :mod:`.releases`).
A ReleasePermit with a ``request_id`` writes a request record
(:mod:`..recipes.requests`); one without a token withdraws whatever the
lease has in the semaphore (a permit or a wait).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import grpc

from fencepost.client.v1 import kinds, lock_pb2
from fencepost.client.v1.keys import Hold

from ..recipes.requests import Call, RequestRecords
from ..recipes.semaphore import Permit, Semaphores
from ..recipes.validate import wait_seconds
from ..telemetry.events import caller, log_event
from ..telemetry.metrics import LOCK_HELD, NO_METRICS, LockMetrics
from .grants import Grants
from .releases import Releases

__all__ = ["SemaphoreCalls"]

_log = logging.getLogger(__name__)


def permit_holders(holders: Sequence[Permit]) -> list[lock_pb2.PermitHolder]:
    """The wire form of a semaphore's permits."""
    return [lock_pb2.PermitHolder(lease_id=h.lease_id, slot=h.slot, token=h.token) for h in holders]


class SemaphoreCalls:
    """The bodies of the semaphore RPCs.

    Args:
        semaphores: the semaphore recipe.
        grants: the bookkeeping of a grant.
        releases: the bookkeeping of a release.
        records: the request records (a retried ReleasePermit).
        metrics: counts the try-once AcquirePermits that found no free permit.
    """

    def __init__(self, semaphores: Semaphores, grants: Grants, releases: Releases, records: RequestRecords,
                 metrics: LockMetrics = NO_METRICS) -> None:
        self._semaphores = semaphores
        self._grants = grants
        self._releases = releases
        self._records = records
        self._metrics = metrics

    async def acquire(self, request: lock_pb2.AcquirePermitRequest, context: grpc.aio.ServicerContext
                      ) -> lock_pb2.AcquirePermitResponse:
        """AcquirePermit: a permit (slot, token), or (trying once) the holders."""
        started, wait = time.perf_counter(), wait_seconds(request.wait_ms, request.wait_forever)
        with self._grants.acquiring(context, kinds.semaphore_queue(request.name), request.lease_id, wait):
            result = await self._semaphores.acquire(request.name, request.lease_id, request.permits, wait)
        if result.acquired:
            self._grants.granted(Hold(kinds.semaphore_slot(request.name, result.slot), request.lease_id, result.token),
                                 request.name, result.freed_at, time.perf_counter() - started, context,
                                 f"semaphore {request.name!r} slot {result.slot} granted to lease "
                                 f"{request.lease_id:#x}, token {result.token}", name=request.name, slot=result.slot)
        else:
            self._metrics.refused(LOCK_HELD)
        return lock_pb2.AcquirePermitResponse(acquired=result.acquired, slot=result.slot, token=result.token,
                                              holders=permit_holders(result.holders))

    async def release(self, request: lock_pb2.ReleasePermitRequest, context: grpc.aio.ServicerContext
                      ) -> lock_pb2.ReleasePermitResponse:
        """ReleasePermit: release the permit (slot, token); with no token, withdraw the lease's permit or wait."""
        if not request.token:  # withdraw whatever the lease has there
            found, held, revision = await self._semaphores.withdraw(request.name, request.lease_id)
            log_event(_log, logging.DEBUG, "withdraw", f"semaphore {request.name!r}: lease {request.lease_id:#x} "
                      f"withdrew its {'permit' if held else 'wait' if found else 'key (there was none)'}",
                      name=request.name, lease_id=request.lease_id, found=found, held=held, revision=revision,
                      **caller(context))
            return lock_pb2.ReleasePermitResponse(revision=revision, found=found)
        slot = kinds.semaphore_slot(request.name, request.slot)
        with self._releases.releasing(Hold(slot, request.lease_id, request.token), rpc="ReleasePermit"):
            revision = await self._records.run(  # a retry of a ReleasePermit that succeeded: from its record
                request.request_id, Call("ReleasePermit", request.name, request.lease_id, request.token, request.slot),
                lambda also: self._release(request, also))
        log_event(_log, logging.DEBUG, "release", f"semaphore {request.name!r} slot {request.slot} released by lease "
                  f"{request.lease_id:#x}, token {request.token}", name=request.name, lease_id=request.lease_id,
                  token=request.token, slot=request.slot, revision=revision, **caller(context))
        return lock_pb2.ReleasePermitResponse(revision=revision)

    async def _release(self, request: lock_pb2.ReleasePermitRequest, also: Sequence[Any]) -> int:
        return await self._semaphores.release(request.name, request.lease_id, request.slot, request.token, also=also)

    async def describe(self, request: lock_pb2.DescribeSemaphoreRequest) -> lock_pb2.DescribeSemaphoreResponse:
        """DescribeSemaphore: its permits, holders and waiters."""
        d = await self._semaphores.describe(request.name)
        return lock_pb2.DescribeSemaphoreResponse(permits=d.permits, waiter_count=d.waiter_count,
                                                  revision=d.revision, holders=permit_holders(d.holders))
