"""The renewal schedule: when each lease's next keepalive is due, and the one task that sends them.

Each lease is renewed every ``ttl * keepalive_fraction`` seconds (its
*period*, TTL/3 by default), counted from the time its last keepalive was
sent (or, after a reconnect, sent again). One task for all the leases of a
client wakes at the earliest renewal due and sends, in one go, every lease
whose renewal is due within a quarter of its own period (:data:`EARLY`):
a lease is renewed at most a quarter period early and never later than its
period, so leases of one TTL stay together and leases of other TTLs join
them when they come close. The stream sends the leases of one go as one
batch (``KeepAliveRequest.keepalives``) when the coordinator serves batches,
else one keepalive each (:meth:`.stream.KeepAliveStream.send_keepalives`).

Sending early never shortens what a lease has left: its local deadline
moves from the send time of each acknowledged keepalive (:mod:`.lease`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from .lease import Clock, Lease

__all__ = ["EARLY", "Renewals"]

#: How early a lease may be renewed to go with another one, as a fraction of its own period.
EARLY = 0.25


class Renewals:
    """When each live lease is next renewed; :meth:`run` sends them when due.

    Args:
        clock: The monotonic clock of the leases, in seconds.
        fraction: Each lease's renewal period as a fraction of its granted TTL.
        send: Sends one keepalive of each lease given (one batch or one message each).
    """

    def __init__(self, clock: Clock, fraction: float, send: Callable[[list[Lease]], None]) -> None:
        self._clock = clock
        self._fraction = fraction
        self._send = send
        self._due: dict[Lease, float] = {}  # live lease -> clock reading when its next keepalive is due
        self._wakeup = asyncio.Event()
        self._stopped = False

    def period(self, lease: Lease) -> float:
        """Seconds between two renewals of ``lease``: ``ttl * fraction``."""
        return lease.ttl * self._fraction

    def add(self, lease: Lease) -> None:
        """Renew ``lease`` from now on (its first keepalive at once), until it is lost."""
        self._due[lease] = self._clock()
        self._wakeup.set()

    def renewed(self, leases: list[Lease], now: float) -> None:
        """``leases`` were sent a keepalive at ``now``: each is next due one period later."""
        for lease in leases:
            if lease in self._due and not lease.lost:
                self._due[lease] = now + self.period(lease)

    def stop(self) -> None:
        """Send nothing more (the client is closing)."""
        self._stopped = True
        self._wakeup.set()

    def due(self, now: float) -> list[Lease]:
        """The live leases to renew at ``now``: each one due within :data:`EARLY` of its period (lost ones forgotten)."""
        for lease in [lease for lease in self._due if lease.lost]:
            del self._due[lease]
        return [lease for lease, due in self._due.items() if due <= now + EARLY * self.period(lease)]

    def delay(self, now: float) -> float | None:
        """Seconds from ``now`` to the earliest renewal due (0 when one is overdue); None with no lease."""
        due = [at for lease, at in self._due.items() if not lease.lost]
        return max(0.0, min(due) - now) if due else None

    async def run(self) -> None:
        """Send each renewal when due, until cancelled."""
        while not self._stopped:
            now = self._clock()
            due = self.due(now)
            if due:
                self.renewed(due, now)
                self._send(due)
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), self.delay(self._clock()))
            except TimeoutError:
                pass
