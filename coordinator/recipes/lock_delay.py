"""Lock-delay: after a hold ends uncleanly, the lock's next grant waits (Chubby's lock-delay, Consul's).

A hold acquired with a lock-delay of D seconds (``AcquireRequest.lock_delay_seconds``)
that ends because its lease expired or was revoked (or its key was deleted by
an operator), not by Release or Withdraw, holds back the lock's next grant
until D seconds after the end was seen, so that writes still in flight from
the lost holder land before the next holder starts. A mitigation for storage
that cannot check a fencing token, never a replacement for fencing.

Every replica must agree, across restarts, so the state lives in etcd, in two
keys per lock under ``<prefix>!delay!<encoded name>!`` (:func:`delay_range`;
``!`` is percent-encoded in names, so that range is in no lock's range, holds
no other lock's keys, and :meth:`~fencepost.client.v1.keys.Keys.parse` rejects
its keys: listings skip them):

- the **record** ``...!record``, value ``<lease id, 16 hex>:<create revision>:<D>``:
  the hold (lease, key's create revision) granted with D > 0 whose end has not
  been handled. It is written when the hold is granted (before the grant is
  answered), and deleted in the same Txn as the hold's Release or Withdraw
  (a compare on its value: only the record of that very hold). So a record
  whose hold's key is gone says that the hold ended uncleanly.
- the **wait** ``...!wait``, attached to an etcd lease of TTL D granted for it:
  the delay running. Whoever is about to grant the lock next (the waiter at the
  head of the queue, or a try-once Acquire on a free lock) and finds a record
  of an ended hold replaces it with the wait in one Txn (compare: the record
  unchanged), so it happens once whichever replicas race; the grant comes when
  the wait's lease has expired and etcd deleted the key (seen by the
  :class:`~.watch.DeleteWatcher`).

Timing: the delay runs from the moment a contender saw the end, so never
before the end itself. When a waiter is queued it sees the end at once (the
deletion event of the holder's key); when nobody waits, the first Acquire
after the end starts it, and the delay then runs from that Acquire (a try-once
Acquire answers acquired = false, holder unset, until it has passed). etcd
raises a TTL below its minimum lease TTL (about 2 s with its default election
timeout) to that minimum, expires leases up to about half a second late, and
extends them when its leader changes: the delay is a lower bound, often a
little longer.

Cost for locks that never use a delay: no extra etcd request. The try-once
grant Txn gets one more compare (the delay range is empty), the waiting
acquire's reads one more range op, Release and Withdraw a nested Txn of two
value compares on an absent key. With a delay: one more Txn per grant (the
record), and at an unclean end one LeaseGrant and one Txn (the wait).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import unquote

from fencepost.client.errors import FencepostError, InvalidArgument
from fencepost.client.v1 import etcdops
from fencepost.client.v1.etcd import rpc_pb2
from fencepost.client.v1.keys import MAX_LOCK_DELAY_SECONDS, Keys, prefix_end

from ..etcd import NOT_APPLIED, EtcdClient, TxnPlan
from .watch import DeleteWatcher

__all__ = ["DELAY_INFIX", "PENDING", "WAIT", "DelayRecord", "DelayState", "HeldBack", "LockDelays", "delay_range",
           "delay_seconds", "delay_state", "held_back_by", "validate_lock_delay", "wait_lease"]

_log = logging.getLogger(__name__)

#: The infix of every lock's delay range: ``<prefix>!delay!<encoded name>!``.
DELAY_INFIX = b"!delay!"
_RECORD = b"record"
#: The last part of the key of a running delay's wait: ``<prefix>!delay!<encoded name>!wait``.
WAIT = b"wait"
_WAIT = WAIT


def validate_lock_delay(seconds: int) -> int:
    """Check a lock-delay in whole seconds (0 to :data:`MAX_LOCK_DELAY_SECONDS`).

    Returns:
        ``seconds`` unchanged.

    Raises:
        InvalidArgument: field ``lock_delay_seconds``.
    """
    if not 0 <= seconds <= MAX_LOCK_DELAY_SECONDS:
        raise InvalidArgument(f"lock_delay_seconds is {seconds}; must be 0 to {MAX_LOCK_DELAY_SECONDS} seconds",
                              field="lock_delay_seconds")
    return seconds


def delay_range(keys: Keys, lock: bytes) -> bytes:
    """The key prefix of the delay keys of the lock whose key range is ``lock`` (``Keys.lock_prefix``)."""
    return keys.prefix + DELAY_INFIX + lock[len(keys.prefix):-1] + b"!"


@dataclass(frozen=True)
class DelayRecord:
    """A record: the hold (``lease_id``, key create revision ``revision``) granted with ``delay`` seconds."""

    lease_id: int
    revision: int
    delay: int

    def value(self) -> bytes:
        """The record's etcd value."""
        return _hold_tag(self.lease_id, self.revision) + str(self.delay).encode()

    @classmethod
    def parse(cls, value: bytes) -> DelayRecord | None:
        """The record of an etcd value; None when malformed."""
        try:
            lease, revision, delay = value.decode().split(":")
            return cls(int(lease, 16), int(revision), int(delay))
        except ValueError:
            return None


