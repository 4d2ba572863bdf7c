"""The drain: a coordinator told to stop refuses newcomers while it keeps serving what ends or keeps state.

``fencepost serve`` drains for ``--drain-seconds`` after its first SIGTERM
(or SIGINT) before it stops (:meth:`~..process.coordinator.Coordinator.drain`):
an application stopped together with its sidecar coordinator (a pod's
containers, a compose project, get SIGTERM at once) can still release its
locks, resign and revoke its leases through it, and its waiters elsewhere
get the lock at once instead of at the lease's TTL. Meanwhile the RPCs
marked ``drained`` in :data:`~..api.rpcs.RPCS` (new leases, new KeepAlive
streams, Acquire, AcquirePermit, Campaign) are refused with UNAVAILABLE /
DRAINING + RetryInfo 1 s (the call did nothing: clients send it at once to
their next address, as after OVERLOADED); Release, ReleasePermit, Resign,
Withdraw, LeaseRevoke, the keepalives of open streams and the waits already
queued are served as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from fencepost.client.errors import Unavailable
from fencepost.client.v1.details import RETRY_DELAY_BY_REASON, ErrorReason, reason_name

__all__ = ["RETRY_SECONDS", "Drain"]

#: The RetryInfo delay of a DRAINING refusal, in seconds.
RETRY_SECONDS = RETRY_DELAY_BY_REASON[ErrorReason.DRAINING]

_DRAINING = reason_name(ErrorReason.DRAINING)


class Drain:
    """Whether this coordinator drains, and since when; refuses the newcomers while it does.

    Args:
        clock: monotonic seconds (injected by unit tests).
    """

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._clock = clock if clock is not None else time.monotonic
        self._ends_at: float | None = None

    @property
    def draining(self) -> bool:
        """Whether :meth:`start` was called."""
        return self._ends_at is not None

    def start(self, seconds: float) -> None:
        """Drain from now on, for about ``seconds`` (said in refusals; the process stops the server)."""
        if self._ends_at is None:
            self._ends_at = self._clock() + max(0.0, seconds)

    def admit(self, rpc: str) -> None:
        """Refuse ``rpc`` (a newcomer) while draining; return at once otherwise.

        Raises:
            Unavailable: reason DRAINING, ``retry_delay`` :data:`RETRY_SECONDS`.
        """
        if self._ends_at is None:
            return
        left = max(0.0, self._ends_at - self._clock())
        raise Unavailable(f"coordinator is draining before it stops (in at most {left:.1f} s): {rpc} refused; "
                          f"send it to another coordinator", reason=_DRAINING, retry_delay=RETRY_SECONDS)
