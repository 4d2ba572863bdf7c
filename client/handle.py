"""Hold handles: what one hold is, and the asyncio handle that owns its state.

A hold is one grant of one lock (an election's leadership, a semaphore's
permit) under a lease (:class:`~fencepost.client._leases.lease.Lease`), with
its fencing token. :class:`HoldView` gives the read-only properties of a hold
once, for the asyncio :class:`AsyncLockHandle` and the sync
:class:`~fencepost.client.LockHandle`.

An :class:`AsyncLockHandle` is the only writer of its own state: the recipe
that made it, the lease pool and the KeepAlive stream change it through its
methods (:meth:`~AsyncLockHandle._start_release`,
:meth:`~AsyncLockHandle._note_hold_ended`, :meth:`~AsyncLockHandle._mark_lost`,
:meth:`~AsyncLockHandle._mark_released`). It is lost exactly once, whichever
detection path fires first (local deadline, an acknowledgement saying the
lease is gone, a HoldEnded event, a reconnect finding the lease gone), and
never after it was released.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from . import _fork
from ._transport import wire
from .errors import REASON_DEADLINE, LeaseLost, NotHolder
from .v1 import kinds

if TYPE_CHECKING:
    from ._leases.lease import Lease

__all__ = ["AsyncLockHandle", "HoldView"]

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
    if kind == kinds.HoldKind.HOLD_KIND_READ:
        return "read lock"
    return "lock"


def _lost_words(what: str) -> str:
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


class HoldView:
    """The read-only properties of one hold, written once for :class:`AsyncLockHandle` and the sync ``LockHandle``.

    Args:
        hold: The asyncio handle whose state this shows (an AsyncLockHandle shows its own).
    """

    def __init__(self, hold: AsyncLockHandle) -> None:
        self._hold = hold

    @property
    def name(self) -> str:
        """The lock name (the election's or semaphore's, for those holds)."""
        return self._hold._name

    @property
    def slot(self) -> int:
        """The permit slot (0 .. permits-1) of a semaphore permit; 0 for other holds."""
        return self._hold._slot

    @property
    def read(self) -> bool:
        """Whether this is a read hold of a read-write lock (``read=True``, docs/rwlocks.md), shared with readers."""
        return self._hold._kind == kinds.HoldKind.HOLD_KIND_READ

    @property
    def lease_id(self) -> int:
        """The id of the lease holding the lock."""
        return self._hold._lease.lease_id

    @property
    def lease_secret(self) -> str:
        """The secret of the lease holding the lock: whoever presents it may act on the lease ("" when the
        coordinator sent none). A credential: never log it; it is not in the handle's repr."""
        return self._hold._lease.secret

    @property
    def token(self) -> int:
        """The fencing token of this grant (> 0: its key's create revision + the token floor)."""
        return self._hold._token

    @property
    def ttl(self) -> int:
        """The lease's TTL in seconds as granted by the server (>= the requested TTL)."""
        return self._hold._lease.ttl

    @property
    def lost_reason(self) -> str | None:
        """Why the hold was lost (``"DEADLINE"``, ``"LEASE_EXPIRED"``, ``"NOT_HOLDER"``...), None while not lost."""
        return self._hold._lost_reason

    @property
    def released(self) -> bool:
        """Whether :meth:`release` has completed (or the client closed)."""
        return self._hold._released

    @property
    def deadline(self) -> float:
        """The conservative local deadline of the hold's lease, on ``time.monotonic()``.

        Returns:
            Seconds on the monotonic clock: send time of the last acknowledged
            keepalive + granted TTL - :attr:`margin`. It only moves forward;
            past it the hold is reported lost even if no message arrived.
        """
        return self._hold._lease.deadline

    @property
    def margin(self) -> float:
        """Seconds the local deadline keeps short of the granted TTL (``min(1, max(0.1, TTL / 10))``)."""
        return self._hold._lease.margin

    def valid_for(self) -> float:
        """Seconds left on the conservative local deadline.

        Returns:
            Seconds (float) before the hold must be assumed lost; 0.0 once
            lost or released. A lower bound computed from the send time of
            the last acknowledged keepalive; not a promise that no one else
            holds the lock (use the token for that). 0.0 in a forked child.
        """
        if self.released or self.lost_reason is not None or self._inherited():
            return 0.0
        return self._hold._lease.remaining()

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
        hold = self._hold
        if self.released:
            raise NotHolder(f"{hold.what} was released", name=self.name, lease_id=self.lease_id)
        if self.lost_reason is not None:
            raise LeaseLost(f"{_lost_words(hold.what)} was lost", name=self.name, lease_id=self.lease_id,
                            reason=self.lost_reason)
        if hold._lease.remaining() <= 0.0:
            raise LeaseLost(
                "lease deadline passed", name=self.name, lease_id=self.lease_id, reason=REASON_DEADLINE
            )

    def _inherited(self) -> bool:
        return self._hold._generation != _fork.generation()

    def _check_fork(self) -> None:
        if self._inherited():
            raise _fork.inherited_error(_HANDLE_WORDS.get(self._hold._kind, "lock handle"), name=self.name,
                                        lease_id=self.lease_id)


