"""Multi-locks: several locks taken for one lease all together, or none (AcquireAll, ReleaseAll).

A multi-lock of names N1..Nk is one contender key in each lock's queue
(:mod:`.lock`), all put by **one** etcd Txn (through
:func:`.floor_guard.under_floor`), so that every key gets the same create
revision R. The call then waits until each key is the first of its own
lock's queue, with the wait of a single lock (:meth:`.waiters.Waiters.wait_first`:
the deletion of the key just before it), and reads once more, under the
compare that every key is still the one created at R, before it answers.

No deadlock, whatever order callers give the names. A lock's queue is
ordered by create revision, and all the keys of one call share one, so any
two multi-lock calls A (revision Ra) and B (Rb) sharing names are in the
same order in every queue they share: if Ra < Rb, A is before B in each of
them, and B waits for A everywhere, never the reverse. This is the
ordered-resource argument (Havender 1968; Coffman et al. 1971: a global
order on resources in which every process takes them), with the revision
as the order; single-lock callers take one resource and cannot close a
cycle. Curator's ``InterProcessMultiLock`` instead takes the locks one after
another in the order given (and deadlocks on opposite orders unless every
caller sorts), and etcd's own recipe (``concurrency.Mutex``) is per key.

Tokens: every name's fencing token is R plus the token floor, strictly
larger than every earlier token of that name (R is a new etcd revision).

Nothing of a call that does not grant is left: a try-once call whose locks
are not all free puts no key (one Txn, its compares on every lock); a wait
that times out, is cancelled or fails deletes every key of the call in one
Txn. ReleaseAll deletes every key in one Txn, only if each is still the one
created at R (a refused release changes nothing).

Costs with a lease granted beforehand, for k names: a try-once grant or an
uncontended wait is one Txn (k puts and, for try once, 2k compares); a wait
adds, per name that is held, the deletion watch and one read of a single
lock's wait, plus one read at the end; a release is one Txn of k deletes.
A Txn holds at most about 4k ops and compares: :data:`MAX_MULTILOCK_NAMES` keeps it
well under etcd's default ``--max-txn-ops`` of 128.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fencepost.client.errors import FencepostError, InvalidArgument, LeaseLost, LockTimeout
from fencepost.client.v1 import etcdops
from fencepost.client.v1.keys import MAX_MULTILOCK_NAMES, Hold, Keys
from fencepost.client.v1.names import multilock_problem

from ..etcd import NOT_APPLIED, TxnPlan, unbounded
from .floor_guard import under_floor
from .lock import Holder, LockManager, release_refusal
from .validate import validate_lease_id, validate_lock_name, validate_name, validate_token
from .waiters import finish_even_if_cancelled, lock_of

__all__ = ["MultiLockResult", "MultiLocks", "validate_names"]



def validate_names(names: Sequence[str], *, public: bool = False) -> list[str]:
    """Check the names of a multi-lock: 2 to :data:`MAX_MULTILOCK_NAMES` distinct lock names.

    Args:
        names: the names.
        public: a caller's names (never an internal one: :func:`.validate.validate_name`).

    Returns:
        The names as a list, in the order given.

    Raises:
        InvalidArgument: field ``names`` (too few, too many, a duplicate, or a bad name).
    """
    names = list(names)
    problem = multilock_problem(names, MAX_MULTILOCK_NAMES)
    if problem is not None:
        raise InvalidArgument(problem, field="names")
    for name in names:
        try:
            (validate_name if public else validate_lock_name)(name)
        except InvalidArgument as exc:
            raise InvalidArgument(f"names: {exc.message}", field="names") from exc
    return names


@dataclass(frozen=True)
class MultiLockResult:
    """The outcome of :meth:`MultiLocks.acquire`: granted with one token per name, or (try once) a holder.

    Attributes:
        acquired: every name is held by the lease.
        tokens: name -> fencing token (all equal), when acquired.
        holder: when not acquired, the holder of ``held_name`` (None: free, but a lock-delay holds it back).
        held_name: the first name found not free, when not acquired.
        freed_at: for a grant after a wait, when the last deletion that let it through was seen.
    """

    acquired: bool
    tokens: dict[str, int] = field(default_factory=dict)
    holder: Holder | None = None
    held_name: str = ""
    freed_at: float | None = None


class MultiLocks:
    """Acquire and release multi-locks on the lock algorithm of ``locks``.

    Args:
        locks: the lock algorithm (its etcd layer, token floor, waits and lock-delays).
        keys: the key layout.
    """

    def __init__(self, locks: LockManager, keys: Keys) -> None:
        self._locks = locks
        self._keys = keys

    async def acquire(self, names: Sequence[str], lease_id: int, wait: float | None) -> MultiLockResult:
        """Take every lock of ``names`` for ``lease_id``, or none.

        Args:
            names: 2 to :data:`MAX_MULTILOCK_NAMES` distinct lock names, any order (validated here).
            lease_id: the contender's lease.
            wait: 0.0 to try once, seconds to wait at most, or None to wait until granted or cancelled.

        Returns:
            acquired=True with every name's token; or, only when trying once,
            acquired=False with the first name found held and its holder (no key left).
            Idempotent per (lease, names): a lease that holds them all gets the same tokens.

        Raises:
            InvalidArgument: bad names or lease id; or the lease has keys in only
                some of the locks (not from one multi-lock of these names).
            LockTimeout: not granted within ``wait`` (every key is deleted).
            LeaseLost: the lease is gone, or a key was deleted while waiting (the others are deleted).
            ResourceExhausted: this coordinator's queue limit (TOO_MANY_WAITERS).
            DataLoss: tokens would go back (every key is deleted).
            Unavailable: etcd unreachable.
        """
        names = validate_names(names)
        validate_lease_id(lease_id)
        if wait == 0:
            (revision, holder, held), floor = await self._granted_or_withdrawn(self._try_once(names, lease_id),
                                                                               names, lease_id)
            if not revision:
                return MultiLockResult(False, holder=None if holder is None else Holder(
                    holder.lease_id, self._locks.tokens.token(holder.token, floor)), held_name=held)
            return await self._issued(names, lease_id, revision, floor, None)
        with self._locks.waiters.counted(names[0], lease_id):
            revision, floor = await self._granted_or_withdrawn(self._queue(names, lease_id), names, lease_id)
            try:
                async with asyncio.timeout(wait):
                    freed_at = await self._wait_all(names, lease_id, revision)
            except TimeoutError as exc:
                await self._withdraw(names, lease_id, revision)
                raise LockTimeout(f"locks {names!r} not all granted within {wait:.3f} s", name=names[0],
                                  lease_id=lease_id) from exc
            except BaseException:
                await self._withdraw(names, lease_id, revision)
                raise
        return await self._issued(names, lease_id, revision, floor, freed_at)

    async def release(self, names: Sequence[str], lease_id: int, token: int, *, also: Sequence[Any] = ()) -> int:
        """Release the multi-lock of ``names`` by ``lease_id`` granted with ``token``: one Txn, all or nothing.

        Args:
            names, lease_id, token: the grant (validated here).
            also: ops added to the Txn's success branch (the call's request record).

        Returns:
            The etcd revision of the release.

        Raises:
            InvalidArgument: bad names, lease id or token.
            NotHolder, StaleTokenError, LeaseLost: as :meth:`.lock.LockManager.release`, for the first
                name not held under ``token`` (nothing is deleted).
            Unavailable: etcd unreachable.
        """
        names = validate_names(names)
        validate_lease_id(lease_id)
        validate_token(token)
        created = self._locks.tokens.revision(token)
        created = created if created > 0 else -1  # names no key (0 would match an absent key)
        keys = self._contenders(names, lease_id)

        def decide(resp: Any) -> tuple[int, str, Any, Holder | None]:
            if resp.succeeded:
                return int(resp.header.revision), "", None, None
            reads = [r.response_range.kvs for r in resp.responses]
            for i, name in enumerate(names):
                mine, owners = reads[2 * i], reads[2 * i + 1]
                if not mine or int(mine[0].create_revision) != created:
                    return 0, name, (mine[0] if mine else None), (self._holder(owners[0]) if owners else None)
            return 0, names[0], None, None  # cannot be: every compare held

        def released(resp: Any) -> tuple[int, str, Any, Holder | None]:
            if any(r.response_range.kvs for r in resp.responses):
                return NOT_APPLIED  # type: ignore[no-any-return]  # a key is there: send again for the real answer
            return int(resp.header.revision), "", None, None

        reads = [op for key in keys for op in (etcdops.get(key, keys_only=True), etcdops.holder_of(lock_of(key)))]
        revision, name, mine, holder = await self._locks.etcd.txn(TxnPlan(
            etcdops.txn([etcdops.is_owner(key, created) for key in keys],
                        [*self._deletes(keys, lease_id, created), *also], reads),
            decide, [etcdops.get(key, keys_only=True) for key in keys], released, name=names[0], lease_id=lease_id))
        if revision:
            return revision
        alive = True if mine is not None else await self._locks.lease_alive(lease_id)
        raise release_refusal(Hold(name, lease_id, token), mine, holder, alive, floor=self._locks.tokens.floor)

    async def withdraw(self, names: Sequence[str], lease_id: int) -> tuple[int, int]:
        """Delete every key of ``lease_id`` in the locks of ``names``, held or waiting: one Txn. Idempotent.

        Returns:
            (how many of the names had a key, the etcd revision of the deletion).

        Raises:
            InvalidArgument: bad names or lease id.
            Unavailable: etcd unreachable.
        """
        names = validate_names(names)
        validate_lease_id(lease_id)
        keys = self._contenders(names, lease_id)

        def gone(resp: Any) -> tuple[int, int]:
            if any(r.response_range.kvs for r in resp.responses):
                return NOT_APPLIED  # type: ignore[no-any-return]  # still there: send again
            return 0, int(resp.header.revision)

        return await self._locks.etcd.txn(TxnPlan(
            etcdops.txn([], [*(etcdops.get(key, keys_only=True) for key in keys),
                             *self._deletes(keys, lease_id, None)]),
            lambda resp: (sum(bool(r.response_range.kvs) for r in resp.responses[:len(keys)]),
                          int(resp.header.revision)),
            [etcdops.get(key, keys_only=True) for key in keys], gone, name=names[0], lease_id=lease_id))

    # ------------------------------------------------------------------ the steps

    def _contenders(self, names: Sequence[str], lease_id: int) -> list[bytes]:
        return [self._keys.contender(name, lease_id) for name in names]

    def _deletes(self, keys: Sequence[bytes], lease_id: int, revision: int | None) -> list[Any]:
        """Ops deleting ``keys`` and the lock-delay records of their holds (a clean end)."""
        delays = self._locks.delays
        return [op for key in keys for op in (etcdops.delete(key),
                                              delays.forget(lock_of(key), lease_id, revision))]

    async def _try_once(self, names: list[str], lease_id: int) -> tuple[tuple[int, Holder | None, str], int]:
        """One Txn: every lock free (and no lock-delay) -> put every key. Returns ((R or 0, holder, held name),
        floor)."""
        keys = self._contenders(names, lease_id)
        locks = [lock_of(key) for key in keys]
        delays = self._locks.delays

        def owned(ranges: list[Any]) -> tuple[int, Holder | None, str]:
            firsts = [r.kvs[0] if r.kvs else None for r in ranges]
            revisions = {int(kv.create_revision) for kv in firsts if kv is not None}
            if all(kv is not None and bytes(kv.key) == key for kv, key in zip(firsts, keys)) and len(revisions) == 1:
                return revisions.pop(), None, ""  # the lease holds them all already (a retry)
            for name, kv, key in zip(names, firsts, keys):
                if kv is not None and bytes(kv.key) != key:
                    return 0, self._contender(kv), name  # held by another lease
            return 0, None, names[0]  # free, but a lock-delay holds one back

        def decide(resp: Any) -> tuple[int, Holder | None, str]:
            if resp.succeeded:
                return int(resp.header.revision), None, ""
            return owned([r.response_range for r in resp.responses])

        def resolve(resp: Any) -> tuple[int, Holder | None, str]:
            revision, holder, held = owned([r.response_range for r in resp.responses])
            return (revision, holder, held) if revision else NOT_APPLIED  # type: ignore[return-value]

        return await under_floor(self._locks.tokens, self._locks.etcd.txn, TxnPlan(
            etcdops.txn([c for lock in locks for c in (etcdops.is_free(lock), delays.is_clear(lock))],
                        [etcdops.put(key, b"", lease_id=lease_id) for key in keys],
                        [etcdops.holder_of(lock) for lock in locks]),
            decide, [etcdops.holder_of(lock) for lock in locks], resolve, name=names[0], lease_id=lease_id))

    async def _queue(self, names: list[str], lease_id: int) -> tuple[int, int]:
        """One Txn puts every key (none there yet), else finds them all from an earlier call: (R, floor).

        A withdrawal of these keys still in flight here (an earlier attempt of the same call, cancelled when
        its connection broke) is awaited first, so that this attempt cannot adopt keys about to be deleted.
        """
        keys = self._contenders(names, lease_id)
        pending = {step for key in keys if (step := self._locks.pending_write(key)) is not None}
        if pending:
            await asyncio.wait(pending)

        def found(ranges: list[Any]) -> int:
            revisions = {int(r.kvs[0].create_revision) for r in ranges if r.kvs}
            if all(r.kvs for r in ranges) and len(revisions) == 1:
                return revisions.pop()
            if not any(r.kvs for r in ranges):
                return NOT_APPLIED  # type: ignore[no-any-return]  # only from the read-back: send again
            mixed = [name for name, r in zip(names, ranges) if r.kvs]
            raise InvalidArgument(f"lease {lease_id:#x} already has keys in {mixed!r}, not from one multi-lock of "
                                  f"these names (do not mix Acquire and AcquireAll of one name under one lease)",
                                  field="names", name=names[0], lease_id=lease_id)

        def decide(resp: Any) -> int:
            if resp.succeeded:
                return int(resp.header.revision)
            return found([r.response_range for r in resp.responses])

        reads = [etcdops.get(key, keys_only=True) for key in keys]
        return await under_floor(self._locks.tokens, self._locks.etcd.txn, TxnPlan(
            etcdops.txn([etcdops.is_absent(key) for key in keys],
                        [etcdops.put(key, b"", lease_id=lease_id) for key in keys], reads),
            decide, reads, lambda resp: found([r.response_range for r in resp.responses]),
            name=names[0], lease_id=lease_id))

    async def _wait_all(self, names: list[str], lease_id: int, revision: int) -> float | None:
        """Wait until every key (created at ``revision``) is first in its lock, then check they all still are.

        Once first, a key stays first until deleted (no key is ever created
        before an existing one), so the locks are waited for one after another;
        the last read checks that none was deleted meanwhile.

        Raises:
            LeaseLost: a key was deleted (the lease ended, or an operator revoked one of the names).
        """
        keys = self._contenders(names, lease_id)
        freed_at: float | None = None
        for name, key in zip(names, keys):
            seen = await self._locks.waiters.wait_first(name, lease_id, key, revision)
            freed_at = seen if seen is not None else freed_at
        resp = await self._locks.etcd.read([], compare=[
            c for key in keys for c in (etcdops.is_owner(key, revision),
                                        etcdops.is_first(lock_of(key), revision))],
            name=names[0], lease_id=lease_id)
        if not resp.succeeded:
            raise LeaseLost(f"lease {lease_id:#x} lost its place in the queue of one of {names!r}",
                            name=names[0], lease_id=lease_id)
        return freed_at

    async def _granted_or_withdrawn(self, write: Any, names: list[str], lease_id: int) -> Any:
        """Run the Txn that puts the keys (``write``, a coroutine returning ``(result, floor)``, its result's
        first item R or 0) to its end even if the call is cancelled meanwhile; then, if cancelled, delete the keys
        it put (one Txn) before the cancellation goes on: no key of an abandoned call is left."""
        step = asyncio.ensure_future(write)
        try:
            return await asyncio.shield(step)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                result, _ = await step
                revision = result[0] if isinstance(result, tuple) else result
                if revision:
                    await self._withdraw(names, lease_id, revision)
            raise

    async def _withdraw(self, names: list[str], lease_id: int, revision: int) -> None:
        """Delete every key of a call that will not be granted (those still created at ``revision``): one Txn,
        shielded from cancellation. A failure is logged by the etcd layer: the keys then end with the lease."""
        keys = self._contenders(names, lease_id)
        deletes = [etcdops.txn_op([etcdops.is_owner(key, revision)], self._deletes([key], lease_id, revision))
                   for key in keys]

        def gone(resp: Any) -> None:
            if any(r.response_range.kvs and int(r.response_range.kvs[0].create_revision) == revision
                   for r in resp.responses):
                return NOT_APPLIED  # type: ignore[no-any-return]  # still there: send again
            return None

        plan = TxnPlan(etcdops.txn([], deletes), lambda resp: None, [etcdops.get(key, keys_only=True) for key in keys],
                       gone, name=names[0], lease_id=lease_id)
        with unbounded():
            step = asyncio.ensure_future(self._locks.etcd.txn(plan))
        for key in keys:  # a later attempt of the same call waits for it (_queue)
            self._locks.waiters.writing(key, step)
        with contextlib.suppress(FencepostError):
            await finish_even_if_cancelled(step)

    async def _issued(self, names: list[str], lease_id: int, revision: int, floor: int,
                      freed_at: float | None) -> MultiLockResult:
        """The grant with its tokens; a grant the token floor refuses is withdrawn."""
        try:
            token = self._locks.tokens.token(revision, floor)
        except FencepostError:
            await self._withdraw(names, lease_id, revision)
            raise
        return MultiLockResult(True, tokens=dict.fromkeys(names, token), freed_at=freed_at)

    def _contender(self, kv: Any) -> Holder:
        parsed = self._keys.parse(bytes(kv.key))
        return Holder(parsed[1] if parsed else 0, int(kv.create_revision))

    def _holder(self, kv: Any) -> Holder:
        contender = self._contender(kv)
        return Holder(contender.lease_id, self._locks.tokens.reported(contender.token))
