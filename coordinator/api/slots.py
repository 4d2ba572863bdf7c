"""The streams served at once: KeepAlive and Observe streams count against one bound and each caller's limit.

A stream holds a task (and, for Observe, an etcd watch) for as long as its
client keeps it open, so it is refused (before anything else is set up) at
shutdown (UNAVAILABLE / SHUTTING_DOWN), past ``max_streams`` on this
coordinator (RESOURCE_EXHAUSTED / TOO_MANY_STREAMS), or past its caller's
stream limit (RESOURCE_EXHAUSTED / LIMIT_EXCEEDED, :mod:`..admission.limit_tracker`).
"""

from __future__ import annotations

import asyncio

from fencepost.client.errors import ResourceExhausted
from fencepost.client.v1.details import ErrorReason, reason_name

from ..admission.limit_tracker import LimitTracker
from .status import shutting_down

__all__ = ["StreamSlots"]


class StreamSlots:
    """Counts the streams being served, and refuses one more past the bounds.

    Args:
        limits: each caller's stream limit.
        max_streams: most streams served at once (0: no limit).
        closing: set when the coordinator shuts down.
    """

    def __init__(self, limits: LimitTracker, max_streams: int, closing: asyncio.Event) -> None:
        self._limits = limits
        self._max = max_streams or 2**63
        self._closing = closing
        self._open = 0

    @property
    def count(self) -> int:
        """The streams being served."""
        return self._open

    def open(self, caller: str) -> None:
        """Count one more stream of ``caller`` (:attr:`..admission.identity.Caller.key`); :meth:`close` it after.

        Raises:
            Unavailable: SHUTTING_DOWN.
            ResourceExhausted: TOO_MANY_STREAMS on this coordinator.
            LimitExceeded: the caller's stream limit.
        """
        if self._closing.is_set():
            raise shutting_down()
        if self._open >= self._max:
            raise ResourceExhausted(f"more than {self._max} streams", reason=reason_name(ErrorReason.TOO_MANY_STREAMS))
        self._limits.stream_opened(caller)
        self._open += 1

    def close(self, caller: str) -> None:
        """A stream :meth:`open` counted has ended."""
        self._open -= 1
        self._limits.stream_closed(caller)
