"""Semaphores with a fencing token per permit, client side: AcquirePermit, ReleasePermit, DescribeSemaphore.

A permit is a hold like a lock's (:class:`~fencepost.client.handle.AsyncLockHandle`
of kind ``HOLD_KIND_SEMAPHORE`` with its ``slot``): under the client's lease
for its TTL, registered in the lease's holds and watched on the KeepAlive
stream, so that its loss is signalled exactly as a lock's (``handle.lost``,
``on_lost``, ``cancel_on_lost``). Its token is strictly larger than every
earlier token of the same slot of the same semaphore: storage partitioned by
slot fences each slot like a lock (docs/recipes.md, "Semaphores").

The coordinator grants one permit per lease per semaphore (an AcquirePermit
of a lease that holds one returns it again). So, as for a lock, a second
local acquire of a semaphore under the same TTL waits for this client's
permit to be released: a client holds at most one permit of a semaphore per
TTL at a time; use several clients to hold several.

Calls and clean-up are the lock's (:class:`~.holds.Holds`, with a
:class:`PermitRecipe` in place of the lock's): an acquire that ends without a
definite answer is withdrawn (ReleasePermit with token 0), a release keeps
the permit until the coordinator answers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

from .._transport import wire
from ..errors import FencepostError, InvalidArgument, LeaseLost, LockHeld, LockTimeout, PermitsMismatch, Unavailable
from ..handle import AsyncLockHandle
from ..v1 import kinds
from ..v1 import lock_pb2 as pb
from ..v1.keys import MAX_PERMITS
from .recipe import Recipe, bounded, wait_request

if TYPE_CHECKING:
    from .._leases.lease import Lease
    from .holds import Holds

__all__ = ["AsyncSemaphore", "PermitHolder", "PermitRecipe", "SemaphoreInfo", "check_permits"]

T = TypeVar("T")


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


class PermitRecipe(Recipe):
    """One acquire of a permit of semaphore ``name`` (AcquirePermit), and the release of its grant (ReleasePermit).

    Args:
        holds: The client's holds and leases.
        name: The semaphore's name (checked).
        permits: Its number of permits (checked).
    """

    def __init__(self, holds: Holds, name: str, permits: int) -> None:
        # The local exclusion: one permit per lease and semaphore (handle.local_name).
        super().__init__(holds, name, kinds.semaphore_queue(name))
        self.permits = permits

    def held_here(self, lease_id: int, *, waiting: bool) -> str:
        return f"this client holds a permit of semaphore {self.name!r} (lease {lease_id:#x})"

    def not_granted_now(self, held: LockHeld) -> str:
        return f"semaphore {self.name!r} granted no permit within 0 s: {held.message}"

    def settled(self, err: BaseException) -> bool:
        return isinstance(err, PermitsMismatch) or super().settled(err)

    async def acquire_call(self, lease: Lease, until: float | None, try_once: bool) -> AsyncLockHandle:
        name, holds = self.name, self.holds
        request_id = wire.new_request_id()  # the same on every attempt (only the wait left changes)
        make = wait_request(lambda wait_ms, forever: pb.AcquirePermitRequest(
            name=name, lease_id=lease.lease_id, permits=self.permits, wait_ms=wait_ms, wait_forever=forever,
            request_id=request_id), try_once=try_once, call_timeout=holds.call_timeout)
        resp = await holds.transport.call("AcquirePermit", make, until=until, idempotent=True, name=name,
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
        return AsyncLockHandle(name, lease, int(resp.token), self.release, kind=kinds.HoldKind.HOLD_KIND_SEMAPHORE,
                               slot=int(resp.slot))

    async def withdraw_call(self, lease: Lease) -> str | None:
        """ReleasePermit with token 0: withdraw whatever the lease has in the semaphore."""
        holds = self.holds
        resp = await holds.transport.call(
            "ReleasePermit", lambda _left: (pb.ReleasePermitRequest(name=self.name, lease_id=lease.lease_id),
                                            holds.call_timeout),
            until=None, idempotent=True, name=self.name, lease_id=lease.lease_id, secret=lease.secret)
        return "what it left" if resp.found else None

    async def release_call(self, handle: AsyncLockHandle, until: float) -> None:
        holds = self.holds
        # One request id per permit: a retry of its ReleasePermit answers as the first did.
        request = pb.ReleasePermitRequest(name=handle.name, lease_id=handle.lease_id, slot=handle.slot,
                                          token=handle.token, request_id=handle._release_request_id())
        await holds.transport.call("ReleasePermit", lambda left: (request, bounded(holds.call_timeout, left)),
                                   until=until, idempotent=True, name=handle.name, lease_id=handle.lease_id,
                                   token=handle.token, secret=handle.lease_secret)


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

    def __init__(self, holds: Holds, name: str, permits: int, ttl: int, *,
                 usable: Callable[[str], Awaitable[None]],
                 closed_error: Callable[[str], FencepostError | None]) -> None:
        self._holds = holds
        self._usable = usable  # raises unless the client may call now (opens a new one)
        self._closed_error = closed_error  # the error of a call that close() ended, None while open
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
        await self._usable(self.name)
        until = None if timeout is None else asyncio.get_running_loop().time() + timeout
        return await self._call(self._holds.acquire(self._recipe(), self.ttl, until, try_once=False))

    async def try_acquire(self) -> AsyncLockHandle:
        """Take a permit if one is free, without waiting.

        Returns:
            The permit's handle.

        Raises:
            LockHeld: every permit is held (``holder_lease_id``/``holder_token``: slot 0's holder, if any),
                or this client holds one under this TTL.
            PermitsMismatch, Unavailable, FencepostError: as :meth:`acquire`.
        """
        await self._usable(self.name)
        return await self._call(self._holds.acquire(self._recipe(), self.ttl, None, try_once=True))

    async def describe(self) -> SemaphoreInfo:
        """Report the permits, holders (slot, lease, token) and waiters of the semaphore (DescribeSemaphore).

        Raises:
            Unavailable: no coordinator reachable.
            FencepostError: the client is closed, or was inherited through fork.
        """
        await self._usable(self.name)
        resp = await self._call(self._holds.transport.call(
            "DescribeSemaphore", lambda _left: (pb.DescribeSemaphoreRequest(name=self.name),
                                                self._holds.call_timeout),
            until=None, idempotent=True, name=self.name))
        return SemaphoreInfo.from_response(self.name, resp)

    def _recipe(self) -> PermitRecipe:
        return PermitRecipe(self._holds, self.name, self.permits)

    async def _call(self, step: Awaitable[T]) -> T:
        try:
            return await step
        except FencepostError as exc:
            closed = self._closed_error(self.name)
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
        if isinstance(exc, asyncio.CancelledError) and task is not None and handle._cancelled_by_loss(task) \
                and task.uncancel() == 0:
            await self._holds.release_quietly(handle)
            raise LeaseLost(f"{handle.what} was lost", name=self.name, lease_id=handle.lease_id,
                            reason=handle.lost_reason) from exc
        with contextlib.suppress(FencepostError):
            await self._holds.release_quietly(handle)

    def __repr__(self) -> str:
        return f"<AsyncSemaphore name={self.name!r} permits={self.permits} ttl={self.ttl}>"
