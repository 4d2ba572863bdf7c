"""Lock handles of the asyncio client.

An :class:`AsyncLockHandle` is one hold: one grant of one lock under a lease
(:class:`~fencepost.client._leases.lease.Lease`), with its fencing token. It is lost
exactly once, whichever detection path fires first (local deadline, an
acknowledgement saying the lease is gone, a HoldEnded event, a reconnect
finding the lease gone), and never after it was released.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from . import _fork
from .errors import REASON_DEADLINE, LeaseLost, NotHolder
from .v1 import kinds

if TYPE_CHECKING:
    from ._leases.lease import Lease

__all__ = ["AsyncLockHandle"]

log = logging.getLogger("fencepost.client")


#: What a fork refusal calls a handle of each kind of hold (a lock's: "lock handle").
_HANDLE_WORDS = {kinds.HoldKind.HOLD_KIND_ELECTION: "leadership handle",
                 kinds.HoldKind.HOLD_KIND_SEMAPHORE: "permit handle"}


def hold_words(kind: int, name: str, slot: int = 0) -> str:
    """A hold as the client's error messages name it: ``"lock"`` (the lock's name is in the error's ``name``,
    and the lock messages stay as they were), ``"leadership of election 'e'"``, ``"permit 2 of semaphore 's'"``.

    Args:
        kind: A ``HoldKind``.
        name: The lock, election or semaphore name.
        slot: The permit slot (semaphores).
    """
    if kind == kinds.HoldKind.HOLD_KIND_ELECTION:
        return f"leadership of election {name!r}"
    if kind == kinds.HoldKind.HOLD_KIND_SEMAPHORE:
        return f"permit {slot} of semaphore {name!r}"
    return "lock"


def _hold(what: str) -> str:
    """``what`` as the thing that is lost: "lock hold" for a lock (as the messages always said), else ``what``."""
    return "lock hold" if what == "lock" else what


def _run_in_thread(callback: Callable[[object], object], arg: object) -> None:
    """Run ``callback(arg)`` in a new daemon thread, logging what it raises."""

    def run() -> None:
        try:
            callback(arg)
        except BaseException:  # noqa: BLE001 - a user callback must not kill the client
            log.exception("fencepost: on_lost callback %r failed", callback)

    threading.Thread(target=run, name="fencepost-on-lost", daemon=True).start()


class AsyncLockHandle:
    """One grant of a lock, held under a lease, with its fencing token.

    Returned by :meth:`AsyncLockClient.acquire` and friends; not built by
    callers. Pass :attr:`token` to the storage with every write: the lease can
    be lost at any moment (a pause longer than the TTL), and only the storage
    can then refuse the late write.

    In a child forked from the process that made it, a handle is never
    valid (``valid_for()`` is 0) and :meth:`check`, :meth:`release`,
    :meth:`on_lost` and :meth:`cancel_on_lost` raise FencepostError (reason
    "FORKED") at once: the hold stays the parent's.

    Attributes:
        lost: Set (once) when the hold is lost; never set by a release.
        lost_reason: Why it was lost (``"DEADLINE"``, ``"LEASE_EXPIRED"``,
            ``"NOT_HOLDER"``...), None while not lost.
    """

    def __init__(
        self,
        name: str,
        lease: Lease,
        token: int,
        release: Callable[[AsyncLockHandle], Awaitable[None]],
        *,
        kind: int = 0,
        slot: int = 0,
    ) -> None:
        self._name = name
        self._kind = kind
        self._slot = slot
        #: The hold's name in the client's bookkeeping: the lock name, or the internal
        #: name of an election's or a semaphore slot's lock (:mod:`fencepost.client.v1.kinds`).
        self.hold_name = kinds.internal_name(kind, name, slot)
        self._lease = lease
        self._token = token
        self._release_fn = release
        self.lost = asyncio.Event()
        self.lost_reason: str | None = None
        self._released = False
        self._releasing = False
        self._release_task: asyncio.Future[None] | None = None  # the Release call in flight
        self._request_id = ""  # the request id of its Release: one per hold, the same on every retry
        self._ended_during_release: str | None = None
        self._callbacks: list[Callable[[AsyncLockHandle], object]] = []
        self._hooks: list[Callable[[AsyncLockHandle], None]] = []
        self._tasks: list[asyncio.Task[object]] = []
        self._cancelled_tasks: set[asyncio.Task[object]] = set()
        self._generation = _fork.generation()

    @property
    def name(self) -> str:
        """The lock name (the election's or semaphore's, for those holds)."""
        return self._name

    @property
    def kind(self) -> int:
        """What this is a hold of: a ``HoldKind`` (``HOLD_KIND_LOCK``, ``_ELECTION``, ``_SEMAPHORE``)."""
        return self._kind

    @property
    def slot(self) -> int:
        """The permit slot (0 .. permits-1) of a semaphore permit; 0 for other holds."""
        return self._slot

    @property
    def what(self) -> str:
        """What this is a hold of, as error messages say it: ``"lock"``, ``"leadership of election 'e'"``,
        ``"permit 2 of semaphore 's'"`` (a lock's name is in the errors' ``name`` already)."""
        return hold_words(self._kind, self._name, self._slot)

    @property
    def local_name(self) -> str:
        """The name of this hold's local exclusion in the client's lease pool (one local holder per lease):
        the lock name, an election's internal name, a semaphore's queue (one permit per lease per semaphore)."""
        if self._kind == kinds.HoldKind.HOLD_KIND_SEMAPHORE:
            return kinds.semaphore_queue(self._name)
        return self.hold_name

    @property
    def lease_id(self) -> int:
        """The id of the lease holding the lock."""
        return self._lease.lease_id

    @property
    def lease_secret(self) -> str:
        """The secret of the lease holding the lock: whoever presents it may act on the lease ("" when the
        coordinator sent none). A credential: never log it; it is not in the handle's repr."""
        return self._lease.secret

    @property
    def token(self) -> int:
        """The fencing token of this grant (> 0: its key's create revision + the token floor)."""
        return self._token

    @property
    def ttl(self) -> int:
        """The lease's TTL in seconds as granted by the server (>= the requested TTL)."""
        return self._lease.ttl

    @property
    def released(self) -> bool:
        """Whether :meth:`release` has completed (or the client closed)."""
        return self._released

    @property
    def deadline(self) -> float:
        """The conservative local deadline of the hold's lease, on ``time.monotonic()``.

        Returns:
            Seconds on the monotonic clock: send time of the last acknowledged
            keepalive + granted TTL - :attr:`margin`. It only moves forward;
            past it the hold is reported lost even if no message arrived.
        """
        return self._lease.deadline

    @property
    def margin(self) -> float:
        """Seconds the local deadline keeps short of the granted TTL (``min(1, max(0.1, TTL / 10))``)."""
        return self._lease.margin

    def valid_for(self) -> float:
        """Seconds left on the conservative local deadline.

        Returns:
            Seconds (float) before the hold must be assumed lost; 0.0 once
            lost or released. A lower bound computed from the send time of
            the last acknowledged keepalive; not a promise that no one else
            holds the lock (use the token for that). 0.0 in a forked child.
        """
        if self._released or self.lost_reason is not None or self._inherited():
            return 0.0
        return self._lease.remaining()

    def is_valid(self) -> bool:
        """Whether the hold is still believed live (``valid_for() > 0``)."""
        return self.valid_for() > 0.0

    def check(self) -> None:
        """Raise unless the hold is still believed live.

        Raises:
            LeaseLost: the hold was lost, or its local deadline has passed
                (``.reason`` says why).
            NotHolder: the handle was released.
            FencepostError: the handle was inherited through fork (reason "FORKED").
        """
        self._check_fork()
        if self._released:
            raise NotHolder(f"{self.what} was released", name=self._name, lease_id=self.lease_id)
        if self.lost_reason is not None:
            raise LeaseLost(f"{_hold(self.what)} was lost", name=self._name, lease_id=self.lease_id,
                            reason=self.lost_reason)
        if self._lease.remaining() <= 0.0:
            raise LeaseLost(
                "lease deadline passed", name=self._name, lease_id=self.lease_id, reason=REASON_DEADLINE
            )

    async def release(self) -> None:
        """Release the lock (one Release RPC).

        Cancellation-safe: the Release call goes on when its caller is
        cancelled, and the handle keeps its ownership until the server
        answers (then it is released, or lost if the server refused); a
        release called again meanwhile waits for the same call. On a handle already
        lost, the release is still attempted when the server may not know
        yet, and LeaseLost is raised.

        Raises:
            NotHolder: the lease no longer holds the lock, or it was already
                released.
            StaleTokenError: the lease holds the lock under a newer token.
            LeaseLost: the lease is gone, or the hold was lost before release.
            Unavailable: no coordinator reachable (ownership is kept).
            FencepostError: the handle was inherited through fork (reason
                "FORKED"; the parent keeps the hold).
        """
        self._check_fork()
        await self._release_fn(self)

    def on_lost(self, callback: Callable[[AsyncLockHandle], object]) -> None:
        """Call ``callback(handle)`` once when the hold is lost.

        The callback runs in a new daemon thread, so that one that blocks does
        not stall the client. Registered after the loss, it is called at once.
        It is never called for a released handle. Exceptions are logged.
        Call from the event loop that runs the client.

        Args:
            callback: Called with this handle; its return value is ignored.

        Raises:
            FencepostError: the handle was inherited through fork (reason "FORKED").
        """
        self._check_fork()
        if self.lost_reason is not None:
            _run_in_thread(callback, self)  # type: ignore[arg-type]
        elif not self._released:
            self._callbacks.append(callback)

    def cancel_on_lost(self, task: asyncio.Task[object] | None = None) -> None:
        """Cancel ``task`` when the hold is lost (at once if it already is).

        Inside :meth:`AsyncLockClient.lock`, such a cancellation of the
        current task surfaces as LeaseLost from the ``async with`` block.

        Args:
            task: The task to cancel; the current task by default.

        Raises:
            RuntimeError: no task given and none is running.
            FencepostError: the handle was inherited through fork (reason "FORKED").
        """
        self._check_fork()
        if task is None:
            task = asyncio.current_task()
            if task is None:
                raise RuntimeError("cancel_on_lost() needs a task outside of a running task")
        if self.lost_reason is not None:
            self._cancel(task)
        elif not self._released:
            self._tasks.append(task)

    def _inherited(self) -> bool:
        return self._generation != _fork.generation()

    def _check_fork(self) -> None:
        if self._inherited():
            raise _fork.inherited_error(_HANDLE_WORDS.get(self._kind, "lock handle"), name=self._name,
                                        lease_id=self.lease_id)

    def _cancel(self, task: asyncio.Task[object]) -> None:
        if not task.done():
            self._cancelled_tasks.add(task)
            task.cancel(f"fencepost: {kinds.describe(self.hold_name)} lost ({self.lost_reason})")

    def _mark_lost(self, reason: str) -> bool:
        """Signal the loss once: set ``lost``, run hooks, callbacks, cancel tasks.

        Returns:
            True the first time; False if already lost or released.
        """
        if self.lost_reason is not None or self._released:
            return False
        self.lost_reason = reason
        self.lost.set()
        for hook in self._hooks:
            try:
                hook(self)
            except Exception:  # noqa: BLE001
                log.exception("fencepost: lost hook failed")
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            _run_in_thread(callback, self)  # type: ignore[arg-type]
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            self._cancel(task)
        return True

    def _mark_released(self) -> None:
        self._released = True
        self._releasing = False
        self._callbacks.clear()
        self._tasks.clear()

    def __repr__(self) -> str:
        state = "released" if self._released else f"lost:{self.lost_reason}" if self.lost_reason else "held"
        slot = f" slot={self._slot}" if self._kind == kinds.HoldKind.HOLD_KIND_SEMAPHORE else ""
        return (
            f"<AsyncLockHandle name={self._name!r}{slot} lease_id={self.lease_id} token={self._token} "
            f"ttl={self.ttl} {state}>"
        )
