"""How far behind the coordinator is: the sign that it cannot keep up.

A coordinator is one Python process: past what one core can do, work waits,
and the first victims are the keepalives of live leases (a keepalive
answered after its lease's TTL is a lease lost, a spurious expiry).
:class:`LoopLag` wakes every :data:`INTERVAL` seconds and measures two
things: how much later than asked it ran (the event loop's lateness), and
how long the oldest keepalive forwarded to etcd has waited for its answer
(a backlog of keepalives, queued here or at a slow etcd; the loop can be on
time while thousands of them wait). The KeepAlive streams add a third: how
long an answer waited in a stream's queue to be sent to its client (a
backlog on the way out; told by the stream itself as it sends). All stay
near 0 while the coordinator keeps up and grow while work piles up. The limit ``--max-lag``
(:mod:`.limits`) refuses new leases (LeaseGrant, RESOURCE_EXHAUSTED /
LIMIT_EXCEEDED with a RetryInfo) while the largest of them is above it,
so that the leases already granted keep being renewed: under overload, new
work is refused and live leases do not die. Keepalives, releases and
revokes are always served.

The figure is the largest seen in the last :data:`WINDOW` seconds (a single
late wake-up counts for that long), in ``fencepost_lag_seconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable

from .lock_metrics import NO_METRICS, LockMetrics

__all__ = ["INTERVAL", "WINDOW", "LoopLag"]

#: Seconds between two measurements.
INTERVAL = 0.05
#: Seconds a lateness counts for.
WINDOW = 2.0


class LoopLag:
    """Measures how far behind the coordinator is, in a background task.

    Args:
        metrics: where the figure is set (``fencepost_lag_seconds``).
        waiting: the age of the oldest keepalive waiting for etcd, seconds
            (:attr:`.etcd.EtcdClient.keepalive_waiting_seconds`); none: only the loop's lateness.
        interval: seconds between measurements.
        window: seconds a measured lateness counts for.
    """

    def __init__(self, metrics: LockMetrics = NO_METRICS, *, waiting: Callable[[], float] = lambda: 0.0,
                 interval: float = INTERVAL, window: float = WINDOW) -> None:
        self._metrics = metrics
        self._waiting = waiting
        self._interval = interval
        self._window = window
        self._samples: deque[tuple[float, float]] = deque()  # (when, lateness), lateness decreasing
        self._task: asyncio.Task[None] | None = None

    @property
    def seconds(self) -> float:
        """The largest lag measured in the last ``window`` seconds (0.0 before the first measurement)."""
        self._expire(time.monotonic())
        return self._samples[0][1] if self._samples else 0.0

    def start(self) -> None:
        """Start measuring (in a task of the running loop)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="fencepost-loop-lag")

    async def close(self) -> None:
        """Stop measuring."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def record(self, lateness: float, now: float | None = None) -> None:
        """Count one measured ``lateness`` in seconds (what the task does each wake-up; tests call it too)."""
        now = time.monotonic() if now is None else now
        while self._samples and self._samples[-1][1] <= lateness:
            self._samples.pop()  # a larger, newer lateness hides the smaller, older ones
        self._samples.append((now, lateness))
        self._expire(now)
        self._metrics.loop_lag(self._samples[0][1])

    def _expire(self, now: float) -> None:
        while self._samples and self._samples[0][0] < now - self._window:
            self._samples.popleft()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            asked = loop.time() + self._interval
            await asyncio.sleep(self._interval)
            self.record(max(0.0, loop.time() - asked, self._waiting()))
