"""The deadline watcher: leases lost at their local deadline, idle leases retired.

:class:`DeadlineWatcher` declares a lease lost (reason ``DEADLINE``) when its
local deadline passes, even if no message arrives (a partition, a half-open
TCP stream), and retires the leases the pool's bound says are idle too long
or too many (:meth:`~.lease.LeasePool.retire_idle`). It reads only the
monotonic clock of the pool.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from .lease import Lease, LeasePool

__all__ = ["DeadlineWatcher"]


class DeadlineWatcher:
    """Declares leases lost when their local deadline passes, and retires idle ones (monotonic clock only).

    Args:
        pool: The leases to watch, and their clock.
        on_retired: Called with each lease the pool retired for being idle
            (see :meth:`LeasePool.retire_idle`): the client revokes it.
    """

    def __init__(self, pool: LeasePool, on_retired: Callable[[Lease], None] = lambda lease: None) -> None:
        self.pool = pool
        self._on_retired = on_retired
        self._wakeup = asyncio.Event()

    def wake(self) -> None:
        """Look at the deadlines and the idle leases again now (a lease was added, or became idle)."""
        self._wakeup.set()

    async def run(self) -> None:
        """Lose each lease at its deadline and retire idle ones, until cancelled."""
        while True:
            delay = self.pool.expire()
            retired, idle_delay = self.pool.retire_idle()
            for lease in retired:
                self._on_retired(lease)
            if idle_delay is not None:
                delay = idle_delay if delay is None else min(delay, idle_delay)
            self._wakeup.clear()
            # asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a cancellation that comes as the
            # event is set (close() cancels this task as a failing acquire wakes it): the loop would then
            # never end, and close() would wait for it for ever.
            try:
                async with asyncio.timeout(delay):
                    await self._wakeup.wait()
            except TimeoutError:
                pass
