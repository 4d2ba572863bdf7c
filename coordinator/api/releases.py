"""Ending holds and leases here: the bookkeeping around every release, withdrawal and revoke, in one place.

A call that deletes a hold's key (Release, ReleasePermit, Resign; Withdraw)
or revokes a lease (LeaseRevoke, AdminRevoke) tells the coordinator's
memory of holds before its etcd work starts, because the deletion may reach
the lock watch before the call returns, and after it ends, with how it
ended:

- :class:`RecentReleases`: a hold released by its token, so that a KeepAlive
  stream that sees its key deleted ends it quietly (the ``release`` event
  already said why);
- :class:`~..recipes.holds.HoldTracker`: the followed hold ends ``released``
  (or, for a revoke, ``revoked``) rather than as a loss;
- after a revoke: the lease is no longer kept alive here
  (:class:`~..recipes.lease.KeptLeases`), counted against its caller's limits,
  or remembered as owned;
- :class:`ServedEnds`: which call served here deleted a key or revoked a
  lease, for the lock board's timeline (whoever granted the hold).

:meth:`Releases.releasing` and :meth:`Releases.revoke` do each of those
steps, and undo the first ones when the call fails.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fencepost.client.v1.keys import Hold

from ..admission.limit_tracker import LimitTracker
from ..admission.ownership import Ownership
from ..recipes.holds import HoldTracker
from ..recipes.lease import KeptLeases, Leases
from ..telemetry.metrics import NO_METRICS, LockMetrics

__all__ = ["Ending", "RecentReleases", "Releases", "ServedEnds"]


class RecentReleases:
    """The holds released through this coordinator whose deletion no stream has reported yet.

    A stream that sees such a hold's key deleted ends it quietly: the
    ``release`` event already said why it ended. Bounded: the oldest entries
    go first (raw API users release holds that no stream watches), so under a
    very high rate a release can be logged as a ``hold_ended`` too.

    Args:
        size: most holds remembered.
    """

    def __init__(self, size: int = 10_000) -> None:
        self._size = size
        self._holds: OrderedDict[Hold, None] = OrderedDict()

    def add(self, hold: Hold) -> None:
        """Remember ``hold`` as being released."""
        self._holds[hold] = None
        if len(self._holds) > self._size:
            self._holds.popitem(last=False)

    def discard(self, hold: Hold) -> None:
        """Forget ``hold`` (its release failed, or its watch was dropped)."""
        self._holds.pop(hold, None)

    def take(self, hold: Hold) -> bool:
        """Forget ``hold``; True when it was being released."""
        if hold not in self._holds:
            return False
        del self._holds[hold]
        return True


class ServedEnds:
    """The key deletions and lease revokes served by this coordinator, remembered for the lock board.

    Each is noted before its etcd work starts (its deletion may reach a watch
    before the call returns) and dropped again when the call fails. Bounded:
    the oldest go first. Another coordinator's (or worker's) calls are not
    here: the board infers their reason (:mod:`..http.board_feed`).

    Args:
        size: most deletions, and most revokes, remembered.
    """

    def __init__(self, size: int = 10_000) -> None:
        self._size = size
        # (internal name, lease) or lease id -> (the RPC, when it started: monotonic seconds)
        self._deleted: OrderedDict[tuple[str, int], tuple[str, float]] = OrderedDict()
        self._revoked: OrderedDict[int, tuple[str, float]] = OrderedDict()

    def deleting(self, name: str, lease_id: int, rpc: str) -> None:
        """A call ``rpc`` (Release, Withdraw, ...) is about to delete the key of (``name``, ``lease_id``)."""
        _remember(self._deleted, (name, lease_id), rpc, self._size)

    def revoking(self, lease_id: int, rpc: str) -> None:
        """A call ``rpc`` (LeaseRevoke, AdminRevoke) is about to revoke ``lease_id``."""
        _remember(self._revoked, lease_id, rpc, self._size)

    def failed(self, name: str | None, lease_id: int) -> None:
        """That call failed: what it was about to do is not its doing (``name`` None: a revoke)."""
        if name is None:
            self._revoked.pop(lease_id, None)
        else:
            self._deleted.pop((name, lease_id), None)

    def deleted_by(self, name: str, lease_id: int, since: float) -> str | None:
        """The RPC served here that deleted the key of (``name``, ``lease_id``) after ``since`` (monotonic
        seconds: when the hold began; an earlier call ended an earlier hold); None for none."""
        return _after(self._deleted.get((name, lease_id)), since)

    def revoked_by(self, lease_id: int) -> str | None:
        """The RPC served here that revoked ``lease_id``; None for none."""
        return _after(self._revoked.get(lease_id), 0.0)


def _remember(memory: OrderedDict[Any, tuple[str, float]], key: Any, rpc: str, size: int) -> None:
    memory[key] = (rpc, time.monotonic())
    memory.move_to_end(key)
    if len(memory) > size:
        memory.popitem(last=False)


def _after(noted: tuple[str, float] | None, since: float) -> str | None:
    return noted[0] if noted is not None and noted[1] >= since else None


class Ending:
    """One release or withdrawal in progress (see :meth:`Releases.releasing`).

    Attributes:
        held: whether the call deletes the followed hold's key: for a release
            by token, whether that token is the followed hold's; a withdrawal
            sets it from its answer (its key held the lock).
    """

    __slots__ = ("held",)

    def __init__(self, held: bool) -> None:
        self.held = held


class Releases:
    """The bookkeeping of the calls that end holds and leases.

    Args:
        holds: the holds granted here, followed to their end.
        leases: revokes leases in etcd.
        kept: the leases kept alive through this coordinator's streams.
        limits: the leases counted against their callers.
        owners: the ownership records of leases.
        metrics: counts the releases (``fencepost_releases_total``).
        released: the holds released here and not yet reported by a stream.

    Attributes:
        served: the key deletions and revokes served here (:class:`ServedEnds`, read by the lock board).
    """

    def __init__(self, holds: HoldTracker, leases: Leases, kept: KeptLeases, limits: LimitTracker, owners: Ownership,
                 *, metrics: LockMetrics = NO_METRICS, released: RecentReleases | None = None) -> None:
        self._holds = holds
        self._leases = leases
        self._kept = kept
        self._limits = limits
        self._owners = owners
        self._metrics = metrics
        self.released = released if released is not None else RecentReleases()
        self.served = ServedEnds()

    @contextmanager
    def releasing(self, hold: Hold, *, by_token: bool = True, rpc: str = "Release") -> Iterator[Ending]:
        """Around the etcd work of a call that deletes the key of (``hold.name``, ``hold.lease_id``).

        Args:
            hold: what the call ends (the internal lock name: a permit's slot lock, an election's lock).
            by_token: the call releases ``hold`` by its token (Release, ReleasePermit, Resign with a
                token): it is remembered as released (before the Txn: its deletion event may reach a stream
                before the call returns) and counted once it succeeded. False: the call withdraws the
                lease's key whatever its token (Withdraw, Resign without one), and sets ``held`` itself.
            rpc: the call, as the lock board names the end's cause.

        Yields:
            The :class:`Ending` of the call; when the block raises, the hold was not released.
        """
        if by_token:
            self.released.add(hold)
        followed = self._holds.releasing(hold.name, hold.lease_id)
        ending = Ending(held=by_token and followed == hold)
        self.served.deleting(hold.name, hold.lease_id, rpc)
        try:
            yield ending
        except BaseException:
            self.served.failed(hold.name, hold.lease_id)
            if by_token:
                self.released.discard(hold)
            self._holds.release_done(followed, released=False)
            raise
        self._holds.release_done(followed, released=ending.held)
        if by_token:
            self._metrics.released()

    async def revoke(self, lease_id: int, *, rpc: str = "LeaseRevoke") -> bool:
        """Revoke lease ``lease_id`` in etcd, with the holds' and leases' bookkeeping (ownership is the caller's
        to check).

        Args:
            lease_id: the lease.
            rpc: the call (LeaseRevoke, AdminRevoke), as the lock board names the end's cause.

        Returns:
            False when etcd no longer knew the lease.

        Raises:
            Unavailable: etcd unreachable.
        """
        self._holds.revoking(lease_id)  # before the call: its deletions may be seen before it returns
        self.served.revoking(lease_id, rpc)
        try:
            found = await self._leases.revoke(lease_id)
        except BaseException:
            self._holds.revoke_failed(lease_id)
            self.served.failed(None, lease_id)
            raise
        self._kept.revoked(lease_id)
        self._limits.lease_ended(lease_id)
        self._owners.ended(lease_id)
        return found
