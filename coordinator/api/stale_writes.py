"""Stale writes refused by fencing guards, as applications report them: the ReportStaleWrite RPC.

A guard runs in the application's process, so the coordinator learns of a
refused write only when the application reports it (the Python client's
``stale_write_reporter()`` as a guard's ``on_reject``). :class:`StaleWrites`
takes each report: it counts it (``fencepost_stale_writes_reported_total``,
labelled by storage kind), logs it (event ``stale_write``) and hands it to
whoever listens (the lock board's feed, while a board is open). Nothing is
written to etcd.

A flood of reports cannot hurt: the fields are bounded
(:func:`validate_report`) and one token bucket per coordinator process
takes at most :data:`REPORTS_PER_SECOND` reports a second, a burst of
:data:`REPORT_BURST`; past it a report is refused with RESOURCE_EXHAUSTED /
LIMIT_EXCEEDED and a RetryInfo.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fencepost.client.errors import InvalidArgument, LimitExceeded
from fencepost.client.v1.keys import MAX_TOKEN
from fencepost.client.v1.names import forbidden_problem

from ..admission.limit_tracker import TokenBucket
from ..recipes.validate import validate_name
from ..telemetry.events import caller, log_event
from ..telemetry.metrics import NO_METRICS, LockMetrics

__all__ = ["MAX_RECORD_BYTES", "REPORTS_PER_SECOND", "REPORT_BURST", "StaleWrite", "StaleWrites", "validate_report"]

_log = logging.getLogger(__name__)

#: Reports taken a second per coordinator process, and the burst above it.
REPORTS_PER_SECOND = 20.0
REPORT_BURST = 100
#: Longest record label, in bytes of UTF-8.
MAX_RECORD_BYTES = 128
#: What a storage kind looks like (a guard's ``storage`` metrics label).
STORAGE = re.compile(r"^[a-z][a-z0-9_]{0,31}\Z")


def _invalid(field: str, problem: str) -> InvalidArgument:
    return InvalidArgument(f"{field} {problem}", field=field)


def validate_report(request: Any) -> None:
    """Check a ReportStaleWriteRequest's fields (see proto/fencepost/v1/lock.proto).

    Raises:
        InvalidArgument: naming the field: ``name`` (not a lock name; "" is allowed), ``token`` (not 1 to
            2**63-1), ``current_token`` (negative), ``storage`` (not 1 to 32 of a-z, 0-9, _ from a letter),
            ``record`` (over :data:`MAX_RECORD_BYTES` bytes, or a control or format character).
    """
    if request.name:
        validate_name(request.name)
    if not 0 < request.token <= MAX_TOKEN:
        raise _invalid("token", f"is {request.token}; must be the refused write's fencing token (> 0)")
    if request.current_token < 0:
        raise _invalid("current_token", f"is {request.current_token}; must be >= 0 (0: not known)")
    if not STORAGE.match(request.storage):
        raise _invalid("storage", f"is {request.storage[:40]!r}; must be 1 to 32 of a-z, 0-9 and _, from a letter")
    size = len(request.record.encode("utf-8", "surrogatepass"))
    if size > MAX_RECORD_BYTES:
        raise _invalid("record", f"is {size} bytes; at most {MAX_RECORD_BYTES} bytes of UTF-8 (a label, not the data)")
    problem = forbidden_problem(request.record) if request.record else None
    if problem is not None:
        raise _invalid("record", problem)


@dataclass(frozen=True)
class StaleWrite:
    """One reported stale write: the ReportStaleWriteRequest's fields, and when it came (monotonic seconds)."""

    name: str
    token: int
    current_token: int
    storage: str
    record: str
    at: float


class StaleWrites:
    """Takes the reports of stale writes (see the module docstring).

    Args:
        metrics: counts them (``fencepost_stale_writes_reported_total``).
        clock: the monotonic clock, seconds (injected in tests).
    """

    def __init__(self, metrics: LockMetrics = NO_METRICS, clock: Callable[[], float] = time.monotonic) -> None:
        self._metrics = metrics
        self._clock = clock
        self._bucket = TokenBucket(REPORT_BURST, clock())
        self._listeners: list[Callable[[StaleWrite], None]] = []

    def listen(self, listener: Callable[[StaleWrite], None]) -> Callable[[], None]:
        """Call ``listener`` with each report taken from now on; returns the call that stops it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def report(self, request: Any, context: Any) -> None:
        """Take one report (its fields checked already: :func:`validate_report`).

        Raises:
            LimitExceeded: past :data:`REPORTS_PER_SECOND` (``retry_delay``: when one is taken again).
        """
        now = self._clock()
        wait = self._bucket.take(REPORTS_PER_SECOND, REPORT_BURST, now)
        if wait > 0:
            raise LimitExceeded(
                f"stale write reports: at most {REPORTS_PER_SECOND:g} a second (a burst of {REPORT_BURST}) per "
                f"coordinator; retry in {wait:.3f} s", name=request.name or None, limit="stale-write-reports",
                value=f"{REPORTS_PER_SECOND:g}/s", retry_delay=round(wait, 3) or 0.001)
        write = StaleWrite(request.name, request.token, request.current_token, request.storage, request.record, now)
        self._metrics.stale_write_reported(write.storage)
        log_event(_log, logging.WARNING, "stale_write",
                  f"a {write.storage} guard refused a write with fencing token {write.token} (the record had "
                  f"{write.current_token or 'a malformed token'})" + (f" of {write.name!r}" if write.name else ""),
                  name=write.name or None, token=write.token, current_token=write.current_token or None,
                  storage=write.storage, record=write.record or None, **caller(context))
        for listener in list(self._listeners):
            listener(write)
