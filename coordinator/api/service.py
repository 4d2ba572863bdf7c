"""The gRPC LockService servicer: one short method per RPC, each one call into the recipes.

What each RPC needs before its body runs (validated fields, the access
policy's action, the token floor, the lease's owner) is its row of
:data:`.rpcs.RPCS`, applied by :func:`.rpcs.served`, which also turns a
``FencepostError`` into its gRPC status (:mod:`.status`). The bookkeeping of
calls that grant holds is :mod:`.grants`'s, of those that end holds or
leases :mod:`.releases`'s. The admin, semaphore and election calls (with
Observe) are :mod:`.admin_calls`, :mod:`.semaphore_calls` and
:mod:`.election_calls`; KeepAlive is :mod:`.keepalive` (one stream:
:mod:`.stream`).

While fencing tokens would go back (etcd restored from an older snapshot,
see :mod:`..recipes.tokens`), the calls that grant, check or report a token,
and LeaseGrant, are refused with UNAVAILABLE / DATA_LOSS; KeepAlive streams,
LeaseRevoke and Withdraw only keep or remove state and are still served.

Acquire, Release and Withdraw are also served as messages on a KeepAlive
stream (:mod:`.stream_calls`): the same methods below, given a context made
from the stream and the message, answered on the stream.

Retries (:mod:`..recipes.requests`): Release, ReleasePermit, Resign and
AdminRevoke with a ``request_id`` write a request record, so that a retry of
one that succeeded answers as the first attempt did; Acquire and Withdraw
are idempotent already (their ``request_id`` is checked and logged).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterable, AsyncIterator, Sequence
from typing import Any

import grpc

from fencepost.client.v1 import lock_pb2, lock_pb2_grpc
from fencepost.client.v1.keys import Hold, Keys

from ..admission.access import Access
from ..admission.capacity import Capacity
from ..admission.identity import caller_of
from ..admission.limit_tracker import LimitTracker
from ..admission.limits import Limits
from ..admission.lock_delay_limit import LockDelayLimit
from ..admission.overload import LoopLag
from ..admission.ownership import OwnerRecord, Ownership, new_secret
from ..etcd import bounded
from ..recipes.election import Elections
from ..recipes.holds import HoldTracker
from ..recipes.lease import KeptLeases, Leases
from ..recipes.listing import GrantTimes, list_locks
from ..recipes.lock import Holder, LockManager
from ..recipes.multilock import MultiLocks
from ..recipes.requests import Call, RequestRecords
from ..recipes.rwlock import ReadLocks, hold_name
from ..recipes.semaphore import Semaphores
from ..recipes.validate import wait_seconds
from ..recipes.watch import DeleteWatcher
from ..telemetry.events import caller, log_event
from ..telemetry.metrics import LOCK_HELD, NO_METRICS, LockMetrics
from .admin_calls import AdminCalls
from .election_calls import ElectionCalls
from .grants import Grants
from .keepalive import KeepAlives
from .multilock_calls import MultiLockCalls
from .releases import Releases, ServedEnds
from .renewals import renew_once
from .rpcs import Admission, served
from .semaphore_calls import SemaphoreCalls
from .server_info import ETCD_SECONDS, About, read_etcd, server_info
from .slots import StreamSlots
from .stale_writes import StaleWrites
from .status import Refusals
from .stream import KeepAliveStream
from .stream_calls import wrapped_calls

_log = logging.getLogger(__name__)


def _holder(holder: Holder | None) -> lock_pb2.Holder | None:
    return lock_pb2.Holder(lease_id=holder.lease_id, token=holder.token, read=holder.read) if holder else None


class LockService(lock_pb2_grpc.LockServiceServicer):
    """Implements fencepost.v1.LockService (see proto/fencepost/v1/lock.proto).

    Args:
        leases: lease grant/revoke/keepalive.
        locks: the lock algorithm.
        watcher: the shared deletion watcher.
        keys: the key layout.
        max_streams: most KeepAlive and Observe streams served at once (0: no limit); default
            ``limits.max_streams``.
        metrics: counts grants, holds and their ends, releases, refusals, leases and keepalives.
        about: the coordinator's own facts, for ServerInfo; None for a servicer
            made alone (ServerInfo then reports only the prefix and the counts).
        access: the access policy in force (:mod:`..admission.access`), checked first in
            each call; None, or an Access without a policy, allows every call.
        limits: the limits on each caller and lease (:mod:`..admission.limits`).
        owners: the ownership records of leases (who may act on which lease);
            None for records in ``locks.etcd`` under ``keys``.
        records: the request records of calls with a ``request_id``; None for
            records in ``locks.etcd`` under ``keys``.
        loop_lag: the overload monitor (started by the server); None for one that
            measures the event loop and the etcd layer's keepalive backlog.
        capacity: tells when the coordinator is past its capacity, measured at each of
            ``loop_lag``'s measurements; None for one with ``limits``' marks.
    """

    def __init__(self, leases: Leases, locks: LockManager, watcher: DeleteWatcher, keys: Keys,
                 *, max_streams: int | None = None, metrics: LockMetrics = NO_METRICS, about: About | None = None,
                 access: Access | None = None, limits: Limits | None = None, owners: Ownership | None = None,
                 records: RequestRecords | None = None, loop_lag: LoopLag | None = None,
                 capacity: Capacity | None = None) -> None:
        limits = limits if limits is not None else Limits()
        owners = owners if owners is not None else Ownership(locks.etcd, keys)
        self._leases, self._locks, self._watcher, self._keys, self._metrics = leases, locks, watcher, keys, metrics
        self._records = records if records is not None else RequestRecords(locks.etcd, keys)
        self._semaphores = Semaphores(locks, keys)
        self._reads = ReadLocks(locks, keys)
        self._elections = Elections(locks, keys)
        self._about = about if about is not None else About(prefix=keys.prefix.decode(), endpoints=())
        self._kept = KeptLeases(metrics)
        self._holds = HoldTracker(watcher, keys.contender, locks.hold_exists, locks.lease_alive, metrics=metrics)
        self.loop_lag = loop_lag if loop_lag is not None else LoopLag(
            metrics, waiting=lambda: locks.etcd.keepalive_waiting_seconds)  # started by the server
        self._limits = LimitTracker(limits, holds_of=self._holds.holds_of, holds=self._holds.holds)
        #: Whether this coordinator is past its capacity (newcomers refused, see :mod:`..admission.capacity`).
        self.capacity = capacity if capacity is not None else Capacity(limits)
        self.capacity.follow(self.loop_lag, metrics, kept=lambda: self._kept.count)
        self.closing = asyncio.Event()
        #: Applies each RPC's row of the RPC table (see :func:`.rpcs.served`).
        access = access if access is not None else Access()
        self.admission = Admission(access, owners, locks.tokens, self.capacity,
                                   LockDelayLimit(access, limits.max_lock_delay))
        #: Ends refused calls with their status.
        self.refusals = Refusals(metrics, self._limits)
        self._releases = Releases(self._holds, leases, self._kept, self._limits, owners, metrics=metrics)
        self._grants = Grants(self._limits, self._holds, metrics)
        slots = StreamSlots(self._limits, limits.max_streams if max_streams is None else max_streams, self.closing)
        self._admin = AdminCalls(locks, self._semaphores, self._elections, self._records, self._releases, keys)
        self._multilock_calls = MultiLockCalls(MultiLocks(locks, keys), access, self._grants, self._releases,
                                               self._records, metrics)
        self._semaphore_calls = SemaphoreCalls(self._semaphores, self._grants, self._releases, self._records, metrics)
        self._election_calls = ElectionCalls(self._elections, self._grants, self._releases, self._records,
                                             self.admission, self.refusals, slots, self.closing)
        self._keepalives = KeepAlives(self.admission, self.refusals, slots, self.closing, self._stream)
        self._slots = slots
        self._stream_calls = wrapped_calls(self, ())
        #: The stale writes applications report (ReportStaleWrite), heard by the lock board.
        self.stale_writes = StaleWrites(metrics)

    def intercepted_by(self, interceptors: Sequence[Any]) -> None:
        """Serve the calls sent on KeepAlive streams through the server's ``interceptors`` (outermost first),
        so that they are traced and counted as the unary calls are."""
        self._stream_calls = wrapped_calls(self, interceptors)

    @property
    def records(self) -> RequestRecords:
        """The request records (:mod:`..recipes.requests`) of the calls served here that carry a ``request_id``."""
        return self._records

    @property
    def lock_view(self) -> tuple[Any, Keys, GrantTimes, ServedEnds]:
        """What a read-only view of every lock reads (the lock board): (etcd client, keys, grant times here,
        the key deletions and revokes served here)."""
        return self._locks.etcd, self._keys, self._holds.grant_times, self._releases.served

    @property
    def open_streams(self) -> int:
        """The KeepAlive and Observe streams being served."""
        return self._slots.count

    def state_sizes(self) -> dict[str, int]:
        """The entries of each per-stream, per-lease and per-name table kept in memory (for tests and benches).

        Returns:
            ``streams`` (open), ``keepalive_streams``, the watcher's ``deletions``
            and ``subscriptions``, the hold tracker's ``holds``, ``hold_ends``,
            ``revoked_leases`` and ``grant_times``, and the limit tracker's
            tables prefixed ``limits_``.
        """
        return {"streams": self._slots.count, "keepalive_streams": len(self._keepalives.open),
                **self._watcher.sizes, **self._holds.sizes,
                **{f"limits_{k}": v for k, v in self._limits.tracked.items()}}

    def enter_drain(self, seconds: float) -> None:
        """Refuse newcomers (new leases and streams, acquires) with UNAVAILABLE / DRAINING from now on, for
        about ``seconds``; serve the rest (see :mod:`..admission.drain`)."""
        self.admission.drain.start(seconds)

    def enter_graceful_shutdown(self) -> None:
        """Refuse new KeepAlive streams and end the open ones with UNAVAILABLE / SHUTTING_DOWN."""
        self.closing.set()

    async def close(self) -> None:
        """Stop following the holds granted here and measuring the loop's lag (after the server stopped)."""
        await self._holds.close()
        await self._semaphores.close()
        await self.loop_lag.close()
        await self._records.close()

    @served
    async def LeaseGrant(self, request: lock_pb2.LeaseGrantRequest, context: grpc.aio.ServicerContext
                         ) -> lock_pb2.LeaseGrantResponse:
        secret = new_secret()  # the lease's credential: only its SHA-256 is kept (see ownership)
        record = OwnerRecord.for_secret(caller_of(context).identity, secret)
        with self._limits.lease_grant(caller_of(context).key) as counted:  # refuses past the caller's limits
            lease_id, ttl = await self._leases.grant_or_revoke(
                request.ttl_seconds, then=lambda granted: self.admission.owners.record(granted, record))
            counted(lease_id, ttl)
        self.capacity.granted()
        log_event(_log, logging.DEBUG, "lease_granted", f"lease {lease_id:#x} granted, TTL {ttl} s",
                  lease_id=lease_id, ttl_s=ttl, owner=record.owner, **caller(context))
        return lock_pb2.LeaseGrantResponse(lease_id=lease_id, ttl_seconds=ttl, lease_secret=secret)

    @served
    async def LeaseRevoke(self, request: lock_pb2.LeaseRevokeRequest, context: grpc.aio.ServicerContext
                          ) -> lock_pb2.LeaseRevokeResponse:
        found = await self._releases.revoke(request.lease_id)
        log_event(_log, logging.DEBUG, "lease_revoked",
                  f"lease {request.lease_id:#x} {'revoked' if found else 'was already gone'}",
                  lease_id=request.lease_id, found=found, **caller(context))
        return lock_pb2.LeaseRevokeResponse(found=found)

    @served
    async def LeaseKeepAlive(self, request: lock_pb2.LeaseKeepAliveRequest, context: grpc.aio.ServicerContext
                             ) -> lock_pb2.LeaseKeepAliveResponse:
        ttl = await renew_once(self._leases, request.lease_id, metrics=self._metrics,
                               on_keepalive=self._limits.kept_alive, owners=self.admission.owners,
                               log_fields=caller(context))
        return lock_pb2.LeaseKeepAliveResponse(lease_id=request.lease_id, ttl_seconds=ttl)

    @served
    async def Acquire(self, request: lock_pb2.AcquireRequest, context: grpc.aio.ServicerContext
                      ) -> lock_pb2.AcquireResponse:
        started, wait = time.perf_counter(), wait_seconds(request.wait_ms, request.wait_forever)
        take = self._reads.acquire if request.mode == lock_pb2.LOCK_MODE_READ else self._locks.acquire
        with self._grants.acquiring(context, request.name, request.lease_id, wait):
            result = await take(request.name, request.lease_id, wait, request.lock_delay_seconds)
        if result.acquired:
            held = Hold(hold_name(request.name, request.mode), request.lease_id, result.token)
            self._grants.granted(held, request.name, result.freed_at,
                                 time.perf_counter() - started, context, f"{request.name!r} granted to lease "
                                 f"{request.lease_id:#x}, token {result.token}", name=request.name,
                                 request_id=request.request_id or None)
        else:
            self._metrics.refused(LOCK_HELD)
            log_event(_log, logging.DEBUG, "refusal", f"Acquire refused: LOCK_HELD: {request.name!r} is held",
                      call="Acquire", reason=LOCK_HELD, name=request.name, lease_id=request.lease_id,
                      current_token=result.holder.token if result.holder is not None else None, **caller(context))
        return lock_pb2.AcquireResponse(acquired=result.acquired, token=result.token, holder=_holder(result.holder))

    @served
    async def Release(self, request: lock_pb2.ReleaseRequest, context: grpc.aio.ServicerContext
                      ) -> lock_pb2.ReleaseResponse:
        name = hold_name(request.name, request.mode)
        with self._releases.releasing(Hold(name, request.lease_id, request.token)):
            # With a request_id, its record rides in the release's Txn; a retry of a Release that
            # succeeded is refused by etcd (the key is gone) and answered from that record.
            revision = await self._records.run(
                request.request_id, Call("Release", request.name, request.lease_id, request.token),
                lambda also: self._locks.release(name, request.lease_id, request.token, also=also))
        if _log.isEnabledFor(logging.DEBUG):  # not built otherwise: caller() reads the span, peer and metadata
            log_event(_log, logging.DEBUG, "release", f"{request.name!r} released by lease {request.lease_id:#x}, "
                      f"token {request.token}", name=request.name, lease_id=request.lease_id, token=request.token,
                      revision=revision, request_id=request.request_id or None, **caller(context))
        return lock_pb2.ReleaseResponse(revision=revision)

    @served
    async def Withdraw(self, request: lock_pb2.WithdrawRequest, context: grpc.aio.ServicerContext
                       ) -> lock_pb2.WithdrawResponse:
        name = hold_name(request.name, request.mode)
        with self._releases.releasing(Hold(name, request.lease_id, 0), by_token=False, rpc="Withdraw") as ending:
            found, ending.held, revision = await self._locks.withdraw(name, request.lease_id)
        log_event(_log, logging.DEBUG, "withdraw", f"{request.name!r}: lease {request.lease_id:#x} withdrew its "
                  f"{'hold' if ending.held else 'wait' if found else 'key (there was none)'}", name=request.name,
                  lease_id=request.lease_id, found=found, held=ending.held, revision=revision,
                  request_id=request.request_id or None, **caller(context))
        return lock_pb2.WithdrawResponse(found=found, held=ending.held, revision=revision)

    @served
    async def Describe(self, request: lock_pb2.DescribeRequest, context: grpc.aio.ServicerContext
                       ) -> lock_pb2.DescribeResponse:
        d = await self._locks.describe(request.name)
        return lock_pb2.DescribeResponse(
            held=d.holder is not None, holder=_holder(d.holder), ttl_remaining_seconds=d.ttl_remaining_seconds,
            ttl_seconds=d.ttl_seconds, waiter_count=d.waiter_count, waiters=[_holder(w) for w in d.waiters],
            revision=d.revision, lock_delay_remaining_ms=d.lock_delay.remaining_ms,
            lock_delay_seconds=d.lock_delay.seconds, holders=[_holder(h) for h in d.holders])

    @served
    async def ListLocks(self, request: lock_pb2.ListLocksRequest, context: grpc.aio.ServicerContext
                        ) -> lock_pb2.ListLocksResponse:
        visible = self.admission.access.lister(context, request.prefix)  # None: every lock listed
        page = await list_locks(self._locks.etcd, self._keys, request.prefix, request.page_size, request.page_token,
                                self._holds.grant_times, self._locks.tokens)
        return lock_pb2.ListLocksResponse(
            locks=[lock_pb2.LockInfo(name=lock.name, holder=_holder(lock.holder),
                                     ttl_remaining_seconds=lock.ttl_remaining_seconds, ttl_seconds=lock.ttl_seconds,
                                     held_seconds=lock.held_seconds, waiter_count=lock.waiter_count,
                                     lock_delay_remaining_ms=lock.lock_delay.remaining_ms,
                                     lock_delay_seconds=lock.lock_delay.seconds, holder_count=lock.holder_count)
                   for lock in page.locks if visible is None or visible(lock.name)],
            next_page_token=page.next_page_token, revision=page.revision)

    @served
    async def ServerInfo(self, request: lock_pb2.ServerInfoRequest, context: grpc.aio.ServicerContext
                         ) -> lock_pb2.ServerInfoResponse:
        with bounded(ETCD_SECONDS):  # within the caller's deadline too (see .rpcs.served)
            etcd = await read_etcd(self._locks.etcd, self._keys)
        return server_info(self._about, etcd, waiting_acquires=self._locks.waiting, **self._keepalives.counts())

    @served
    async def AdminRevoke(self, request: lock_pb2.AdminRevokeRequest, context: grpc.aio.ServicerContext
                          ) -> lock_pb2.AdminRevokeResponse:
        return await self._admin.revoke(request, context)

    @served
    async def ListSessions(self, request: lock_pb2.ListSessionsRequest, context: grpc.aio.ServicerContext
                           ) -> lock_pb2.ListSessionsResponse:
        return await self._admin.list_sessions(request, context)

    @served
    async def ReportStaleWrite(self, request: lock_pb2.ReportStaleWriteRequest, context: grpc.aio.ServicerContext
                               ) -> lock_pb2.ReportStaleWriteResponse:
        self.stale_writes.report(request, context)
        return lock_pb2.ReportStaleWriteResponse()

    # ------------------------------------------------------------------ multi-locks (see .multilock_calls)

    @served
    async def AcquireAll(self, request: lock_pb2.AcquireAllRequest, context: grpc.aio.ServicerContext
                         ) -> lock_pb2.AcquireAllResponse:
        return await self._multilock_calls.acquire(request, context)

    @served
    async def ReleaseAll(self, request: lock_pb2.ReleaseAllRequest, context: grpc.aio.ServicerContext
                         ) -> lock_pb2.ReleaseAllResponse:
        return await self._multilock_calls.release(request, context)

    # ------------------------------------------------------------------ semaphores (see .semaphore_calls)

    @served
    async def AcquirePermit(self, request: lock_pb2.AcquirePermitRequest, context: grpc.aio.ServicerContext
                            ) -> lock_pb2.AcquirePermitResponse:
        return await self._semaphore_calls.acquire(request, context)

    @served
    async def ReleasePermit(self, request: lock_pb2.ReleasePermitRequest, context: grpc.aio.ServicerContext
                            ) -> lock_pb2.ReleasePermitResponse:
        return await self._semaphore_calls.release(request, context)

    @served
    async def AdminEndLockDelay(self, request: lock_pb2.AdminEndLockDelayRequest,
                                context: grpc.aio.ServicerContext) -> lock_pb2.AdminEndLockDelayResponse:
        return await self._admin.end_lock_delay(request, context)

    @served
    async def DescribeSemaphore(self, request: lock_pb2.DescribeSemaphoreRequest, context: grpc.aio.ServicerContext
                                ) -> lock_pb2.DescribeSemaphoreResponse:
        return await self._semaphore_calls.describe(request)

    # ------------------------------------------------------------------ elections (see .election_calls)

    @served
    async def Campaign(self, request: lock_pb2.CampaignRequest, context: grpc.aio.ServicerContext
                       ) -> lock_pb2.CampaignResponse:
        return await self._election_calls.campaign(request, context)

    @served
    async def Proclaim(self, request: lock_pb2.ProclaimRequest, context: grpc.aio.ServicerContext
                       ) -> lock_pb2.ProclaimResponse:
        return await self._election_calls.proclaim(request)

    @served
    async def Resign(self, request: lock_pb2.ResignRequest, context: grpc.aio.ServicerContext
                     ) -> lock_pb2.ResignResponse:
        return await self._election_calls.resign(request, context)

    @served
    async def Leader(self, request: lock_pb2.LeaderRequest, context: grpc.aio.ServicerContext
                     ) -> lock_pb2.LeaderResponse:
        return await self._election_calls.leader(request)

    async def Observe(self, request: lock_pb2.ObserveRequest, context: grpc.aio.ServicerContext
                      ) -> AsyncIterator[lock_pb2.ObserveResponse]:
        responses = self._election_calls.observe(request, context)
        try:
            async for response in responses:
                yield response
        finally:
            await responses.aclose()  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ KeepAlive (see .keepalive, .stream)

    async def KeepAlive(self, request_iterator: AsyncIterable[lock_pb2.KeepAliveRequest],
                        context: grpc.aio.ServicerContext) -> AsyncIterator[lock_pb2.KeepAliveResponse]:
        responses = self._keepalives.serve(request_iterator, context)
        try:
            async for response in responses:
                yield response
        finally:
            await responses.aclose()  # type: ignore[attr-defined]

    def _stream(self, context: grpc.aio.ServicerContext, **who: Any) -> KeepAliveStream:
        """The :class:`~.stream.KeepAliveStream` of the KeepAlive call of ``context`` (``who``: its log fields)."""
        return KeepAliveStream(self._leases, self._locks, self._watcher, self._keys.contender, metrics=self._metrics,
                               released=self._releases.released, kept=self._kept, on_keepalive=self._limits.kept_alive,
                               owners=self.admission.owners, caller=caller_of(context), calls=self._stream_calls,
                               context=context, on_late=self.loop_lag.record, on_rtt=self.capacity.reported,
                               on_wait=self.capacity.waited, **who)
