"""The answers of the client's read and admin calls, as frozen dataclasses.

:class:`LockInfo` is one lock as Describe reports it, :class:`HeldLock` one
entry of a ListLocks listing (:meth:`AsyncLockClient.describe`,
:meth:`AsyncLockClient.list_locks`).

:class:`Revoked` and :class:`Session` come from AdminRevoke and ListSessions
(:meth:`AsyncLockClient.admin_revoke`, :meth:`AsyncLockClient.list_sessions`,
docs/security.md "Administration").

Returned by :meth:`AsyncLockClient.server_info` and
:meth:`LockClient.server_info`, and printed by ``fencepost status``
without a lock name. Counts marked *this coordinator* are of the replica
that answered; *cluster-wide* ones are read from etcd.
"""

from __future__ import annotations

import dataclasses

from .errors import InvalidArgument
from .v1 import lock_pb2 as pb
from .v1.keys import MAX_PERMITS

__all__ = ["EtcdInfo", "HeldLock", "LockInfo", "Revoked", "ServerInfo", "Session"]


@dataclasses.dataclass(frozen=True)
class EtcdInfo:
    """The etcd a coordinator uses, as it saw it during one ServerInfo call.

    Attributes:
        endpoints: The etcd endpoints as the coordinator was configured with
            them (never with credentials).
        embedded: Whether the coordinator runs its own etcd.
        available: Whether etcd answered; when False, the fields below
            ``error`` are None.
        error: Why etcd did not answer, or why its Status call failed while
            the read worked; None when both answered.
        server_version: The answering etcd member's version (``"3.5.1"``);
            None when unknown.
        cluster_id: The etcd cluster id.
        member_id: The id of the etcd member that answered.
        revision: The etcd revision when the coordinator read it.
        raft_term: The answering member's raft term.
        leader: The raft leader's member id; None when unknown or there is none.
        raft_index: The answering member's raft index; None when unknown.
        db_size: The answering member's database size in bytes; None when unknown.
    """

    endpoints: tuple[str, ...]
    embedded: bool
    available: bool
    error: str | None
    server_version: str | None
    cluster_id: int | None
    member_id: int | None
    revision: int | None
    raft_term: int | None
    leader: int | None
    raft_index: int | None
    db_size: int | None

    @classmethod
    def from_message(cls, msg: pb.EtcdInfo) -> EtcdInfo:
        """The etcd part of a ServerInfoResponse."""
        up = bool(msg.available)

        def known(value: int) -> int | None:
            return int(value) if up and value else None

        return cls(
            endpoints=tuple(msg.endpoints),
            embedded=bool(msg.embedded),
            available=up,
            error=msg.error or None,
            server_version=(msg.server_version or None) if up else None,
            cluster_id=int(msg.cluster_id) if up else None,
            member_id=int(msg.member_id) if up else None,
            revision=int(msg.revision) if up else None,
            raft_term=int(msg.raft_term) if up else None,
            leader=known(msg.leader),
            raft_index=known(msg.raft_index),
            db_size=known(msg.db_size_bytes),
        )


