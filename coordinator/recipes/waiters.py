"""Waiting in a lock's queue: a contender key written once, then a wait for the keys before it to go.

After etcd's ``concurrency.Mutex`` (``waitDeletes``): a waiting contender
puts its key (attached to its lease) in the lock's key range, then waits for
the deletion of the key just before its own (no thundering herd); it is
first, so the holder, once no key with a lower create revision is left. A
semaphore's queue (:mod:`.semaphore`) waits the same way until fewer than N
keys are before its own.

What a wait leaves behind is bounded:

- at most ``max_waiters`` calls wait at once on this coordinator (then
  RESOURCE_EXHAUSTED / TOO_MANY_WAITERS);
- a wait that times out deletes its key (shielded from cancellation);
- a wait whose call was cancelled (the caller gave up, or its connection
  broke) keeps its key for :data:`REATTACH_SECONDS`: a caller whose
  connection broke Acquires again within that time, here or on another
  replica, and keeps its key, its revision and so its place in the queue;
  otherwise the key is deleted then (:meth:`Waiters.withdraw_later`), unless
  an Acquire wrote it again meanwhile (its mod revision changed);
- the write of a cancelled call goes on, tracked (:meth:`Waiters.writing`),
  so that a Withdraw of the same key waits for it instead of finding nothing
  and leaving a late key behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Iterator
from typing import Any, TypeVar

from fencepost.client.errors import (FencepostError, InvalidArgument, LeaseLost, LockTimeout, ResourceExhausted,
                                     Unavailable)
from fencepost.client.v1 import etcdops, kinds
from fencepost.client.v1.details import ErrorReason, reason_name
from fencepost.client.v1.keys import Keys
from fencepost.client.v1.retry import ETCD_BACKOFF

from ..etcd import NOT_APPLIED, EtcdClient, TxnPlan, unbounded
from ..telemetry.metrics import NO_METRICS, LockMetrics
from .floor_guard import under_floor
from .lock_delay import LockDelays
from .tokens import TokenFloor
from .watch import DeleteWatcher

__all__ = ["REATTACH_SECONDS", "Waiters", "finish_even_if_cancelled", "lock_of", "mode_conflict", "wait_any_deleted"]

_log = logging.getLogger(__name__)
T = TypeVar("T")

#: Seconds the key of a waiting Acquire that ended without an answer (the call
#: was cancelled: the caller gave up, or its connection broke) is kept before
#: it is deleted. A caller whose connection broke Acquires again within this
#: time, here or on another replica, and keeps its key, its revision and so its
#: place in the queue; a caller that gave up withdraws its key itself at once
#: (the Withdraw call). A grant cannot wait for this: the key of a call that
#: ended after its grant is the caller's to release.
REATTACH_SECONDS = 2.0


class Waiters:
    """The contenders waiting here, their keys' writes, and the deferred withdrawals of abandoned keys.

    Args:
        etcd: the coordinator's etcd layer.
        keys: the key layout.
        watcher: the running deletion watcher for the same prefix.
        delays: the lock-delays (a grant waits for one, a withdrawal forgets one).
        tokens: the token floor a key is created under (:func:`.floor_guard.under_floor`).
        max_waiters: most calls that may wait at once on this coordinator.
        metrics: follows the number of those (``fencepost_waiting_acquires``).
        reattach_seconds: how long the key of a cancelled waiting call is kept for its caller to come back.
    """

    def __init__(self, etcd: EtcdClient, keys: Keys, watcher: DeleteWatcher, delays: LockDelays, tokens: TokenFloor, *,
                 max_waiters: int = 10_000, metrics: LockMetrics = NO_METRICS,
                 reattach_seconds: float = REATTACH_SECONDS) -> None:
        self._etcd = etcd
        self._keys = keys
        self._watcher = watcher
        self._delays = delays
        self._tokens = tokens
        self._metrics = metrics
        self._max_waiters = max_waiters
        self.reattach_seconds = reattach_seconds
        self._waiting = 0
        self._later: set[asyncio.Task[None]] = set()
        self._writing: dict[bytes, asyncio.Future[Any]] = {}  # key -> an Acquire's write in flight

    @property
    def waiting(self) -> int:
        """The calls with a wait in progress on this coordinator."""
        return self._waiting

    def pending_write(self, key: bytes) -> asyncio.Future[Any] | None:
        """The write of contender key ``key`` by an Acquire still in flight here, if any (a withdrawal waits for it)."""
        return self._writing.get(key)

    @contextlib.contextmanager
    def counted(self, name: str, lease_id: int) -> Iterator[None]:
        """One more call waits here while the block runs.

        Raises:
            ResourceExhausted: TOO_MANY_WAITERS: ``max_waiters`` calls wait already.
        """
        if self._waiting >= self._max_waiters:
            raise ResourceExhausted(f"more than {self._max_waiters} waiting acquires", name=name, lease_id=lease_id,
                                    reason=reason_name(ErrorReason.TOO_MANY_WAITERS))
        self._waiting += 1
        self._metrics.waiting_acquires(+1)
        try:
            yield
        finally:
            self._waiting -= 1
            self._metrics.waiting_acquires(-1)

    async def wait(self, name: str, lease_id: int, wait: float | None, places: int = 1, value: bytes = b"",
                   lock_delay: int = 0, ahead: tuple[bytes, bytes] | None = None) -> tuple[int, float | None, int]:
        """Queue ``lease_id``'s key in lock ``name`` and wait until fewer than ``places`` keys are before it.

        A key already there (this lease queued before, and its call ended: a
        broken connection, a coordinator that stopped) is kept with its create
        revision, its place in the queue, and written again: the new mod
        revision tells a pending deferred withdrawal that it was reattached.

        Args:
            name: the lock name (checked by the caller).
            lease_id: the contender's lease.
            wait: seconds to wait at most, or None to wait until granted or cancelled.
            places: how many keys may be at the front (1: a lock's holder).
            value: the key's value (an election candidate's).
            lock_delay: this hold's lock-delay in seconds (a grant also waits out an earlier hold's).
            ahead: the key range [start, end) whose earlier keys hold it back (a reader's: its lock's writers,
                :mod:`.rwlock`); None: the lock's whole range.

        Returns:
            (the key's create revision, the monotonic clock reading when the deletion that let it through
            was seen, or None when it was through at once or the watch could not tell, the token floor the
            key was created under: :func:`.floor_guard.under_floor`).

        Raises:
            LockTimeout: not through within ``wait`` seconds (the key is deleted).
            LeaseLost: the lease is gone, or the key was deleted while waiting.
            Unavailable: etcd unreachable while queueing.
        """
        key = self._keys.contender(name, lease_id)
        lock = self._keys.lock_prefix(name)
        start, end = ahead or (lock, None)

        # (our key's create revision, its mod revision, the first `places` keys, the lock-delay range)
        def queued(mine: Any, owners: Any, delays: Any) -> tuple[int, int, Any, Any]:
            if not mine.kvs:
                return NOT_APPLIED  # type: ignore[no-any-return]  # only from the read-back
            return int(mine.kvs[0].create_revision), int(mine.kvs[0].mod_revision), owners.kvs, delays

        def decide(resp: Any) -> tuple[int, int, Any, Any]:
            if resp.succeeded:
                owners, delays = resp.responses[1].response_range, resp.responses[2].response_range
                revision = int(resp.header.revision)
                return revision, revision, owners.kvs, delays
            _, mine, owners, delays = (r.response_range if r.WhichOneof("response") == "response_range" else None
                                       for r in resp.responses)
            if not mine.kvs:  # deleted between the compare and the read: cannot be, Txn is atomic
                raise LeaseLost("the waiter key vanished", name=name, lease_id=lease_id)
            return queued(mine, owners, delays)

        def resolve(resp: Any) -> tuple[int, int, Any, Any]:
            # Read back after a lost answer: our key is there, created or touched by this call or before it.
            return queued(*(r.response_range for r in resp.responses))

        reads = [etcdops.get(key, keys_only=True), etcdops.holder_of(start, limit=places, range_end=end),
                 self._delays.read(lock)]
        step = self.writing(key, under_floor(self._tokens, lambda plan: self._etcd.lock_txn(plan, lock), TxnPlan(
            etcdops.txn([etcdops.is_absent(key)], [etcdops.put(key, value, lease_id=lease_id), *reads[1:]],
                        [etcdops.put(key, value, lease_id=lease_id), *reads]),
            decide, reads, resolve, name=name, lease_id=lease_id)))
        try:
            (my_rev, mod_rev, firsts, delays), floor = await asyncio.shield(step)
        except asyncio.CancelledError:
            # Cancelled while queueing: finish the write, then withdraw the key unless it is reattached.
            with contextlib.suppress(Exception):
                (my_rev, mod_rev, _, _), _ = await step
                self.withdraw_later(key, my_rev, mod_rev)
            raise
        if self.own_ahead(firsts, key, lease_id):
            await self.withdraw(key, my_rev)
            raise mode_conflict(name, lease_id)
        if sum(int(kv.create_revision) < my_rev for kv in firsts) < places and self._delays.settled(
                delays, lease_id, my_rev, lock_delay):
            return my_rev, None, floor
        try:
            async with asyncio.timeout(wait):
                return my_rev, await self._wait_turn(name, lease_id, key, lock, my_rev, places, lock_delay,
                                                     ahead), floor
        except TimeoutError as exc:
            await self.withdraw(key, my_rev)
            raise LockTimeout(f"lock {name!r} not granted within {wait:.3f} s", name=name, lease_id=lease_id) from exc
        except asyncio.CancelledError:
            # The call ended without an answer: the caller gave up (its client then withdraws), or its
            # connection broke (it will Acquire again, here or on another replica, and keep its place).
            self.withdraw_later(key, my_rev, mod_rev)
            raise
        except BaseException:
            await self.withdraw(key, my_rev)
            raise

    def writing(self, key: bytes, write: Awaitable[T]) -> asyncio.Future[T]:
        """Run an Acquire's write of ``key`` as a task a Withdraw of the same key waits for.

        The write of a cancelled Acquire goes on; without this, the caller's
        Withdraw could reach etcd first, find nothing, and the late write
        would then leave a key (a grant) nobody knows of.
        """
        step = asyncio.ensure_future(write)
        self._writing[key] = step

        def done(finished: asyncio.Future[T]) -> None:
            if self._writing.get(key) is finished:
                del self._writing[key]

        step.add_done_callback(done)
        return step

    def withdraw_later(self, key: bytes, my_rev: int, mod_rev: int) -> asyncio.Task[None]:
        """Delete a waiter key after :attr:`reattach_seconds` unless an Acquire wrote it again meanwhile.

        Returns:
            The deferred withdrawal (:meth:`close` stops it; its failure is logged, not raised).
        """
        async def later() -> None:
            await asyncio.sleep(self.reattach_seconds)
            plan = TxnPlan(etcdops.txn([etcdops.is_owner(key, my_rev), etcdops.is_unchanged(key, mod_rev)],
                                       [etcdops.delete(key), self.forget(key, my_rev)]),
                           lambda resp: bool(resp.succeeded), [], lambda resp: True)
            try:
                if await self._etcd.lock_txn(plan, lock_of(key)):
                    _log.debug("withdrew %s: its Acquire ended without an answer", self._named(key))
                else:
                    _log.debug("kept %s: written again by an Acquire since (or gone)", self._named(key))
            except FencepostError as exc:
                _log.warning("could not withdraw %s: %s", self._named(key), exc)

        with unbounded():
            task = asyncio.ensure_future(later())
        self._later.add(task)
        task.add_done_callback(self._later.discard)
        return task

    async def withdraw(self, key: bytes, my_rev: int) -> None:
        """Delete a waiter key (if it is still the one created at ``my_rev``), shielded from cancellation.

        A failure is logged: the key then stays until its lease ends.
        """
        def gone(resp: Any) -> bool:
            kvs = resp.responses[0].response_range.kvs
            return NOT_APPLIED if kvs and int(kvs[0].create_revision) == my_rev else True  # type: ignore[no-any-return]

        plan = TxnPlan(etcdops.txn([etcdops.is_owner(key, my_rev)], [etcdops.delete(key), self.forget(key, my_rev)]),
                       lambda resp: True, [etcdops.get(key, keys_only=True)], gone)
        try:
            with unbounded():  # not bounded by the deadline of the call that ends
                await finish_even_if_cancelled(self._etcd.lock_txn(plan, lock_of(key)))
        except FencepostError as exc:
            # The key stays until its lease ends; log it so an operator can see it.
            _log.warning("could not withdraw %s: %s", self._named(key), exc)

    def own_ahead(self, kvs: Any, key: bytes, lease_id: int) -> bool:
        """Whether a key of ``kvs`` (keys before ``key`` in its queue) is another key of ``lease_id``: its hold
        or wait of the same lock in the other mode of a read-write lock (:mod:`.rwlock`), which ``key`` would
        wait for until its timeout."""
        return any(bytes(kv.key) != key and (parsed := self._keys.parse(bytes(kv.key))) is not None
                   and parsed[1] == lease_id for kv in kvs)

    def _named(self, key: bytes) -> str:
        """A contender key as the log names it: its lock name as text and its lease, never a bytes repr."""
        parsed = self._keys.parse(key)
        if parsed is None:
            return f"key {key.decode('utf-8', 'backslashreplace')}"
        return f"the waiter key of lease {parsed[1]:#x} for lock {parsed[0]!r}"

    def forget(self, key: bytes, my_rev: int) -> Any:
        """The op that deletes the lock-delay record of the hold of contender key ``key`` created at ``my_rev``."""
        parsed = self._keys.parse(key)
        return self._delays.forget(lock_of(key), parsed[1] if parsed else 0, my_rev)

    async def close(self) -> None:
        """Stop the deferred withdrawals still waiting (their keys end with their leases)."""
        for task in list(self._later):
            task.cancel()
        for task in list(self._later):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def wait_first(self, name: str, lease_id: int, key: bytes, my_rev: int) -> float | None:
        """Wait until contender ``key`` of lock ``name``, created at ``my_rev``, is the first of its queue
        (and any lock-delay has passed): a multi-lock's wait in each of its locks (:mod:`.multilock`).

        Returns:
            As :meth:`_wait_turn`: when the deletion that let it through was seen, or None.

        Raises:
            LeaseLost: the key was deleted while waiting.
        """
        return await self._wait_turn(name, lease_id, key, lock_of(key), my_rev)

    async def _wait_turn(self, name: str, lease_id: int, key: bytes, lock: bytes, my_rev: int,
                         places: int = 1, lock_delay: int = 0, ahead: tuple[bytes, bytes] | None = None
                         ) -> float | None:
        """Wait until ``key`` (created at ``my_rev``) is the lowest in its range (fewer than ``places`` before
        it), and any lock-delay has passed. With ``ahead``, only the keys of that range count (a reader's wait).

        With ``places`` > 1 (a semaphore's queue) it waits for the deletion of
        any of the ``places`` keys just before its own: a deletion further
        ahead leaves at least ``places`` before it and does not change which
        keys those nearest are (no key is ever created before an existing one).

        Returns:
            The monotonic clock reading when the deletion of the last key
            waited for was seen: the key before ours, deleted when nothing was
            before it, so the holder's (the hand-off's start). None when the
            wait did not end on a deletion event (the watch could not tell),
            or a lock-delay held the grant back.
        """
        delays = ETCD_BACKOFF.delays()
        freed_at: float | None = None
        start, end = ahead or (lock, None)
        while True:
            try:
                resp = await self._etcd.read([etcdops.last_before(start, my_rev, limit=places, range_end=end),
                                              self._delays.read(lock)],
                                             compare=[etcdops.is_owner(key, my_rev)], name=name, lease_id=lease_id)
                if resp.succeeded and len(resp.responses[0].response_range.kvs) < places:
                    # First (among the first `places`) at this revision: granted, unless a lock-delay runs
                    # (then read again after it).
                    if await self._delays.gate(lock, key, lease_id, my_rev, lock_delay,
                                               resp.responses[1].response_range, int(resp.header.revision)):
                        return freed_at
                    freed_at = None
                    continue
            except Unavailable:
                await asyncio.sleep(next(delays))  # etcd blip: keep our place, retry within the wait
                continue
            delays = ETCD_BACKOFF.delays()
            if not resp.succeeded:
                # Our key is gone: the lease expired or was revoked, or someone deleted it.
                raise LeaseLost(f"lease {lease_id:#x} lost its place in the queue of {name!r}",
                                name=name, lease_id=lease_id)
            predecessors = resp.responses[0].response_range.kvs
            if self.own_ahead(predecessors, key, lease_id):
                raise mode_conflict(name, lease_id)  # the caller withdraws our key
            seen = await wait_any_deleted(self._watcher, [bytes(kv.key) for kv in predecessors],
                                          int(resp.header.revision))
            freed_at = time.monotonic() if seen else None


async def wait_any_deleted(watcher: DeleteWatcher, keys: list[bytes], revision: int) -> bool:
    """Return once any of ``keys``, seen at ``revision``, may have been deleted (:meth:`DeleteWatcher.wait_deleted`).

    Returns:
        True when it returned on a deletion event itself.
    """
    if len(keys) == 1:
        return await watcher.wait_deleted(keys[0], revision)
    waits = [asyncio.ensure_future(watcher.wait_deleted(key, revision)) for key in keys]
    try:
        done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        return any(not w.cancelled() and w.exception() is None and w.result() for w in done)
    finally:
        for w in waits:
            w.cancel()


def mode_conflict(name: str, lease_id: int) -> InvalidArgument:
    """The refusal of a contender whose own lease holds or waits for the same lock in the other mode.

    A read-write lock has no upgrade or downgrade (etcd's recipe has none): the second hold would wait for
    the first, which its own lease keeps, until its timeout. INVALID_ARGUMENT naming field ``mode``.
    """
    public = kinds.public_hold(name).name
    return InvalidArgument(f"lease {lease_id:#x} already holds or waits for lock {public!r} in the other mode "
                           f"(read or write): no upgrade or downgrade; release that hold first", field="mode",
                           name=public, lease_id=lease_id)


def lock_of(key: bytes) -> bytes:
    """The lock key prefix of a contender key (``<prefix><encoded name>/<lease id>``: no "/" after the name's)."""
    return key[:key.rindex(b"/") + 1]


async def finish_even_if_cancelled(step: Awaitable[T]) -> T:
    """Await ``step`` to the end even if the caller is cancelled meanwhile.

    A write to etcd that the caller abandons half-way could leave a waiter key
    behind that nobody knows of; finishing it lets the caller clean up. The
    cancellation is re-raised once the step is done.
    """
    task = asyncio.ensure_future(step)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await task
        raise
