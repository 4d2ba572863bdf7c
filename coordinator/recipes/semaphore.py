"""Semaphores with a fencing token per permit slot, built from locks: acquire, release, withdraw, describe.

A semaphore ``S`` of N permits (:mod:`fencepost.client.v1.kinds`) is

- a **queue**: the lock ``"\\x01q/" + S``; each contender puts its key there
  (:meth:`.lock.LockManager.queue`, exactly as a waiting Acquire queues, with
  its reattach-after-cancel and withdraw-on-timeout), first come, first
  served. A member with fewer than N keys before its own is *eligible*; it
  waits for the deletion of any of the N keys just before it (holders leave
  in any order);
- one **slot lock** per permit ``i`` in 0..N-1, ``"\\x01s/" + S + "\\x02" + i``:
  an eligible member takes a free one, try once, in one Txn that also checks
  that its queue key is still its own (create revision) and unchanged since
  it read the slots (mod revision; the Txn writes the queue key again, so a
  second call of the same lease, or a reattaching retry, cannot take a
  second slot). The permit's fencing token is the slot key's create
  revision plus the token floor: strictly larger for each grant of that slot;
- a **permits record**, ``<lock range of "\\x01p/" + S>permits`` (no lease):
  N, written at first use; another N is refused (PERMITS_MISMATCH).

Invariant: every slot holder's queue key is among the first N of the queue.
A slot key is only created while its lease's queue key exists and is
eligible (no key is ever created before an existing one, so an eligible
member stays eligible), and the two keys go together: ReleasePermit and a
withdrawal delete both in one Txn, and both are on the same lease, so its
expiry or revocation deletes both at one revision. Hence the at most N
eligible members hold at most N slots, and an eligible member always finds a
free slot; a lost race for one just picks another. (An operator deleting
only a queue key breaks this: a member that finds no free slot then waits
for a slot key's deletion.)

Idempotent per (lease, S): a lease that holds a permit is eligible at once
(invariant) and finds its own slot key: the same slot and token again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fencepost.client.errors import DataLoss, FencepostError, InvalidArgument, LeaseLost, LockTimeout, PermitsMismatch
from fencepost.client.v1 import etcdops, kinds
from fencepost.client.v1.keys import MAX_PERMITS, Hold, Keys, prefix_end

from ..etcd import NOT_APPLIED, TxnPlan, unbounded
from .floor_guard import read_under_floor, under_floor
from .lock import Holder, LockManager, release_refusal
from .validate import validate_lease_id, validate_name, validate_token
from .waiters import finish_even_if_cancelled, wait_any_deleted

__all__ = ["Permit", "PermitResult", "SemaphoreDescription", "Semaphores", "validate_permits", "validate_slot"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Permit:
    """One granted permit: its lease, slot and fencing token."""

    lease_id: int
    slot: int
    token: int


@dataclass(frozen=True)
class PermitResult:
    """The outcome of :meth:`Semaphores.acquire`: granted (slot, token), or (try once only) the holders."""

    acquired: bool
    slot: int = 0
    token: int = 0
    holders: list[Permit] = field(default_factory=list)
    freed_at: float | None = None


@dataclass(frozen=True)
class SemaphoreDescription:
    """A snapshot of one semaphore at one etcd revision."""

    permits: int
    holders: list[Permit]
    waiter_count: int
    revision: int


def validate_permits(permits: int) -> int:
    """Check a semaphore's number of permits (1 to MAX_PERMITS).

    Raises:
        InvalidArgument: field ``permits``.
    """
    if not 1 <= permits <= MAX_PERMITS:
        raise InvalidArgument(f"permits is {permits}; must be 1 to {MAX_PERMITS}", field="permits")
    return permits


def validate_slot(slot: int) -> int:
    """Check a permit slot (0 to MAX_PERMITS - 1).

    Raises:
        InvalidArgument: field ``slot``.
    """
    if not 0 <= slot < MAX_PERMITS:
        raise InvalidArgument(f"slot is {slot}; must be 0 to {MAX_PERMITS - 1}", field="slot")
    return slot


def _public(exc: FencepostError, name: str) -> FencepostError:
    """``exc`` (raised for an internal lock name) naming the semaphore instead."""
    exc.name = name
    return exc


class Semaphores:
    """Acquire, release, withdraw and describe semaphore permits stored in etcd (see the module docstring).

    Args:
        locks: the lock algorithm (its queue, etcd layer, watcher and token floor).
        keys: the key layout.
    """

    def __init__(self, locks: LockManager, keys: Keys) -> None:
        self._locks = locks
        self._etcd = locks.etcd
        self._keys = keys
        self._later: set[asyncio.Task[None]] = set()
        self._claiming: dict[bytes, asyncio.Future[Any]] = {}  # queue key -> a slot claim in flight here

    # ------------------------------------------------------------------ keys

    def _queue_key(self, name: str, lease_id: int) -> bytes:
        return self._keys.contender(kinds.semaphore_queue(name), lease_id)

    def _slot_key(self, name: str, slot: int, lease_id: int) -> bytes:
        return self._keys.contender(kinds.semaphore_slot(name, slot), lease_id)

    def _slots_range(self, name: str) -> etcdops.RequestOp:
        """A read op of every slot key of ``name`` (and no other semaphore's: names have no control characters)."""
        start = self._keys.name_prefix(kinds.semaphore_slots(name))
        return etcdops.RequestOp(request_range=etcdops.RangeRequest(key=start, range_end=prefix_end(start),
                                                                    keys_only=True))

    def _permit_of(self, kv: Any) -> Permit | None:
        """The (lease, slot, create revision) of a slot key, None if it is not one."""
        parsed = self._keys.parse(bytes(kv.key))
        if parsed is None:
            return None
        hold = kinds.public_hold(parsed[0])
        if hold.kind != kinds.HoldKind.HOLD_KIND_SEMAPHORE or hold.slot < 0:
            return None
        return Permit(parsed[1], hold.slot, int(kv.create_revision))

    def _record_key(self, name: str) -> bytes:
        return self._keys.lock_prefix(kinds.semaphore_permits_record(name)) + b"permits"

    # ------------------------------------------------------------------ acquire

    async def acquire(self, name: str, lease_id: int, permits: int, wait: float | None) -> PermitResult:
        """Take a permit of semaphore ``name`` (of ``permits`` permits) for lease ``lease_id``.

        Args:
            name: the semaphore's public name (validated here).
            lease_id: the contender's lease.
            permits: the semaphore's number of permits (1 to 1000), fixed at its first use.
            wait: 0.0 to try once, seconds to wait at most, or None to wait until granted or cancelled.

        Returns:
            acquired=True with the slot and the permit's fencing token; or, only
            when trying once, acquired=False with the holders (nothing is left
            queued). Idempotent per (lease, name).

        Raises:
            InvalidArgument: bad name, lease id or permits.
            PermitsMismatch: the semaphore has another number of permits (``permits``: its own).
            LockTimeout: not granted within ``wait`` seconds (the queue key is deleted).
            LeaseLost: the lease is gone, or its queue key was deleted while waiting.
            ResourceExhausted: this coordinator's queue limit (TOO_MANY_WAITERS).
            DataLoss: tokens would go back; the permit written for this call is withdrawn.
            Unavailable: etcd unreachable.
        """
        validate_name(name)
        validate_lease_id(lease_id)
        validate_permits(permits)
        await self._check_permits(name, permits)
        try:
            queued = await self._locks.queue(kinds.semaphore_queue(name), lease_id, wait, places=permits)
        except LockTimeout as exc:
            if wait == 0:
                return PermitResult(False, holders=(await self.describe(name)).holders)
            raise LockTimeout(f"semaphore {name!r} granted no permit within {wait:.3f} s", name=name,
                              lease_id=lease_id) from exc
        except FencepostError as exc:
            raise _public(exc, name) from None
        step = asyncio.ensure_future(self._claim(name, lease_id, permits, queued.token))
        qkey = self._queue_key(name, lease_id)
        self._claiming[qkey] = step
        step.add_done_callback(lambda done: self._claiming.pop(qkey, None) if self._claiming.get(qkey) is done
                               else None)
        try:
            slot, created, _, floor = await asyncio.shield(step)
        except asyncio.CancelledError:
            # The claim goes on; a permit that reaches nobody is withdrawn later unless the caller retries.
            with contextlib.suppress(Exception):
                _, _, queue_mod, _ = await step
                self.withdraw_later(name, lease_id, queue_mod)
            raise
        except DataLoss:  # tokens would go back (the claim found the coordinator refusing): leave no queue key
            await finish_even_if_cancelled(self.withdraw(name, lease_id))
            raise
        try:
            token = self._locks.tokens.token(created, floor)
        except FencepostError:
            await finish_even_if_cancelled(self.withdraw(name, lease_id))
            raise
        return PermitResult(True, slot, token, freed_at=queued.freed_at)

    async def _check_permits(self, name: str, permits: int) -> None:
        """Write the permits record at first use, else compare with it (one Txn).

        Raises:
            PermitsMismatch: the record holds another number.
        """
        record = self._record_key(name)
        wanted = str(permits).encode()

        def decide(resp: Any) -> int:
            if resp.succeeded:
                return permits
            kvs = resp.responses[0].response_range.kvs
            return int(kvs[0].value) if kvs else permits

        def resolve(resp: Any) -> int:
            kvs = resp.responses[0].response_range.kvs
            return int(kvs[0].value) if kvs else NOT_APPLIED

        existing = await self._etcd.txn(TxnPlan(
            etcdops.txn([etcdops.is_absent(record)], [etcdops.put(record, wanted)], [etcdops.get(record)]),
            decide, [etcdops.get(record)], resolve, name=name))
        if existing != permits:
            raise PermitsMismatch(f"semaphore {name!r} has {existing} permits, not {permits} (fixed at its first use)",
                                  name=name, permits=existing)

    async def _claim(self, name: str, lease_id: int, permits: int, my_rev: int) -> tuple[int, int, int, int]:
        """Take a free slot for the eligible queue key of ``lease_id`` (created at ``my_rev``), or find its own.

        Returns:
            (slot, create revision of the slot key, mod revision of the queue key after the claim, the token
            floor the slot key was created or found under: :mod:`.floor_guard`).

        Raises:
            LeaseLost: the queue key is gone (the lease ended, or it was withdrawn).
            Unavailable: etcd unreachable.
        """
        qkey = self._queue_key(name, lease_id)
        tokens = self._locks.tokens
        while True:
            resp, floor = await read_under_floor(tokens, self._etcd, [etcdops.get(qkey, keys_only=True),
                                                                      self._slots_range(name)],
                                                 name=name, lease_id=lease_id)
            mine, slots = (r.response_range.kvs for r in resp.responses)
            if not mine or int(mine[0].create_revision) != my_rev:
                raise LeaseLost(f"lease {lease_id:#x} lost its place in the queue of semaphore {name!r}",
                                name=name, lease_id=lease_id)
            taken: set[int] = set()
            for kv in slots:
                permit = self._permit_of(kv)
                if permit is None:
                    continue
                if permit.lease_id == lease_id:
                    return permit.slot, permit.token, int(mine[0].mod_revision), floor  # idempotent: its permit
                taken.add(permit.slot)
            free = [i for i in range(permits) if i not in taken]
            if not free:  # only when the invariant was broken from outside (see the module docstring)
                _log.warning("semaphore %r: eligible lease %#x finds no free slot; waiting for one", name, lease_id)
                await wait_any_deleted(self._locks.watcher, [bytes(kv.key) for kv in slots],
                                       int(resp.header.revision))
                continue
            slot = free[0]
            skey = self._slot_key(name, slot, lease_id)

            def decide(r: Any, slot: int = slot) -> tuple[int, int, int] | None:
                revision = int(r.header.revision)  # of both puts: the slot key's creation, the queue key's mod
                return (slot, revision, revision) if r.succeeded else None

            def resolve(r: Any, slot: int = slot) -> tuple[int, int, int]:
                kvs = r.responses[0].response_range.kvs
                return (slot, int(kvs[0].create_revision), int(kvs[0].create_revision)) if kvs else NOT_APPLIED

            claimed, floor = await under_floor(tokens, self._etcd.txn, TxnPlan(
                etcdops.txn([etcdops.is_owner(qkey, my_rev), etcdops.is_unchanged(qkey, int(mine[0].mod_revision)),
                             etcdops.is_free(self._keys.lock_prefix(kinds.semaphore_slot(name, slot)))],
                            [etcdops.put(skey, lease_id=lease_id), etcdops.put(qkey, lease_id=lease_id)]),
                decide, [etcdops.get(skey, keys_only=True)], resolve, name=name, lease_id=lease_id))
            if claimed is not None:
                return (*claimed, floor)
            # Lost a race for that slot, or the queue key changed (another call of this lease): read again.

    def withdraw_later(self, name: str, lease_id: int, queue_mod: int) -> asyncio.Task[None]:
        """Withdraw the permit of a call that was cancelled after its claim, after the reattach time, unless a
        retry touched the queue key meanwhile (its mod revision is no longer ``queue_mod``).

        Returns:
            The deferred withdrawal (:meth:`close` stops it; its failure is logged, not raised).
        """
        async def later() -> None:
            await asyncio.sleep(self._locks.reattach_seconds)
            await self.withdraw(name, lease_id, unless_changed_since=queue_mod)

        async def logged() -> None:
            try:
                await later()
            except FencepostError as exc:
                _log.warning("could not withdraw the permit of %r of lease %#x: %s", name, lease_id, exc)

        with unbounded():
            task = asyncio.ensure_future(logged())
        self._later.add(task)
        task.add_done_callback(self._later.discard)
        return task

    async def close(self) -> None:
        """Stop the deferred withdrawals still waiting (their keys end with their leases)."""
        for task in list(self._later):
            task.cancel()
        for task in list(self._later):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # ------------------------------------------------------------------ release

    async def release(self, name: str, lease_id: int, slot: int, token: int, *, also: Sequence[Any] = ()) -> int:
        """Release the permit (``slot``, ``token``) of ``lease_id``: its slot key and queue key in one Txn.

        ``also``: more ops for that Txn's success branch (a request record, :mod:`.requests`).

        Returns:
            The etcd revision of the release.

        Raises:
            InvalidArgument: bad name, lease id, slot or token; when refused, a slot not below the semaphore's
                number of permits (its permits record's; field ``slot``).
            NotHolder: the lease holds no such permit (``current_token``: the slot holder's, when held).
            StaleTokenError: the lease holds that slot under a newer token.
            LeaseLost: the lease is gone.
            Unavailable: etcd unreachable.
        """
        validate_name(name)
        validate_lease_id(lease_id)
        validate_slot(slot)
        validate_token(token)
        tokens = self._locks.tokens
        created = tokens.revision(token)
        created = created if created > 0 else -1  # at or below the floor: no key has it
        skey = self._slot_key(name, slot, lease_id)
        slot_lock = self._keys.lock_prefix(kinds.semaphore_slot(name, slot))

        def decide(resp: Any) -> tuple[int, Any, Holder | None]:
            if resp.succeeded:
                return int(resp.header.revision), None, None
            mine, owners, record = (r.response_range.kvs for r in resp.responses)
            if record and slot >= int(record[0].value):  # no such permit: the caller's slot is wrong
                raise InvalidArgument(f"slot is {slot}; semaphore {name!r} has {int(record[0].value)} permits "
                                      f"(slots 0 to {int(record[0].value) - 1})", name=name, field="slot")
            holder = None
            if owners:
                parsed = self._keys.parse(bytes(owners[0].key))
                holder = Holder(parsed[1] if parsed else 0, tokens.reported(int(owners[0].create_revision)))
            return 0, (mine[0] if mine else None), holder

        def released(resp: Any) -> tuple[int, Any, Holder | None]:
            if resp.responses[0].response_range.kvs:
                return NOT_APPLIED  # type: ignore[no-any-return]  # still there: send again for the real answer
            return int(resp.header.revision), None, None

        revision, mine, holder = await self._etcd.txn(TxnPlan(
            etcdops.txn([etcdops.is_owner(skey, created)],
                        [etcdops.delete(skey), etcdops.delete(self._queue_key(name, lease_id)), *also],
                        [etcdops.get(skey, keys_only=True), etcdops.holder_of(slot_lock),
                         etcdops.get(self._record_key(name))]),
            decide, [etcdops.get(skey, keys_only=True)], released, name=name, lease_id=lease_id))
        if revision:
            return revision
        alive = True if mine is not None else await self._locks.lease_alive(lease_id)
        raise release_refusal(Hold(name, lease_id, token), mine, holder, alive, floor=tokens.floor)

    async def withdraw(self, name: str, lease_id: int, *, unless_changed_since: int | None = None
                       ) -> tuple[bool, bool, int]:
        """Delete whatever ``lease_id`` has in semaphore ``name`` (a permit, a place in the queue). Idempotent.

        Args:
            name: the semaphore's name (validated here).
            lease_id: the contender's lease.
            unless_changed_since: only if the queue key's mod revision is still this (a deferred withdrawal).

        Returns:
            (found: the lease had a key there, held: it held a permit, revision).

        Raises:
            InvalidArgument: bad name or lease id.
            Unavailable: etcd unreachable.
        """
        validate_name(name)
        validate_lease_id(lease_id)
        qkey = self._queue_key(name, lease_id)
        for pending in (self._claiming.get(qkey), self._locks.pending_write(qkey)):
            if pending is not None:  # a write of this lease's keys still in flight here: let it land first
                await asyncio.wait({pending})
        while True:
            resp = await self._etcd.read([etcdops.get(qkey, keys_only=True), self._slots_range(name)],
                                         name=name, lease_id=lease_id)
            queued, slots = (r.response_range.kvs for r in resp.responses)
            mine = [p for p in map(self._permit_of, slots) if p is not None and p.lease_id == lease_id]
            if not queued and not mine:
                return False, False, int(resp.header.revision)
            if unless_changed_since is not None and (not queued or int(queued[0].mod_revision)
                                                     != unless_changed_since):
                return False, False, int(resp.header.revision)
            skeys = [self._slot_key(name, p.slot, lease_id) for p in mine]
            compare = [etcdops.is_unchanged(qkey, int(queued[0].mod_revision))] if queued else \
                [etcdops.is_absent(qkey)]
            reads = [etcdops.get(k, keys_only=True) for k in (qkey, *skeys)]

            def resolve(r: Any, held: bool = bool(mine)) -> tuple[bool, bool, int] | None:
                if any(x.response_range.kvs for x in r.responses):
                    return NOT_APPLIED  # type: ignore[no-any-return]
                return True, held, int(r.header.revision)

            done = await self._etcd.txn(TxnPlan(
                etcdops.txn(compare, [etcdops.delete(k) for k in (qkey, *skeys)]),
                lambda r, held=bool(mine): (True, held, int(r.header.revision)) if r.succeeded else None,
                reads, resolve, name=name, lease_id=lease_id))
            if done is not None:
                return done

    # ------------------------------------------------------------------ describe

    async def describe(self, name: str) -> SemaphoreDescription:
        """Report the permits, holders (in slot order) and waiters of semaphore ``name`` at one revision.

        Raises:
            InvalidArgument: bad name.
            DataLoss: tokens would go back.
            Unavailable: etcd unreachable.
        """
        validate_name(name)
        queue = self._keys.lock_prefix(kinds.semaphore_queue(name))
        resp = await self._etcd.read([etcdops.get(self._record_key(name)), self._slots_range(name),
                                      etcdops.RequestOp(request_range=etcdops.count(queue))], name=name)
        tokens = self._locks.tokens
        tokens.check_serving()
        record, slots, queued = (r.response_range for r in resp.responses)
        permits = int(record.kvs[0].value) if record.kvs else 0
        holders = sorted((Permit(p.lease_id, p.slot, tokens.reported(p.token))
                          for p in map(self._permit_of, slots.kvs) if p is not None), key=lambda p: p.slot)
        return SemaphoreDescription(permits, holders, max(0, int(queued.count) - len(holders)),
                                    int(resp.header.revision))
