"""The gRPC LockService servicer: a thin adapter onto the lock and lease modules.

Each RPC makes one call into ``lock.LockManager`` or ``lease.Leases``;
errors leave through one decorator that turns a ``FencepostError`` into its
gRPC status with an ``ErrorInfo`` detail (see ``errors``).

While fencing tokens would go back (etcd restored from an older snapshot,
see ``tokens``), the calls that grant, check or report a token, and
LeaseGrant, are refused with UNAVAILABLE / DATA_LOSS; KeepAlive streams,
LeaseRevoke and Withdraw only keep or remove state and are still served.

With an access policy (:mod:`..admission.access`), each call first checks that the
caller's identity may take the call's action (on its lock name), and is
refused with PERMISSION_DENIED / ACCESS_DENIED otherwise; ListLocks shows
only the locks the caller may describe.

Acquire, Release and Withdraw are also served as messages on a KeepAlive
stream (:mod:`.stream_calls`): the same methods below, given a context made
from the stream and the message, answered on the stream.

The admin calls (AdminRevoke, ListSessions) need the ``admin`` action, and
an access policy: without one they are refused (PERMISSION_DENIED /
ACCESS_DENIED), since a coordinator open to every caller would let anyone
revoke anyone's lease. Each one, allowed or not, logs one ``admin`` event.

Retries (:mod:`..recipes.requests`): Release and AdminRevoke with a ``request_id``
write a request record, so that a retry of one that succeeded answers as
the first attempt did; Acquire and Withdraw are idempotent already (their
``request_id`` is checked and logged).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc

from fencepost.client.errors import AccessDenied, FencepostError, InvalidArgument, LimitExceeded, ResourceExhausted
from fencepost.client.v1 import kinds, lock_pb2, lock_pb2_grpc
from fencepost.client.v1.details import ErrorReason, reason_name
from fencepost.client.v1.keys import OBSERVE_ACCEPTED_METADATA, Hold, Keys

from ..admission.access import ACQUIRE, ADMIN, DESCRIBE, RELEASE, Access
from ..admission.identity import caller_of
from ..admission.limits import Limits, LimitTracker
from ..admission.overload import LoopLag
from ..admission.ownership import OwnerRecord, Ownership, new_secret
from ..etcd import bounded
from ..process.info import ETCD_SECONDS, About, read_etcd
from ..recipes.election import Elections, Leader, public_errors, validate_election, validate_value
from ..recipes.holds import HoldTracker
from ..recipes.lease import Leases
from ..recipes.listing import list_locks
from ..recipes.lock import Holder, LockManager
from ..recipes.lock_delay import validate_lock_delay
from ..recipes.requests import Call, RequestRecords, validate_request_id
from ..recipes.semaphore import Semaphores, validate_permits, validate_slot
from ..recipes.sessions import list_sessions
from ..recipes.validate import validate_lease_id, validate_name, validate_token, wait_seconds
from ..recipes.watch import DeleteWatcher
from ..telemetry.events import caller, log_event
from ..telemetry.metrics import LOCK_HELD, NO_METRICS, LockMetrics
from .decode import Undecodable
from .status import reason_of, shutting_down, to_status
from .stream import KeepAliveStream, KeptLeases, RecentReleases
from .stream_calls import CALLS_METADATA, wrapped_calls

R = TypeVar("R")
_log = logging.getLogger(__name__)

#: How long before the caller's gRPC deadline the etcd calls made for it end, in seconds (at most;
#: a fifth of the time left when that is less): time for the answer to reach the caller first.
DEADLINE_MARGIN_SECONDS = 0.5


def _statuses(method: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
    """Turn a FencepostError raised by ``method`` into its gRPC status (and count the refusal).

    A request that could not be decoded (:class:`~.decode.Undecodable`: a
    string field that is not UTF-8, or bytes that are no protobuf) is refused
    as InvalidArgument naming the field (if any).
    """

    @functools.wraps(method)
    async def wrapper(self: LockService, request: Any, context: grpc.aio.ServicerContext) -> R:
        try:
            if isinstance(request, Undecodable):
                raise request.error()
            left = context.time_remaining()
            # etcd calls end a little before the caller's deadline, so that the caller
            # hears why (UNAVAILABLE / ETCD_UNAVAILABLE) rather than its own DEADLINE_EXCEEDED.
            with bounded(None if left is None else left - min(DEADLINE_MARGIN_SECONDS, left / 5)):
                return await method(self, request, context)
        except FencepostError as exc:
            await self._refuse(context, exc, method.__name__)
            raise  # unreachable: abort raises

    return wrapper


def _check_fields(name: str, lease_id: int, token: int | None = None) -> None:
    """Refuse a malformed name, lease id or token (InvalidArgument naming the field) before any policy,
    ownership or etcd work, so that bad input is told as such whoever sends it."""
    validate_name(name)
    validate_lease_id(lease_id)
    if token is not None:
        validate_token(token)


#: The kinds of hold AdminRevoke ends.
_REVOKE_KINDS = (kinds.HoldKind.HOLD_KIND_LOCK, kinds.HoldKind.HOLD_KIND_ELECTION, kinds.HoldKind.HOLD_KIND_SEMAPHORE)


def _check_revoke_kind(kind: int, slot: int) -> None:
    """Refuse an AdminRevoke's unknown ``kind``, or a ``slot`` given for a lock or an election, or out of
    0 to MAX_PERMITS - 1 (the semaphore's own number of permits is checked once it is read).

    Raises:
        InvalidArgument: field ``kind`` or ``slot``.
    """
    if kind not in _REVOKE_KINDS:
        raise InvalidArgument(f"kind is {kind}; must be HOLD_KIND_LOCK (0), HOLD_KIND_ELECTION (1) or "
                              "HOLD_KIND_SEMAPHORE (2)", field="kind")
    if kind != kinds.HoldKind.HOLD_KIND_SEMAPHORE and slot:
        raise InvalidArgument(f"slot is {slot}; a slot names a semaphore's permit: give it only with "
                              "kind HOLD_KIND_SEMAPHORE", field="slot")
    if kind == kinds.HoldKind.HOLD_KIND_SEMAPHORE:
        validate_slot(slot)


def _revoked_what(request: lock_pb2.AdminRevokeRequest) -> dict[str, Any]:
    """The audit line's extra fields of an AdminRevoke: its kind (and slot) unless it names a lock."""
    if request.kind == kinds.HoldKind.HOLD_KIND_ELECTION:
        return {"kind": "election"}
    if request.kind == kinds.HoldKind.HOLD_KIND_SEMAPHORE:
        return {"kind": "semaphore", "slot": request.slot}
    if request.kind != kinds.HoldKind.HOLD_KIND_LOCK:
        return {"kind": int(request.kind)}
    return {}


def _leader(leader: Leader | None) -> lock_pb2.LeaderInfo | None:
    return lock_pb2.LeaderInfo(lease_id=leader.lease_id, token=leader.token, value=leader.value) if leader else None


def _holder(holder: Holder | None) -> lock_pb2.Holder | None:
    return lock_pb2.Holder(lease_id=holder.lease_id, token=holder.token) if holder else None


class LockService(lock_pb2_grpc.LockServiceServicer):
    """Implements fencepost.v1.LockService (see proto/fencepost/v1/lock.proto).

    Args:
        leases: lease grant/revoke/keepalive.
        locks: the lock algorithm.
        watcher: the shared deletion watcher.
        keys: the key layout.
        max_streams: most KeepAlive streams served at once (0: no limit); default ``limits.max_streams``.
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
    """

    def __init__(self, leases: Leases, locks: LockManager, watcher: DeleteWatcher, keys: Keys,
                 *, max_streams: int | None = None, metrics: LockMetrics = NO_METRICS, about: About | None = None,
                 access: Access | None = None, limits: Limits | None = None,
                 owners: Ownership | None = None, records: RequestRecords | None = None) -> None:
        limits = limits if limits is not None else Limits()
        if max_streams is None:
            max_streams = limits.max_streams
        self._leases = leases
        self._access = access if access is not None else Access()
        self._owners = owners if owners is not None else Ownership(locks.etcd, keys)
        self._records = records if records is not None else RequestRecords(locks.etcd, keys)
        self._metrics = metrics
        self._locks = locks
        self._semaphores = Semaphores(locks, keys)
        self._elections = Elections(locks, keys)
        self._watcher = watcher
        self._keys = keys
        self._max_streams = max_streams or 2**63
        self._streams = 0
        self._open: set[KeepAliveStream] = set()  # the streams being served, for ServerInfo's counts
        self._about = about if about is not None else About(prefix=keys.prefix.decode(), endpoints=())
        self._released = RecentReleases()
        self._kept = KeptLeases(metrics)
        self._holds = HoldTracker(watcher, keys.contender, locks.hold_exists, locks.lease_alive, metrics=metrics)
        # started by the server (not started: 0, never refuses)
        self.loop_lag = LoopLag(metrics, waiting=lambda: locks.etcd.keepalive_waiting_seconds)
        self._limits = LimitTracker(limits, holds_of=self._holds.holds_of, holds=self._holds.holds,
                                    loop_lag=lambda: self.loop_lag.seconds)
        self.closing = asyncio.Event()
        self._stream_calls = wrapped_calls(self, ())

    def intercepted_by(self, interceptors: Sequence[Any]) -> None:
        """Serve the calls sent on KeepAlive streams through the server's ``interceptors`` (outermost first),
        so that they are traced and counted as the unary calls are."""
        self._stream_calls = wrapped_calls(self, interceptors)

    @property
    def records(self) -> RequestRecords:
        """The request records (:mod:`..recipes.requests`) of the calls served here that carry a ``request_id``."""
        return self._records

    @property
    def open_streams(self) -> int:
        """The KeepAlive streams being served."""
        return self._streams

    def enter_graceful_shutdown(self) -> None:
        """Refuse new KeepAlive streams and end the open ones with UNAVAILABLE / SHUTTING_DOWN."""
        self.closing.set()

    async def close(self) -> None:
        """Stop following the holds granted here and measuring the loop's lag (after the server stopped)."""
        await self._holds.close()
        await self._semaphores.close()
        await self.loop_lag.close()
        await self._records.close()

    async def _refuse(self, context: grpc.aio.ServicerContext, exc: FencepostError, call: str, *,
                      log: bool = True) -> None:
        """End the call with ``exc``'s status (this raises), counted in ``fencepost_refusals_total``.

        Args:
            call: the RPC's name, for the ``refusal`` event.
            log: False for a stream the coordinator itself ends at shutdown (``stream_close`` says so).
        """
        status = to_status(exc)
        reason = reason_name(reason_of(exc))
        self._metrics.refused(reason)
        level, limited = logging.INFO, {}
        if log and isinstance(exc, LimitExceeded):  # one line per caller and limit per 10 s: a loop must not flood
            who = caller_of(context)
            suppressed = self._limits.log_refusal(who.key, exc.limit)
            log = suppressed is not None
            level, limited = logging.WARNING, {"limit": exc.limit, "value": exc.value, "identity": who.identity,
                                               "suppressed": suppressed}
        if log:
            identity = getattr(exc, "identity", None)
            if reason == reason_name(ErrorReason.NOT_LEASE_OWNER):
                identity = caller_of(context).identity
            log_event(_log, level, "refusal", f"{call} refused: {reason}: {exc.message}", call=call,
                      reason=reason, name=exc.name, lease_id=exc.lease_id, token=getattr(exc, "token", None),
                      current_token=getattr(exc, "current_token", None),
                      **{"action": getattr(exc, "action", None), "identity": identity, **limited},
                      **caller(context))
        await context.abort_with_status(status)

    @_statuses
    async def LeaseGrant(self, request: lock_pb2.LeaseGrantRequest, context: grpc.aio.ServicerContext
                         ) -> lock_pb2.LeaseGrantResponse:
        self._access.check(context, ACQUIRE)  # a lease is only good for acquiring
        self._locks.tokens.check_serving()  # a lease carries no token: refused only once tokens are known unsafe
        secret = new_secret()  # the lease's credential: only its SHA-256 is kept (see ownership)
        record = OwnerRecord.for_secret(caller_of(context).identity, secret)
        with self._limits.lease_grant(caller_of(context).key) as counted:  # refuses past the caller's limits
            lease_id, ttl = await self._leases.grant_or_revoke(
                request.ttl_seconds, then=lambda granted: self._owners.record(granted, record))
            counted(lease_id, ttl)
        log_event(_log, logging.DEBUG, "lease_granted", f"lease {lease_id:#x} granted, TTL {ttl} s",
                  lease_id=lease_id, ttl_s=ttl, owner=record.owner, **caller(context))
        return lock_pb2.LeaseGrantResponse(lease_id=lease_id, ttl_seconds=ttl, lease_secret=secret)

    @_statuses
    async def LeaseRevoke(self, request: lock_pb2.LeaseRevokeRequest, context: grpc.aio.ServicerContext
                          ) -> lock_pb2.LeaseRevokeResponse:
        self._access.check(context, ACQUIRE)
        await self._owners.check_call(context, request.lease_id, "LeaseRevoke")
        self._holds.revoking(request.lease_id)  # before the call: its deletions may be seen before it returns
        try:
            found = await self._leases.revoke(request.lease_id)
        except BaseException:
            self._holds.revoke_failed(request.lease_id)
            raise
        self._kept.revoked(request.lease_id)
        self._limits.lease_ended(request.lease_id)
        self._owners.ended(request.lease_id)
        log_event(_log, logging.DEBUG, "lease_revoked",
                  f"lease {request.lease_id:#x} {'revoked' if found else 'was already gone'}",
                  lease_id=request.lease_id, found=found, **caller(context))
        return lock_pb2.LeaseRevokeResponse(found=found)

    @_statuses
    async def Acquire(self, request: lock_pb2.AcquireRequest, context: grpc.aio.ServicerContext
                      ) -> lock_pb2.AcquireResponse:
        _check_fields(request.name, request.lease_id)  # a malformed request is INVALID_ARGUMENT before anything else
        validate_request_id(request.request_id)
        self._access.check(context, ACQUIRE, request.name)
        started = time.perf_counter()
        wait = wait_seconds(request.wait_ms, request.wait_forever)
        lock_delay = validate_lock_delay(request.lock_delay_seconds)
        await self._locks.tokens.ready()
        await self._owners.check_call(context, request.lease_id, "Acquire")
        # A bounded wait bounds the etcd calls too: with etcd down, the caller hears why at its timeout.
        # The lease's holds and waits and the caller's rate are checked, and this call counted while it runs.
        with (self._limits.acquiring(caller_of(context).key, request.name, request.lease_id),
              bounded(None if wait is None else wait + DEADLINE_MARGIN_SECONDS)):
            result = await self._locks.acquire(request.name, request.lease_id, wait, lock_delay)
        waited = time.perf_counter() - started
        if result.acquired:
            self._metrics.granted(request.name, waited)
            self._holds.granted(Hold(request.name, request.lease_id, result.token), result.freed_at,
                                time.monotonic() - waited)
            log_event(_log, logging.DEBUG, "grant", f"{request.name!r} granted to lease {request.lease_id:#x}, "
                      f"token {result.token}", name=request.name, lease_id=request.lease_id, token=result.token,
                      waited_s=round(waited, 6), request_id=request.request_id or None, **caller(context))
        else:
            self._metrics.refused(LOCK_HELD)
            current = result.holder.token if result.holder is not None else None
            log_event(_log, logging.DEBUG, "refusal", f"Acquire refused: LOCK_HELD: {request.name!r} is held",
                      call="Acquire", reason=LOCK_HELD, name=request.name, lease_id=request.lease_id,
                      current_token=current, **caller(context))
        return lock_pb2.AcquireResponse(acquired=result.acquired, token=result.token, holder=_holder(result.holder))

    @_statuses
    async def Release(self, request: lock_pb2.ReleaseRequest, context: grpc.aio.ServicerContext
                      ) -> lock_pb2.ReleaseResponse:
        _check_fields(request.name, request.lease_id, request.token)
        validate_request_id(request.request_id)
        self._access.check(context, RELEASE, request.name)
        await self._locks.tokens.ready()
        await self._owners.check_call(context, request.lease_id, "Release")
        hold = Hold(request.name, request.lease_id, request.token)
        self._released.add(hold)  # before the Txn: its deletion event may reach a stream before it returns
        followed = self._holds.releasing(request.name, request.lease_id)
        try:
            # With a request_id, its record rides in the release's Txn; a retry of a Release that
            # succeeded is refused by etcd (the key is gone) and answered from that record.
            revision = await self._records.run(
                request.request_id, Call("Release", request.name, request.lease_id, request.token),
                lambda also: self._locks.release(request.name, request.lease_id, request.token, also=also))
        except BaseException:
            self._released.discard(hold)
            self._holds.release_done(followed, released=False)
            raise
        self._holds.release_done(followed, released=followed == hold)
        self._metrics.released()
        log_event(_log, logging.DEBUG, "release", f"{request.name!r} released by lease {request.lease_id:#x}, "
                  f"token {request.token}", name=request.name, lease_id=request.lease_id, token=request.token,
                  revision=revision, request_id=request.request_id or None, **caller(context))
        return lock_pb2.ReleaseResponse(revision=revision)

    @_statuses
    async def Withdraw(self, request: lock_pb2.WithdrawRequest, context: grpc.aio.ServicerContext
                       ) -> lock_pb2.WithdrawResponse:
        _check_fields(request.name, request.lease_id)
        validate_request_id(request.request_id)
        self._access.check(context, ACQUIRE, request.name)
        await self._owners.check_call(context, request.lease_id, "Withdraw")
        followed = self._holds.releasing(request.name, request.lease_id)
        try:
            found, held, revision = await self._locks.withdraw(request.name, request.lease_id)
        except BaseException:
            self._holds.release_done(followed, released=False)
            raise
        self._holds.release_done(followed, released=held)
        log_event(_log, logging.DEBUG, "withdraw",
                  f"{request.name!r}: lease {request.lease_id:#x} withdrew its "
                  f"{'hold' if held else 'wait' if found else 'key (there was none)'}",
                  name=request.name, lease_id=request.lease_id, found=found, held=held, revision=revision,
                  request_id=request.request_id or None, **caller(context))
        return lock_pb2.WithdrawResponse(found=found, held=held, revision=revision)

    @_statuses
    async def Describe(self, request: lock_pb2.DescribeRequest, context: grpc.aio.ServicerContext
                       ) -> lock_pb2.DescribeResponse:
        validate_name(request.name)  # a caller's lock name: never an election's or a semaphore's internal one
        self._access.check(context, DESCRIBE, request.name)
        await self._locks.tokens.ready()
        d = await self._locks.describe(request.name)
        return lock_pb2.DescribeResponse(
            held=d.holder is not None, holder=_holder(d.holder), ttl_remaining_seconds=d.ttl_remaining_seconds,
            ttl_seconds=d.ttl_seconds, waiter_count=d.waiter_count,
            waiters=[_holder(w) for w in d.waiters], revision=d.revision,
        )

    @_statuses
    async def ListLocks(self, request: lock_pb2.ListLocksRequest, context: grpc.aio.ServicerContext
                        ) -> lock_pb2.ListLocksResponse:
        visible = self._access.lister(context, request.prefix)  # None: every lock listed
        await self._locks.tokens.ready()
        page = await list_locks(self._locks.etcd, self._keys, request.prefix, request.page_size, request.page_token,
                                self._holds.grant_times, self._locks.tokens)
        return lock_pb2.ListLocksResponse(
            locks=[lock_pb2.LockInfo(name=lock.name, holder=_holder(lock.holder),
                                     ttl_remaining_seconds=lock.ttl_remaining_seconds, ttl_seconds=lock.ttl_seconds,
                                     held_seconds=lock.held_seconds, waiter_count=lock.waiter_count)
                   for lock in page.locks if visible is None or visible(lock.name)],
            next_page_token=page.next_page_token, revision=page.revision)

    @_statuses
    async def ServerInfo(self, request: lock_pb2.ServerInfoRequest, context: grpc.aio.ServicerContext
                         ) -> lock_pb2.ServerInfoResponse:
        self._access.check(context, ADMIN)
        with bounded(ETCD_SECONDS):  # within the caller's deadline too (see _statuses)
            etcd = await read_etcd(self._locks.etcd, self._keys)
        about = self._about
        return lock_pb2.ServerInfoResponse(
            version=about.version, instance_id=about.instance_id, uptime_seconds=about.uptime_seconds,
            listen_address=about.listen_address, health_address=about.health_address,
            metrics_address=about.metrics_address, key_prefix=about.prefix, serving=about.serving,
            etcd=lock_pb2.EtcdInfo(
                endpoints=list(about.endpoints), embedded=about.embedded, available=etcd.available, error=etcd.error,
                server_version=etcd.server_version, cluster_id=etcd.cluster_id, member_id=etcd.member_id,
                revision=etcd.revision, raft_term=etcd.raft_term, leader=etcd.leader, raft_index=etcd.raft_index,
                db_size_bytes=etcd.db_size_bytes),
            keepalive_streams=len(self._open), keepalive_leases=sum(s.lease_count for s in self._open),
            watched_holds=sum(s.watched_count for s in self._open), waiting_acquires=self._locks.waiting,
            contender_keys=etcd.contender_keys, held_locks=etcd.held_locks, waiters=etcd.waiters)

    def _admit(self, context: grpc.aio.ServicerContext, action: str, name: str) -> None:
        """Refuse an admin call unless a policy is in force and allows the caller ``admin`` on ``name``.

        Raises:
            AccessDenied: no access policy (admin calls need one), or it does not allow the caller.
        """
        who = caller_of(context)
        try:
            if self._access.policy is None:
                raise AccessDenied("admin calls need an access policy (--policy) that grants the admin action; "
                                   "this coordinator has none", name=name, action=ADMIN, identity=who.identity)
            self._access.require(who, ADMIN, name)
        except AccessDenied as exc:
            self._audit(context, action, name, "denied", logging.WARNING, error=exc.message)
            raise

    def _audit(self, context: grpc.aio.ServicerContext, action: str, name: str, outcome: str, level: int,
               **fields: Any) -> None:
        """Log the ``admin`` event of one admin call (who, from where, what, on which name, what came of it)."""
        identity = caller_of(context).identity
        log_event(_log, level, "admin", f"admin {action} {name!r} by {identity or 'a caller without a certificate'}"
                  f": {outcome}", identity=identity, action=action, name=name, outcome=outcome, **fields,
                  **caller(context))

    @_statuses
    async def AdminRevoke(self, request: lock_pb2.AdminRevokeRequest, context: grpc.aio.ServicerContext
                          ) -> lock_pb2.AdminRevokeResponse:
        validate_request_id(request.request_id)
        self._admit(context, "revoke", request.name)
        await self._locks.tokens.ready()
        request_id = request.request_id or None
        shown = _revoked_what(request)
        try:
            validate_name(request.name)  # a lock's: an election's or a semaphore's internal name is refused
            _check_revoke_kind(request.kind, request.slot)
            holder = await self._holder_to_revoke(request)
            # With a request_id, what this call revokes is recorded first (etcd cannot revoke inside a
            # Txn): a retry finds the record and revokes that lease again (a no-op once it is gone)
            # and answers as the first attempt, instead of revoking the next holder. The call names the
            # internal name, so that reusing the id for another kind or slot is REQUEST_ID_REUSED.
            call = Call("AdminRevoke", kinds.internal_name(request.kind, request.name, request.slot),
                        slot=request.slot)
            earlier = await self._records.claim(request.request_id, call,
                                                {"lease_id": holder.lease_id, "token": holder.token} if holder else {})
            if earlier is not None:
                recorded = earlier.outcome
                holder = Holder(recorded["lease_id"], recorded["token"]) if "lease_id" in recorded else None
            found = False
            if holder is not None:
                found = await self._revoke_lease(holder.lease_id) or earlier is not None
        except FencepostError as exc:
            self._audit(context, "revoke", request.name, "failed", logging.WARNING, error=exc.message,
                        request_id=request_id, **shown)
            raise
        if not found:
            self._audit(context, "revoke", request.name, "not_held", logging.WARNING, request_id=request_id, **shown)
            return lock_pb2.AdminRevokeResponse(revoked=False)
        assert holder is not None
        self._audit(context, "revoke", request.name, "revoked", logging.WARNING, lease_id=holder.lease_id,
                    token=holder.token, request_id=request_id, retried=True if earlier is not None else None, **shown)
        return lock_pb2.AdminRevokeResponse(revoked=True, lease_id=holder.lease_id, token=holder.token)

    async def _holder_to_revoke(self, request: lock_pb2.AdminRevokeRequest) -> Holder | None:
        """The holder an AdminRevoke ends (checked already): the lock's holder, the election's leader, or
        the holder of the semaphore's permit ``slot``; None when there is none.

        Raises:
            InvalidArgument: field ``slot``: not below the semaphore's number of permits.
            DataLoss, Unavailable: as the reads.
        """
        if request.kind == kinds.HoldKind.HOLD_KIND_ELECTION:
            leader, _ = await self._elections.leader(request.name)
            return Holder(leader.lease_id, leader.token) if leader is not None else None
        if request.kind == kinds.HoldKind.HOLD_KIND_SEMAPHORE:
            d = await self._semaphores.describe(request.name)
            if d.permits and request.slot >= d.permits:
                raise InvalidArgument(f"slot is {request.slot}; semaphore {request.name!r} has {d.permits} permits "
                                      f"(slots 0 to {d.permits - 1})", name=request.name, field="slot")
            return next((Holder(p.lease_id, p.token) for p in d.holders if p.slot == request.slot), None)
        return (await self._locks.describe(request.name)).holder

    async def _revoke_lease(self, lease_id: int) -> bool:
        """Revoke lease ``lease_id`` for an operator (bypassing ownership), with the holds' bookkeeping.

        Returns:
            False when etcd no longer knew the lease.
        """
        self._holds.revoking(lease_id)  # before the call: its deletions may be seen before it returns
        try:
            found = await self._leases.revoke(lease_id)  # bypasses ownership: the admin's own act
        except BaseException:
            self._holds.revoke_failed(lease_id)
            raise
        self._kept.revoked(lease_id)
        self._limits.lease_ended(lease_id)
        self._owners.ended(lease_id)
        return found

    @_statuses
    async def ListSessions(self, request: lock_pb2.ListSessionsRequest, context: grpc.aio.ServicerContext
                           ) -> lock_pb2.ListSessionsResponse:
        self._admit(context, "list_sessions", "*")  # every lease of every lock: admin on every name
        try:
            page = await list_sessions(self._locks.etcd, self._keys, request.page_size, request.page_token)
        except FencepostError as exc:
            self._audit(context, "list_sessions", "*", "failed", logging.INFO, error=exc.message)
            raise
        self._audit(context, "list_sessions", "*", "listed", logging.INFO, sessions=len(page.sessions))
        return lock_pb2.ListSessionsResponse(
            sessions=[lock_pb2.SessionInfo(lease_id=s.lease_id, owner_identity=s.owner or "", ttl_seconds=s.ttl_seconds,
                                           ttl_remaining_seconds=s.ttl_remaining_seconds, holds=s.holds,
                                           waits=s.waits) for s in page.sessions],
            next_page_token=page.next_page_token, revision=page.revision)

    # ------------------------------------------------------------------ semaphores (coordinator/semaphore.py)

    @_statuses
    async def AcquirePermit(self, request: lock_pb2.AcquirePermitRequest, context: grpc.aio.ServicerContext
                            ) -> lock_pb2.AcquirePermitResponse:
        _check_fields(request.name, request.lease_id)
        validate_permits(request.permits)
        validate_request_id(request.request_id)
        self._access.check(context, ACQUIRE, request.name)
        started = time.perf_counter()
        wait = wait_seconds(request.wait_ms, request.wait_forever)
        await self._locks.tokens.ready()
        await self._owners.check_call(context, request.lease_id, "AcquirePermit")
        with (self._limits.acquiring(caller_of(context).key, kinds.semaphore_queue(request.name), request.lease_id),
              bounded(None if wait is None else wait + DEADLINE_MARGIN_SECONDS)):
            result = await self._semaphores.acquire(request.name, request.lease_id, request.permits, wait)
        waited = time.perf_counter() - started
        if result.acquired:
            self._metrics.granted(request.name, waited)
            self._holds.granted(Hold(kinds.semaphore_slot(request.name, result.slot), request.lease_id, result.token),
                                result.freed_at, time.monotonic() - waited)
            log_event(_log, logging.DEBUG, "grant", f"semaphore {request.name!r} slot {result.slot} granted to lease "
                      f"{request.lease_id:#x}, token {result.token}", name=request.name, lease_id=request.lease_id,
                      token=result.token, slot=result.slot, waited_s=round(waited, 6), **caller(context))
        else:
            self._metrics.refused(LOCK_HELD)
        return lock_pb2.AcquirePermitResponse(
            acquired=result.acquired, slot=result.slot, token=result.token,
            holders=[lock_pb2.PermitHolder(lease_id=h.lease_id, slot=h.slot, token=h.token) for h in result.holders])

    @_statuses
    async def ReleasePermit(self, request: lock_pb2.ReleasePermitRequest, context: grpc.aio.ServicerContext
                            ) -> lock_pb2.ReleasePermitResponse:
        _check_fields(request.name, request.lease_id)
        validate_slot(request.slot)
        if request.token:
            validate_token(request.token)
        validate_request_id(request.request_id)
        self._access.check(context, RELEASE, request.name)
        await self._locks.tokens.ready()
        await self._owners.check_call(context, request.lease_id, "ReleasePermit")
        if not request.token:  # withdraw whatever the lease has there
            found, held, revision = await self._semaphores.withdraw(request.name, request.lease_id)
            log_event(_log, logging.DEBUG, "withdraw", f"semaphore {request.name!r}: lease {request.lease_id:#x} "
                      f"withdrew its {'permit' if held else 'wait' if found else 'key (there was none)'}",
                      name=request.name, lease_id=request.lease_id, found=found, held=held, revision=revision,
                      **caller(context))
            return lock_pb2.ReleasePermitResponse(revision=revision, found=found)
        slot_lock = kinds.semaphore_slot(request.name, request.slot)
        hold = Hold(slot_lock, request.lease_id, request.token)
        self._released.add(hold)  # before the Txn: its deletion event may reach a stream before it returns
        followed = self._holds.releasing(slot_lock, request.lease_id)
        try:
            revision = await self._records.run(  # a retry of a ReleasePermit that succeeded: from its record
                request.request_id, Call("ReleasePermit", request.name, request.lease_id, request.token, request.slot),
                lambda also: self._semaphores.release(request.name, request.lease_id, request.slot, request.token,
                                                      also=also))
        except BaseException:
            self._released.discard(hold)
            self._holds.release_done(followed, released=False)
            raise
        self._holds.release_done(followed, released=followed == hold)
        self._metrics.released()
        log_event(_log, logging.DEBUG, "release", f"semaphore {request.name!r} slot {request.slot} released by lease "
                  f"{request.lease_id:#x}, token {request.token}", name=request.name, lease_id=request.lease_id,
                  token=request.token, slot=request.slot, revision=revision, **caller(context))
        return lock_pb2.ReleasePermitResponse(revision=revision)

    @_statuses
    async def DescribeSemaphore(self, request: lock_pb2.DescribeSemaphoreRequest, context: grpc.aio.ServicerContext
                                ) -> lock_pb2.DescribeSemaphoreResponse:
        validate_name(request.name)
        self._access.check(context, DESCRIBE, request.name)
        await self._locks.tokens.ready()
        d = await self._semaphores.describe(request.name)
        return lock_pb2.DescribeSemaphoreResponse(
            permits=d.permits, waiter_count=d.waiter_count, revision=d.revision,
            holders=[lock_pb2.PermitHolder(lease_id=h.lease_id, slot=h.slot, token=h.token) for h in d.holders])

    # ------------------------------------------------------------------ elections (see .election)

    @_statuses
    async def Campaign(self, request: lock_pb2.CampaignRequest, context: grpc.aio.ServicerContext
                       ) -> lock_pb2.CampaignResponse:
        validate_election(request.election)
        validate_lease_id(request.lease_id)
        validate_value(request.value)
        validate_request_id(request.request_id)
        self._access.check(context, ACQUIRE, request.election)
        started = time.perf_counter()
        wait = wait_seconds(request.wait_ms, request.wait_forever)
        await self._locks.tokens.ready()
        await self._owners.check_call(context, request.lease_id, "Campaign")
        internal = kinds.election_lock(request.election)
        with (public_errors(request.election),  # the limits name the internal lock they count
              self._limits.acquiring(caller_of(context).key, internal, request.lease_id),
              bounded(None if wait is None else wait + DEADLINE_MARGIN_SECONDS)):
            result = await self._elections.campaign(request.election, request.lease_id, request.value, wait)
        waited = time.perf_counter() - started
        if result.elected:
            self._metrics.granted(internal, waited)
            self._holds.granted(Hold(internal, request.lease_id, result.token), None, time.monotonic() - waited)
            log_event(_log, logging.DEBUG, "elected", f"election {request.election!r}: lease "
                      f"{request.lease_id:#x} leads, token {result.token}", name=request.election,
                      lease_id=request.lease_id, token=result.token, waited_s=round(waited, 6), **caller(context))
        return lock_pb2.CampaignResponse(elected=result.elected, token=result.token, leader=_leader(result.leader))

    @_statuses
    async def Proclaim(self, request: lock_pb2.ProclaimRequest, context: grpc.aio.ServicerContext
                       ) -> lock_pb2.ProclaimResponse:
        validate_election(request.election)
        validate_lease_id(request.lease_id)
        validate_token(request.token)
        validate_value(request.value)
        self._access.check(context, ACQUIRE, request.election)
        await self._locks.tokens.ready()
        await self._owners.check_call(context, request.lease_id, "Proclaim")
        revision = await self._elections.proclaim(request.election, request.lease_id, request.token, request.value)
        return lock_pb2.ProclaimResponse(revision=revision)

    @_statuses
    async def Resign(self, request: lock_pb2.ResignRequest, context: grpc.aio.ServicerContext
                     ) -> lock_pb2.ResignResponse:
        validate_election(request.election)
        validate_lease_id(request.lease_id)
        if request.token:
            validate_token(request.token)
        validate_request_id(request.request_id)
        self._access.check(context, RELEASE, request.election)
        await self._locks.tokens.ready()
        await self._owners.check_call(context, request.lease_id, "Resign")
        internal = kinds.election_lock(request.election)
        hold = Hold(internal, request.lease_id, request.token)
        if request.token:
            self._released.add(hold)  # before the Txn: its deletion event may reach a stream before it returns
        followed = self._holds.releasing(internal, request.lease_id)
        try:
            if request.token:  # a retry of a Resign that succeeded answers from its request record
                found = held = True
                revision = await self._records.run(
                    request.request_id, Call("Resign", request.election, request.lease_id, request.token),
                    lambda also: self._resigned(request, also))
            else:
                revision, found, held = await self._elections.resign(request.election, request.lease_id, 0)
        except BaseException:
            self._released.discard(hold)
            self._holds.release_done(followed, released=False)
            raise
        self._holds.release_done(followed, released=followed == hold if request.token else held)
        if request.token:
            self._metrics.released()
        log_event(_log, logging.DEBUG, "resign", f"election {request.election!r}: lease {request.lease_id:#x} "
                  f"resigned (token {request.token})", name=request.election, lease_id=request.lease_id,
                  token=request.token, found=found, revision=revision, **caller(context))
        return lock_pb2.ResignResponse(revision=revision, found=found)

    async def _resigned(self, request: lock_pb2.ResignRequest, also: Sequence[Any]) -> int:
        revision, _, _ = await self._elections.resign(request.election, request.lease_id, request.token, also=also)
        return revision

    @_statuses
    async def Leader(self, request: lock_pb2.LeaderRequest, context: grpc.aio.ServicerContext
                     ) -> lock_pb2.LeaderResponse:
        validate_election(request.election)
        self._access.check(context, DESCRIBE, request.election)
        await self._locks.tokens.ready()
        leader, revision = await self._elections.leader(request.election)
        return lock_pb2.LeaderResponse(leader=_leader(leader), revision=revision)

    async def Observe(self, request: lock_pb2.ObserveRequest, context: grpc.aio.ServicerContext
                      ) -> AsyncIterator[lock_pb2.ObserveResponse]:
        changes: AsyncIterator[Any] | None = None
        step: asyncio.Future[Any] | None = None
        counted, caller_key = False, ""
        try:
            if isinstance(request, Undecodable):
                raise request.error()
            validate_election(request.election)
            if request.after_revision < 0:
                raise InvalidArgument(f"after_revision is {request.after_revision}; must be >= 0",
                                      field="after_revision")
            self._access.check(context, DESCRIBE, request.election)
            if self.closing.is_set():
                raise shutting_down()
            # An Observe holds an etcd watch: it counts as a stream for the stream limits.
            if self._streams >= self._max_streams:
                raise ResourceExhausted(f"more than {self._max_streams} streams",
                                        reason=reason_name(ErrorReason.TOO_MANY_STREAMS))
            self._limits.stream_opened(caller_key := caller_of(context).key)
            self._streams += 1
            counted = True
            await self._locks.tokens.ready()
            ready = asyncio.Event()
            changes = self._elections.observe(request.election, request.after_revision, ready=ready.set)
            accepted = False
            closing = asyncio.ensure_future(self.closing.wait())
            try:
                while True:
                    step = asyncio.ensure_future(anext(changes))
                    while not accepted:
                        # Accepted once the first etcd read succeeded: the client learns the stream is up
                        # even if nothing changes for a long time (a resumed Observe sends nothing until
                        # the leader changes). Not before: an Observe refused at once (etcd unreachable)
                        # must not count as accepted, or a client would retry it forever.
                        readying = asyncio.ensure_future(ready.wait())
                        await asyncio.wait({step, closing, readying}, return_when=asyncio.FIRST_COMPLETED)
                        readying.cancel()
                        if ready.is_set():
                            await context.send_initial_metadata(((OBSERVE_ACCEPTED_METADATA, "1"),))
                            accepted = True
                        elif step.done() or closing.done():
                            break
                    if not step.done() and not closing.done():
                        await asyncio.wait({step, closing}, return_when=asyncio.FIRST_COMPLETED)
                    if not step.done():
                        step.cancel()
                        await asyncio.gather(step, return_exceptions=True)
                        raise shutting_down()  # the client resumes on another replica
                    seen = step.result()
                    yield lock_pb2.ObserveResponse(leader=_leader(seen.leader), revision=seen.revision,
                                                   compacted=seen.compacted)
            finally:
                closing.cancel()
        except FencepostError as exc:
            await self._refuse(context, exc, "Observe", log=not self.closing.is_set())
        finally:
            if step is not None and not step.done():  # the caller went: stop the read in flight first
                step.cancel()
                await asyncio.gather(step, return_exceptions=True)
            if changes is not None:
                await changes.aclose()  # type: ignore[attr-defined]
            if counted:
                self._streams -= 1
                self._limits.stream_closed(caller_key)

    async def KeepAlive(self, request_iterator: AsyncIterable[lock_pb2.KeepAliveRequest],
                        context: grpc.aio.ServicerContext) -> AsyncIterator[lock_pb2.KeepAliveResponse]:
        try:
            self._access.check(context, ACQUIRE)
        except AccessDenied as exc:
            await self._refuse(context, exc, "KeepAlive")
        if self.closing.is_set():
            await self._refuse(context, shutting_down(), "KeepAlive")
        if self._streams >= self._max_streams:
            await self._refuse(context, ResourceExhausted(
                f"more than {self._max_streams} streams", reason=reason_name(ErrorReason.TOO_MANY_STREAMS)),
                "KeepAlive")
        key = caller_of(context).key
        try:
            self._limits.stream_opened(key)
        except LimitExceeded as exc:
            await self._refuse(context, exc, "KeepAlive")
        self._streams += 1
        who = caller(context)
        stream = KeepAliveStream(self._leases, self._locks, self._watcher, self._keys.contender,
                                 metrics=self._metrics, released=self._released, kept=self._kept,
                                 on_keepalive=self._limits.kept_alive, owners=self._owners,
                                 caller=caller_of(context), calls=self._stream_calls, context=context,
                                 on_late=self.loop_lag.record, **who)
        self._open.add(stream)
        log_event(_log, logging.INFO, "stream_open", f"KeepAlive stream opened by {who['peer']}", **who)
        started = time.monotonic()
        ended = "error"  # a failure of the stream
        refused: FencepostError | None = None
        try:
            await context.send_initial_metadata((CALLS_METADATA,))  # Acquire, Release, Withdraw served on the stream
            async for response in stream.serve(request_iterator, self.closing):
                yield response
            ended = "shutdown" if self.closing.is_set() else "half_closed"
        except FencepostError as exc:  # a message the stream refuses (a name that is not UTF-8, no protobuf)
            ended = "refused"
            refused = exc
        except (asyncio.CancelledError, GeneratorExit):
            ended = "cancelled"
            raise
        finally:
            self._streams -= 1
            self._limits.stream_closed(key)
            self._open.discard(stream)
            log_event(_log, logging.INFO, "stream_close", f"KeepAlive stream of {who['peer']} ended: {ended}",
                      ended=ended, leases=stream.lease_count, holds=stream.hold_count,
                      duration_s=round(time.monotonic() - started, 3), **who)
        if refused is not None:
            await self._refuse(context, refused, "KeepAlive")
        if self.closing.is_set():
            await self._refuse(context, shutting_down(), "KeepAlive", log=False)
