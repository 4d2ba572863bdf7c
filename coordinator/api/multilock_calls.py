"""The multi-lock RPCs: AcquireAll and ReleaseAll, once admitted (:mod:`.rpcs`).

Each is one call into :class:`~..recipes.multilock.MultiLocks`, with the
bookkeeping of a grant and of a release (:mod:`.grants`, :mod:`.releases`)
for every name: each name's grant is counted and followed to its end as a
lock's is, so ``fencepost locks``, ``status`` and the metrics show each name.
The access policy's ``acquire`` (``release``) is checked on every name here,
since the row names no single lock. A ReleaseAll with a ``request_id``
writes a request record (:mod:`..recipes.requests`); one with token 0
withdraws whatever keys the lease has in those locks.
"""

from __future__ import annotations

import contextlib
import logging
import time

import grpc

from fencepost.client.v1 import lock_pb2
from fencepost.client.v1.keys import Hold

from ..admission.access import ACQUIRE, RELEASE, Access
from ..recipes.multilock import MultiLocks, validate_names
from ..recipes.requests import Call, RequestRecords
from ..recipes.validate import wait_seconds
from ..telemetry.events import caller, log_event
from ..telemetry.metrics import LOCK_HELD, NO_METRICS, LockMetrics
from .grants import Grants
from .releases import Releases

__all__ = ["MultiLockCalls"]

_log = logging.getLogger(__name__)


class MultiLockCalls:
    """The bodies of the multi-lock RPCs.

    Args:
        multilocks: the multi-lock recipe.
        access: the access policy (checked on every name).
        grants: the bookkeeping of a grant.
        releases: the bookkeeping of a release.
        records: the request records (a retried ReleaseAll).
        metrics: counts the try-once calls that found a name held.
    """

    def __init__(self, multilocks: MultiLocks, access: Access, grants: Grants, releases: Releases,
                 records: RequestRecords, metrics: LockMetrics = NO_METRICS) -> None:
        self._multilocks = multilocks
        self._access = access
        self._grants = grants
        self._releases = releases
        self._records = records
        self._metrics = metrics

    async def acquire(self, request: lock_pb2.AcquireAllRequest, context: grpc.aio.ServicerContext
                      ) -> lock_pb2.AcquireAllResponse:
        """AcquireAll: every name's token, or (trying once) the first name found held and its holder."""
        names = validate_names(request.names)
        for name in names:
            self._access.check(context, ACQUIRE, name)
        started, wait = time.perf_counter(), wait_seconds(request.wait_ms, request.wait_forever)
        with self._grants.acquiring(context, names[0], request.lease_id, wait):
            result = await self._multilocks.acquire(names, request.lease_id, wait)
        if not result.acquired:
            self._metrics.refused(LOCK_HELD)
            holder = result.holder
            return lock_pb2.AcquireAllResponse(acquired=False, held_name=result.held_name, holder=None if holder is None
                                               else lock_pb2.Holder(lease_id=holder.lease_id, token=holder.token))
        waited = time.perf_counter() - started
        for name, token in result.tokens.items():
            self._grants.granted(Hold(name, request.lease_id, token), name, result.freed_at, waited, context,
                                 f"{name!r} granted to lease {request.lease_id:#x} with {len(names) - 1} other "
                                 f"names (AcquireAll), token {token}", name=name,
                                 request_id=request.request_id or None, recipe="multilock")
        return lock_pb2.AcquireAllResponse(acquired=True, tokens=[result.tokens[name] for name in names])

    async def release(self, request: lock_pb2.ReleaseAllRequest, context: grpc.aio.ServicerContext
                      ) -> lock_pb2.ReleaseAllResponse:
        """ReleaseAll: every name released in one Txn; with token 0, every key of the lease there withdrawn."""
        names = validate_names(request.names)
        for name in names:
            self._access.check(context, RELEASE if request.token else ACQUIRE, name)
        if not request.token:
            found, revision = await self._multilocks.withdraw(names, request.lease_id)
            log_event(_log, logging.DEBUG, "withdraw", f"{names!r}: lease {request.lease_id:#x} withdrew {found} "
                      "keys (ReleaseAll without a token)", name=names[0], lease_id=request.lease_id, found=found,
                      revision=revision, **caller(context))
            return lock_pb2.ReleaseAllResponse(revision=revision, found=found)
        with contextlib.ExitStack() as stack:
            for name in names:
                stack.enter_context(self._releases.releasing(Hold(name, request.lease_id, request.token),
                                                             rpc="ReleaseAll"))
            revision = await self._records.run(
                request.request_id, Call("ReleaseAll", "\n".join(names), request.lease_id, request.token),
                lambda also: self._multilocks.release(names, request.lease_id, request.token, also=also))
        log_event(_log, logging.DEBUG, "release", f"{names!r} released by lease {request.lease_id:#x}, token "
                  f"{request.token}", name=names[0], lease_id=request.lease_id, token=request.token,
                  revision=revision, **caller(context))
        return lock_pb2.ReleaseAllResponse(revision=revision)
