"""The lock algorithm on etcd: acquire, release, describe.

After etcd's ``concurrency.Mutex`` (client/v3/concurrency/mutex.go): a lock
named N is a key range; each contender puts one key attached to its lease;
the holder is the key with the lowest create revision; a waiter waits for the
deletion of the key just before its own (first come, first served, no
thundering herd). The fencing token is the holder key's create revision:
etcd revisions are cluster-wide and only grow, so each new holder of N gets
a strictly larger token (Kleppmann 2016; Chubby's sequencers, Burrows 2006).

Costs with a session (a lease granted beforehand): an uncontended acquire is
one etcd Txn, a release one Txn. Every "is this still the holder" decision is
made by a compare inside one Txn, never by a read followed by a write.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import grpc
from etcd3aio import Etcd3Client, EtcdError, SortOrder, SortTarget
from etcd3aio._protobuf import (
    Compare,
    DeleteRangeRequest,
    PutRequest,
    RangeRequest,
    RequestOp,
    TxnResponse,
)

from fencepost.client.errors import LeaseLost, LockTimeout, NotHolder, ResourceExhausted, StaleTokenError, Unavailable
from fencepost.client.v1.details import ErrorReason, reason_name

from .errors import etcd_unavailable
from fencepost.client.v1.keys import Keys, prefix_end

from .validate import validate_lease_id, validate_name, validate_token
from .session import ETCD_CALL_TIMEOUT
from .watch import DeleteWatcher

_log = logging.getLogger(__name__)
T = TypeVar("T")

#: Most queued contenders listed by describe().
DESCRIBE_WAITERS = 100


@dataclass(frozen=True)
class Holder:
    """A contender: its lease and the create revision of its key (the token when it holds)."""

    lease_id: int
    token: int


@dataclass(frozen=True)
class AcquireResult:
    """The outcome of acquire(): granted with ``token``, or (try once only) the current holder."""

    acquired: bool
    token: int = 0
    holder: Holder | None = None


@dataclass(frozen=True)
class Description:
    """A snapshot of one lock at one etcd revision."""

    holder: Holder | None
    ttl_remaining_seconds: int
    ttl_seconds: int
    waiter_count: int
    waiters: list[Holder] = field(default_factory=list)
    revision: int = 0


class LockManager:
    """Acquire, release and describe locks stored in etcd.

    Args:
        etcd: a connected etcd3aio client.
        keys: the key layout.
        watcher: the running deletion watcher for the same prefix.
        max_waiters: most Acquire calls that may wait at once on this coordinator.
    """

    def __init__(self, etcd: Etcd3Client, keys: Keys, watcher: DeleteWatcher, *, max_waiters: int = 10_000) -> None:
        self._etcd = etcd
        self._keys = keys
        self._watcher = watcher
        self._max_waiters = max_waiters
        self._waiting = 0

    async def acquire(self, name: str, lease_id: int, wait: float | None) -> AcquireResult:
        """Take lock ``name`` for lease ``lease_id``.

        Args:
            name: the lock name (validated here).
            lease_id: the contender's lease.
            wait: 0.0 to try once, seconds to wait at most, or None to wait
                until granted or cancelled.

        Returns:
            acquired=True with the fencing token; or, only when trying once,
            acquired=False with the current holder (nothing is left queued).
            Idempotent per (lease, name): a lease that already holds the lock
            gets the same token again.

        Raises:
            InvalidField: bad name or lease id.
            AcquireTimeout: not granted within ``wait`` seconds (the waiter key is deleted).
            LeaseExpired: the lease is gone, or the waiter key was deleted while waiting.
            TooManyWaiters: this coordinator's queue limit.
            EtcdUnavailable: etcd unreachable.
        """
        validate_name(name)
        validate_lease_id(lease_id)
        if wait == 0:
            return await self._try_once(name, lease_id)
        if self._waiting >= self._max_waiters:
            raise ResourceExhausted(f"more than {self._max_waiters} waiting acquires", name=name, lease_id=lease_id,
                                    reason=reason_name(ErrorReason.TOO_MANY_WAITERS))
        self._waiting += 1
        try:
            return await self._acquire_waiting(name, lease_id, wait)
        finally:
            self._waiting -= 1

    async def _try_once(self, name: str, lease_id: int) -> AcquireResult:
        key = self._keys.contender(name, lease_id)
        lock = self._keys.lock_prefix(name)
        # The whole range compares to create revision 0 only when it is empty.
        free = Compare(result=Compare.EQUAL, target=Compare.CREATE, key=lock, range_end=prefix_end(lock), create_revision=0)
        resp = await self._txn([free], [_put(key, lease_id)], [self._first(lock)], name=name, lease_id=lease_id)
        if resp.succeeded:
            return AcquireResult(True, token=int(resp.header.revision))
        owner = resp.responses[0].response_range.kvs[0]
        if bytes(owner.key) == key:
            return AcquireResult(True, token=int(owner.create_revision))
        return AcquireResult(False, holder=self._holder(owner))

    async def _acquire_waiting(self, name: str, lease_id: int, wait: float | None) -> AcquireResult:
        key = self._keys.contender(name, lease_id)
        lock = self._keys.lock_prefix(name)
        absent = Compare(result=Compare.EQUAL, target=Compare.CREATE, key=key, create_revision=0)
        step = asyncio.ensure_future(self._txn(
            [absent], [_put(key, lease_id), self._first(lock)], [_get(key), self._first(lock)],
            name=name, lease_id=lease_id,
        ))
        try:
            put_resp = await asyncio.shield(step)
        except asyncio.CancelledError:
            # Cancelled while queueing: finish the write, then take back a key we created.
            with contextlib.suppress(Exception):
                done = await step
                if done.succeeded:
                    await self._withdraw(key, int(done.header.revision))
            raise
        if put_resp.succeeded:
            my_rev = int(put_resp.header.revision)
        else:
            mine = put_resp.responses[0].response_range.kvs
            if not mine:  # deleted between the compare and the read: cannot be, Txn is atomic
                raise LeaseLost("the waiter key vanished", name=name, lease_id=lease_id)
            my_rev = int(mine[0].create_revision)
        owner = put_resp.responses[1].response_range.kvs
        if owner and int(owner[0].create_revision) == my_rev:
            return AcquireResult(True, token=my_rev)
        granted = False
        try:
            async with asyncio.timeout(wait):
                await self._wait_turn(name, lease_id, key, lock, my_rev)
            granted = True
            return AcquireResult(True, token=my_rev)
        except TimeoutError as exc:
            raise LockTimeout(f"lock {name!r} not granted within {wait:.3f} s", name=name, lease_id=lease_id) from exc
        finally:
            if not granted:
                await self._withdraw(key, my_rev)

    async def _wait_turn(self, name: str, lease_id: int, key: bytes, lock: bytes, my_rev: int) -> None:
        """Wait until ``key`` (created at ``my_rev``) is the lowest in its range."""
        mine = Compare(result=Compare.EQUAL, target=Compare.CREATE, key=key, create_revision=my_rev)
        before = RequestOp(request_range=RangeRequest(
            key=lock, range_end=prefix_end(lock), max_create_revision=my_rev - 1,
            sort_order=RangeRequest.DESCEND, sort_target=RangeRequest.CREATE, limit=1, keys_only=True,
        ))
        backoff = 0.05
        while True:
            try:
                resp = await self._txn([mine], [before], [], name=name, lease_id=lease_id)
            except Unavailable:
                await asyncio.sleep(backoff)  # etcd blip: keep our place, retry within the wait
                backoff = min(backoff * 2, 1.0)
                continue
            backoff = 0.05
            if not resp.succeeded:
                # Our key is gone: the lease expired or was revoked, or someone deleted it.
                raise LeaseLost(f"lease {lease_id:#x} lost its place in the queue of {name!r}",
                                   name=name, lease_id=lease_id)
            predecessors = resp.responses[0].response_range.kvs
            if not predecessors:
                return  # granted: at this revision our key exists and is the lowest
            await self._watcher.wait_deleted(bytes(predecessors[0].key), int(resp.header.revision))

    async def _withdraw(self, key: bytes, my_rev: int) -> None:
        """Delete our waiter key (if it is still the one we created), shielded from cancellation."""
        mine = Compare(result=Compare.EQUAL, target=Compare.CREATE, key=key, create_revision=my_rev)
        delete = RequestOp(request_delete_range=DeleteRangeRequest(key=key))
        try:
            await _finish_even_if_cancelled(self._etcd.kv.txn([mine], [delete], [], timeout=ETCD_CALL_TIMEOUT))
        except (EtcdError, grpc.aio.AioRpcError, TimeoutError) as exc:
            # The key stays until its lease ends; log it so an operator can see it.
            _log.warning("could not withdraw waiter key %r: %s", key, exc)

    async def release(self, name: str, lease_id: int, token: int) -> int:
        """Release the hold of ``name`` by ``lease_id`` granted with ``token``.

        Returns:
            The etcd revision of the release.

        Raises:
            InvalidField: bad name, lease id or token.
            NotHolder: the lease holds no such lock.
            StaleToken: the lease holds the lock under a newer token.
            LeaseExpired: the lease is gone.
            EtcdUnavailable: etcd unreachable.
        """
        validate_name(name)
        validate_lease_id(lease_id)
        validate_token(token)
        key = self._keys.contender(name, lease_id)
        held = Compare(result=Compare.EQUAL, target=Compare.CREATE, key=key, create_revision=token)
        delete = RequestOp(request_delete_range=DeleteRangeRequest(key=key))
        resp = await self._txn([held], [delete], [_get(key)], name=name, lease_id=lease_id)
        if resp.succeeded:
            return int(resp.header.revision)
        current = resp.responses[0].response_range.kvs
        if current:
            if int(current[0].create_revision) > token:
                raise StaleTokenError(f"token {token} of {name!r} is stale: the lease holds it under "
                                      f"{current[0].create_revision}", name=name, lease_id=lease_id, token=token,
                                      current_token=int(current[0].create_revision))
            raise NotHolder(f"token {token} was not granted to lease {lease_id:#x} for {name!r} (its key "
                            f"there has revision {current[0].create_revision})", name=name, lease_id=lease_id,
                            token=token)
        if not await self._lease_alive(lease_id):
            raise LeaseLost(f"lease {lease_id:#x} has expired or was revoked", name=name, lease_id=lease_id)
        raise NotHolder(f"lease {lease_id:#x} does not hold {name!r}", name=name, lease_id=lease_id, token=token)

    async def describe(self, name: str) -> Description:
        """Report the holder, token, waiters and TTL left of lock ``name``.

        Raises:
            InvalidField: bad name.
            EtcdUnavailable: etcd unreachable.
        """
        validate_name(name)
        lock = self._keys.lock_prefix(name)
        try:
            resp = await self._etcd.kv.get(
                lock, range_end=prefix_end(lock), sort_order=SortOrder.ASCEND, sort_target=SortTarget.CREATE,
                keys_only=True,
                limit=DESCRIBE_WAITERS + 1, timeout=ETCD_CALL_TIMEOUT,
            )
            count = await self._etcd.kv.get(lock, range_end=prefix_end(lock), count_only=True, timeout=ETCD_CALL_TIMEOUT)
        except (EtcdError, grpc.aio.AioRpcError, TimeoutError) as exc:
            raise etcd_unavailable(f"etcd: describe failed: {exc}", name=name) from exc
        contenders = [self._holder(kv) for kv in resp.kvs]
        if not contenders:
            return Description(None, -1, 0, 0, [], int(resp.header.revision))
        holder = contenders[0]
        ttl_left, granted = -1, 0
        with contextlib.suppress(EtcdError, grpc.aio.AioRpcError, TimeoutError):
            info = await self._etcd.lease.time_to_live(holder.lease_id, timeout=ETCD_CALL_TIMEOUT)
            ttl_left, granted = int(info.TTL), int(info.grantedTTL)
        return Description(holder, ttl_left, granted, int(count.count) - 1, contenders[1:], int(resp.header.revision))

    async def hold_exists(self, name: str, lease_id: int, token: int) -> bool:
        """Whether ``lease_id`` still holds ``name`` under ``token`` (one read).

        Raises:
            EtcdUnavailable: etcd unreachable.
        """
        key = self._keys.contender(name, lease_id)
        try:
            resp = await self._etcd.kv.get(key, timeout=ETCD_CALL_TIMEOUT)
        except (EtcdError, grpc.aio.AioRpcError, TimeoutError) as exc:
            raise etcd_unavailable(f"etcd: read failed: {exc}", name=name, lease_id=lease_id) from exc
        return bool(resp.kvs) and int(resp.kvs[0].create_revision) == token

    async def _lease_alive(self, lease_id: int) -> bool:
        try:
            info = await self._etcd.lease.time_to_live(lease_id, timeout=ETCD_CALL_TIMEOUT)
        except (EtcdError, grpc.aio.AioRpcError, TimeoutError) as exc:
            raise etcd_unavailable(f"etcd: lease lookup failed: {exc}", lease_id=lease_id) from exc
        return int(info.TTL) > 0

    async def _txn(self, compare: Sequence[Compare], success: Sequence[RequestOp], failure: Sequence[RequestOp],
                   *, name: str, lease_id: int) -> TxnResponse:
        try:
            return await self._etcd.kv.txn(compare, success, failure, timeout=ETCD_CALL_TIMEOUT)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:  # "requested lease not found"
                raise LeaseLost(f"lease {lease_id:#x} has expired or was revoked",
                                   name=name, lease_id=lease_id) from exc
            raise etcd_unavailable(f"etcd: {exc.code().name}: {exc.details()}", name=name, lease_id=lease_id) from exc
        except (EtcdError, TimeoutError) as exc:
            raise etcd_unavailable(f"etcd: {exc}", name=name, lease_id=lease_id) from exc

    def _first(self, lock: bytes) -> RequestOp:
        """A range read of the lock's holder: its key with the lowest create revision."""
        return RequestOp(request_range=RangeRequest(
            key=lock, range_end=prefix_end(lock), sort_order=RangeRequest.ASCEND,
            sort_target=RangeRequest.CREATE, limit=1, keys_only=True,
        ))

    def _holder(self, kv: object) -> Holder:
        parsed = self._keys.parse(bytes(kv.key))  # type: ignore[attr-defined]
        return Holder(parsed[1] if parsed else 0, int(kv.create_revision))  # type: ignore[attr-defined]


def _put(key: bytes, lease_id: int) -> RequestOp:
    return RequestOp(request_put=PutRequest(key=key, value=b"", lease=lease_id))


def _get(key: bytes) -> RequestOp:
    return RequestOp(request_range=RangeRequest(key=key, keys_only=True))


async def _finish_even_if_cancelled(step: Awaitable[T]) -> T:
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