@dataclasses.dataclass(frozen=True)
class ServerInfo:
    """One coordinator's version, identity, addresses, readiness, etcd and counts.

    Attributes:
        version: The coordinator's fencepost version.
        instance_id: Random hex, new at each coordinator process start (tells
            replicas apart; a new one means a restart).
        uptime: Seconds since the coordinator started serving.
        listen_address: Where it serves LockService (``HOST:PORT`` or ``unix:/PATH``).
        health_address: Its plaintext health-only listener; None without one.
        metrics_address: ``HOST:PORT`` of its ``/metrics`` endpoint; None without one.
        http_address: Where it serves the HTTP/JSON API and the lock board (``HOST:PORT`` or
            ``unix:/PATH``); None without one.
        key_prefix: The etcd key prefix of its locks.
        serving: Its readiness: True when its health is SERVING.
        etcd: The etcd it uses.
        keepalive_streams: This coordinator: KeepAlive streams open.
        keepalive_leases: This coordinator: leases kept alive through the open
            streams (once per stream, including leases that ended since).
        watched_holds: This coordinator: holds the open streams watch for their end.
        waiting_acquires: This coordinator: Acquire calls waiting for a lock.
        contender_keys: Cluster-wide: lock keys under the prefix (holders and
            waiters); None when etcd did not answer.
        held_locks: Cluster-wide: held locks; None when etcd did not answer or
            there are more than 1000 lock keys.
        waiters: Cluster-wide: contenders queued behind a holder; None when
            ``held_locks`` is.
    """

    version: str
    instance_id: str
    uptime: float
    listen_address: str
    health_address: str | None
    metrics_address: str | None
    http_address: str | None
    key_prefix: str
    serving: bool
    etcd: EtcdInfo
    keepalive_streams: int
    keepalive_leases: int
    watched_holds: int
    waiting_acquires: int
    contender_keys: int | None
    held_locks: int | None
    waiters: int | None

    @classmethod
    def from_response(cls, resp: pb.ServerInfoResponse) -> ServerInfo:
        """The report in a ServerInfoResponse."""

        def count(value: int) -> int | None:
            return int(value) if value >= 0 else None

        return cls(
            version=resp.version,
            instance_id=resp.instance_id,
            uptime=float(resp.uptime_seconds),
            listen_address=resp.listen_address,
            health_address=resp.health_address or None,
            metrics_address=resp.metrics_address or None,
            http_address=resp.http_address or None,
            key_prefix=resp.key_prefix,
            serving=bool(resp.serving),
            etcd=EtcdInfo.from_message(resp.etcd),
            keepalive_streams=int(resp.keepalive_streams),
            keepalive_leases=int(resp.keepalive_leases),
            watched_holds=int(resp.watched_holds),
            waiting_acquires=int(resp.waiting_acquires),
            contender_keys=count(resp.contender_keys) if resp.etcd.available else None,
            held_locks=count(resp.held_locks) if resp.etcd.available else None,
            waiters=count(resp.waiters) if resp.etcd.available else None,
        )


@dataclasses.dataclass(frozen=True)
class Revoked:
    """What :meth:`AsyncLockClient.admin_revoke` did.

    Attributes:
        name: The lock name (the election's, the semaphore's: see ``kind``).
        revoked: Whether a lease was revoked (False: the lock, election or permit slot was free).
        lease_id: The revoked lease (the holder's, leader's, permit holder's); 0 when none.
        token: The fencing token of the hold that ended; 0 when none.
        kind: What ``name`` names: a ``HoldKind`` (``HOLD_KIND_LOCK``, ``_ELECTION``, ``_SEMAPHORE``).
        slot: The semaphore's permit slot whose holder was revoked; 0 for the other kinds.
    """

    name: str
    revoked: bool
    lease_id: int
    token: int
    kind: int = pb.HoldKind.HOLD_KIND_LOCK
    slot: int = 0


#: The kinds of hold :meth:`AsyncLockClient.admin_revoke` ends.
REVOKE_KINDS = (pb.HoldKind.HOLD_KIND_LOCK, pb.HoldKind.HOLD_KIND_ELECTION, pb.HoldKind.HOLD_KIND_SEMAPHORE)


#: admin_revoke's ``kind`` by name.
KIND_NAMES = {"lock": pb.HoldKind.HOLD_KIND_LOCK, "election": pb.HoldKind.HOLD_KIND_ELECTION,
              "semaphore": pb.HoldKind.HOLD_KIND_SEMAPHORE}


