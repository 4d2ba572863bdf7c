"""Multi-locks, client side: several locks taken all together or none (AcquireAll), released together (ReleaseAll).

The coordinator puts the keys of every name in one etcd Txn, so they share
one create revision: no deadlock whatever order callers give the names, and
one fencing token per name (all equal, each strictly larger than that
name's earlier tokens); see ``coordinator/recipes/multilock.py``.

Here a grant is one :class:`~fencepost.client.AsyncLockHandle` per name,
kept under the lease and watched on the KeepAlive stream as a single lock's
hold is (each name's loss arrives as the lock's would), gathered in an
:class:`AsyncMultiLockHandle`: the loss of any one name loses the whole
multi-lock. The local exclusion of the client's pool (one local holder per
lease and name) is taken for every name, in sorted order (so two local
multi-locks cannot deadlock on it either), before the call.

No state outlives the call unless its caller holds it: a call that ends
without a definite answer (cancelled, the client's own deadline, the
transport failed) is withdrawn (ReleaseAll with token 0: every key of the
lease in those locks, one Txn), keeping the local slots until then.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence

from .._fork import generation
from .._leases.lease import Lease, Slot
from .._transport import wire
from ..errors import REASON_DEADLINE, FencepostError, InvalidArgument, LeaseLost, LockHeld, LockTimeout, NotHolder
from ..handle import AsyncLockHandle
from ..v1 import lock_pb2 as pb
from ..v1.keys import MAX_MULTILOCK_NAMES
from ..v1.names import multilock_problem
from .holds import Holds
from .lock import LockRecipe
from .recipe import LEASE_EXPIRED, bounded, settled, wait_request

__all__ = ["AsyncMultiLockHandle", "acquire_all", "check_names"]

log = logging.getLogger("fencepost.client")



def check_names(names: Sequence[str]) -> list[str]:
    """Check the names of a multi-lock before any call: 2 to :data:`MAX_MULTILOCK_NAMES` distinct lock names.

    Raises:
        InvalidArgument: field ``names``.
    """
    if isinstance(names, str):
        raise InvalidArgument("names must be a sequence of lock names, not one str", field="names")
    names = list(names)
    problem = multilock_problem(names, MAX_MULTILOCK_NAMES)
    if problem is not None:
        raise InvalidArgument(problem, field="names")
    for name in names:
        try:
            wire.check_name(name)
        except InvalidArgument as exc:
            raise InvalidArgument(f"names: {exc.message}", field="names") from exc
    return names


class AsyncMultiLockHandle:
    """One grant of several locks together, each with its fencing token.

    Returned by :meth:`AsyncLockClient.acquire_all` and friends; not built by
    callers. Write each resource with the token of its own name
    (:meth:`token_for`): tokens are ordered per name. The multi-lock is lost
    as soon as any one of its names is (its key deleted, the lease gone):
    ``lost`` is set, ``on_lost`` callbacks run, ``cancel_on_lost`` tasks are
    cancelled, as for a single lock's handle.

    Attributes:
        lost: Set (once) when any name's hold is lost; never set by a release.
        handles: name -> the single-lock handle of that name (read-only use).
    """

    def __init__(self, holds: Holds, names: list[str], lease: Lease, tokens: Sequence[int]) -> None:
        self._holds = holds
        self._names = names
        self._lease = lease
        self.handles: dict[str, AsyncLockHandle] = {
            name: AsyncLockHandle(name, lease, token, self._release_member) for name, token in zip(names, tokens)}
        self.lost = asyncio.Event()
        self._lost_reason: str | None = None
        self._lost_name: str | None = None
        self._released = False
        self._request_id = ""
        self._release_call: asyncio.Future[None] | None = None
        self._callbacks: list[Callable[[AsyncMultiLockHandle], object]] = []
        self._tasks: list[asyncio.Task[object]] = []
        self._generation = generation()
        for handle in self.handles.values():
            handle._add_lost_hook(self._member_lost)

    @property
    def names(self) -> list[str]:
        """The lock names, in the order given."""
        return list(self._names)

    @property
    def tokens(self) -> dict[str, int]:
        """name -> the fencing token of that name (all equal: the keys' create revision plus the token floor)."""
        return {name: handle.token for name, handle in self.handles.items()}

    def token_for(self, name: str) -> int:
        """The fencing token of lock ``name`` of this multi-lock.

        Raises:
            KeyError: ``name`` is not one of :attr:`names`.
        """
        return self.handles[name].token

    @property
    def lease_id(self) -> int:
        """The lease that holds every name."""
        return self._lease.lease_id

    @property
    def lease_secret(self) -> str:
        """The lease's secret, as :attr:`AsyncLockHandle.lease_secret` (a credential: never log it)."""
        return self._lease.secret

    @property
    def ttl(self) -> int:
        """The lease's granted TTL in seconds."""
        return self._lease.ttl

    @property
    def deadline(self) -> float:
        """The conservative local deadline of the lease, on ``time.monotonic()`` (see :attr:`AsyncLockHandle.deadline`).

        Returns:
            Seconds on the monotonic clock: send time of the last acknowledged keepalive + granted TTL
            - :attr:`margin`; the same for every name (one lease).
        """
        return self._lease.deadline

    @property
    def margin(self) -> float:
        """Seconds the local deadline keeps short of the granted TTL (as :attr:`AsyncLockHandle.margin`)."""
        return self._lease.margin

    @property
    def lost_reason(self) -> str | None:
        """Why the multi-lock was lost (the first lost name's reason), None while held or once released."""
        return self._lost_reason

    @property
    def lost_name(self) -> str | None:
        """The name whose hold was lost first (the multi-lock was lost with it), None while held."""
        return self._lost_name

    @property
    def released(self) -> bool:
        """Whether it was released (or its client closed)."""
        return self._released or all(handle.released for handle in self.handles.values())

    def valid_for(self) -> float:
        """Seconds the multi-lock is believed held, at most (0 once lost): the least of its names'."""
        return min(handle.valid_for() for handle in self.handles.values())

    def is_valid(self) -> bool:
        """Whether every name is believed held now (an early warning only: fence every write)."""
        return all(handle.is_valid() for handle in self.handles.values())

    def check(self) -> None:
        """Raise unless every name is believed held.

        Raises:
            LeaseLost: a name's hold was lost (or its local deadline passed).
            FencepostError: released, or inherited through fork (reason "FORKED").
        """
        for handle in self.handles.values():
            handle.check()

    async def release(self) -> None:
        """Release every name: one ReleaseAll call, one etcd Txn (all or nothing).

        Cancellation-safe as a single lock's release: the call goes on when its
        caller is cancelled, and every name stays held until the server answers.

        Raises:
            NotHolder: already released, or a name is no longer held (nothing was released by the call).
            StaleTokenError: as :meth:`AsyncLockHandle.release`.
            LeaseLost: the lease is gone, or a name was lost before the release (the rest is
                released in the background).
            Unavailable: no coordinator reachable (every name is kept).
            FencepostError: the client is closed, or the handle was inherited through fork.
        """
        if self._generation != generation():
            raise FencepostError("multi-lock handle inherited through fork", name=self._names[0],
                                 lease_id=self.lease_id, reason="FORKED")
        holds = self._holds
        if not holds.is_open and self._lost_reason is None:
            raise FencepostError("client is closed", name=self._names[0], lease_id=self.lease_id)
        if self.released:
            raise NotHolder("multi-lock was already released", name=self._names[0], lease_id=self.lease_id)
        if self._lost_reason is not None:  # the names still held are being released (_release_rest)
            self._released = True
            raise LeaseLost(f"multi-lock hold was lost before release: {self._lost_name!r} first",
                            name=self._lost_name, lease_id=self.lease_id, reason=self._lost_reason)
        if self._release_call is None:
            deadline = asyncio.get_running_loop().time() + holds.call_timeout
            call = self._release_call = asyncio.ensure_future(self._release_all(deadline))
            call.add_done_callback(self._release_ended)
            for handle in self.handles.values():
                handle._start_release(lambda: call, lambda done, h=handle: holds.settle_release(h, done))
        await asyncio.shield(self._release_call)

    def on_lost(self, callback: Callable[[AsyncMultiLockHandle], object]) -> None:
        """Call ``callback(handle)`` once, in a new daemon thread, when the multi-lock is lost (at once if it is)."""
        if self._lost_reason is not None:
            _in_thread(callback, self)
        elif not self._released:
            self._callbacks.append(callback)

    def cancel_on_lost(self, task: asyncio.Task[object] | None = None) -> None:
        """Cancel ``task`` (the current task by default) when the multi-lock is lost (at once if it is).

        Raises:
            RuntimeError: no task given and none is running.
        """
        task = task if task is not None else asyncio.current_task()
        if task is None:
            raise RuntimeError("cancel_on_lost() needs a task outside of a running task")
        if self._lost_reason is not None:
            task.cancel(f"fencepost: multi-lock {self._names!r} lost ({self._lost_reason})")
        elif not self._released:
            self._tasks.append(task)

    async def _release_all(self, until: float) -> None:
        holds = self._holds
        self._request_id = self._request_id or wire.new_request_id()
        token = self.handles[self._names[0]].token
        request = pb.ReleaseAllRequest(names=self._names, lease_id=self.lease_id, token=token,
                                       request_id=self._request_id)
        await holds.transport.call("ReleaseAll", lambda left: (request, bounded(holds.call_timeout, left)),
                                   until=until, idempotent=True, name=self._names[0], lease_id=self.lease_id,
                                   token=token, secret=self._lease.secret)

    def _release_ended(self, done: asyncio.Future[None]) -> None:
        self._release_call = None
        if not done.cancelled() and done.exception() is None:
            self._released = True
            self._callbacks.clear()
            self._tasks.clear()

    async def _release_member(self, _handle: AsyncLockHandle) -> None:
        await self.release()

    def _member_lost(self, handle: AsyncLockHandle) -> None:
        """A name's hold was lost: the whole multi-lock is (hook of each member, on the loop)."""
        if self._lost_reason is not None or self._released:
            return
        self._lost_reason = handle.lost_reason or LEASE_EXPIRED
        self._lost_name = handle.name
        self.lost.set()
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            _in_thread(callback, self)
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            if not task.done():
                task.cancel(f"fencepost: multi-lock {self._names!r} lost ({self._lost_reason})")
        self._holds.spawn(self._release_rest(), f"fencepost-release-{self._names[0]}")

    async def _release_rest(self) -> None:
        """Release the names still held once one is lost: each by its own token (a Release each), so that
        nothing newer of the lease in those locks can be deleted; failures are logged (the keys end with the
        lease)."""
        for name, handle in self.handles.items():
            if handle.lost_reason is None and not handle.released:
                try:
                    await self._holds.release(handle, LockRecipe(self._holds, name).release_call)
                except FencepostError as err:
                    log.debug("fencepost: release of %r after its multi-lock was lost: %r", name, err)

    def __repr__(self) -> str:
        state = "released" if self._released else f"lost:{self._lost_reason}" if self._lost_reason else "held"
        return f"<AsyncMultiLockHandle names={self._names!r} lease_id={self.lease_id} tokens={self.tokens} {state}>"


def _in_thread(callback: Callable[[AsyncMultiLockHandle], object], handle: AsyncMultiLockHandle) -> None:
    def run() -> None:
        try:
            callback(handle)
        except Exception:  # noqa: BLE001
            log.exception("fencepost: on_lost callback %r failed", callback)

    threading.Thread(target=run, name="fencepost-on-lost", daemon=True).start()


async def acquire_all(holds: Holds, names: list[str], ttl: int, until: float | None, *,
                      try_once: bool) -> AsyncMultiLockHandle:
    """Take every lock of ``names`` under the lease for ``ttl`` (see ``AsyncLockClient.acquire_all``).

    Args:
        holds: The client's holds and leases.
        names: 2 to 32 distinct lock names (checked).
        ttl: Requested TTL in whole seconds (checked).
        until: Loop time after which to give up waiting, or None.
        try_once: Fail with LockHeld instead of waiting.

    Raises:
        LockHeld, LockTimeout, LeaseLost, FencepostError: as the public methods say.
    """
    if until is not None and not try_once and until - asyncio.get_running_loop().time() < 0.001:
        try:
            return await acquire_all(holds, names, ttl, None, try_once=True)
        except LockHeld as held:
            raise LockTimeout(f"locks {names!r} not all granted within 0 s: {held}", name=held.name,
                              lease_id=held.lease_id) from None
    lease = await holds.lease_for(ttl, until)
    holds.pool.used(lease)
    slots: list[tuple[str, Slot]] = []
    taken: list[Slot] = []
    try:
        for name in sorted(names):  # one order for every local multi-lock: no local deadlock
            slot = holds.pool.slot(lease.lease_id, name)
            slot.users += 1
            slots.append((name, slot))
            if try_once and (slot.lock.locked() or slot.users > 1):
                raise LockHeld(f"lock {name!r} is held by this client (lease {lease.lease_id:#x})", name=name,
                               lease_id=lease.lease_id, holder_lease_id=lease.lease_id,
                               holder_token=slot.holder.token if slot.holder is not None else 0)
            left = None if until is None else max(0.0, until - asyncio.get_running_loop().time())
            try:
                await asyncio.wait_for(slot.lock.acquire(), left)
            except TimeoutError:
                raise LockTimeout("lock is held by this client", name=name, lease_id=lease.lease_id) from None
            taken.append(slot)
        try:
            tokens = await _acquire_call(holds, names, lease, until, try_once)
        except BaseException as err:
            if settled(err) or lease.lost or not holds.is_open:
                raise
            await holds.clean_up(_withdraw(holds, names, lease, [(n, s) for n, s in slots if s in taken]),
                                 f"fencepost-withdraw-{names[0]}")
            taken = []  # the withdrawal frees them once done
            raise
        handle = AsyncMultiLockHandle(holds, names, lease, tokens)
        if lease.lost:
            holds.spawn(_withdraw(holds, names, lease), f"fencepost-release-{names[0]}")
            raise LeaseLost("the lease was lost while acquiring", name=names[0], lease_id=lease.lease_id,
                            reason=lease.lost_reason or LEASE_EXPIRED)
        by_name = dict(slots)
        for name, member in handle.handles.items():
            holds.keep("acquiring", member)
            by_name[name].holder = member
        taken = []  # each member's release or loss frees its slot
        return handle
    finally:
        for slot in taken:
            slot.lock.release()
        for name, slot in slots:
            slot.users -= 1
            holds.pool.drop_slot_if_idle(lease.lease_id, name)
        holds.pool.unused(lease)


async def _acquire_call(holds: Holds, names: list[str], lease: Lease, until: float | None, try_once: bool
                        ) -> list[int]:
    """AcquireAll: the tokens in the order of ``names``; LockHeld when trying once and a name is held."""
    request_id = wire.new_request_id()  # the same on every attempt
    make = wait_request(lambda wait_ms, forever: pb.AcquireAllRequest(
        names=names, lease_id=lease.lease_id, wait_ms=wait_ms, wait_forever=forever, request_id=request_id),
        try_once=try_once, call_timeout=holds.call_timeout)
    resp = await holds.transport.call("AcquireAll", make, until=until, idempotent=True, name=names[0],
                                      lease_id=lease.lease_id, secret=lease.secret)
    if not resp.acquired:
        holder_lease = int(resp.holder.lease_id) if resp.HasField("holder") else 0
        holder_token = int(resp.holder.token) if resp.HasField("holder") else 0
        held = resp.held_name or names[0]
        message = (f"lock {held!r} is held by lease {holder_lease:#x} with token {holder_token}"
                   if resp.HasField("holder") else f"lock {held!r} is free but a lock-delay holds it back")
        raise LockHeld(f"{message}: none of {names!r} taken", name=held, lease_id=lease.lease_id,
                       holder_lease_id=holder_lease, holder_token=holder_token)
    return [int(token) for token in resp.tokens]


async def _withdraw(holds: Holds, names: list[str], lease: Lease, slots: Sequence[tuple[str, Slot]] = ()) -> None:
    """ReleaseAll with token 0: delete every key of ``lease`` in those locks (retried while the lease lives);
    then free ``slots``."""
    try:
        request = pb.ReleaseAllRequest(names=names, lease_id=lease.lease_id, token=0,
                                       request_id=wire.new_request_id())
        while not lease.lost and holds.is_open:
            try:
                await holds.transport.call("ReleaseAll", lambda _left: (request, holds.call_timeout), until=None,
                                           idempotent=True, name=names[0], lease_id=lease.lease_id,
                                           secret=lease.secret)
                return
            except LeaseLost:
                return
            except FencepostError as err:
                if err.reason == REASON_DEADLINE:
                    return
                log.warning("fencepost: could not withdraw %r (lease %d; what the acquire left ends with the "
                            "lease): %s", names, lease.lease_id, err)
                return
    finally:
        for name, slot in slots:
            slot.lock.release()
            holds.pool.drop_slot_if_idle(lease.lease_id, name)
