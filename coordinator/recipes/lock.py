"""The lock algorithm on etcd: acquire, release, describe.

After etcd's ``concurrency.Mutex`` (client/v3/concurrency/mutex.go): a lock
named N is a key range; each contender puts one key attached to its lease;
the holder is the key with the lowest create revision; a waiter waits for the
deletion of the key just before its own (first come, first served, no
thundering herd). The fencing token is the holder key's create revision
plus the token floor (:mod:`.tokens`; 0 until an operator recovers from an
etcd restore): etcd revisions are cluster-wide and only grow, so each new
holder of N gets a strictly larger token (Kleppmann 2016; Chubby's
sequencers, Burrows 2006). Inside this module revisions are revisions; they
become tokens (and tokens revisions) only through the :class:`~.tokens.TokenFloor`.

Costs with a lease granted beforehand: an uncontended acquire is one etcd
Txn, a release one Txn. A lock-delay (:mod:`.lock_delay`) adds a compare or
a range read to the grants' Txns and reads and a nested Txn to the
releases', and etcd requests only to the holds that ask for one. Every "is this still the holder" decision is made by
a compare inside one Txn (:func:`fencepost.client.v1.etcdops.is_owner`),
never by a read followed by a write. Every Txn goes through the etcd layer
with a read-back that resolves it when its outcome is unknown. Each Txn of
one lock (all its ops in that lock's key range) goes through
:meth:`~..etcd.EtcdClient.lock_txn`, which sends concurrent ones of different
locks to etcd as one Txn (:mod:`..etcd.batch`). Waiting in a lock's queue, and
what a wait leaves behind when its call ends, is :mod:`.waiters`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from fencepost.client.errors import FencepostError, LeaseLost, NotHolder, StaleTokenError
from fencepost.client.v1 import etcdops, kinds
from fencepost.client.v1.keys import Hold, Keys

from ..etcd import NOT_APPLIED, EtcdClient, TxnPlan
from ..telemetry.metrics import NO_METRICS, LockMetrics
from .floor_guard import under_floor
from .lock_delay import DelayState, HeldBack, LockDelays, validate_lock_delay
from .snapshots import DESCRIBE_WAITERS, AcquireResult, Description, Holder, holding
from .tokens import TokenFloor
from .validate import validate_lease_id, validate_lock_name, validate_token
from .waiters import REATTACH_SECONDS, Waiters, mode_conflict
from .watch import DeleteWatcher

__all__ = ["DESCRIBE_WAITERS", "REATTACH_SECONDS", "AcquireResult", "Description", "Holder", "LockManager",
           "release_refusal", "shown_hold"]

def release_refusal(hold: Hold, mine: Any | None, holder: Holder | None, lease_alive: bool, *,
                    floor: int = 0) -> FencepostError:
    """The error of a release whose ``is_owner`` compare failed.

    Args:
        hold: What the caller asked to release.
        mine: The lease's key in that lock as read in the Txn's failure
            branch (a KeyValue), None when it has none.
        holder: The lock's holder read in the same failure branch, None when free.
        lease_alive: Whether the lease still exists (only consulted when ``mine`` is None).
        floor: The token floor (the token of ``mine`` is its create revision + ``floor``).

    Returns:
        StaleTokenError (the lease's key is newer: ``current_token`` is its
        token), LeaseLost (no key and no lease), or NotHolder
        (``current_token`` is the holder's token when the lock is held).
    """
    name, lease_id, token = hold
    current = holder.token if holder is not None else None
    shown = shown_hold(name)
    if mine is not None:
        created = int(mine.create_revision) + floor
        if created > token:
            return StaleTokenError(f"token {token} of {shown} is stale: the lease holds it under {created}",
                                   name=name, lease_id=lease_id, token=token, current_token=created)
        return NotHolder(f"token {token} was not granted to lease {lease_id:#x} for {shown} (its key there "
                         f"has token {created})", name=name, lease_id=lease_id, token=token, current_token=current)
    if not lease_alive:
        return LeaseLost(f"lease {lease_id:#x} has expired or was revoked", name=name, lease_id=lease_id)
    other = ""
    if holder is not None and holder.lease_id == lease_id:  # it holds the lock, in the other mode (rwlock.py)
        other = ": it holds it for reading (release with mode LOCK_MODE_READ)" if holder.read else \
            ": it holds it for writing (release without mode LOCK_MODE_READ)"
    return NotHolder(f"lease {lease_id:#x} does not hold {shown}{other}", name=name, lease_id=lease_id, token=token,
                     current_token=current)


def shown_hold(name: str) -> str:
    """An internal lock name as error messages show it: ``'n'``, ``'n' for reading``, ``election 'e'``,
    ``permit 2 of semaphore 's'`` (never the internal name's control characters)."""
    public = kinds.public_hold(name)
    if public.kind == kinds.HoldKind.HOLD_KIND_READ:
        return f"{public.name!r} for reading"
    if public.kind == kinds.HoldKind.HOLD_KIND_ELECTION:
        return f"election {public.name!r}"
    if public.kind == kinds.HoldKind.HOLD_KIND_SEMAPHORE:
        return f"permit {public.slot} of semaphore {public.name!r}" if public.slot >= 0 else \
            f"the queue of semaphore {public.name!r}"
    return repr(name)


class LockManager:
    """Acquire, release and describe locks stored in etcd.

    Args:
        etcd: the coordinator's etcd layer.
        keys: the key layout.
        watcher: the running deletion watcher for the same prefix.
        max_waiters: most Acquire calls that may wait at once on this coordinator.
        metrics: follows the number of those (``fencepost_waiting_acquires``).
        reattach_seconds: how long the key of a waiting Acquire that ended without
            an answer (cancelled) is kept for the caller to Acquire again in its place.
        tokens: turns revisions into fencing tokens and refuses while tokens would
            go back; None for a floor of 0 that never refuses.
    """

    def __init__(self, etcd: EtcdClient, keys: Keys, watcher: DeleteWatcher, *, max_waiters: int = 10_000,
                 metrics: LockMetrics = NO_METRICS, reattach_seconds: float = REATTACH_SECONDS,
                 tokens: TokenFloor | None = None) -> None:
        self._etcd = etcd
        self._tokens = tokens if tokens is not None else TokenFloor(None, keys)
        self._metrics = metrics
        self._keys = keys
        self._watcher = watcher
        self._delays = LockDelays(etcd, keys, watcher)
        self._waiters = Waiters(etcd, keys, watcher, self._delays, self._tokens, max_waiters=max_waiters,
                                metrics=metrics, reattach_seconds=reattach_seconds)

    @property
    def waiting(self) -> int:
        """The Acquire calls with a wait in progress on this coordinator."""
        return self._waiters.waiting

    @property
    def tokens(self) -> TokenFloor:
        """The token floor: every token this module hands out or checks goes through it."""
        return self._tokens

    @property
    def etcd(self) -> EtcdClient:
        """The etcd layer the locks live in (read-only listings use it directly)."""
        return self._etcd

    @property
    def waiters(self) -> Waiters:
        """The waits in the locks' queues (a multi-lock waits in each of its locks' queues through it)."""
        return self._waiters

    @property
    def delays(self) -> LockDelays:
        """The lock-delays (a multi-lock's grant honours them as a lock's does)."""
        return self._delays

    @property
    def watcher(self) -> DeleteWatcher:
        """The deletion watcher the waits use."""
        return self._watcher

    @property
    def reattach_seconds(self) -> float:
        """How long the key of a cancelled waiting call is kept for its caller to come back (REATTACH_SECONDS)."""
        return self._waiters.reattach_seconds

    def pending_write(self, key: bytes) -> asyncio.Future[Any] | None:
        """The write of contender key ``key`` by an Acquire still in flight here, if any (a withdrawal waits for it)."""
        return self._waiters.pending_write(key)

    async def acquire(self, name: str, lease_id: int, wait: float | None, lock_delay: int = 0, *,
                      value: bytes | None = None) -> AcquireResult:
        """Take lock ``name`` for lease ``lease_id``.

        Args:
            name: the lock name (validated here).
            lease_id: the contender's lease.
            wait: 0.0 to try once, seconds to wait at most, or None to wait
                until granted or cancelled.
            lock_delay: the lock-delay of this hold in whole seconds, 0 to 3600
                (:mod:`.lock_delay`): after an unclean end of it, the next grant waits.
                Any grant waits for the delay of an earlier hold that ended uncleanly;
                meanwhile a try-once Acquire answers acquired=False with no holder.
            value: the value of the contender's key (an election candidate's,
                :mod:`.election`); a key already there (the same lease asking
                again) gets it too. None: a lock's empty value, and a try-once
                Acquire leaves a key already there as it is.

        Returns:
            acquired=True with the fencing token; or, only when trying once,
            acquired=False with the current holder (nothing is left queued).
            Idempotent per (lease, name): a lease that already holds the lock
            gets the same token again.

        Raises:
            InvalidArgument: bad name, lease id or lock_delay; field ``mode``: the lease holds or waits for
                the lock as a reader (:func:`.waiters.mode_conflict`).
            LockTimeout: not granted within ``wait`` seconds (the waiter key is deleted).
            LeaseLost: the lease is gone, or the waiter key was deleted while waiting.
            ResourceExhausted: this coordinator's queue limit (TOO_MANY_WAITERS).
            DataLoss: tokens would go back (etcd restored from an older snapshot);
                a key written for this call is withdrawn.
            Unavailable: etcd unreachable.
        """
        validate_lock_name(name)
        validate_lease_id(lease_id)
        validate_lock_delay(lock_delay)
        if wait == 0:
            result, floor = await self._try_once(name, lease_id, lock_delay, value)
            if not result.acquired and result.holder is not None and result.holder.lease_id == lease_id:
                raise mode_conflict(name, lease_id)  # its own read hold (rwlock.py) holds it
            return await self._issued(name, lease_id, result, floor)
        with self._waiters.counted(name, lease_id):
            token, freed_at, floor = await self._waiters.wait(name, lease_id, wait, lock_delay=lock_delay,
                                                              value=value or b"")
        return await self._issued(name, lease_id, AcquireResult(True, token=token, freed_at=freed_at), floor)

    async def queue(self, name: str, lease_id: int, wait: float | None, *, places: int) -> AcquireResult:
        """Queue ``lease_id`` in lock ``name`` and wait until fewer than ``places`` keys are before its key.

        A semaphore's queue (:mod:`.semaphore`): its first ``places`` members
        may hold permits. Queued and waited for as a waiting :meth:`acquire`
        (counted in :attr:`waiting`, kept for :data:`REATTACH_SECONDS` when the
        call is cancelled, withdrawn on timeout); ``places`` = 1 is a lock's wait.

        Args:
            name: the lock name (validated here).
            lease_id: the contender's lease.
            wait: seconds to wait at most (0.0: only if among the first ``places`` at once),
                or None to wait until then or cancelled.
            places: how many keys may be at the front (>= 1).

        Returns:
            acquired=True with ``token`` the key's create revision (not a fencing
            token: the caller takes it no further than its own compares).

        Raises:
            As :meth:`acquire` (LockTimeout also for ``wait`` 0: the key is withdrawn).
        """
        validate_lock_name(name)
        validate_lease_id(lease_id)
        with self._waiters.counted(name, lease_id):
            token, freed_at, _ = await self._waiters.wait(name, lease_id, wait, places)
        return AcquireResult(True, token=token, freed_at=freed_at)

    async def _issued(self, name: str, lease_id: int, result: AcquireResult, floor: int) -> AcquireResult:
        """``result`` (create revisions of keys created or found under ``floor``) with fencing tokens; a grant
        refused by the token floor is withdrawn."""
        try:
            if result.acquired:
                return replace(result, token=self._tokens.token(result.token, floor))
            holder = result.holder
            return AcquireResult(False, holder=None if holder is None else Holder(
                holder.lease_id, self._tokens.token(holder.token, floor)))
        except FencepostError:
            if result.acquired:  # granted in etcd, but its token would not be safe: leave no hold behind
                await self._waiters.withdraw(self._keys.contender(name, lease_id), result.token)
            raise

    async def _try_once(self, name: str, lease_id: int, lock_delay: int,
                        value: bytes | None = None) -> tuple[AcquireResult, int]:
        """One grant Txn (:func:`.floor_guard.under_floor`): its result, and the floor of the keys it created or
        found."""
        key = self._keys.contender(name, lease_id)
        lock = self._keys.lock_prefix(name)

        def owned(owners: Any) -> AcquireResult:
            if not owners.kvs:
                return NOT_APPLIED  # type: ignore[no-any-return]  # only from the read-back: the lock is free
            owner = owners.kvs[0]
            if bytes(owner.key) == key:
                return AcquireResult(True, token=int(owner.create_revision))
            return AcquireResult(False, holder=self._contender(owner))

        def decide(resp: Any) -> AcquireResult | HeldBack:
            if resp.succeeded:
                return AcquireResult(True, token=int(resp.header.revision))
            owners, delays = resp.responses[0].response_range, resp.responses[1].response_range
            if not owners.kvs:  # free, but a lock-delay holds it back (lock_delay.py)
                return HeldBack(delays, int(resp.header.revision))
            return owned(owners)

        # A value to set (an election's): the failure branch also rewrites our key if it is there with another value.
        rewrite = [] if value is None else [etcdops.txn_op([etcdops.value_differs(key, value)],
                                                           [etcdops.put(key, value, lease_id=lease_id)])]

        async def grant() -> tuple[AcquireResult | HeldBack, int]:
            result, floor = await under_floor(self._tokens, lambda plan: self._etcd.lock_txn(plan, lock), TxnPlan(
                etcdops.txn([etcdops.is_free(lock), self._delays.is_clear(lock)],
                            [etcdops.put(key, value or b"", lease_id=lease_id)],
                            [etcdops.holder_of(lock), self._delays.read(lock), *rewrite]),
                decide, [etcdops.holder_of(lock)], lambda r: owned(r.responses[0].response_range),
                name=name, lease_id=lease_id))
            if lock_delay and isinstance(result, AcquireResult) and result.acquired:
                await self._delays.remember(lock, key, lease_id, result.token, lock_delay)
            return result, floor

        # The whole range compares to create revision 0 only when it is empty.
        # A cancelled call's Txn goes on (tracked: a Withdraw waits for it); a grant that reaches
        # nobody is withdrawn REATTACH_SECONDS later, unless the caller Acquires again meanwhile.
        step = self._waiters.writing(key, grant())
        try:
            result, floor = await asyncio.shield(step)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                done, _ = await step
                if isinstance(done, AcquireResult) and done.acquired:
                    self._waiters.withdraw_later(key, done.token, done.token)
            raise
        if isinstance(result, HeldBack):
            await self._delays.gate(lock, key, lease_id, 0, lock_delay, result.delays, result.revision, wait=False)
            return AcquireResult(False), floor
        return result, floor

    async def withdraw(self, name: str, lease_id: int) -> tuple[bool, bool, int]:
        """Delete the key of ``lease_id`` in lock ``name``, a hold or a queued wait, whatever its token.

        For a caller that gave up an Acquire whose outcome it does not know.
        Idempotent.

        Args:
            name: the lock name (validated here).
            lease_id: the contender's lease.

        Returns:
            (found: the lease had a key there, held: that key held the lock,
            revision: of the deletion, or of the read that found none).

        Raises:
            InvalidArgument: bad name or lease id.
            Unavailable: etcd unreachable.
        """
        validate_lock_name(name)
        validate_lease_id(lease_id)
        key = self._keys.contender(name, lease_id)
        lock = self._keys.lock_prefix(name)
        pending = self._waiters.pending_write(key)
        if pending is not None:  # an Acquire's write of this key still in flight here: let it land first
            await asyncio.wait({pending})

        def decide(resp: Any) -> tuple[bool, bool, int]:
            mine, owners = resp.responses[0].response_range, resp.responses[1].response_range
            found = bool(mine.kvs)  # held: no key that holds it back is before it (a reader's: no writer's)
            held = found and (not owners.kvs or owners.kvs[0].create_revision >= mine.kvs[0].create_revision)
            return found, held, int(resp.header.revision)

        def resolve(resp: Any) -> tuple[bool, bool, int]:
            if resp.responses[0].response_range.kvs:
                return NOT_APPLIED  # type: ignore[no-any-return]  # still there: send again
            return False, False, int(resp.header.revision)

        return await self._etcd.lock_txn(TxnPlan(
            etcdops.txn([], [etcdops.get(key, keys_only=True), etcdops.holder_of(*self._keys.ahead(name)),
                             etcdops.delete(key), self._delays.forget(lock, lease_id, None)]),
            decide, [etcdops.get(key, keys_only=True)], resolve, name=name, lease_id=lease_id), lock)

    async def close(self) -> None:
        """Stop the deferred withdrawals still waiting (their keys end with their leases)."""
        await self._waiters.close()

    async def release(self, name: str, lease_id: int, token: int, *, also: Sequence[Any] = ()) -> int:
        """Release the hold of ``name`` by ``lease_id`` granted with ``token``: one Txn.

        Args:
            name, lease_id, token: The hold.
            also: Ops added to the Txn's success branch, applied with the
                release only: the call's request record (:mod:`.requests`).

        Returns:
            The etcd revision of the release (when its answer was lost and
            the read-back found the key gone: the revision of that read).

        Raises:
            InvalidArgument: bad name, lease id or token.
            NotHolder: the lease holds no such lock (``current_token``: the holder's, when held).
            StaleTokenError: the lease holds the lock under a newer token (``current_token``).
            LeaseLost: the lease is gone.
            Unavailable: etcd unreachable.
        """
        validate_lock_name(name)
        validate_lease_id(lease_id)
        validate_token(token)
        # A token at or below the floor names no key (every key's token is above it): compare with a
        # create revision no key has (0 would match an absent key).
        created = self._tokens.revision(token)
        created = created if created > 0 else -1
        hold = Hold(name, lease_id, token)
        key = self._keys.contender(name, lease_id)
        lock = self._keys.lock_prefix(name)

        def decide(resp: Any) -> tuple[int, Any, Holder | None]:
            if resp.succeeded:
                return int(resp.header.revision), None, None
            mine, owners = (r.response_range.kvs for r in resp.responses)
            return 0, (mine[0] if mine else None), (self._holder(owners[0]) if owners else None)

        def released(resp: Any) -> tuple[int, Any, Holder | None]:
            kvs = resp.responses[0].response_range.kvs
            if kvs:
                return NOT_APPLIED  # type: ignore[no-any-return]  # a key is there: send again for the real answer
            return int(resp.header.revision), None, None

        revision, mine, holder = await self._etcd.lock_txn(TxnPlan(
            etcdops.txn([etcdops.is_owner(key, created)],
                        [etcdops.delete(key), self._delays.forget(lock, lease_id, created), *also],
                        [etcdops.get(key, keys_only=True), etcdops.holder_of(lock)]),
            decide, [etcdops.get(key, keys_only=True)], released, name=name, lease_id=lease_id), lock)
        if revision:
            return revision
        alive = True if mine is not None else await self.lease_alive(lease_id)
        raise release_refusal(hold, mine, holder, alive, floor=self._tokens.floor)

    async def describe(self, name: str) -> Description:
        """Report the holder (the holders: readers together), tokens, waiters and TTL left of lock ``name``.

        Raises:
            InvalidArgument: bad name.
            DataLoss: tokens would go back (etcd restored from an older snapshot).
            Unavailable: etcd unreachable.
        """
        validate_lock_name(name)
        lock = self._keys.lock_prefix(name)
        count = etcdops.RequestOp(request_range=etcdops.count(lock))
        resp = await self._etcd.read([etcdops.holder_of(lock, limit=DESCRIBE_WAITERS + 1), count,
                                      self._delays.read(lock)], name=name)
        self._tokens.check_serving()
        listed, counted, delays = (r.response_range for r in resp.responses)
        contenders = [self._holder(kv) for kv in listed.kvs]
        first = None
        if contenders:
            head = listed.kvs[0]
            parsed = self._keys.parse(bytes(head.key))
            first = (parsed[1] if parsed else 0, int(head.create_revision))
        delay = await self._delays.state(delays, first) if delays.kvs else DelayState(0, 0)
        if first is not None and not self._delays.settled(delays, first[0], first[1], 0):
            # A lock-delay holds the first contender back: nobody holds the lock, all of them wait.
            return Description(None, -1, 0, int(counted.count), contenders, int(resp.header.revision), delay)
        if not contenders:
            return Description(None, -1, 0, 0, [], int(resp.header.revision), delay)
        holders = holding(contenders)
        ttl_left, granted = -1, 0
        with contextlib.suppress(FencepostError):
            ttl_left, granted = await self._etcd.lease_ttl(contenders[0].lease_id)
        return Description(contenders[0], ttl_left, granted, int(counted.count) - holders, contenders[holders:],
                           int(resp.header.revision), holders=contenders[:holders])

    async def end_lock_delay(self, name: str) -> DelayState:
        """End the lock-delay of lock ``name`` (:meth:`.lock_delay.LockDelays.end`): the delay that was ended.

        Raises:
            InvalidArgument: bad name.
            Unavailable: etcd unreachable.
        """
        validate_lock_name(name)
        return await self._delays.end(self._keys.lock_prefix(name))

    async def hold_exists(self, hold: Hold) -> bool:
        """Whether ``hold.lease_id`` still holds ``hold.name`` under ``hold.token`` (one read).

        Raises:
            Unavailable: etcd unreachable.
        """
        key = self._keys.contender(hold.name, hold.lease_id)
        resp = await self._etcd.range(etcdops.get(key, keys_only=True).request_range, name=hold.name,
                                      lease_id=hold.lease_id)
        return bool(resp.kvs) and int(resp.kvs[0].create_revision) == self._tokens.revision(hold.token)

    async def lease_alive(self, lease_id: int) -> bool:
        """Whether lease ``lease_id`` still exists (one LeaseTimeToLive).

        Raises:
            Unavailable: etcd unreachable.
        """
        ttl, _ = await self._etcd.lease_ttl(lease_id)
        return ttl > 0

    def _contender(self, kv: Any) -> Holder:
        """The contender of key ``kv`` with its create revision (not yet a token)."""
        parsed = self._keys.parse(bytes(kv.key))
        return Holder(parsed[1] if parsed else 0, int(kv.create_revision), self._keys.is_reader(bytes(kv.key)))

    def _holder(self, kv: Any) -> Holder:
        """The contender of key ``kv`` with its fencing token, to report."""
        contender = self._contender(kv)
        return replace(contender, token=self._tokens.reported(contender.token))
