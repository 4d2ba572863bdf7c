"""The caller's deadline, carried to every etcd call made on its behalf.

A gRPC call to the coordinator may carry a deadline (``acquire(timeout=2)``
sends one). Every etcd call the coordinator makes for it must end by then:
otherwise a caller whose etcd is down waits for the etcd layer's own per-call
deadline (:data:`~.failures.RULES`, 5 s) instead of its own. The servicer sets
the deadline with :func:`bounded` around each call; :meth:`EtcdClient._unary`
reads :func:`left`. It is a context variable, so tasks created inside the
block inherit it; work that must outlive the call (a deferred withdrawal)
is started inside :func:`unbounded`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar

__all__ = ["bounded", "left", "unbounded"]

_DEADLINE: ContextVar[float | None] = ContextVar("fencepost_etcd_deadline", default=None)


@contextlib.contextmanager
def bounded(seconds: float | None) -> Iterator[None]:
    """Within the block, etcd calls end ``seconds`` from now at the latest.

    A block inside another keeps the earlier of the two deadlines.

    Args:
        seconds: Time left to the caller, in seconds (``time.monotonic``);
            None for no (further) bound.
    """
    outer = _DEADLINE.get()
    mine = None if seconds is None else time.monotonic() + max(0.0, seconds)
    token = _DEADLINE.set(mine if outer is None else outer if mine is None else min(outer, mine))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


@contextlib.contextmanager
def unbounded() -> Iterator[None]:
    """Within the block (and in tasks created in it), etcd calls have no caller's deadline."""
    token = _DEADLINE.set(None)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def left() -> float | None:
    """Seconds left before the caller's deadline (<= 0 once passed); None without one."""
    deadline = _DEADLINE.get()
    return None if deadline is None else deadline - time.monotonic()
