"""Granting holds here: the bookkeeping around every call that may grant one (Acquire, AcquirePermit, Campaign).

While such a call runs, it counts against its lease's holds and waits and
its caller's acquire rate (:meth:`~..admission.limit_tracker.LimitTracker.acquiring`),
and a bounded wait bounds its etcd calls too (with etcd down, the caller
hears why at its timeout). A grant is counted (``fencepost_grants_total``
and the wait), followed to its end (:class:`~..recipes.holds.HoldTracker`:
hold time, hand-off) and logged (a ``grant`` or ``elected`` event).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fencepost.client.v1.keys import Hold

from ..admission.identity import caller_of
from ..admission.limit_tracker import LimitTracker
from ..etcd import bounded
from ..recipes.holds import HoldTracker
from ..telemetry.events import caller, log_event
from ..telemetry.metrics import NO_METRICS, LockMetrics, recipe_of
from .rpcs import DEADLINE_MARGIN_SECONDS

__all__ = ["Grants"]

_log = logging.getLogger(__name__)


class Grants:
    """The bookkeeping of the calls that grant holds.

    Args:
        limits: counts each call against its lease and caller.
        holds: follows each hold granted here to its end.
        metrics: counts grants and their waits.
    """

    def __init__(self, limits: LimitTracker, holds: HoldTracker, metrics: LockMetrics = NO_METRICS) -> None:
        self._limits = limits
        self._holds = holds
        self._metrics = metrics

    @contextmanager
    def acquiring(self, context: Any, name: str, lease_id: int, wait: float | None) -> Iterator[None]:
        """Around the wait of one call that may grant lock ``name`` (the internal name) to ``lease_id``.

        Args:
            context: the call's context (its caller).
            wait: the call's wait in seconds (None: without limit); its etcd calls end
                :data:`~.rpcs.DEADLINE_MARGIN_SECONDS` after it.

        Raises:
            LimitExceeded: the lease's holds and waits, or the caller's acquire rate.
        """
        with (self._limits.acquiring(caller_of(context).key, name, lease_id),
              bounded(None if wait is None else wait + DEADLINE_MARGIN_SECONDS)):
            yield

    def granted(self, hold: Hold, counted_as: str, freed_at: float | None, waited: float, context: Any, message: str,
                *, event: str = "grant", name: str, slot: int | None = None, request_id: str | None = None,
                recipe: str = "") -> None:
        """A grant served here: counted, followed to its end, logged.

        Args:
            hold: the grant (its internal lock name).
            counted_as: the name its metrics are labelled by (a semaphore's or an election's own).
            freed_at: for a grant after a wait, when the deletion that made it the holder was seen.
            waited: seconds from the call's start to the grant.
            context: the call's context (its peer and trace id, for the log).
            message: the log line.
            event: ``grant`` or ``elected``.
            name, slot, request_id: the event's fields (the public name).
            recipe: the grant's recipe when its name does not tell it (``multilock``).
        """
        self._metrics.granted(counted_as, waited, recipe or recipe_of(hold.name))
        self._holds.granted(hold, freed_at, time.monotonic() - waited)
        if _log.isEnabledFor(logging.DEBUG):  # not built otherwise: caller() reads the span, peer and metadata
            log_event(_log, logging.DEBUG, event, message, name=name, lease_id=hold.lease_id, token=hold.token,
                      slot=slot, waited_s=round(waited, 6), request_id=request_id, **caller(context))
