"""Leases as the client sees them: the deadline rules, and the pool of leases by TTL.

A :class:`Lease` is one etcd lease the client keeps alive, with the
conservative local deadline (docs/architecture.md, "Guarantees"): ``send time of the
last acknowledged keepalive + granted TTL - margin``, on a monotonic clock.
The deadline only moves forward, and a lease is lost exactly once.

A :class:`LeasePool` holds the client's live leases, one per requested TTL
(granted at the first lock with that TTL, reused by the later ones, never
reused once lost), the holds under each lease, and the local exclusion of
one (lease, lock name): one local holder at a time. The pool is bounded: a
lease with no hold and no acquire using it is *idle*; it is retired (and the
client revokes it) once it has been idle for ``idle_timeout`` seconds, or at
once when more than ``max_idle`` leases are idle (the longest idle first). It is the one place that
spreads a loss: a lost lease loses every hold under it, each exactly once,
whichever detection path fires first (the local deadline, an acknowledgement
saying the lease is gone, a HoldEnded event).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .._metrics import NO_CLIENT_METRICS, ClientMetrics
from ..errors import REASON_CLOSED, REASON_DEADLINE
from ..v1 import kinds

#: Why a lease was retired from the pool: idle too long, or over the cap of idle leases.
REASON_IDLE = "IDLE"
#: Seconds a lease may stay idle (no hold, no acquire) before it is revoked, by default.
IDLE_LEASE_TIMEOUT = 30.0
#: Most idle leases a client keeps, by default.
MAX_IDLE_LEASES = 8

if TYPE_CHECKING:
    from ..handle import AsyncLockHandle

__all__ = ["IDLE_LEASE_TIMEOUT", "MAX_IDLE_LEASES", "REASON_IDLE", "Clock", "Lease", "LeasePool", "Slot", "margin_for"]

log = logging.getLogger("fencepost.client")

#: A monotonic clock in seconds (``time.monotonic``, or a fake in tests).
Clock = Callable[[], float]


def margin_for(ttl: float) -> float:
    """Safety margin taken off the local lease deadline.

    Args:
        ttl: Granted TTL in seconds.

    Returns:
        The margin in seconds: ``min(1.0, max(0.1, 0.1 * ttl))``.
    """
    return min(1.0, max(0.1, 0.1 * ttl))


class Lease:
    """One lease's liveness as seen by the client, on an injected monotonic clock.

    Args:
        lease_id: The etcd lease id.
        ttl: The granted TTL in whole seconds.
        granted_at: Clock reading taken just before the LeaseGrant call was sent.
        clock: Monotonic clock in seconds (``time.monotonic`` by default).
        secret: The lease's secret (LeaseGrantResponse.lease_secret), sent with
            every call naming the lease; "" when the coordinator sent none.
            Never shown in reprs or logs.

    Attributes:
        deadline: Clock reading after which the lease must be assumed gone.
            It only moves forward: an acknowledged keepalive sent at ``t``
            moves it to ``max(deadline, t + ttl - margin)``.
        lost_reason: Why the lease was lost, None while it is live. Once
            lost, a lease is never used again.
        holds: Lock name -> the live handle holding that lock under this lease.
        users: How many acquires are using the lease now.
        last_used: Clock reading when its last acquire or hold ended.
    """

    def __init__(self, lease_id: int, ttl: int, granted_at: float, *, clock: Clock = time.monotonic,
                 secret: str = "") -> None:
        self.lease_id = lease_id
        self.secret = secret
        self.ttl = ttl
        self.margin = margin_for(ttl)
        self.deadline = granted_at + ttl - self.margin
        self.lost_reason: str | None = None
        self.clock = clock
        self.holds: dict[str, AsyncLockHandle] = {}
        self.users = 0  # acquires using the lease now
        self.last_used = granted_at  # clock reading when the last acquire or hold under it ended

    @property
    def idle(self) -> bool:
        """Whether no hold and no acquire uses the lease."""
        return self.users == 0 and not self.holds

    @property
    def lost(self) -> bool:
        """Whether the lease has been declared lost."""
        return self.lost_reason is not None

    def on_ack(self, send_time: float, ttl_seconds: int) -> bool:
        """Apply a keepalive acknowledgement.

        Args:
            send_time: Clock reading when the acknowledged keepalive was sent.
            ttl_seconds: The acknowledgement's TTL in seconds; <= 0 means the
                lease is gone.

        Returns:
            True when the lease is still alive, False when the acknowledgement
            says it is gone (the caller then loses it) or it was already lost.
        """
        if self.lost or ttl_seconds <= 0:
            return False
        self.deadline = max(self.deadline, send_time + self.ttl - self.margin)
        return True

    def remaining(self) -> float:
        """Seconds left before the local deadline (0.0 once lost or past it)."""
        if self.lost:
            return 0.0
        return max(0.0, self.deadline - self.clock())

    def expired(self) -> bool:
        """Whether the local deadline has passed."""
        return self.clock() >= self.deadline

    def mark_lost(self, reason: str) -> bool:
        """Declare the lease lost.

        Args:
            reason: Why (an ErrorReason name such as ``LEASE_EXPIRED``, or a
                client-local reason such as ``DEADLINE``).

        Returns:
            True the first time only; False if it was already lost.
        """
        if self.lost:
            return False
        self.lost_reason = reason
        return True

    def __repr__(self) -> str:
        state = f"lost:{self.lost_reason}" if self.lost else f"deadline={self.deadline:.3f}"
        return f"<Lease {self.lease_id} ttl={self.ttl} {state} holds={sorted(self.holds)}>"


class Slot:
    """Local exclusion of one (lease, lock name): one local holder at a time.

    Attributes:
        lock: Held by the local contender that is acquiring or holding.
        users: How many local contenders are waiting for or holding it.
        holder: The handle holding the lock, None while none does.
    """

    __slots__ = ("lock", "users", "holder")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0
        self.holder: AsyncLockHandle | None = None


class LeasePool:
    """The client's live leases (one per requested TTL), their holds and their slots.

    Args:
        clock: The monotonic clock of every lease's deadline, in seconds.
        idle_timeout: Seconds a lease may stay idle before :meth:`retire_idle` retires it.
        max_idle: Most idle leases kept; beyond that the longest idle are retired at once.
        metrics: Counts each lost hold, once, by reason (``fencepost_client_losses_total``).
    """

    def __init__(self, clock: Clock = time.monotonic, *, idle_timeout: float = IDLE_LEASE_TIMEOUT,
                 max_idle: int = MAX_IDLE_LEASES, metrics: ClientMetrics = NO_CLIENT_METRICS) -> None:
        self.clock = clock
        self.metrics = metrics
        self.idle_timeout = idle_timeout
        self.max_idle = max_idle
        self._by_ttl: dict[int, Lease] = {}  # requested TTL -> live lease
        self._by_id: dict[int, Lease] = {}  # lease id -> live lease
        self._grant_locks: dict[int, asyncio.Lock] = {}
        self._slots: dict[tuple[int, str], Slot] = {}

    # ------------------------------------------------------------------ leases

    def live(self, ttl: int) -> Lease | None:
        """The live lease granted for a requested TTL of ``ttl`` whole seconds, if any."""
        lease = self._by_ttl.get(ttl)
        return None if lease is None or lease.lost else lease

    def grant_lock(self, ttl: int) -> asyncio.Lock:
        """The lock serialising the grant of a lease for ``ttl`` (one LeaseGrant at a time)."""
        return self._grant_locks.setdefault(ttl, asyncio.Lock())

    def add(self, ttl: int, lease: Lease) -> None:
        """Make ``lease`` the live lease for a requested TTL of ``ttl`` whole seconds."""
        self._by_ttl[ttl] = lease
        self._by_id[lease.lease_id] = lease

    def get(self, lease_id: int) -> Lease | None:
        """The live lease with id ``lease_id``, if any."""
        return self._by_id.get(lease_id)

    def leases(self) -> list[Lease]:
        """A snapshot of the live leases."""
        return list(self._by_id.values())

    def holds(self) -> list[AsyncLockHandle]:
        """A snapshot of the live holds, under every live lease."""
        return [handle for lease in self._by_id.values() for handle in lease.holds.values()]

    def find_hold(self, lease_id: int, name: str, token: int) -> AsyncLockHandle | None:
        """The live hold of ``name`` (a lock name or a hold's internal name) by ``lease_id`` under ``token``."""
        lease = self._by_id.get(lease_id)
        handle = lease.holds.get(name) if lease is not None else None
        return handle if handle is not None and handle.token == token else None

    def lose(self, lease: Lease, reason: str) -> bool:
        """Declare ``lease`` lost (once): drop it, lose its holds (its keepalives stop: see :mod:`.renewals`).

        Args:
            lease: The lease.
            reason: Why; every hold under the lease is lost with this reason.

        Returns:
            True the first time; False if the lease was already lost.
        """
        if not lease.mark_lost(reason):
            return False
        log.info("fencepost: lease %d lost (%s)", lease.lease_id, reason)
        self._forget(lease)
        for handle in list(lease.holds.values()):
            self.lose_hold(handle, reason)
        return True

    def add_hold(self, handle: AsyncLockHandle) -> None:
        """Keep a new grant: ``handle`` holds its name under its lease (until released or lost)."""
        handle._lease.holds[handle.hold_name] = handle

    def lose_hold(self, handle: AsyncLockHandle, reason: str) -> None:
        """Declare one hold lost (its ``lost`` is signalled once) and free its slot.

        Args:
            handle: The hold.
            reason: Why (``NOT_HOLDER``, ``LEASE_EXPIRED``, ``DEADLINE``...).
        """
        self._drop_hold(handle)
        if handle._mark_lost(reason):
            self.metrics.lost(reason)
            log.info("fencepost: %s (lease %d, token %d) lost (%s)", kinds.describe(handle.hold_name),
                     handle.lease_id, handle.token, reason)
        self.free_slot(handle)

    def finish_release(self, handle: AsyncLockHandle) -> None:
        """Forget a hold that is released (or known gone): free its slot, mark it released."""
        self._drop_hold(handle)
        self.free_slot(handle)
        handle._mark_released()

    def expire(self) -> float | None:
        """Lose every lease whose local deadline has passed (reason ``DEADLINE``).

        Returns:
            Seconds until the nearest deadline of the leases still live, None
            when there is none.
        """
        now = self.clock()
        nearest: float | None = None
        for lease in list(self._by_id.values()):
            if lease.deadline <= now:
                self.lose(lease, REASON_DEADLINE)
            elif nearest is None or lease.deadline < nearest:
                nearest = lease.deadline
        return None if nearest is None else nearest - now

    def used(self, lease: Lease) -> None:
        """An acquire starts using ``lease`` (it is not idle until :meth:`unused`)."""
        lease.users += 1

    def unused(self, lease: Lease) -> None:
        """An acquire stops using ``lease``, or a hold under it ended."""
        lease.users = max(0, lease.users - 1)
        lease.last_used = self.clock()

    def retire_idle(self) -> tuple[list[Lease], float | None]:
        """Retire the leases idle for ``idle_timeout`` seconds, and the longest idle beyond ``max_idle``.

        A retired lease leaves the pool at once (a later acquire with its TTL
        gets a new lease) and its keepalives stop; the caller revokes it.

        Returns:
            The retired leases, and the seconds until the next lease would be
            retired for its idle time (None when no lease is idle).
        """
        now = self.clock()
        idle = sorted((lease for lease in self._by_id.values() if lease.idle), key=lambda lease: lease.last_used)
        over = max(0, len(idle) - self.max_idle)
        retired = [lease for i, lease in enumerate(idle) if i < over or now - lease.last_used >= self.idle_timeout]
        for lease in retired:
            lease.mark_lost(REASON_IDLE)
            self._forget(lease)
            log.debug("fencepost: lease %d retired (idle %.1f s)", lease.lease_id, now - lease.last_used)
        kept = [lease.last_used + self.idle_timeout - now for lease in idle if lease not in retired]
        return retired, (min(kept) if kept else None)

    def _forget(self, lease: Lease) -> None:
        self._by_id.pop(lease.lease_id, None)
        for ttl, current in list(self._by_ttl.items()):
            if current is lease:
                del self._by_ttl[ttl]

    def close(self) -> None:
        """Forget every lease (lost with reason ``CLOSED``) and mark every hold released."""
        for lease in list(self._by_id.values()):
            lease.mark_lost(REASON_CLOSED)
            for handle in list(lease.holds.values()):
                handle._mark_released()
        self._by_id.clear()
        self._by_ttl.clear()

    def _drop_hold(self, handle: AsyncLockHandle) -> None:
        lease = handle._lease
        if lease.holds.get(handle.hold_name) is handle:
            del lease.holds[handle.hold_name]
            lease.last_used = self.clock()

    # ------------------------------------------------------------------ local exclusion

    def slot(self, lease_id: int, name: str) -> Slot:
        """The slot of (``lease_id``, ``name``), made on first use."""
        slot = self._slots.get((lease_id, name))
        if slot is None:
            slot = self._slots[(lease_id, name)] = Slot()
        return slot

    def drop_slot_if_idle(self, lease_id: int, name: str) -> None:
        """Forget the slot of (``lease_id``, ``name``) when nobody uses or holds it."""
        slot = self._slots.get((lease_id, name))
        if slot is not None and slot.users == 0 and not slot.lock.locked():
            del self._slots[(lease_id, name)]

    def free_slot(self, handle: AsyncLockHandle) -> None:
        """Let the next local contender of ``handle``'s (lease, name) go, if ``handle`` held it."""
        key = (handle.lease_id, handle.local_name)
        slot = self._slots.get(key)
        if slot is not None and slot.holder is handle:
            slot.holder = None
            slot.lock.release()
            self.drop_slot_if_idle(*key)