def held_back_by(delay_kvs: Any, lease_id: int, revision: int) -> bool:
    """Whether the delay keys ``delay_kvs`` of a lock (its record and wait, as read) hold back its first
    contender (``lease_id``, key create revision ``revision``): any delay state but that contender's own record.
    """
    return bool(delay_kvs) and not _own_record(delay_kvs, lease_id, revision)


def _own_record(delay_kvs: Any, lease_id: int, revision: int) -> bool:
    """Whether the record among ``delay_kvs`` is that of the hold (``lease_id``, ``revision``)."""
    for kv in delay_kvs:
        if bytes(kv.key).endswith(b"!" + _RECORD):
            record = DelayRecord.parse(bytes(kv.value))
            return record is not None and (record.lease_id, record.revision) == (lease_id, revision)
    return False


def _hold_tag(lease_id: int, revision: int | None) -> bytes:
    """The start of the value of the record of (lease, revision), or of any hold of the lease (None)."""
    return f"{lease_id:016x}:".encode() + (b"" if revision is None else f"{revision}:".encode())


def _starts_with(key: bytes, start: bytes) -> list[rpc_pb2.Compare]:
    """Compares "``key`` exists and its value starts with ``start``" (``start`` ends with ``:``, so ``;`` bounds it)."""
    above = etcdops.Compare(result=etcdops.Compare.GREATER, target=etcdops.Compare.VALUE, key=key, value=start)
    return [above, etcdops.value_below(key, start[:-1] + b";")]


#: :attr:`DelayState.remaining_ms` of a delay that starts at the next Acquire (its hold ended uncleanly).
PENDING = -1


@dataclass(frozen=True)
class DelayState:
    """A lock's lock-delay as Describe reports it.

    Attributes:
        seconds: the delay running or pending, in seconds; 0: none.
        remaining_ms: milliseconds left on a running delay (etcd's lease TTL, whole seconds, at least 1);
            :data:`PENDING` when it starts at the next Acquire; 0: none.
    """

    seconds: int
    remaining_ms: int


def wait_lease(delay_kvs: Any) -> int:
    """The etcd lease of the wait among a lock's delay keys ``delay_kvs`` (a running delay); 0: none."""
    for kv in delay_kvs:
        if bytes(kv.key).endswith(b"!" + _WAIT):
            return int(kv.lease)
    return 0


