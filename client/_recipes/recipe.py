"""What one kind of hold plugs into the acquire loop and the release: the :class:`Recipe` interface.

A lock, a semaphore permit and an election's leadership are acquired by the
same loop and released by the same code (:class:`~.holds.Holds`: leases,
local exclusion, retries on a lost lease, withdrawal of an abandoned call,
a release that keeps the hold until the server answers). What differs is a
recipe, one per acquire:

- the calls it makes: :meth:`Recipe.acquire_call` (Acquire, AcquirePermit,
  Campaign), :meth:`Recipe.withdraw_call` (Withdraw, ReleasePermit with
  token 0, Resign with token 0) and :meth:`Recipe.release_call` (Release,
  ReleasePermit, Resign);
- its names: :attr:`Recipe.name` in the loop's own errors,
  :attr:`Recipe.local_name` for the local exclusion (one local contender
  per lease), and the words of its messages;
- which failed acquire calls are known to have left nothing in etcd
  (:meth:`Recipe.settled`).

The helpers below build the parts the recipes share: the request of a call
that may wait (:func:`wait_request`), an attempt's deadline
(:func:`bounded`).
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from google.protobuf.message import Message

from .._transport import wire
from .._transport.transport import MakeRequest
from ..errors import FencepostError, InvalidArgument, LockHeld, LockTimeout
from ..handle import AsyncLockHandle
from ..v1.details import ErrorReason, reason_name

if TYPE_CHECKING:
    from .._leases.lease import Lease
    from .holds import Holds

__all__ = ["ACQUIRE_SLACK_SECONDS", "LEASE_EXPIRED", "NOT_HOLDER", "SETTLED_REASONS", "Recipe", "bounded",
           "settled", "wait_request"]

LEASE_EXPIRED = reason_name(ErrorReason.LEASE_EXPIRED)
NOT_HOLDER = reason_name(ErrorReason.NOT_HOLDER)

#: Slack added to the gRPC deadline of a bounded acquire call, in seconds, so that
#: the coordinator's own ACQUIRE_TIMEOUT answer normally arrives first.
ACQUIRE_SLACK_SECONDS = 1.0

#: Reasons of a refused acquire call after which the coordinator has left nothing of
#: that call in etcd (bad input, its wait timed out and was withdrawn, the lease
#: is gone, the queue was full, a limit refused the call before it did anything; the
#: access policy or the lease's ownership refused it before it did anything, and would
#: refuse a withdrawal for the same reason): no withdrawal is needed.
SETTLED_REASONS = frozenset(reason_name(r) for r in (
    ErrorReason.INVALID_FIELD, ErrorReason.ACQUIRE_TIMEOUT, ErrorReason.LEASE_EXPIRED, ErrorReason.TOO_MANY_WAITERS,
    ErrorReason.LIMIT_EXCEEDED, ErrorReason.ACCESS_DENIED, ErrorReason.NOT_LEASE_OWNER))


class Recipe(abc.ABC):
    """One acquire of one kind of hold: its calls, names and words (see the module docstring).

    Args:
        holds: The client's holds and leases (its transport, stream and pool).
        name: The hold's name in the acquire loop's errors.
        local_name: The name of the local exclusion (one local contender per
            lease and name); ``name`` by default.

    Attributes:
        acting: What the loop says the caller was doing when a grant arrived
            on a lease lost meanwhile (``"acquiring"``).
        withdraw_failure_level: The log level of a withdrawal the coordinator
            refused (what it left ends with the lease anyway).
    """

    acting = "acquiring"
    withdraw_failure_level = logging.WARNING

    def __init__(self, holds: Holds, name: str, local_name: str | None = None) -> None:
        self.holds = holds
        self.name = name
        self.local_name = name if local_name is None else local_name

    @abc.abstractmethod
    def held_here(self, lease_id: int, *, waiting: bool) -> str:
        """The message of an acquire refused (``waiting`` False) or timed out (True) because this client
        holds it already under lease ``lease_id``."""

    @abc.abstractmethod
    def not_granted_now(self, held: LockHeld) -> str:
        """The message of an acquire with no time to wait (``timeout`` 0) that found it ``held``."""

    @abc.abstractmethod
    async def acquire_call(self, lease: Lease, until: float | None, try_once: bool) -> AsyncLockHandle:
        """Make the acquire call under ``lease`` (its retries until loop time ``until``).

        Returns:
            The handle of the grant, made with :meth:`release` as its release; not yet kept.

        Raises:
            LockHeld: ``try_once`` and it is held.
            LockTimeout: not granted by ``until``.
            FencepostError: as the coordinator answered.
        """

    @abc.abstractmethod
    async def withdraw_call(self, lease: Lease) -> str | None:
        """Withdraw what an abandoned acquire call may have left under ``lease`` (one call, its retries).

        Returns:
            What was withdrawn, for the log (``"the wait"``), or None when nothing was (or it is not known).

        Raises:
            FencepostError: as the coordinator answered.
        """

    @abc.abstractmethod
    async def release_call(self, handle: AsyncLockHandle, until: float) -> None:
        """Make the release call of ``handle`` (its retries until loop time ``until``).

        Raises:
            NotHolder, StaleTokenError, LeaseLost, Unavailable, FencepostError: as the coordinator answered.
        """

    def settled(self, err: BaseException) -> bool:
        """Whether an acquire call that failed with ``err`` is known to have left nothing in etcd."""
        return settled(err)

    async def release(self, handle: AsyncLockHandle) -> None:
        """Release ``handle`` (the release function of the handles this recipe makes)."""
        await self.holds.release(handle, self.release_call)


def settled(err: BaseException) -> bool:
    """Whether an acquire call that failed with ``err`` is known to have left nothing in etcd."""
    if not isinstance(err, FencepostError):
        return False  # cancelled: the call may have queued or been granted
    if isinstance(err, (LockHeld, InvalidArgument)):
        return True
    if err.code is None:  # made here: a one-try acquire answered "held" (settled), or no answer at all
        return isinstance(err, LockTimeout)
    return err.reason in SETTLED_REASONS


def bounded(call_timeout: float, left: float | None) -> float:
    """The gRPC deadline of one attempt: ``call_timeout``, or less when the caller has less time ``left``."""
    return call_timeout if left is None else max(0.001, min(call_timeout, left))


def wait_request(build: Callable[[int, bool], Message], *, try_once: bool, call_timeout: float) -> MakeRequest:
    """The attempts of an acquire call that may wait (Acquire, AcquirePermit, Campaign).

    Args:
        build: Makes the request from its ``wait_ms`` and ``wait_forever`` fields.
        try_once: The call does not wait (``wait_ms`` 0).
        call_timeout: The gRPC deadline of an attempt that does not wait, in seconds.

    Returns:
        The transport's request maker: each attempt waits what is left of the
        caller's time (forever when unbounded), with a gRPC deadline
        :data:`ACQUIRE_SLACK_SECONDS` longer than that wait.
    """

    def make(left: float | None) -> tuple[Message, float | None]:
        wait_ms, forever = (0, False) if try_once else wire.wait_to_wire(left)
        request = build(wait_ms, forever)
        if forever:
            return request, None
        if try_once:
            return request, call_timeout
        return request, wait_ms / 1000 + ACQUIRE_SLACK_SECONDS

    return make