class AsyncLockHandle(HoldView):
    """One grant of a lock, held under a lease, with its fencing token.

    Returned by :meth:`AsyncLockClient.acquire` and friends; not built by
    callers. Pass :attr:`token` to the storage with every write: the lease can
    be lost at any moment (a pause longer than the TTL), and only the storage
    can then refuse the late write.

    In a child forked from the process that made it, a handle is never
    valid (``valid_for()`` is 0) and :meth:`check`, :meth:`release`,
    :meth:`on_lost` and :meth:`cancel_on_lost` raise FencepostError (reason
    "FORKED") at once: the hold stays the parent's.

    The methods under "Bookkeeping" are the client's: the recipe that made
    the handle, the lease pool and the KeepAlive stream change its state
    through them. Applications do not call them.

    Attributes:
        lost: Set (once) when the hold is lost; never set by a release
            (:attr:`lost_reason` says why).
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
        super().__init__(self)
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
        self._lost_reason: str | None = None
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
    def kind(self) -> int:
        """What this is a hold of: a ``HoldKind`` (``HOLD_KIND_LOCK``, ``_ELECTION``, ``_SEMAPHORE``, ``_READ``)."""
        return self._kind

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
        if self._lost_reason is not None:
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
        if self._lost_reason is not None:
            self._cancel(task)
        elif not self._released:
            self._tasks.append(task)

    # ------------------------------------------------------------------ bookkeeping (the client's)
    # Called by the client's own modules (the recipes, the lease pool, the KeepAlive stream), never by
    # applications: underscore names, so that they stay out of the public API. They read ``_lease``,
    # ``_releasing`` and ``_ended_during_release``; only these methods write the hold's state.

    def _release_request_id(self) -> str:
        """The request id of this hold's Release: made at first use, the same on every retry and later call."""
        if not self._request_id:
            self._request_id = wire.new_request_id()
        return self._request_id

    def _start_release(self, call: Callable[[], Awaitable[None]],
                      settle: Callable[[asyncio.Future[None]], None]) -> asyncio.Future[None]:
        """The Release call of this hold: ``call()`` started unless one is in flight, shared by every caller.

        The call is not cancelled with its caller: a Release that reached the
        server may have committed, and only its answer tells. When it ends,
        the hold is no longer releasing and ``settle(done)`` applies
        its outcome (also when every caller was cancelled).

        Returns:
            The call in flight (shield it when awaiting).
        """
        if self._release_task is None:
            self._releasing = True
            task = self._release_task = asyncio.ensure_future(call())
            task.add_done_callback(lambda done: self._release_ended(done, settle))
        return self._release_task

    def _release_ended(self, done: asyncio.Future[None], settle: Callable[[asyncio.Future[None]], None]) -> None:
        self._release_task = None
        self._releasing = False
        settle(done)

    def _note_hold_ended(self, reason: str) -> bool:
        """A HoldEnded event for this hold arrived, with ``reason``.

        Returns:
            True when the hold is to be lost now; False while its Release is in
            flight: the reason is kept (``_ended_during_release``) for the
            release's outcome to interpret (most likely that very Release ended it).
        """
        if self._releasing:
            self._ended_during_release = reason
            return False
        return True

    def _mark_lost(self, reason: str) -> bool:
        """Signal the loss once: set ``lost``, run hooks, callbacks, cancel tasks.

        Returns:
            True the first time; False if already lost or released.
        """
        if self._lost_reason is not None or self._released:
            return False
        self._lost_reason = reason
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
        """The hold is released (or known gone, or its client closed): no callback or task is told of a loss."""
        self._released = True
        self._releasing = False
        self._callbacks.clear()
        self._tasks.clear()

    def _add_lost_hook(self, hook: Callable[[AsyncLockHandle], None]) -> None:
        """Call ``hook(handle)`` on the loop, synchronously, when the hold is lost (a sync handle's event)."""
        self._hooks.append(hook)

    def _cancelled_by_loss(self, task: asyncio.Task[object]) -> bool:
        """Whether ``task`` was cancelled because the hold was lost (:meth:`cancel_on_lost`)."""
        return task in self._cancelled_tasks

    def _cancel(self, task: asyncio.Task[object]) -> None:
        if not task.done():
            self._cancelled_tasks.add(task)
            task.cancel(f"fencepost: {kinds.describe(self.hold_name)} lost ({self._lost_reason})")

    def __repr__(self) -> str:
        state = "released" if self._released else f"lost:{self._lost_reason}" if self._lost_reason else "held"
        slot = f" slot={self._slot}" if self._kind == kinds.HoldKind.HOLD_KIND_SEMAPHORE else ""
        slot += " read" if self._kind == kinds.HoldKind.HOLD_KIND_READ else ""
        return (
            f"<AsyncLockHandle name={self._name!r}{slot} lease_id={self.lease_id} token={self._token} "
            f"ttl={self.ttl} {state}>"
        )