def delay_state(delay_kvs: Any, head: tuple[int, int] | None, wait_left: int) -> DelayState:
    """The delay that holds a lock back, from its delay keys (record and wait, as read).

    Args:
        delay_kvs: the lock's delay keys, values included.
        head: (lease id, create revision) of the lock's first contender; None when it has none.
        wait_left: seconds etcd reports left on the wait's lease (:func:`wait_lease`); -1 when it ended or
            there is no wait.

    Returns:
        A :class:`DelayState` (``seconds`` 0: none; a contender's own record is none).
    """
    found = {bytes(kv.key).rsplit(b"!", 1)[-1]: kv for kv in delay_kvs}
    wait = found.get(_WAIT)
    if wait is not None and wait_left >= 0:
        return DelayState(_int(bytes(wait.value)), max(1, wait_left * 1000))
    record = found.get(_RECORD)
    parsed = DelayRecord.parse(bytes(record.value)) if record is not None else None
    if parsed is None or (head is not None and (parsed.lease_id, parsed.revision) == head):
        return DelayState(0, 0)
    return DelayState(parsed.delay, PENDING)


def delay_seconds(delay_kvs: Any) -> int:
    """The delay, in seconds, that a lock's delay keys name: the wait's, else the record's; 0: none."""
    for kv in delay_kvs:
        key = bytes(kv.key)
        if key.endswith(b"!" + _WAIT):
            return _int(bytes(kv.value))
    record = next((DelayRecord.parse(bytes(kv.value)) for kv in delay_kvs), None)
    return record.delay if record is not None else 0


def _int(value: bytes) -> int:
    try:
        return int(value)
    except ValueError:
        return 0


class HeldBack(NamedTuple):
    """A free lock that a try-once Acquire found held back: the :meth:`LockDelays.read` range at ``revision``."""

    delays: Any
    revision: int


