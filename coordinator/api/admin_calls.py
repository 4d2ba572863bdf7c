"""The admin calls: AdminRevoke, ListSessions and AdminEndLockDelay, each audited with one ``admin`` event.

Both need the ``admin`` action of an access policy (:func:`admit_admin`):
without a policy they are refused (PERMISSION_DENIED / ACCESS_DENIED), since
a coordinator open to every caller would let anyone revoke anyone's lease.
Each call, allowed or not, logs one ``admin`` event (:func:`audit`): who,
from where, what, on which name, and what came of it.

AdminRevoke ends the hold of a lock, the leadership of an election or the
permit ``slot`` of a semaphore by revoking its lease (bypassing ownership:
the operator's own act). With a ``request_id``, what it revokes is recorded
first (:mod:`..recipes.requests`; etcd cannot revoke inside a Txn): a retry
finds the record and revokes that lease again (a no-op once it is gone) and
answers as the first attempt, instead of revoking the next holder.

AdminEndLockDelay ends a lock's running or pending lock-delay
(:meth:`..recipes.lock.LockManager.end_lock_delay`): idempotent, so it needs
no request id.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc

from fencepost.client.errors import AccessDenied, FencepostError, InvalidArgument
from fencepost.client.v1 import kinds, lock_pb2
from fencepost.client.v1.keys import Keys

from ..admission.access import ADMIN, Access
from ..admission.identity import caller_of
from ..recipes.election import Elections
from ..recipes.lock import Holder, LockManager
from ..recipes.requests import Call, RequestRecords
from ..recipes.semaphore import Semaphores, validate_slot
from ..recipes.sessions import list_sessions
from ..recipes.validate import validate_name
from ..telemetry.events import caller, log_event
from .releases import Releases

__all__ = ["AdminCalls", "admit_admin", "audit"]

_log = logging.getLogger(__name__)

#: The kinds of hold AdminRevoke ends.
REVOKE_KINDS = (kinds.HoldKind.HOLD_KIND_LOCK, kinds.HoldKind.HOLD_KIND_ELECTION, kinds.HoldKind.HOLD_KIND_SEMAPHORE)


def audit(context: grpc.aio.ServicerContext, action: str, name: str, outcome: str, level: int,
          **fields: Any) -> None:
    """Log the ``admin`` event of one admin call (who, from where, what, on which name, what came of it).

    Args:
        context: the call's context (its caller and peer).
        action: the audited action (``revoke``, ``list_sessions``).
        name: the lock name it acts on (``*``: every name).
        outcome: ``denied``, ``failed``, ``not_held``, ``revoked``, ``listed``, ``ended``, ``no_delay``.
        level: the log level.
        fields: more fields of the event.
    """
    identity = caller_of(context).identity
    log_event(_log, level, "admin", f"admin {action} {name!r} by {identity or 'a caller without a certificate'}"
              f": {outcome}", identity=identity, action=action, name=name, outcome=outcome, **fields,
              **caller(context))


def admit_admin(access: Access, context: grpc.aio.ServicerContext, action: str, name: str) -> None:
    """Refuse an admin call unless a policy is in force and allows the caller ``admin`` on ``name``.

    A refusal is audited (outcome ``denied``).

    Raises:
        AccessDenied: no access policy (admin calls need one), or it does not allow the caller.
    """
    who = caller_of(context)
    try:
        if access.policy is None:
            raise AccessDenied("admin calls need an access policy (--policy) that grants the admin action; "
                               "this coordinator has none", name=name, action=ADMIN, identity=who.identity)
        access.require(who, ADMIN, name)
    except AccessDenied as exc:
        audit(context, action, name, "denied", logging.WARNING, error=exc.message)
        raise


def check_revoke_kind(kind: int, slot: int) -> None:
    """Refuse an AdminRevoke's unknown ``kind``, or a ``slot`` given for a lock or an election, or out of
    0 to MAX_PERMITS - 1 (the semaphore's own number of permits is checked once it is read).

    Raises:
        InvalidArgument: field ``kind`` or ``slot``.
    """
    if kind not in REVOKE_KINDS:
        raise InvalidArgument(f"kind is {kind}; must be HOLD_KIND_LOCK (0), HOLD_KIND_ELECTION (1) or "
                              "HOLD_KIND_SEMAPHORE (2)", field="kind")
    if kind != kinds.HoldKind.HOLD_KIND_SEMAPHORE and slot:
        raise InvalidArgument(f"slot is {slot}; a slot names a semaphore's permit: give it only with "
                              "kind HOLD_KIND_SEMAPHORE", field="slot")
    if kind == kinds.HoldKind.HOLD_KIND_SEMAPHORE:
        validate_slot(slot)


def revoked_what(request: lock_pb2.AdminRevokeRequest) -> dict[str, Any]:
    """The audit line's extra fields of an AdminRevoke: its kind (and slot) unless it names a lock."""
    if request.kind == kinds.HoldKind.HOLD_KIND_ELECTION:
        return {"kind": "election"}
    if request.kind == kinds.HoldKind.HOLD_KIND_SEMAPHORE:
        return {"kind": "semaphore", "slot": request.slot}
    if request.kind != kinds.HoldKind.HOLD_KIND_LOCK:
        return {"kind": int(request.kind)}
    return {}


class AdminCalls:
    """The bodies of AdminRevoke and ListSessions, once admitted (:mod:`.rpcs`).

    Args:
        locks: the lock algorithm (a lock's holder).
        semaphores: a semaphore's permits.
        elections: an election's leader.
        records: the request records (a retried AdminRevoke).
        releases: revokes a lease with the holds' bookkeeping.
        keys: the key layout (ListSessions reads the whole prefix).
    """

    def __init__(self, locks: LockManager, semaphores: Semaphores, elections: Elections, records: RequestRecords,
                 releases: Releases, keys: Keys) -> None:
        self._locks = locks
        self._semaphores = semaphores
        self._elections = elections
        self._records = records
        self._releases = releases
        self._keys = keys

    async def revoke(self, request: lock_pb2.AdminRevokeRequest, context: grpc.aio.ServicerContext
                     ) -> lock_pb2.AdminRevokeResponse:
        """AdminRevoke, audited: revoke the lease of the hold ``request`` names.

        Raises:
            InvalidArgument: fields ``name``, ``kind``, ``slot``.
            DataLoss, Unavailable: as the reads and the revoke.
        """
        request_id = request.request_id or None
        shown = revoked_what(request)
        try:
            validate_name(request.name)  # a lock's: an election's or a semaphore's internal name is refused
            check_revoke_kind(request.kind, request.slot)
            holder = await self._holder_to_revoke(request)
            # The call names the internal name, so that reusing the id for another kind or slot is
            # REQUEST_ID_REUSED.
            call = Call("AdminRevoke", kinds.internal_name(request.kind, request.name, request.slot),
                        slot=request.slot)
            earlier = await self._records.claim(request.request_id, call,
                                                {"lease_id": holder.lease_id, "token": holder.token} if holder else {})
            if earlier is not None:
                recorded = earlier.outcome
                holder = Holder(recorded["lease_id"], recorded["token"]) if "lease_id" in recorded else None
            found = False
            if holder is not None:
                found = await self._releases.revoke(holder.lease_id, rpc="AdminRevoke") or earlier is not None
        except FencepostError as exc:
            audit(context, "revoke", request.name, "failed", logging.WARNING, error=exc.message,
                  request_id=request_id, **shown)
            raise
        if not found:
            audit(context, "revoke", request.name, "not_held", logging.WARNING, request_id=request_id, **shown)
            return lock_pb2.AdminRevokeResponse(revoked=False)
        assert holder is not None
        audit(context, "revoke", request.name, "revoked", logging.WARNING, lease_id=holder.lease_id,
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

    async def end_lock_delay(self, request: lock_pb2.AdminEndLockDelayRequest, context: grpc.aio.ServicerContext
                             ) -> lock_pb2.AdminEndLockDelayResponse:
        """AdminEndLockDelay, audited: end the lock-delay of lock ``request.name``.

        Raises:
            InvalidArgument: field ``name``.
            Unavailable: etcd unreachable.
        """
        try:
            validate_name(request.name)
            ended = await self._locks.end_lock_delay(request.name)
        except FencepostError as exc:
            audit(context, "end_lock_delay", request.name, "failed", logging.WARNING, error=exc.message)
            raise
        if not ended.seconds:
            audit(context, "end_lock_delay", request.name, "no_delay", logging.WARNING)
            return lock_pb2.AdminEndLockDelayResponse(ended=False)
        left = max(ended.remaining_ms, 0)
        audit(context, "end_lock_delay", request.name, "ended", logging.WARNING, lock_delay_seconds=ended.seconds,
              lock_delay_remaining_ms=left)
        return lock_pb2.AdminEndLockDelayResponse(ended=True, lock_delay_remaining_ms=left)

    async def list_sessions(self, request: lock_pb2.ListSessionsRequest, context: grpc.aio.ServicerContext
                            ) -> lock_pb2.ListSessionsResponse:
        """ListSessions, audited: one page of the leases with keys under the prefix, with their owners.

        Raises:
            InvalidArgument: a bad ``page_token``.
            Unavailable: etcd unreachable.
        """
        try:
            page = await list_sessions(self._locks.etcd, self._keys, request.page_size, request.page_token)
        except FencepostError as exc:
            audit(context, "list_sessions", "*", "failed", logging.INFO, error=exc.message)
            raise
        audit(context, "list_sessions", "*", "listed", logging.INFO, sessions=len(page.sessions))
        return lock_pb2.ListSessionsResponse(
            sessions=[lock_pb2.SessionInfo(lease_id=s.lease_id, owner_identity=s.owner or "", ttl_seconds=s.ttl_seconds,
                                           ttl_remaining_seconds=s.ttl_remaining_seconds, holds=s.holds,
                                           waits=s.waits) for s in page.sessions],
            next_page_token=page.next_page_token, revision=page.revision)
