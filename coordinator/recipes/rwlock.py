"""Read-write locks on the lock algorithm: readers share a lock's queue with its writers.

After etcd's read-write mutex (``contrib/recipes/rwmutex.go``) and Curator's
``InterProcessReadWriteLock``: any number of readers or one writer hold a
lock named N at once; contenders are served first come, first served, and a
waiting writer blocks the readers that came after it (no writer starvation).

Keys: a reader puts ``<prefix><N>/r<lease id>`` (:meth:`~fencepost.client.v1.keys.Keys.contender`
of the internal name ``kinds.read_lock(N)``) in N's own range, where a
writer, which is any plain Acquire of N, puts ``<prefix><N>/<lease id>``.
Both queue in one order, that of their keys' create revisions:

- a writer is granted when no key at all is before its own: the lock
  algorithm unchanged (:mod:`.lock`), so a plain lock of N excludes its readers;
- a reader is granted when no *writer's* key is before its own
  (:meth:`~fencepost.client.v1.keys.Keys.writers`: the range without the
  readers' keys), and waits for the deletion of the last writer's key before
  its own (:meth:`.waiters.Waiters.wait` with ``ahead``): readers behind a
  writer are granted together when it ends, no thundering herd of readers
  on each other.

Tokens: a reader's token is its own key's create revision plus the token
floor, as a writer's. A writer's token is strictly larger than every earlier
grant's token of N, readers' included: a grant before it was made while its
key existed, so to a contender that was then before it or beside it, never
after (a writer is granted only once every key before its own is gone, and a
reader whose key came later waits for that writer), and create revisions
only grow. Readers granted together may carry any order of tokens among
themselves; a storage that fences writers keeps the highest token it saw.

Liveness is the lock's: the keys are on the contenders' leases; Release,
Withdraw, the hold watch (``HOLD_KIND_READ``) and the deferred withdrawal of
a cancelled wait are the lock's, on the reader's key. A read Acquire takes
no lock-delay, but waits out a running one as every grant does.

Costs: an uncontended read is one Txn (floor-guarded, as every write that
may create a contender key), its release one Txn; a try-once read refused
adds one read of the writer in the way and one Txn deleting its key.
"""

from __future__ import annotations

from fencepost.client.errors import InvalidArgument, LockTimeout
from fencepost.client.v1 import etcdops, kinds, lock_pb2
from fencepost.client.v1.keys import Keys

from .lock import AcquireResult, Holder, LockManager
from .validate import validate_lease_id, validate_lock_name

__all__ = ["ReadLocks", "hold_name", "validate_mode"]


def validate_mode(mode: int) -> int:
    """Check a ``LockMode`` field (AcquireRequest, ReleaseRequest, WithdrawRequest.mode).

    Raises:
        InvalidArgument: field ``mode``: not LOCK_MODE_WRITE (0) or LOCK_MODE_READ (1).
    """
    if mode not in (lock_pb2.LOCK_MODE_WRITE, lock_pb2.LOCK_MODE_READ):
        raise InvalidArgument(f"mode {mode} is not a LockMode (0: write, 1: read)", field="mode")
    return mode


def hold_name(name: str, mode: int) -> str:
    """The internal name of a hold of lock ``name`` in ``mode`` (a LockMode): ``name`` itself for a writer."""
    return kinds.read_lock(name) if mode == lock_pb2.LOCK_MODE_READ else name


class ReadLocks:
    """The readers of read-write locks, queued in the locks' own ranges (see the module docstring).

    Args:
        locks: the lock manager whose queues, token floor and etcd layer the readers share.
        keys: the key layout.
    """

    def __init__(self, locks: LockManager, keys: Keys) -> None:
        self._locks = locks
        self._keys = keys

    async def acquire(self, name: str, lease_id: int, wait: float | None, lock_delay: int = 0) -> AcquireResult:
        """Take a read hold of lock ``name`` for lease ``lease_id``.

        Args:
            name: the lock name (validated here).
            lease_id: the reader's lease.
            wait: 0.0 to try once, seconds to wait at most, or None to wait until granted or cancelled.
            lock_delay: must be 0 (a reader sets no lock-delay).

        Returns:
            acquired=True with the fencing token of the reader's key; or, trying once, acquired=False
            with the first writer (nothing is left queued). Idempotent per (lease, name): a lease that
            reads the lock already gets the same token again.

        Raises:
            InvalidArgument: bad name, lease id, or a lock_delay (field ``lock_delay_seconds``); field ``mode``:
                the lease holds or waits for the lock as a writer (:func:`.waiters.mode_conflict`).
            LockTimeout: not granted within ``wait`` seconds (the reader's key is deleted).
            LeaseLost: the lease is gone, or the reader's key was deleted while waiting.
            ResourceExhausted: this coordinator's queue limit (TOO_MANY_WAITERS).
            DataLoss: tokens would go back.
            Unavailable: etcd unreachable.
        """
        validate_lock_name(name)
        validate_lease_id(lease_id)
        if lock_delay:
            raise InvalidArgument("a read hold takes no lock-delay", field="lock_delay_seconds", name=name,
                                  lease_id=lease_id)
        keys, waiters, tokens = self._keys, self._locks.waiters, self._locks.tokens
        internal = kinds.read_lock(name)
        try:
            with waiters.counted(name, lease_id):
                revision, freed_at, floor = await waiters.wait(internal, lease_id, wait, ahead=keys.ahead(internal))
        except LockTimeout:
            if wait != 0:
                raise
            return AcquireResult(False, holder=await self._first_writer(name))
        try:
            return AcquireResult(True, token=tokens.token(revision, floor), freed_at=freed_at)
        except Exception:  # granted in etcd, but its token would not be safe: leave no hold behind
            await waiters.withdraw(keys.contender(internal, lease_id), revision)
            raise

    async def _first_writer(self, name: str) -> Holder | None:
        """The writer that holds or waits first for lock ``name`` (its token), None when there is none."""
        start, end = self._keys.writers(name)
        resp = await self._locks.etcd.read([etcdops.holder_of(start, range_end=end)], name=name)
        kvs = resp.responses[0].response_range.kvs
        if not kvs:
            return None
        parsed = self._keys.parse(bytes(kvs[0].key))
        return Holder(parsed[1] if parsed else 0, self._locks.tokens.reported(int(kvs[0].create_revision)), False)
