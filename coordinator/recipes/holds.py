"""The holds this coordinator granted, followed to their end: hold times, hand-offs, and how each ended.

etcd keeps no time of a grant and says nothing of why a key was deleted,
so this is the coordinator's own memory, on its monotonic clock, of the
grants it made (``fencepost_holds``, ``fencepost_hold_seconds``,
``fencepost_losses_total``, ``fencepost_handoff_seconds``; the times also
answer ListLocks' ``held_seconds``). Each hold granted here is followed by
a subscription to its key's deletion on the shared lock watch (whoever
keeps it alive, whether or not a KeepAlive stream watches it), and ends
once, with one reason:

- ``released``: a Release served here released it, or a Withdraw served
  here deleted it while it held (the deletion may reach the watch before
  the call's answer: it waits for the call's outcome);
- ``revoked``: its key was deleted and its lease is gone, revoked by a
  LeaseRevoke served here;
- ``expired``: its key was deleted and its lease is gone otherwise (expired,
  or revoked through another coordinator or etcdctl);
- ``key_deleted``: its key was deleted while its lease lived (a Release
  through another coordinator, or someone deleting the key).

The lease is asked of etcd (LeaseTimeToLive, one per lease at a time) only
for a deletion that no call served here explains. While the lock watch
restarts, each hold is read again (as a KeepAlive stream does).

Hand-off: the end of each hold this coordinator saw is remembered by lock
name, for :data:`HANDOFF_MEMORY_SECONDS` and for at most
:data:`HANDOFF_MEMORY_NAMES` names (an end older than that is forgotten
even while no grant comes: a flood of names used once leaves nothing
behind); the next grant of that name here
observes the time since the later of that end and the one a waiting
Acquire brings (below), once per end, labelled ``queued="true"`` when its
Acquire call had started by then (the lock passed to a contender already
asking: the hand-off latency) and ``"false"`` when the lock was free when
asked (the time it stayed free). A waiting Acquire's own end is the moment
the deletion that made it the holder reached the watch, which also covers a
hold granted by another coordinator.

Bounded: at most ``capacity`` holds are followed; beyond, the oldest is
forgotten (it leaves ``fencepost_holds`` without an end being counted).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fencepost.client.errors import FencepostError
from fencepost.client.v1.keys import Hold
from fencepost.client.v1.retry import ETCD_BACKOFF

from ..etcd import unbounded
from ..telemetry.metrics import NO_METRICS, LockMetrics
from .listing import GrantTimes
from .watch import DeleteWatcher

__all__ = ["HANDOFF_MEMORY_NAMES", "HANDOFF_MEMORY_SECONDS", "HoldTracker"]

_log = logging.getLogger(__name__)

#: Seconds the end of a hold is remembered for the hand-off to the next grant of its name.
HANDOFF_MEMORY_SECONDS = 60.0
#: Most lock names whose last hold end is remembered at once (the oldest go first).
HANDOFF_MEMORY_NAMES = 10_000
#: Leases remembered as revoked through this coordinator.
REVOKED_MEMORY = 10_000


@dataclass
class _Followed:
    """One hold granted here and not ended yet."""

    unsubscribe: Callable[[], None]
    releasing: int = 0  # Release or Withdraw calls of it in flight here
    deleted_at: float | None = None  # when its deletion was seen, while a call of it was in flight
    ending: bool = False  # its end is being classified (a LeaseTimeToLive in flight)


class HoldTracker:
    """Follows each hold granted by this coordinator to its end.

    Args:
        watcher: the shared lock watch (deletions by key).
        keys_for: (lock name, lease id) -> the contender key.
        hold_exists: reads whether a hold still exists (while the watch cannot tell).
        lease_alive: reads whether a lease still exists (LeaseTimeToLive).
        metrics: where the holds, their times, ends and hand-offs are counted.
        capacity: most holds followed at once.
        clock: the monotonic clock, seconds (injected in tests).
    """

    def __init__(self, watcher: DeleteWatcher, keys_for: Callable[[str, int], bytes],
                 hold_exists: Callable[[Hold], Awaitable[bool]], lease_alive: Callable[[int], Awaitable[bool]],
                 *, metrics: LockMetrics = NO_METRICS, capacity: int = 100_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._watcher = watcher
        self._keys_for = keys_for
        self._hold_exists = hold_exists
        self._lease_alive = lease_alive
        self._metrics = metrics
        self._capacity = capacity
        self._clock = clock
        #: Grant times (also ListLocks' ``held_seconds``).
        self.grant_times = GrantTimes(capacity, clock)
        self._held: OrderedDict[Hold, _Followed] = OrderedDict()
        self._by_key: dict[tuple[str, int], Hold] = {}
        self._per_lease: dict[int, int] = {}  # lease id -> its holds followed (for the limits)
        self._ends: OrderedDict[str, float] = OrderedDict()  # lock name -> when its last hold end was seen
        self._revoked: OrderedDict[int, int] = OrderedDict()  # lease id -> LeaseRevoke calls (in flight or done)
        self._leases: dict[int, asyncio.Future[bool]] = {}  # lease id -> its liveness read in flight
        self._tasks: set[asyncio.Task[None]] = set()
        self._sweep: asyncio.TimerHandle | None = None  # forgets the hold ends older than HANDOFF_MEMORY_SECONDS

    @property
    def count(self) -> int:
        """The holds followed now (``fencepost_holds``)."""
        return len(self._held)

    @property
    def sizes(self) -> dict[str, int]:
        """What the tracker holds now: ``holds`` followed, ``hold_ends`` remembered for the hand-off,
        ``revoked_leases`` remembered, ``grant_times`` kept."""
        return {"holds": len(self._held), "hold_ends": len(self._ends), "revoked_leases": len(self._revoked),
                "grant_times": self.grant_times.count}

    def holds_of(self, lease_id: int) -> int:
        """The holds of ``lease_id`` granted here and followed now (for ``--max-holds-per-lease``)."""
        return self._per_lease.get(lease_id, 0)

    def holds(self, name: str, lease_id: int) -> bool:
        """Whether ``lease_id`` holds lock ``name`` by a grant made here and followed now."""
        return (name, lease_id) in self._by_key

    # ------------------------------------------------------------------ grants

    def granted(self, hold: Hold, freed_at: float | None = None, asked_at: float | None = None) -> None:
        """A grant of ``hold`` made here: follow it, and observe the hand-off to it.

        Args:
            hold: the grant.
            freed_at: for a waiting Acquire, the clock reading when the
                deletion that made it the holder was seen; None otherwise.
            asked_at: the clock reading when the Acquire call started; None: now.
        """
        if hold in self._held:
            return  # the same lease asked again for a lock it holds: the same hold
        now = self._clock()
        seen = self._ends.pop(hold.name, None)
        if seen is not None and now - seen > HANDOFF_MEMORY_SECONDS:
            seen = None
        # The later of the two: an end seen here, older than the waiter's, was followed by a hold not seen here.
        ends = [end for end in (seen, freed_at) if end is not None]
        ended = max(ends) if ends else None
        if ended is not None:
            queued = freed_at is not None or (asked_at if asked_at is not None else now) <= ended
            self._metrics.handed_off(max(0.0, now - ended), queued)
        self.grant_times.granted(hold)
        key = self._keys_for(hold.name, hold.lease_id)

        def on_delete(revision: int | None) -> None:
            if revision is None:
                self._spawn(self._recheck(hold))
            elif revision > hold.token:
                self._deleted(hold)

        self._held[hold] = _Followed(self._watcher.subscribe(key, on_delete))
        self._by_key[hold.name, hold.lease_id] = hold
        self._per_lease[hold.lease_id] = self._per_lease.get(hold.lease_id, 0) + 1
        self._metrics.holds(+1)
        while len(self._held) > self._capacity:
            oldest, followed = self._held.popitem(last=False)
            self._forget(oldest, followed)
            self._metrics.holds(-1)
        known = self._watcher.deleted_after(key, hold.token)
        if known:
            self._deleted(hold)
        elif known is None:
            self._spawn(self._recheck(hold))

    # ------------------------------------------------------------------ calls served here

    def releasing(self, name: str, lease_id: int) -> Hold | None:
        """A Release or Withdraw of the key of (``name``, ``lease_id``) starts here.

        Returns:
            The followed hold it may end (pass it to :meth:`release_done`), None when none is followed.
        """
        hold = self._by_key.get((name, lease_id))
        followed = self._held.get(hold) if hold is not None else None
        if followed is None:
            return None
        followed.releasing += 1
        return hold

    def release_done(self, hold: Hold | None, released: bool) -> None:
        """The call :meth:`releasing` announced ended: ``released`` when it deleted ``hold``'s key."""
        followed = self._held.get(hold) if hold is not None else None
        if hold is None or followed is None:
            return
        followed.releasing -= 1
        if released:
            self._end(hold, "released", followed.deleted_at)
        elif followed.releasing == 0 and followed.deleted_at is not None:
            self._classify(hold, followed.deleted_at)

    def revoking(self, lease_id: int) -> None:
        """A LeaseRevoke of ``lease_id`` starts here (its deletions may be seen before it returns)."""
        self._revoked[lease_id] = self._revoked.get(lease_id, 0) + 1
        self._revoked.move_to_end(lease_id)
        while len(self._revoked) > REVOKED_MEMORY:
            self._revoked.popitem(last=False)

    def revoke_failed(self, lease_id: int) -> None:
        """That LeaseRevoke failed: the lease's end is not its doing."""
        left = self._revoked.get(lease_id, 0) - 1
        if left <= 0:
            self._revoked.pop(lease_id, None)
        else:
            self._revoked[lease_id] = left

    async def close(self) -> None:
        """Stop following: drop every subscription and stop the reads in flight."""
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for hold, followed in list(self._held.items()):
            self._forget(hold, followed)
        self._held.clear()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # ------------------------------------------------------------------ ends

    def _deleted(self, hold: Hold) -> None:
        followed = self._held.get(hold)
        if followed is None or followed.ending:
            return
        now = self._clock()
        if followed.releasing:
            followed.deleted_at = followed.deleted_at or now  # the call's outcome tells why
            return
        self._classify(hold, now)

    def _classify(self, hold: Hold, at: float) -> None:
        """End ``hold``, deleted at ``at`` by nothing served here: revoked, expired or key_deleted."""
        followed = self._held.get(hold)
        if followed is None or followed.ending:
            return
        followed.ending = True
        if hold.lease_id in self._revoked:
            self._end(hold, "revoked", at)
            return

        async def why() -> None:
            delays = ETCD_BACKOFF.delays()
            while hold in self._held:
                try:
                    alive = await self._alive(hold.lease_id)
                except FencepostError:
                    await asyncio.sleep(next(delays))  # etcd out of reach: ask again
                    continue
                self._end(hold, "key_deleted" if alive else
                          "revoked" if hold.lease_id in self._revoked else "expired", at)
                return

        self._spawn(why())

    async def _alive(self, lease_id: int) -> bool:
        """Whether ``lease_id`` exists: one read per lease at a time, shared by its holds."""
        pending = self._leases.get(lease_id)
        if pending is None:
            with unbounded():
                pending = self._leases[lease_id] = asyncio.ensure_future(self._lease_alive(lease_id))
            pending.add_done_callback(lambda _: self._leases.pop(lease_id, None))
        return await asyncio.shield(pending)

    async def _recheck(self, hold: Hold) -> None:
        """Read ``hold`` again when the watch cannot tell whether it was deleted."""
        delays = ETCD_BACKOFF.delays()
        while hold in self._held:
            try:
                if not await self._hold_exists(hold):
                    self._deleted(hold)
                return
            except FencepostError:
                await asyncio.sleep(next(delays))

    def _end(self, hold: Hold, reason: str, at: float | None) -> None:
        followed = self._held.pop(hold, None)
        if followed is None:
            return
        self._forget(hold, followed)
        at = self._clock() if at is None else at
        granted_at = self.grant_times.granted_at(hold)
        self.grant_times.released(hold)
        self._metrics.holds(-1)
        self._metrics.hold_ended(hold.name, max(0.0, at - granted_at) if granted_at is not None else 0.0, reason)
        self._ends[hold.name] = at
        self._ends.move_to_end(hold.name)
        while len(self._ends) > HANDOFF_MEMORY_NAMES:
            self._ends.popitem(last=False)
        if self._sweep is None:
            with contextlib.suppress(RuntimeError):  # no running loop (a unit test): forgotten at the next end
                self._sweep = asyncio.get_running_loop().call_later(HANDOFF_MEMORY_SECONDS, self._forget_ends)

    def _forget_ends(self) -> None:
        """Forget the hold ends older than HANDOFF_MEMORY_SECONDS; run again while some are left."""
        old = self._clock() - HANDOFF_MEMORY_SECONDS
        while self._ends and next(iter(self._ends.values())) < old:
            self._ends.popitem(last=False)
        if not self._ends:
            self._ends = OrderedDict()  # a dict keeps its largest table: give it back once empty
        if not self._held:
            self._held, self._by_key, self._per_lease = OrderedDict(), {}, {}
        self._sweep = None
        if self._ends:  # again when the oldest left is due
            due = next(iter(self._ends.values())) + HANDOFF_MEMORY_SECONDS - self._clock()
            self._sweep = asyncio.get_running_loop().call_later(max(0.1, due), self._forget_ends)

    def _forget(self, hold: Hold, followed: _Followed) -> None:
        followed.unsubscribe()
        left = self._per_lease.get(hold.lease_id, 0) - 1
        if left <= 0:
            self._per_lease.pop(hold.lease_id, None)
        else:
            self._per_lease[hold.lease_id] = left
        if self._by_key.get((hold.name, hold.lease_id)) == hold:
            del self._by_key[hold.name, hold.lease_id]

    def _spawn(self, step: Awaitable[None]) -> None:
        with unbounded():  # not cut short by the deadline of the call that saw the end (an Acquire, a Release)
            task = asyncio.ensure_future(step)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            _log.error("following a hold failed", exc_info=task.exception())