class LockDelays:
    """The lock-delay records and waits of the locks under one prefix (see the module docstring).

    Args:
        etcd: the coordinator's etcd layer.
        keys: the key layout.
        watcher: the running deletion watcher of the same prefix (it sees the waits' deletions).
    """

    def __init__(self, etcd: EtcdClient, keys: Keys, watcher: DeleteWatcher) -> None:
        self._etcd = etcd
        self._keys = keys
        self._watcher = watcher

    def is_clear(self, lock: bytes) -> rpc_pb2.Compare:
        """The compare "lock ``lock`` has neither a record nor a wait" (every grant of a free lock needs it)."""
        return etcdops.is_free(delay_range(self._keys, lock))

    def read(self, lock: bytes) -> rpc_pb2.RequestOp:
        """A range op of the lock's record and wait (values included: empty for a lock that never used a delay)."""
        start = delay_range(self._keys, lock)
        return etcdops.RequestOp(request_range=etcdops.RangeRequest(key=start, range_end=prefix_end(start)))

    def forget(self, lock: bytes, lease_id: int, revision: int | None) -> rpc_pb2.RequestOp:
        """A nested Txn op that deletes the lock's record if it is that of the hold (lease, create revision).

        For the branch of a Txn that ends the hold cleanly (Release, Withdraw).
        ``revision`` None: of any hold of the lease (Withdraw, which does not
        know its key's revision; a lease holds one key per lock).
        """
        record = delay_range(self._keys, lock) + _RECORD
        return etcdops.txn_op(_starts_with(record, _hold_tag(lease_id, revision)), [etcdops.delete(record)])

    def settled(self, delays: Any, lease_id: int, revision: int, delay: int) -> bool:
        """Whether a contender at the head of the queue may be granted without any more etcd work.

        Args:
            delays: the range response of :meth:`read`, read when (lease, revision) was first.
            lease_id, revision: the contender's lease and its key's create revision.
            delay: the lock-delay it asks for.

        Returns:
            True when the lock has no delay state and ``delay`` is 0, or when
            the record is already this hold's; False when :meth:`gate` must run.
        """
        if not delays.kvs:
            return delay == 0
        return _own_record(delays.kvs, lease_id, revision)

    async def gate(self, lock: bytes, key: bytes, lease_id: int, revision: int, delay: int, delays: Any,
                   read_at: int, *, wait: bool = True) -> bool:
        """Let a contender at the head of the queue through, or run the lock-delay first.

        Args:
            lock: the lock's key range.
            key: the contender's key; ``revision`` its create revision (0: none
                yet, a try-once Acquire of a free lock).
            lease_id: the contender's lease.
            delay: the lock-delay the contender asks for (recorded when granted).
            delays: the range response of :meth:`read` at revision ``read_at``,
                read when the contender was first (or the lock free).
            wait: wait for a running delay to pass (False: return at once).

        Returns:
            True: grant now (with ``delay`` > 0 the record of this hold is
            written first). False: a delay was running or has been started (and,
            with ``wait``, has been waited for): read the lock again.

        Raises:
            Unavailable: etcd unreachable.
        """
        start = delay_range(self._keys, lock)
        if self.settled(delays, lease_id, revision, delay):
            return True
        found = {bytes(kv.key)[len(start):]: kv for kv in delays.kvs}
        if _WAIT in found:
            if wait:
                await self._watcher.wait_deleted(start + _WAIT, read_at)
            return False
        record = found.get(_RECORD)
        if record is None:  # nothing to wait for: this grant records its own delay
            if not revision:
                return False  # a try-once Acquire whose Txn met a key it does not know here: not granted
            await self.remember(lock, key, lease_id, revision, delay)
            return True
        # The record names a hold that ended (this contender is first, or the lock is free) and was not
        # released: start the delay, once whoever else races here.
        ended = DelayRecord.parse(bytes(record.value))
        if ended is None or ended.delay <= 0:
            _log.warning("lock-delay record of lock %r has a malformed value %r: deleted", self._name(lock),
                         bytes(record.value).decode("utf-8", "backslashreplace"))
        started = await self._start(start, record, ended.delay if ended is not None else 0, self._name(lock))
        if started and wait:
            await self._watcher.wait_deleted(start + _WAIT, started)
        return False

    async def _start(self, start: bytes, record: Any, delay: int, name: str) -> int:
        """Replace the record of an ended hold by the wait of ``delay`` seconds.

        Returns:
            The revision of the Txn that started the wait; 0 when there was
            nothing to wait for (a malformed record, deleted) or another
            contender changed the record first.
        """
        ops = [etcdops.delete(bytes(record.key))]
        lease_id = 0
        if delay > 0:
            lease_id, granted = await self._etcd.lease_grant(delay)
            ops.append(etcdops.put(start + _WAIT, str(delay).encode(), lease_id=lease_id))
            ended = DelayRecord.parse(bytes(record.value))
            _log.info("lock-delay of %d s (etcd granted %d s) starts for lock %r after an unclean end of "
                      "the hold of lease %#x (token revision %d)", delay, granted, name,
                      ended.lease_id if ended else 0, ended.revision if ended else 0)
        unchanged = etcdops.is_unchanged(bytes(record.key), int(record.mod_revision))

        def resolve(resp: Any) -> int:
            # The answer was lost: our wait is there (applied), or the record unchanged (send again), or
            # another contender handled the record first.
            mine, wait = (r.response_range.kvs for r in resp.responses)
            if wait and lease_id and int(wait[0].lease) == lease_id:
                return int(wait[0].create_revision)
            if mine and int(mine[0].mod_revision) == int(record.mod_revision):
                return NOT_APPLIED  # type: ignore[no-any-return]
            return 0 if lease_id else int(resp.header.revision)

        revision = await self._etcd.txn(TxnPlan(
            etcdops.txn([unchanged], ops), lambda resp: int(resp.header.revision) if resp.succeeded else 0,
            [etcdops.get(bytes(record.key), keys_only=True), etcdops.get(start + _WAIT, keys_only=True)], resolve))
        if not revision and lease_id:
            await self._revoke_quietly(lease_id)
        return revision if lease_id else 0

    async def remember(self, lock: bytes, key: bytes, lease_id: int, revision: int, delay: int) -> None:
        """Write the record of the hold (lease, revision) granted with ``delay`` > 0, before the grant is answered.

        A no-op when the hold's key is gone or the lock already has a record
        (this hold's: an Acquire again of the same hold).

        Raises:
            Unavailable: etcd unreachable.
        """
        start = delay_range(self._keys, lock)
        value = DelayRecord(lease_id, revision, delay).value()
        # After a lost answer: a record there is this one (or another hold's: nothing to do), none: send again.
        plan = TxnPlan(etcdops.txn([etcdops.is_owner(key, revision), etcdops.is_free(start)],
                                   [etcdops.put(start + _RECORD, value)]),
                       lambda resp: None, [etcdops.get(start + _RECORD, keys_only=True)],
                       lambda resp: None if resp.responses[0].response_range.kvs else NOT_APPLIED)
        await self._etcd.lock_txn(plan, lock)

    def _name(self, lock: bytes) -> str:
        """The lock name of the key range ``lock``, as text (for logs)."""
        return unquote(lock[len(self._keys.prefix):-1].decode("utf-8", "backslashreplace"))

    async def state(self, delays: Any, head: tuple[int, int] | None) -> DelayState:
        """The delay that holds the lock back, from its delay keys as :meth:`read` read them.

        Args:
            delays: the range response of :meth:`read`.
            head: (lease id, create revision) of the lock's first contender; None when it has none.

        Returns:
            A :class:`DelayState` (``seconds`` 0: none; a contender's own record is none).

        Raises:
            Unavailable: etcd unreachable (reading the wait's lease).
        """
        lease = wait_lease(delays.kvs)
        return delay_state(delays.kvs, head, (await self._etcd.lease_ttl(lease))[0] if lease else -1)

    async def end(self, lock: bytes) -> DelayState:
        """End the lock-delay of the lock whose key range is ``lock`` (AdminEndLockDelay).

        Deletes the running wait (its waiters are then granted: the watcher
        sees the deletion) and the record of a hold that ended uncleanly; the
        record of a hold still held stays. One Txn, compared on what was read.

        Returns:
            The delay ended (``seconds`` 0: there was none, or it changed meanwhile).

        Raises:
            Unavailable: etcd unreachable.
        """
        start = delay_range(self._keys, lock)
        resp = await self._etcd.read([self.read(lock), etcdops.holder_of(lock)], name=self._name(lock))
        delays, heads = (r.response_range for r in resp.responses)
        head = heads.kvs[0] if heads.kvs else None
        state = await self.state(delays, (int(bytes(head.key)[len(lock):], 16), int(head.create_revision))
                                 if head is not None else None)
        found = {bytes(kv.key)[len(start):]: kv for kv in delays.kvs}
        compares, deletes, gone = [], [], []
        wait, record = found.get(_WAIT), found.get(_RECORD)
        parsed = DelayRecord.parse(bytes(record.value)) if record is not None else None
        if record is not None and state.remaining_ms == 0 and parsed is not None:
            record = None  # the record of the hold still held (no delay now): its own later end still delays
        for kv in (wait, record):
            if kv is not None:
                compares.append(etcdops.is_unchanged(bytes(kv.key), int(kv.mod_revision)))
                deletes.append(etcdops.delete(bytes(kv.key)))
                gone.append(etcdops.get(bytes(kv.key), keys_only=True))
        if record is not None and parsed is not None:  # that hold is gone (else it would be the head)
            compares.append(etcdops.is_absent(lock + f"{parsed.lease_id:016x}".encode()))
        if not deletes:
            return DelayState(0, 0)
        ended = await self._etcd.txn(TxnPlan(
            etcdops.txn(compares, deletes), lambda r: bool(r.succeeded), gone,
            lambda r: NOT_APPLIED if all(x.response_range.kvs for x in r.responses) else True))
        if not ended:
            return DelayState(0, 0)
        if wait is not None:
            await self._revoke_quietly(int(wait.lease))
        return state if state.seconds else DelayState(parsed.delay if parsed else 0, PENDING)

    async def _revoke_quietly(self, lease_id: int) -> None:
        try:
            await self._etcd.lease_revoke(lease_id)
        except FencepostError as exc:  # it expires after its TTL anyway
            _log.debug("could not revoke unused lock-delay lease %#x: %s", lease_id, exc)

