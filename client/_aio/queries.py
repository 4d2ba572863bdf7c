"""The calls of an asyncio client that make no hold: Describe, ListLocks, ServerInfo, ListSessions, AdminRevoke.
"""

from __future__ import annotations

from .._info import HeldLock, LockInfo, Revoked, ServerInfo, Session, check_revoke
from .._transport import wire
from ..errors import Unavailable
from ..v1 import lock_pb2 as pb
from .core import ClientCore

__all__ = ["QueryCalls"]


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
