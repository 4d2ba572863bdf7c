"""The calls of an asyncio client that make no hold: Describe, ListLocks, ServerInfo, ListSessions, AdminRevoke;
and ReportStaleWrite, a fencing guard's refused write told to the coordinator.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from .._info import HeldLock, LockInfo, Revoked, ServerInfo, Session, check_revoke
from .._transport import wire
from ..errors import FencepostError, InvalidArgument, StaleTokenError, Unavailable
from ..v1 import lock_pb2 as pb
from ..v1.keys import MAX_TOKEN
from .core import ClientCore, log

__all__ = ["MAX_REPORTS_IN_FLIGHT", "QueryCalls"]

#: Stale-write reports sent at once by one client; more are dropped (best effort: a flood never piles up).
MAX_REPORTS_IN_FLIGHT = 16
#: The name of a report's background task.
_REPORT_TASK = "fencepost-report-stale-write"
#: Longest record label a report carries, in bytes of UTF-8 (the coordinator's bound).
_RECORD_BYTES = 128


def _report_of(err: StaleTokenError) -> pb.ReportStaleWriteRequest:
    """The ReportStaleWrite request of a guard's refusal: its lock name (if known), tokens, storage, a record label.

    Raises:
        InvalidArgument: ``err`` carries no fencing token (field ``token``).
    """
    if not isinstance(err.token, int) or not 0 < err.token <= MAX_TOKEN:
        raise InvalidArgument(f"the refusal carries no fencing token ({err.token!r})", field="token")
    record = err.record if isinstance(err.record, str) else "" if err.record is None else repr(err.record)
    record = "".join(c if c.isprintable() else "?" for c in record)
    record = record.encode("utf-8", "replace")[:_RECORD_BYTES].decode("utf-8", "ignore")
    current = err.current_token if isinstance(err.current_token, int) and err.current_token > 0 else 0
    return pb.ReportStaleWriteRequest(name=err.name or "", token=err.token, current_token=current,
                                      storage=err.storage or "unknown", record=record)


class QueryCalls(ClientCore):
    """The calls that read the coordinator's state (one lock, the held locks, the coordinator, the sessions),
    and the operator's AdminRevoke; part of :class:`~fencepost.client.AsyncLockClient`."""

    async def describe(self, name: str) -> LockInfo:
        """Report the holder, fencing token, waiters and TTL left of one lock.

        Args:
            name: The lock name.

        Returns:
            A snapshot taken at one etcd revision.

        Raises:
            InvalidArgument: bad name.
            Unavailable: no coordinator reachable.
            FencepostError: the client is closed, or was inherited through
                fork (reason "FORKED").
        """
        self._check_fork()
        wire.check_name(name)
        await self._ensure_open(name)
        try:
            resp = await self._transport.call(
                "Describe",
                lambda _left: (pb.DescribeRequest(name=name), self._connect_timeout),
                until=None,
                idempotent=True,
                name=name,
            )
        except Unavailable as exc:
            raise self._closed_error(name) or exc from exc
        return LockInfo.from_response(name, resp)

    async def list_locks(self, prefix: str = "", *, page_size: int = 0) -> list[HeldLock]:
        """List every held lock whose name starts with ``prefix``, reading all pages.

        Args:
            prefix: The name prefix; "" lists every lock.
            page_size: Locks per ListLocks call, 1 to 1000; 0 lets the
                coordinator choose (100).

        Returns:
            The held locks in the order of their etcd keys, all read at the
            revision of the first page (TTLs as etcd reported them per page).

        Raises:
            InvalidArgument: bad prefix or page size (``field`` names it).
            Unavailable: no coordinator reachable.
            FencepostError: the client is closed, or was inherited through fork.
        """
        self._check_fork()
        wire.check_prefix(prefix)
        await self._ensure_open()
        locks: list[HeldLock] = []
        token = ""
        while True:
            request = pb.ListLocksRequest(prefix=prefix, page_size=page_size, page_token=token)
            resp = await self._transport.call(
                "ListLocks", lambda _left, r=request: (r, self._connect_timeout), until=None, idempotent=True)
            locks.extend(HeldLock.from_message(info, resp.revision) for info in resp.locks)
            token = resp.next_page_token
            if not token:
                return locks

    async def server_info(self) -> ServerInfo:
        """Report on the coordinator currently used: version, uptime, addresses, etcd, counts.

        Answers also while etcd is out of reach (``info.etcd.available`` is
        then False, ``info.etcd.error`` says why): the coordinator gives etcd
        at most 2 s. The counts of ``keepalive_streams`` to ``waiting_acquires``
        are that coordinator's own; ``contender_keys``, ``held_locks`` and
        ``waiters`` are cluster-wide.

        Returns:
            The coordinator's report.

        Raises:
            Unavailable: no coordinator reachable.
            FencepostError: the coordinator does not implement ServerInfo
                (``code`` UNIMPLEMENTED: older than this client, or not a
                coordinator); the client is closed, or was inherited through fork.
        """
        self._check_fork()
        await self._ensure_open()
        try:
            resp = await self._transport.call(
                "ServerInfo", lambda _left: (pb.ServerInfoRequest(), self._connect_timeout), until=None,
                idempotent=True)
        except Unavailable as exc:
            raise self._closed_error(None) or exc from exc
        return ServerInfo.from_response(resp)

    async def admin_revoke(self, name: str, *, kind: int | str = pb.HoldKind.HOLD_KIND_LOCK,
                           slot: int | None = None) -> Revoked:
        """End the hold of lock ``name`` by revoking its holder's lease (AdminRevoke; an operator's call).

        With ``kind``, end the leadership of election ``name`` (its leader's
        lease) or permit ``slot`` of semaphore ``name`` (that permit holder's
        lease) the same way. The lease ends with all its holds and waits; its
        holder is told at once (its handle's ``lost``) and the next waiter
        (candidate, semaphore waiter) is granted with a larger fencing token.
        Carries a request id, the same on each retry, so that a retry after
        a lost answer (within 60 s) answers as the first attempt did instead
        of revoking the next holder.

        Args:
            name: The lock name (the election's, the semaphore's).
            kind: What ``name`` names: ``"lock"`` (the default), ``"election"`` or ``"semaphore"``,
                or a ``HoldKind`` (``fencepost.client.HoldKind``): ``HOLD_KIND_LOCK``,
                ``HOLD_KIND_ELECTION`` or ``HOLD_KIND_SEMAPHORE``.
            slot: ``HOLD_KIND_SEMAPHORE`` only, and then required: the permit slot, 0 to the
                semaphore's permits - 1.

        Returns:
            What was revoked; ``revoked`` False when the lock was free (the
            election had no leader, the slot no holder).

        Raises:
            InvalidArgument: bad name, kind or slot (before any RPC); a slot not below the
                semaphore's number of permits (the coordinator's, field ``slot``).
            AccessDenied: the coordinator has no access policy, or it does not
                grant this client's identity ``admin`` on ``name``.
            Unavailable: no coordinator reachable.
            FencepostError: the client is closed, or was inherited through fork.
        """
        self._check_fork()
        wire.check_name(name)
        kind, wire_slot = check_revoke(kind, slot)
        await self._ensure_open(name)
        try:
            request = pb.AdminRevokeRequest(name=name, kind=kind, slot=wire_slot, request_id=wire.new_request_id())
            resp = await self._transport.call(
                "AdminRevoke", lambda _left: (request, self._connect_timeout), until=None, idempotent=True, name=name)
        except Unavailable as exc:
            raise self._closed_error(name) or exc from exc
        return Revoked(name, bool(resp.revoked), int(resp.lease_id), int(resp.token), kind, wire_slot)

    async def list_sessions(self, *, page_size: int = 0) -> list[Session]:
        """List the live leases with their owner identity, TTLs, holds and waits (ListSessions; every page).

        Args:
            page_size: Leases per ListSessions call, 1 to 1000; 0 lets the coordinator choose (100).

        Returns:
            The sessions in lease id order.

        Raises:
            InvalidArgument: bad page size.
            AccessDenied: the coordinator has no access policy, or it does not
                grant this client's identity ``admin`` on every name.
            Unavailable: no coordinator reachable.
            FencepostError: the client is closed, or was inherited through fork.
        """
        self._check_fork()
        await self._ensure_open()
        sessions: list[Session] = []
        token = ""
        while True:
            request = pb.ListSessionsRequest(page_size=page_size, page_token=token)
            resp = await self._transport.call(
                "ListSessions", lambda _left, r=request: (r, self._connect_timeout), until=None, idempotent=True)
            sessions.extend(Session.from_message(info) for info in resp.sessions)
            token = resp.next_page_token
            if not token:
                return sessions

    async def report_stale_write(self, err: StaleTokenError) -> None:
        """Report a write that a fencing guard refused to the coordinator (ReportStaleWrite).

        The coordinator counts it (``fencepost_stale_writes_reported_total``,
        by storage), logs it and shows it on its lock board's timeline. It
        changes no lock and no record. Mostly used through
        :meth:`stale_write_reporter`, as a guard's ``on_reject``.

        Args:
            err: The guard's :class:`StaleTokenError`: its ``token``,
                ``current_token``, ``storage``, ``record`` (sent as a label of
                at most 128 bytes) and ``name`` (the lock's, when the guard was
                given the lock handle).

        Raises:
            InvalidArgument: ``err`` carries no token, or a field the coordinator refuses.
            AccessDenied: the policy does not let this client acquire the lock.
            LimitExceeded: the coordinator takes no more reports now (20 a second).
            Unavailable: no coordinator reachable.
        """
        self._check_fork()
        request = _report_of(err)
        await self._ensure_open(request.name or None)
        await self._transport.call("ReportStaleWrite", lambda _left: (request, self._connect_timeout), until=None,
                                   idempotent=False, name=request.name or None)

    def stale_write_reporter(self) -> Callable[[StaleTokenError], None]:
        """A fencing guard's ``on_reject`` hook that reports each refused write to the coordinator.

        Opt-in: ``SqlGuard(conn, "invoices", "id", on_reject=client.stale_write_reporter())``.
        Non-blocking and best effort: the hook starts a ReportStaleWrite
        (:meth:`report_stale_write`) and returns at once; a report that fails
        (no coordinator, the coordinator's rate limit, the policy) is logged
        at DEBUG and dropped; at most 16 are sent at once, more are dropped.
        It never changes the write's outcome: the guard raises its
        StaleTokenError as it would without it. Pass the lock handle to the
        guard in place of the token, so that the report names the lock.

        From an :class:`AsyncLockClient` the hook must be called on the
        client's event loop (a guard used from the application's coroutines);
        elsewhere it drops the report. A :class:`LockClient`'s hook may be
        called from any thread; it drops the reports while the client has
        not connected (``with LockClient(...)``, ``connect()``, or a first call).

        Returns:
            The hook: ``hook(err)`` for a :class:`StaleTokenError`.
        """
        def report(err: StaleTokenError) -> None:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                log.debug("stale write not reported: the hook ran outside the client's event loop")
                return
            self._start_report(err)

        return report

    def _start_report(self, err: StaleTokenError) -> None:
        """Send a report in the background (on the running loop): at most MAX_REPORTS_IN_FLIGHT, failures logged."""
        reports = [t for t in self._tasks if t.get_name() == _REPORT_TASK]
        if len(reports) >= MAX_REPORTS_IN_FLIGHT or self._state != "open" and self._state != "new":
            log.debug("stale write not reported: %d reports in flight, client %s", len(reports), self._state)
            return
        self._spawn(self._report_quietly(err), _REPORT_TASK)  # ended by close()

    async def _report_quietly(self, err: StaleTokenError) -> None:
        try:
            await self.report_stale_write(err)
        except FencepostError as exc:
            log.debug("stale write not reported: %s", exc)