def check_revoke(kind: int | str, slot: int | None) -> tuple[int, int]:
    """Check admin_revoke's ``kind`` and ``slot`` before any RPC; the kind and slot to send.

    Args:
        kind: A ``HoldKind``: ``HOLD_KIND_LOCK`` (0), ``HOLD_KIND_ELECTION`` (1) or ``HOLD_KIND_SEMAPHORE`` (2),
            or its name: ``"lock"``, ``"election"`` or ``"semaphore"``.
        slot: The permit slot (an int >= 0) for ``HOLD_KIND_SEMAPHORE``; None for the other kinds.

    Returns:
        (the ``HoldKind``, the slot for the wire: 0 unless a semaphore's).

    Raises:
        InvalidArgument: field ``kind`` (not one of those) or ``slot`` (missing for a semaphore, given for
            another kind, not an int, or not 0 to 999). The semaphore's own number of permits bounds it
            too, checked by the coordinator.
    """
    if isinstance(kind, str):
        kind = KIND_NAMES.get(kind.lower(), kind)  # type: ignore[assignment]
    if isinstance(kind, bool) or kind not in REVOKE_KINDS:
        raise InvalidArgument(f"kind is {kind!r}; must be \"lock\", \"election\" or \"semaphore\" (or "
                              "HoldKind.HOLD_KIND_LOCK, HOLD_KIND_ELECTION or HOLD_KIND_SEMAPHORE)", field="kind")
    kind = int(kind)
    if kind != pb.HoldKind.HOLD_KIND_SEMAPHORE:
        if slot is not None:
            raise InvalidArgument(f"slot is {slot!r}; a slot names a semaphore's permit: give it only with "
                                  "kind HOLD_KIND_SEMAPHORE", field="slot")
        return kind, 0
    if slot is None:
        raise InvalidArgument("slot is missing; revoking a semaphore's permit holder needs the permit's slot",
                              field="slot")
    if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < MAX_PERMITS:
        raise InvalidArgument(f"slot is {slot!r}; must be an int from 0 to {MAX_PERMITS - 1} (below the "
                              "semaphore's permits)", field="slot")
    return kind, slot


@dataclasses.dataclass(frozen=True)
class Session:
    """One live lease, as listed by :meth:`AsyncLockClient.list_sessions`.

    Attributes:
        lease_id: The etcd lease id.
        owner_identity: The certificate identity of the caller that granted
            it; None when it was granted without a client certificate.
        ttl: The granted TTL in seconds.
        ttl_remaining: Seconds left on the lease as etcd reported it (a lower bound only).
        holds: The names of the locks it holds, sorted.
        waits: The names of the locks it waits for, sorted.
    """

    lease_id: int
    owner_identity: str | None
    ttl: int
    ttl_remaining: float
    holds: tuple[str, ...]
    waits: tuple[str, ...]

    @classmethod
    def from_message(cls, info: pb.SessionInfo) -> Session:
        """The session of one ListSessionsResponse entry."""
        return cls(lease_id=int(info.lease_id), owner_identity=info.owner_identity or None,
                   ttl=int(info.ttl_seconds), ttl_remaining=float(info.ttl_remaining_seconds),
                   holds=tuple(info.holds), waits=tuple(info.waits))


