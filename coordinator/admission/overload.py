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
near 0 while the coordinator keeps up and grow while work piles up. Above
``--max-lag`` (:mod:`.limits`) the coordinator is past its capacity
(:mod:`.capacity`, which also measures at each of these wake-ups): new
leases, streams and waits are refused, so that the leases already granted
keep being renewed. Keepalives, releases and revokes are always served.

Overload is what lasts: the figure is the smallest of the last :data:`TICKS`
measurements (each the largest of the three seen since the one before), so
that a single pause (a coordinator SIGSTOPped and continued, a machine that
stalled for a moment) does not count, while a coordinator that was late at
every wake-up for a while does. In ``fencepost_lag_seconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable

from ..telemetry.metrics import NO_METRICS, LockMetrics

__all__ = ["INTERVAL", "TICKS", "LoopLag"]

#: Seconds between two measurements.
INTERVAL = 0.05
#: Measurements the figure is the smallest of (0.25 s at INTERVAL while the loop keeps up).
TICKS = 5


class LoopLag:
    """Measures how far behind the coordinator is, in a background task.

    Args:
        metrics: where the figure is set (``fencepost_lag_seconds``).
        waiting: the age of the oldest keepalive waiting for etcd, seconds
            (:attr:`..etcd.EtcdClient.keepalive_waiting_seconds`); none: only the loop's lateness.
        interval: seconds between measurements.
        ticks: measurements the figure is the smallest of.
    """

    def __init__(self, metrics: LockMetrics = NO_METRICS, *, waiting: Callable[[], float] = lambda: 0.0,
                 interval: float = INTERVAL, ticks: int = TICKS) -> None:
        self._metrics = metrics
        self._waiting = waiting
        self._interval = interval
        self._ticks: deque[float] = deque(maxlen=ticks)
        self._since = 0.0  # the largest lag told (record) since the last measurement
        #: Measurements made so far.
        self.measurements = 0
        #: The last measurement's parts, in seconds: the loop's lateness, the oldest keepalive's wait for etcd,
        #: the longest wait of an answer to be sent.
        self.parts = (0.0, 0.0, 0.0)
        self._task: asyncio.Task[None] | None = None
        self._listeners: list[Callable[[], None]] = []

    @property
    def seconds(self) -> float:
        """How far behind the coordinator has been at each of the last measurements, in seconds (0.0 before
        there are as many as the figure needs)."""
        ticks = self._ticks
        return min(ticks) if len(ticks) == ticks.maxlen else 0.0

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

    def subscribe(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after each measurement, in the event loop's thread (:class:`.capacity.Capacity`)."""
        self._listeners.append(listener)

    def record(self, seconds: float) -> None:
        """Tell a lag seen elsewhere (an answer that waited ``seconds`` to be sent): part of the next measurement."""
        if seconds > self._since:
            self._since = seconds

    def tick(self, lateness: float) -> None:
        """One measurement: the loop's ``lateness`` in seconds, with the keepalive wait and what was told since."""
        self.parts = (lateness, self._waiting(), self._since)
        self._ticks.append(max(self.parts))
        self._since = 0.0
        self.measurements += 1
        self._metrics.loop_lag(self.seconds)
        for listener in self._listeners:
            listener()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            asked = loop.time() + self._interval
            await asyncio.sleep(self._interval)
            self.tick(max(0.0, loop.time() - asked))
