"""The lock recipe, client side: Acquire, Release and Withdraw of one lock, written or read.

A :class:`LockRecipe` plugs the lock's calls into the acquire loop and the
release of :class:`~.holds.Holds`. The three calls go as messages on the
KeepAlive stream when it serves them (see :mod:`~fencepost.client._leases.calls`),
else as unary calls; the same rules either way:

- Acquire carries one request id for all its attempts (only the wait left
  changes); a refusal raises LockHeld (one try) or LockTimeout (the wait ran
  out), with the holder's lease and token when the coordinator sent them;
- Withdraw deletes what an abandoned Acquire may have left: a queued wait,
  or a grant that never reached its caller;
- Release carries one request id per hold (:meth:`AsyncLockHandle._release_request_id`):
  every attempt, and a release called again after one that failed
  (Unavailable), is the same call, so a retry of a Release that committed
  answers OK; hence it is retried after UNAVAILABLE like an idempotent call.

A read hold (``read=True``: a read-write lock's reader, docs/rwlocks.md)
sends all three with ``mode`` LOCK_MODE_READ; its handle's kind is
HOLD_KIND_READ, so its local exclusion and its hold watch are the reader's,
apart from the same client's write hold of the name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._transport import wire
from ..errors import LockHeld, LockTimeout
from ..handle import AsyncLockHandle
from ..v1 import kinds
from ..v1 import lock_pb2 as pb
from .recipe import Recipe, bounded, wait_request

if TYPE_CHECKING:
    from .._leases.lease import Lease
    from .holds import Holds

__all__ = ["LockRecipe"]


class LockRecipe(Recipe):
    """One acquire of lock ``name``, and the release of its grant.

    Args:
        holds: The client's holds and leases.
        name: The lock name (checked).
        lock_delay: The hold's lock-delay in whole seconds (checked), 0 for none.
        read: A read hold (shared with other readers), not a write hold.
    """

    def __init__(self, holds: Holds, name: str, lock_delay: int = 0, *, read: bool = False) -> None:
        super().__init__(holds, name, kinds.read_lock(name) if read else name)
        self.lock_delay = lock_delay
        self.mode = pb.LOCK_MODE_READ if read else pb.LOCK_MODE_WRITE
        self.kind = pb.HOLD_KIND_READ if read else pb.HOLD_KIND_LOCK
        self._withdraw_id = ""  # the request id of its Withdraw: the same on every retry

    def held_here(self, lease_id: int, *, waiting: bool) -> str:
        if waiting:
            return "lock is held by this client"
        return f"lock {self.name!r} is held by this client (lease {lease_id:#x})"

    def not_granted_now(self, held: LockHeld) -> str:
        return (f"lock {self.name!r} not granted within 0 s: it is held (lease {held.holder_lease_id}, "
                f"token {held.holder_token})")

    async def acquire_call(self, lease: Lease, until: float | None, try_once: bool) -> AsyncLockHandle:
        name, holds = self.name, self.holds
        request_id = wire.new_request_id()  # the same on every attempt (only the wait left changes)
        make = wait_request(lambda wait_ms, forever: pb.AcquireRequest(
            name=name, lease_id=lease.lease_id, wait_ms=wait_ms, wait_forever=forever,
            lock_delay_seconds=self.lock_delay, request_id=request_id, mode=self.mode), try_once=try_once,
            call_timeout=holds.call_timeout)
        resp = await holds.transport.call("Acquire", make, until=until, idempotent=True, name=name,
                                          lease_id=lease.lease_id, secret=lease.secret, stream=holds.stream.calls)
        if not resp.acquired:
            holder_lease = int(resp.holder.lease_id) if resp.HasField("holder") else 0
            holder_token = int(resp.holder.token) if resp.HasField("holder") else 0
            if not try_once:  # acquire(timeout=0): the one try failed
                raise LockTimeout(
                    f"lock is held (lease {holder_lease}, token {holder_token})", name=name, lease_id=lease.lease_id
                )
            message = (f"lock {name!r} is held by lease {holder_lease:#x} with token {holder_token}"
                       if resp.HasField("holder") else f"lock {name!r} is free but the lock-delay of a holder that "
                       "was lost has not passed yet")
            raise LockHeld(message, name=name, lease_id=lease.lease_id, holder_lease_id=holder_lease,
                           holder_token=holder_token)
        return AsyncLockHandle(name, lease, int(resp.token), self.release, kind=self.kind)

    async def withdraw_call(self, lease: Lease) -> str | None:
        holds = self.holds
        self._withdraw_id = self._withdraw_id or wire.new_request_id()
        request = pb.WithdrawRequest(name=self.name, lease_id=lease.lease_id, request_id=self._withdraw_id,
                                     mode=self.mode)
        resp = await holds.transport.call(
            "Withdraw", lambda _left: (request, holds.call_timeout), until=None, idempotent=True, name=self.name,
            lease_id=lease.lease_id, secret=lease.secret, stream=holds.stream.calls)
        if not resp.found:
            return None
        return "the grant" if resp.held else "the wait"

    async def release_call(self, handle: AsyncLockHandle, until: float) -> None:
        holds = self.holds
        request = pb.ReleaseRequest(name=handle.name, lease_id=handle.lease_id, token=handle.token,
                                    request_id=handle._release_request_id(), mode=self.mode)
        await holds.transport.call("Release", lambda left: (request, bounded(holds.call_timeout, left)),
                                   until=until, idempotent=True, name=handle.name, lease_id=handle.lease_id,
                                   token=handle.token, secret=handle.lease_secret, stream=holds.stream.calls)