@dataclasses.dataclass(frozen=True)
class LockInfo:
    """A snapshot of one lock, as returned by :meth:`AsyncLockClient.describe`.

    Attributes:
        name: The lock name.
        held: Whether anyone holds the lock.
        holder_lease_id: The holder's lease id (0 when not held).
        holder_token: The holder's fencing token (0 when not held).
        ttl_remaining: Seconds left on the holder's lease as etcd reports it
            (a lower bound only), None when not held.
        ttl: The holder lease's granted TTL in seconds (0 when not held).
        waiter_count: How many contenders are queued behind the holders.
        waiters: The first (up to 100) queued contenders as
            ``(lease_id, queue revision)`` pairs, in grant order.
        revision: The etcd revision of the snapshot.
        readers: The lease ids of the readers holding the lock together (a read-write lock, docs/rwlocks.md),
            the holder first, in grant order; empty when a writer or a plain lock's holder holds it.
        waiting_readers: The lease ids of the listed waiters that will read, in grant order.
    """

    name: str
    held: bool
    holder_lease_id: int
    holder_token: int
    ttl_remaining: float | None
    ttl: int
    waiter_count: int
    waiters: tuple[tuple[int, int], ...]
    revision: int
    readers: tuple[int, ...] = ()
    waiting_readers: tuple[int, ...] = ()

    @classmethod
    def from_response(cls, name: str, resp: pb.DescribeResponse) -> LockInfo:
        """The snapshot of lock ``name`` in a DescribeResponse."""
        return cls(
            name=name,
            held=bool(resp.held),
            holder_lease_id=int(resp.holder.lease_id) if resp.held else 0,
            holder_token=int(resp.holder.token) if resp.held else 0,
            ttl_remaining=float(resp.ttl_remaining_seconds) if resp.held and resp.ttl_remaining_seconds >= 0 else None,
            ttl=int(resp.ttl_seconds),
            waiter_count=int(resp.waiter_count),
            waiters=tuple((int(w.lease_id), int(w.token)) for w in resp.waiters),
            revision=int(resp.revision),
            readers=tuple(int(c.lease_id) for c in resp.holders if c.read),
            waiting_readers=tuple(int(c.lease_id) for c in resp.waiters if c.read),
        )


@dataclasses.dataclass(frozen=True)
class HeldLock:
    """One held lock, as listed by :meth:`AsyncLockClient.list_locks`, or one that a lock-delay holds back.

    Attributes:
        name: The lock name.
        holder_lease_id: The holder's lease id; 0 while a lock-delay holds the lock back.
        token: The holder's fencing token; 0 while a lock-delay holds the lock back.
        ttl_remaining: Seconds left on the holder's lease as etcd reported it
            (a lower bound only), None when the lease ended meanwhile.
        ttl: The holder lease's granted TTL in seconds (0 when it ended).
        held_for: Seconds since the grant, None when the coordinator that
            answered did not make the grant (etcd keeps no grant times).
        waiter_count: How many contenders are queued behind the holder (all of them when held back).
        revision: The etcd revision of the listing.
        lock_delay: The lock-delay holding the lock back, in seconds; 0 for a held lock.
        lock_delay_remaining: Seconds left on that delay as etcd reported it; None when it starts at the next
            acquire (its holder was lost, nobody asked since), or for a held lock.
        holder_reads: The holder is a reader of a read-write lock (docs/rwlocks.md): others may read beside it.
        holder_count: How many contenders hold the lock together: 1, or the readers holding it (the holder
            first, not among the waiters counted); 0 while a lock-delay holds it back.
    """

    name: str
    holder_lease_id: int
    token: int
    ttl_remaining: float | None
    ttl: int
    held_for: float | None
    waiter_count: int
    revision: int
    lock_delay: int = 0
    lock_delay_remaining: float | None = None
    holder_reads: bool = False
    holder_count: int = 0

    @property
    def held_back(self) -> bool:
        """Whether a lock-delay holds the lock back (no holder)."""
        return self.lock_delay > 0

    @classmethod
    def from_message(cls, info: pb.LockInfo, revision: int) -> HeldLock:
        """The lock in one ListLocksResponse entry of the listing at ``revision``."""
        return cls(
            name=info.name,
            holder_lease_id=int(info.holder.lease_id),
            token=int(info.holder.token),
            ttl_remaining=float(info.ttl_remaining_seconds) if info.ttl_remaining_seconds >= 0 else None,
            ttl=int(info.ttl_seconds),
            held_for=float(info.held_seconds) if info.held_seconds >= 0 else None,
            waiter_count=int(info.waiter_count),
            revision=int(revision),
            holder_reads=bool(info.holder.read),
            holder_count=int(info.holder_count),
            lock_delay=int(info.lock_delay_seconds),
            lock_delay_remaining=info.lock_delay_remaining_ms / 1000 if info.lock_delay_remaining_ms >= 0
            and info.lock_delay_seconds else None,
        )
