"""The handles of the sync client: a hold's asyncio handle seen from any thread.

A :class:`LockHandle` shows the state of the
:class:`~fencepost.client.AsyncLockHandle` it wraps (its read-only
properties are :class:`~fencepost.client.handle.HoldView`'s, written once)
and runs its calls on the client's loop thread; its ``lost`` is a
``threading.Event``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from .._recipes.election import Leadership, check_value
from .._recipes.multilock import AsyncMultiLockHandle
from ..handle import AsyncLockHandle, HoldView
from .loop import LoopThread

__all__ = ["LockHandle", "MultiLockHandle", "SyncLeadership"]


class LockHandle(HoldView):
    """One grant of a lock with its fencing token (sync twin of :class:`AsyncLockHandle`).

    Returned by :meth:`LockClient.acquire` and friends. Usable from any
    thread. Pass :attr:`token` to the storage with every write. Its
    properties and :meth:`check` are :class:`AsyncLockHandle`'s.

    Attributes:
        lost: A ``threading.Event`` set (once) when the hold is lost; never
            set by a release.
    """

    def __init__(self, inner: AsyncLockHandle, loop: LoopThread) -> None:
        # Built on the client's loop thread, so that the hook is registered
        # before any loss can be signalled.
        super().__init__(inner)
        self._loop = loop
        self.lost = threading.Event()
        if inner.lost_reason is not None:
            self.lost.set()
        inner._add_lost_hook(lambda _h: self.lost.set())

    def release(self) -> None:
        """Release the lock (one Release RPC); ownership is kept if it fails (see :meth:`AsyncLockHandle.release`).

        Raises:
            NotHolder, StaleTokenError, LeaseLost, Unavailable: as :meth:`AsyncLockHandle.release`.
            FencepostError: the client is closed, also by ``close()`` from another
                thread during the call, or the handle was inherited through
                fork (reason "FORKED"; the parent keeps the hold).
        """
        self._check_fork()
        self._loop.run(self._hold.release(), self.name)

    def wait_lost(self, timeout: float | None = None) -> bool:
        """Block until the hold is lost or ``timeout`` seconds pass.

        Args:
            timeout: Seconds to wait; None waits forever.

        Returns:
            True if the hold was lost, False on timeout.

        Raises:
            FencepostError: the handle was inherited through fork (reason "FORKED").
        """
        self._check_fork()
        return self.lost.wait(timeout)

    def on_lost(self, callback: Callable[[LockHandle], object]) -> None:
        """Call ``callback(handle)`` once, in a new daemon thread, when the hold is lost.

        Called at once if it already is; never for a released handle.
        Exceptions are logged. Callable from any thread.

        Args:
            callback: Called with this handle; its return value is ignored.

        Raises:
            FencepostError: the handle was inherited through fork (reason "FORKED").
        """
        self._check_fork()

        async def register() -> None:
            self._hold.on_lost(lambda _h: callback(self))

        self._loop.run(register())

    def __repr__(self) -> str:
        return repr(self._hold).replace("AsyncLockHandle", "LockHandle", 1)


class SyncLeadership(LockHandle):
    """The leadership of an election (sync twin of :class:`~fencepost.client.Leadership`).

    Returned by :meth:`LockClient.campaign`: a :class:`LockHandle` (``token``,
    ``lost``, ``on_lost``, ...) whose ``name`` is the election's, plus its
    ``value``, :meth:`proclaim` and :meth:`resign`.
    """

    _hold: Leadership

    @property
    def value(self) -> bytes:
        """The value the leader publishes (Campaign's, then the last Proclaim's)."""
        return self._hold.value

    @property
    def text(self) -> str:
        """The value as the str given (see :attr:`LeaderInfo.text`); UnicodeDecodeError when it is not UTF-8."""
        return self._hold.text

    def proclaim(self, value: bytes | str) -> None:
        """Publish a new value without a new election (see :meth:`Leadership.proclaim`).

        Raises:
            InvalidArgument, NotHolder, LeaseLost, Unavailable: as :meth:`Leadership.proclaim`.
        """
        self._check_fork()
        raw = check_value(value)
        self._loop.run(self._hold.proclaim(raw), self.name)

    def resign(self) -> None:
        """Give up the leadership (Resign); as :meth:`release`."""
        self.release()

    def __repr__(self) -> str:
        return repr(self._hold)


class MultiLockHandle:
    """One grant of several locks together (sync twin of :class:`~fencepost.client.AsyncMultiLockHandle`).

    Returned by :meth:`LockClient.acquire_all` and :meth:`LockClient.lock_all`. Usable from any thread.
    Write each resource with :meth:`token_for` its own name.

    Attributes:
        lost: A ``threading.Event`` set (once) when any name is lost; never set by a release.
    """

    def __init__(self, inner: AsyncMultiLockHandle, loop: LoopThread) -> None:
        # Built on the client's loop thread, so that the hook is registered before any loss can be signalled.
        self._hold = inner
        self._loop = loop
        self.lost = threading.Event()
        if inner.lost_reason is not None:
            self.lost.set()
        for handle in inner.handles.values():
            handle._add_lost_hook(lambda _h: self.lost.set())

    @property
    def names(self) -> list[str]:
        """The lock names, in the order given."""
        return self._hold.names

    @property
    def tokens(self) -> dict[str, int]:
        """name -> fencing token."""
        return self._hold.tokens

    def token_for(self, name: str) -> int:
        """The fencing token of lock ``name`` (KeyError when it is not one of :attr:`names`)."""
        return self._hold.token_for(name)

    @property
    def lease_id(self) -> int:
        """The lease that holds every name."""
        return self._hold.lease_id

    @property
    def ttl(self) -> int:
        """The lease's granted TTL in seconds."""
        return self._hold.ttl

    @property
    def deadline(self) -> float:
        """The lease's conservative local deadline, on ``time.monotonic()`` (see :attr:`LockHandle.deadline`)."""
        return self._hold.deadline

    @property
    def margin(self) -> float:
        """Seconds the local deadline keeps short of the granted TTL."""
        return self._hold.margin

    @property
    def lost_reason(self) -> str | None:
        """Why it was lost, None while held."""
        return self._hold.lost_reason

    @property
    def lost_name(self) -> str | None:
        """The name whose hold was lost first, None while held."""
        return self._hold.lost_name

    @property
    def lease_secret(self) -> str:
        """The lease's secret (a credential: never log it)."""
        return self._hold.lease_secret

    def valid_for(self) -> float:
        """Seconds the multi-lock is believed held, at most (see :meth:`AsyncMultiLockHandle.valid_for`)."""
        return self._hold.valid_for()

    @property
    def released(self) -> bool:
        """Whether it was released."""
        return self._hold.released

    def is_valid(self) -> bool:
        """Whether every name is believed held now (an early warning only)."""
        return self._hold.is_valid()

    def check(self) -> None:
        """Raise LeaseLost unless every name is believed held (see :meth:`AsyncMultiLockHandle.check`)."""
        self._hold.check()

    def release(self) -> None:
        """Release every name (one ReleaseAll call); see :meth:`AsyncMultiLockHandle.release`."""
        self._loop.run(self._hold.release(), self.names[0])

    def wait_lost(self, timeout: float | None = None) -> bool:
        """Block until the multi-lock is lost (True) or ``timeout`` seconds pass (False)."""
        return self.lost.wait(timeout)

    def on_lost(self, callback: Callable[[MultiLockHandle], object]) -> None:
        """Call ``callback(handle)`` once, in a new daemon thread, when the multi-lock is lost."""
        async def register() -> None:
            self._hold.on_lost(lambda _h: callback(self))

        self._loop.run(register())

    def __repr__(self) -> str:
        return repr(self._hold).replace("AsyncMultiLockHandle", "MultiLockHandle", 1)
