"""What the lock algorithm answers with: a contender, an acquire's outcome, a snapshot of one lock.

Kept apart from :mod:`.lock` (which re-exports them) so that the read-write
locks' rule of who holds (:func:`holding`) sits beside the shapes it fills.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .lock_delay import DelayState

__all__ = ["DESCRIBE_WAITERS", "AcquireResult", "Description", "Holder", "holding"]

#: Most queued contenders listed by describe().
DESCRIBE_WAITERS = 100


@dataclass(frozen=True)
class Holder:
    """A contender: its lease, the fencing token of its key (the token it holds, or will hold, under), a reader?"""

    lease_id: int
    token: int
    read: bool = False


@dataclass(frozen=True)
class AcquireResult:
    """The outcome of acquire(): granted with ``token``, or (try once only) the current holder.

    ``freed_at``: for a grant after a wait, the monotonic clock reading when the
    deletion that made this contender the holder reached the lock watch (the
    previous hold's end, for ``fencepost_handoff_seconds``); None otherwise.
    """

    acquired: bool
    token: int = 0
    holder: Holder | None = None
    freed_at: float | None = None


@dataclass(frozen=True)
class Description:
    """A snapshot of one lock at one etcd revision.

    ``holder`` is the first of ``holders``: every contender holding the lock
    (one, or the readers holding together: :func:`holding`, among the first
    :data:`DESCRIBE_WAITERS` + 1 contenders read); ``waiters`` and
    ``waiter_count`` are the others, queued behind them.
    """

    holder: Holder | None
    ttl_remaining_seconds: int
    ttl_seconds: int
    waiter_count: int
    waiters: list[Holder] = field(default_factory=list)
    revision: int = 0
    lock_delay: DelayState = DelayState(0, 0)
    holders: list[Holder] = field(default_factory=list)


def holding(contenders: Sequence[Holder]) -> int:
    """How many of ``contenders`` (in grant order, none held back by a lock-delay) hold the lock together.

    0 for none; 1 for a writer (a plain lock's contender) first; for readers
    first (a read-write lock, :mod:`.rwlock`), every reader before the first
    writer: they hold together, the writer and all after it wait.
    """
    if not contenders or not contenders[0].read:
        return min(len(contenders), 1)
    return next((i for i, c in enumerate(contenders) if not c.read), len(contenders))
