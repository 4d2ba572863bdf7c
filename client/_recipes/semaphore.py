"""Semaphores with a fencing token per permit, client side: AcquirePermit, ReleasePermit, DescribeSemaphore.

A permit is a hold like a lock's (:class:`~fencepost.client.handle.AsyncLockHandle`
of kind ``HOLD_KIND_SEMAPHORE`` with its ``slot``): under the client's lease
for its TTL, registered in the lease's holds and watched on the KeepAlive
stream, so that its loss is signalled exactly as a lock's (``handle.lost``,
``on_lost``, ``cancel_on_lost``). Its token is strictly larger than every
earlier token of the same slot of the same semaphore: storage partitioned by
slot fences each slot like a lock (README, "Semaphores").

The coordinator grants one permit per lease per semaphore (an AcquirePermit
of a lease that holds one returns it again). So, as for a lock, a second
local acquire of a semaphore under the same TTL waits for this client's
permit to be released: a client holds at most one permit of a semaphore per
TTL at a time; use several clients to hold several.

Calls and clean-up follow :mod:`~fencepost.client._recipes.lock` (:class:`PermitLocker`
is a :class:`~fencepost.client._recipes.lock.Locker` whose release is ReleasePermit):
an acquire that ends without a definite answer is withdrawn (ReleasePermit
with token 0), a release keeps the permit until the coordinator answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

from google.protobuf.message import Message

from .._transport import wire
from .._leases.lease import Lease, Slot
from .lock import ACQUIRE_SLACK_SECONDS, LEASE_EXPIRED, Locker, _bounded, _settled, _wait_slot
from ..errors import FencepostError, InvalidArgument, LeaseLost, LockHeld, LockTimeout, PermitsMismatch, TlsError, \
    Unavailable
from ..handle import AsyncLockHandle
from ..v1 import kinds
from ..v1 import lock_pb2 as pb
from ..v1.keys import MAX_PERMITS
from ..v1.retry import CLIENT_BACKOFF

if TYPE_CHECKING:
    from .._aio.client import AsyncLockClient

__all__ = ["AsyncSemaphore", "PermitHolder", "PermitLocker", "SemaphoreInfo", "check_permits"]

log = logging.getLogger("fencepost.client")
T = TypeVar("T")

# An acquire with less than this left to wait makes one try (the wire's wait_ms counts in ms).
_ONE_MS = 0.001


def check_permits(permits: int) -> int:
    """Check a semaphore's number of permits (an int, 1 to 1000) before any RPC.

    Raises:
        InvalidArgument: field ``permits``.
    """
    if isinstance(permits, bool) or not isinstance(permits, int) or not 1 <= permits <= MAX_PERMITS:
        raise InvalidArgument(f"permits is {permits!r}; must be an int from 1 to {MAX_PERMITS}", field="permits")
    return permits


@dataclass(frozen=True)
class PermitHolder:
    """One granted permit of a semaphore: its lease, slot (0 .. permits-1) and fencing token."""

    lease_id: int
    slot: int
    token: int


@dataclass(frozen=True)
class SemaphoreInfo:
    """A snapshot of one semaphore at one etcd revision (:meth:`AsyncSemaphore.describe`).

    Attributes:
        name: The semaphore's name.
        permits: Its number of permits; 0 if it was never used.
        holders: The granted permits, in slot order.
        waiter_count: Contenders queued behind the holders.
        revision: The etcd revision of the snapshot.
    """

    name: str
    permits: int
    holders: tuple[PermitHolder, ...]
    waiter_count: int
    revision: int

    @classmethod
    def from_response(cls, name: str, resp: pb.DescribeSemaphoreResponse) -> SemaphoreInfo:
        """The snapshot of semaphore ``name`` in a DescribeSemaphoreResponse."""
        return cls(name, int(resp.permits), tuple(PermitHolder(int(h.lease_id), int(h.slot), int(h.token))
                                                  for h in resp.holders), int(resp.waiter_count), int(resp.revision))


class PermitLocker(Locker):
    """The client's :class:`Locker` for semaphore permits: same leases, pool, stream and clean-up rules.

    Args:
        locker: The client's lock locker, whose parts this one shares.
    """

    def __init__(self, locker: Locker) -> None:
        super().__init__(locker.transport, locker.pool, locker.stream, spawn=locker._spawn,
                         on_new_lease=locker._on_new_lease, state=locker._state, on_idle=locker._on_idle)

    async def acquire_permit(self, name: str, permits: int, ttl: int, until: float | None, *,
                             try_once: bool) -> AsyncLockHandle:
        """Acquire a permit of ``name`` under the lease for ``ttl`` (see :meth:`AsyncSemaphore.acquire`).

        Raises:
            LockHeld: ``try_once`` and every permit is held (or this client holds one under that TTL).
            LockTimeout, LeaseLost, PermitsMismatch, FencepostError: as :meth:`AsyncSemaphore.acquire` says.
        """
        queue = kinds.semaphore_queue(name)  # the local exclusion: one permit per lease (handle.local_name)
        retries_on_lost_lease = 1
        while True:
            lease = await self.lease_for(ttl, until)
            self.pool.used(lease)
            key = (lease.lease_id, queue)
            slot = self.pool.slot(*key)
            slot.users += 1
            try:
                if try_once:
                    if slot.lock.locked() or slot.users > 1:
                        raise LockHeld(f"this client holds a permit of semaphore {name!r} (lease {lease.lease_id:#x})",
                                       name=name, lease_id=lease.lease_id, holder_lease_id=lease.lease_id,
                                       holder_token=slot.holder.token if slot.holder is not None else 0)
                    await slot.lock.acquire()
                else:
                    await _wait_slot(slot, until, name, f"this client holds a permit of semaphore {name!r} (lease "
                                                        f"{lease.lease_id:#x})")
                try:
                    if lease.lost:
                        slot.lock.release()
                        continue
                    handle = await self._acquire_permit_rpc(lease, name, permits, until, try_once)
                except LeaseLost:
                    slot.lock.release()
                    self.pool.lose(lease, LEASE_EXPIRED)
                    if retries_on_lost_lease <= 0:
                        raise
                    retries_on_lost_lease -= 1
                    continue
                except BaseException as err:
                    if isinstance(err, PermitsMismatch) or _settled(err) or lease.lost or self._state() != "open":
                        slot.lock.release()
                        raise
                    # The call may have queued, or been granted, for a caller who will never know: withdraw.
                    await self._clean_up(self._withdraw_permit(lease, name, slot), f"fencepost-withdraw-{name}")
                    raise
                slot.holder = handle
                return handle
            finally:
                slot.users -= 1
                self.pool.drop_slot_if_idle(*key)
                self.pool.unused(lease)
                self._on_idle()

    async def _acquire_permit_rpc(self, lease: Lease, name: str, permits: int, until: float | None,
                                  try_once: bool) -> AsyncLockHandle:
        request_id = wire.new_request_id()  # the same on every attempt (only the wait left changes)

        def make(left: float | None) -> tuple[Message, float | None]:
            wait_ms, forever = (0, False) if try_once else wire.wait_to_wire(left)
            request = pb.AcquirePermitRequest(name=name, lease_id=lease.lease_id, permits=permits, wait_ms=wait_ms,
                                              wait_forever=forever, request_id=request_id)
            if forever:
                return request, None
            if try_once:
                return request, self._call_timeout
            return request, wait_ms / 1000 + ACQUIRE_SLACK_SECONDS

        resp = await self.transport.call("AcquirePermit", make, until=until, idempotent=True, name=name,
                                         lease_id=lease.lease_id, secret=lease.secret)
        if not resp.acquired:
            held = ", ".join(f"slot {h.slot}: lease {h.lease_id:#x} token {h.token}" for h in resp.holders)
            if not try_once:
                raise LockTimeout(f"every permit of semaphore {name!r} is held ({held})", name=name,
                                  lease_id=lease.lease_id)
            first = resp.holders[0] if resp.holders else None
            raise LockHeld(f"every permit of semaphore {name!r} is held ({held})", name=name, lease_id=lease.lease_id,
                           holder_lease_id=int(first.lease_id) if first else 0,
                           holder_token=int(first.token) if first else 0)
        handle = AsyncLockHandle(name, lease, int(resp.token), self.release, kind=kinds.HoldKind.HOLD_KIND_SEMAPHORE,
                                 slot=int(resp.slot))
        if lease.lost:
            self._spawn(self.release_quietly(handle), f"fencepost-release-{name}")
            raise LeaseLost("the lease was lost while acquiring", name=name, lease_id=lease.lease_id,
                            reason=lease.lost_reason or LEASE_EXPIRED)
        lease.holds[handle.hold_name] = handle
        self.stream.watch(handle)
        return handle

    async def _withdraw_permit(self, lease: Lease, name: str, slot: Slot) -> None:
        """ReleasePermit with token 0 (withdraw whatever the lease has there), retried while the lease lives."""
        delays = CLIENT_BACKOFF.delays()
        try:
            while not lease.lost and self._state() == "open":
                try:
                    resp = await self.transport.call(
                        "ReleasePermit", lambda _left: (pb.ReleasePermitRequest(name=name, lease_id=lease.lease_id),
                                                        self._call_timeout),
                        until=None, idempotent=True, name=name, lease_id=lease.lease_id, secret=lease.secret)
                except LeaseLost:
                    return
                except (Unavailable, TlsError) as err:
                    log.debug("fencepost: withdraw of semaphore %r failed, retrying: %r", name, err)
                    await asyncio.sleep(next(delays))
                    continue
                except FencepostError as err:
                    log.warning("fencepost: could not withdraw from semaphore %r (lease %d; its keys end with the "
                                "lease): %s", name, lease.lease_id, err)
                    return
                if resp.found:
                    log.debug("fencepost: withdrew what an abandoned acquire left in semaphore %r (lease %d)",
                              name, lease.lease_id)
                return
        finally:
            slot.lock.release()
            self.pool.drop_slot_if_idle(lease.lease_id, kinds.semaphore_queue(name))

    async def _release_rpc(self, handle: AsyncLockHandle, until: float) -> None:
        if not handle._request_id:  # one per permit: a retry of its ReleasePermit answers as the first did
            handle._request_id = wire.new_request_id()
        request = pb.ReleasePermitRequest(name=handle.name, lease_id=handle.lease_id, slot=handle.slot,
                                          token=handle.token, request_id=handle._request_id)
        await self.transport.call("ReleasePermit", lambda left: (request, _bounded(self._call_timeout, left)),
                                  until=until, idempotent=True, name=handle.name, lease_id=handle.lease_id,
                                  token=handle.token, secret=handle._lease.secret)


class AsyncSemaphore:
    """Semaphore ``name`` of ``permits`` permits, as one :class:`~fencepost.client.AsyncLockClient` uses it.

    Made by :meth:`AsyncLockClient.semaphore`. At most ``permits`` holders at
    once, first come, first served; each permit has a slot (0 .. permits-1)
    and a fencing token strictly larger than every earlier token of that
    slot. The number of permits is fixed at the semaphore's first use.

    Usable as ``async with sem as permit:`` (acquire without timeout, release
    on exit; LeaseLost on exit if the permit was lost while the body ran and
    it raised nothing).

    Example::

        sem = client.semaphore("gpu", permits=3)
        async with sem as permit:
            await storage.write(f"gpu#{permit.slot}", data, token=permit.token)
    """

    def __init__(self, client: AsyncLockClient, locker: PermitLocker, name: str, permits: int, ttl: int) -> None:
        self._client = client
        self._locker = locker
        self.name = name
        self.permits = permits
        self.ttl = ttl
        self._entered: dict[asyncio.Task[object] | None, list[AsyncLockHandle]] = {}

    async def acquire(self, timeout: float | None = None) -> AsyncLockHandle:
        """Take a permit, waiting up to ``timeout`` seconds.

        Args:
            timeout: Seconds to wait, 0 to 86400 (0 tries once); None waits until granted.

        Returns:
            The permit's handle: ``.slot`` and ``.token`` (pass both to the storage), ``release()``.

        Raises:
            InvalidArgument: bad timeout (before any RPC).
            PermitsMismatch: the semaphore has another number of permits (``.permits`` says how many).
            LockTimeout: not granted within ``timeout`` (nothing is left queued).
            LeaseLost: the lease was lost while waiting, twice in a row.
            ResourceExhausted: too many waiters on the coordinator.
            Unavailable: no coordinator reachable.
            FencepostError: the client is closed, or was inherited through fork.
        """
        timeout = wire.check_timeout(timeout)
        until = await self._start(timeout)
        if until is not None and until - asyncio.get_running_loop().time() < _ONE_MS:
            try:
                return await self._locker.acquire_permit(self.name, self.permits, self.ttl, None, try_once=True)
            except LockHeld as held:
                raise LockTimeout(f"semaphore {self.name!r} granted no permit within 0 s: {held.message}",
                                  name=self.name, lease_id=held.lease_id) from None
        return await self._call(self._locker.acquire_permit(self.name, self.permits, self.ttl, until,
                                                            try_once=False))

    async def try_acquire(self) -> AsyncLockHandle:
        """Take a permit if one is free, without waiting.

        Returns:
            The permit's handle.

        Raises:
            LockHeld: every permit is held (``holder_lease_id``/``holder_token``: slot 0's holder, if any),
                or this client holds one under this TTL.
            PermitsMismatch, Unavailable, FencepostError: as :meth:`acquire`.
        """
        await self._start(None)
        return await self._call(self._locker.acquire_permit(self.name, self.permits, self.ttl, None, try_once=True))

    async def describe(self) -> SemaphoreInfo:
        """Report the permits, holders (slot, lease, token) and waiters of the semaphore (DescribeSemaphore).

        Raises:
            Unavailable: no coordinator reachable.
            FencepostError: the client is closed, or was inherited through fork.
        """
        await self._start(None)
        resp = await self._call(self._locker.transport.call(
            "DescribeSemaphore", lambda _left: (pb.DescribeSemaphoreRequest(name=self.name),
                                                self._locker._call_timeout),
            until=None, idempotent=True, name=self.name))
        return SemaphoreInfo.from_response(self.name, resp)

    async def _start(self, timeout: float | None) -> float | None:
        """Check the client is usable (open it if new); the loop time to stop waiting at, None for never."""
        self._client._check_fork()
        await self._client._ensure_open(self.name)
        return None if timeout is None else asyncio.get_running_loop().time() + timeout

    async def _call(self, step: Awaitable[T]) -> T:
        try:
            return await step
        except FencepostError as exc:
            closed = self._client._closed_error(self.name)
            if closed is not None and isinstance(exc, Unavailable):
                raise closed from exc
            raise

    async def __aenter__(self) -> AsyncLockHandle:
        handle = await self.acquire()
        self._entered.setdefault(asyncio.current_task(), []).append(handle)
        return handle

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        task = asyncio.current_task()
        handles = self._entered[task]
        handle = handles.pop()
        if not handles:
            del self._entered[task]
        if exc is None:
            await handle.release()
            return
        if isinstance(exc, asyncio.CancelledError) and task is not None and task in handle._cancelled_tasks \
                and task.uncancel() == 0:
            await self._locker.release_quietly(handle)
            raise LeaseLost(f"{handle.what} was lost", name=self.name, lease_id=handle.lease_id,
                            reason=handle.lost_reason) from exc
        with contextlib.suppress(FencepostError):
            await self._locker.release_quietly(handle)

    def __repr__(self) -> str:
        return f"<AsyncSemaphore name={self.name!r} permits={self.permits} ttl={self.ttl}>"
