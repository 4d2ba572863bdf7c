"""Whether this coordinator is past its capacity: then it refuses newcomers, so that what it admitted is served.

A coordinator is one Python process whose work runs on one event loop
thread. Past what that thread can do, messages wait in gRPC's receive
buffers, where no queue of ours sees them, and every holder's keepalives
are answered later and later until clients declare their holds lost: the
load then degrades everyone instead of being refused at the door.
:class:`Capacity` tells that condition from three signals:

- **loop busy**: the CPU time of the event loop thread per wall second
  (``time.thread_time``, read in that thread at each of
  :class:`.overload.LoopLag`'s measurements). A saturated loop is the
  capacity of the process, whatever the backlog's shape, and seen before the
  backlog grows. A pause (SIGSTOP, a stalled machine) or other processes
  taking the CPU make it smaller, never larger.
- **client round trip**: the round trip each client measured for its
  previous acknowledged keepalive on its stream (``KeepAliveRequest.last_rtt_ms``,
  0 or absent: unknown): what clients experience, including the time their
  messages waited unread in gRPC's buffers. The median of a window's reports,
  so that a few slow clients (their own network, their own pause) do not
  count; a window without reports counts as 0.
- **lag** (:class:`.overload.LoopLag`, ``--max-lag``): the loop's lateness,
  the oldest keepalive waiting for etcd, answers waiting to be sent.

Each of the first two is measured over windows of :data:`WINDOW` seconds;
its figure is the smallest of the last :data:`WINDOWS` windows (sustained:
one busy moment or one slow window does not count). The coordinator is
**past capacity** from the moment a figure reaches its high mark
(``--max-loop-busy``, ``--max-client-rtt``, ``--max-lag``; 0 turns a signal
off) until every signal (each window's loop busy and median, the lag at each
measurement) has stayed below :data:`LOW_MARK` times its high mark for
:data:`CALM_WINDOWS` windows (hysteresis, in level and in time: the leases
admitted just before the condition start their keepalives up to a third of
their TTL later, so calm must last longer than that feedback takes, or the
next rush of grants overshoots again). A condition that starts again
within that calm period after it ended doubles the calm needed next time
(up to :data:`MAX_CALM_SECONDS`; back to :data:`CALM_WINDOWS` after a calm
as long as the last one): a coordinator whose admissions keep tipping it
over admits less and less often. Past capacity, new leases (LeaseGrant), new
KeepAlive streams and new waits (Acquire, AcquirePermit, Campaign with a
wait) are refused with RESOURCE_EXHAUSTED / OVERLOADED and a RetryInfo of
:data:`RETRY_SECONDS` (:meth:`Capacity.admit`); keepalives, releases,
withdrawals, revokes, try-once acquires and watches are always served.

Metrics: ``fencepost_loop_busy_ratio``, ``fencepost_keepalive_client_rtt_seconds``
(the figures) and ``fencepost_overloaded`` (0 or 1); refusals are counted in
``fencepost_refusals_total{reason="OVERLOADED"}``.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable

from fencepost.client.errors import ResourceExhausted
from fencepost.client.v1.details import RETRY_DELAY_BY_REASON, ErrorReason, reason_name

from ..telemetry.events import log_event
from ..telemetry.metrics import NO_METRICS, LockMetrics
from .limits import FLAGS, Limits
from .overload import LoopLag

__all__ = ["CALM_WINDOWS", "LOW_MARK", "MAX_CALM_SECONDS", "RETRY_SECONDS", "SAMPLES", "WINDOW", "WINDOWS", "Capacity"]

_log = logging.getLogger(__name__)

#: Seconds of one measurement window.
WINDOW = 0.5
#: Windows a figure is the smallest of (to enter), or the largest of (to leave): 1.5 s at WINDOW.
WINDOWS = 3
#: A signal must stay below this fraction of its high mark to leave the condition...
LOW_MARK = 0.8
#: ... for this many windows (5 s at WINDOW)...
CALM_WINDOWS = 10
#: ... doubled each time the condition starts again soon after it ended, up to this many seconds.
MAX_CALM_SECONDS = 60.0
#: Reported round trips kept per window (the last ones when more arrive); a power of two.
SAMPLES = 1024
#: The RetryInfo of a refusal, in seconds.
RETRY_SECONDS = RETRY_DELAY_BY_REASON[ErrorReason.OVERLOADED]

_OVERLOADED = reason_name(ErrorReason.OVERLOADED)


class Capacity:
    """Tells whether this coordinator is past its capacity (see the module docstring) and refuses newcomers then.

    Not thread-safe: used from the coordinator's event loop thread only.

    Args:
        limits: the high marks: ``max_loop_busy`` (ratio), ``max_client_rtt``
            and ``max_lag`` (seconds); 0 turns a signal off.
        clock: the wall clock, seconds (monotonic).
        cpu_clock: the CPU seconds of the calling thread (``time.thread_time``;
            read in the loop thread). A test makes the loop look saturated
            with a clock that runs as fast as ``clock``.
        window: seconds per window.
        windows: windows per figure.
        calm: windows every signal must stay below its low mark to leave the condition.
    """

    def __init__(self, limits: Limits | None = None, *, clock: Callable[[], float] = time.monotonic,
                 cpu_clock: Callable[[], float] = time.thread_time, window: float = WINDOW,
                 windows: int = WINDOWS, calm: int = CALM_WINDOWS) -> None:
        limits = limits if limits is not None else Limits()
        self._busy_high = limits.max_loop_busy
        self._rtt_high = limits.max_client_rtt
        self._lag_high = limits.max_lag
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._window = window
        self._base_calm = self._calm_seconds = calm * window
        self._ended_at = -math.inf  # when the condition last ended
        self._unsettled_at = clock()  # the last measurement at which a signal was at or above its low mark
        self._busy: deque[float] = deque(maxlen=windows)
        self._rtt: deque[float] = deque(maxlen=windows)
        self._samples = [0] * SAMPLES
        self._reports = 0  # round trips reported in the current window
        self._started = clock()
        self._cpu_started = cpu_clock()
        self._lag: Callable[[], float] = lambda: 0.0
        self._metrics = NO_METRICS
        self._why = ""
        #: Whether the coordinator is past its capacity now.
        self.overloaded = False
        #: Windows closed so far.
        self.windows = 0

    def follow(self, lag: LoopLag, metrics: LockMetrics = NO_METRICS) -> None:
        """Measure at each of ``lag``'s measurements (in the loop thread), with its figure as the third signal.

        Args:
            lag: the coordinator's lag monitor (its ticker drives the windows).
            metrics: where the figures and the condition are set.
        """
        self._lag = lambda: lag.seconds
        self._metrics = metrics
        lag.subscribe(self.tick)

    # ------------------------------------------------------------------ the signals

    def reported(self, rtt_ms: int) -> None:
        """A client's round trip of its previous acknowledged keepalive, ``rtt_ms`` milliseconds (> 0).

        Called for every keepalive message that carries one: constant work, no allocation.
        """
        i = self._reports
        self._samples[i & (SAMPLES - 1)] = rtt_ms
        self._reports = i + 1

    @property
    def busy(self) -> float:
        """The loop busy figure: the smallest CPU seconds per wall second of the last windows (0.0 until there
        are as many as it needs)."""
        return _smallest(self._busy)

    @property
    def client_rtt(self) -> float:
        """The client round trip figure, in seconds: the smallest median of the last windows (0.0 until there are
        as many as it needs)."""
        return _smallest(self._rtt)

    def tick(self) -> None:
        """One measurement (called by the lag monitor, in the loop thread): close the window if it is over, and
        enter or leave the condition."""
        now = self._clock()
        elapsed = now - self._started
        if elapsed >= self._window:
            cpu = self._cpu_clock()
            self._busy.append(min(1.0, max(0.0, (cpu - self._cpu_started) / elapsed)))
            self._rtt.append(self._median() / 1000.0)
            self._started, self._cpu_started, self._reports = now, cpu, 0
            self.windows += 1
            self._metrics.capacity(self.busy, self.client_rtt)
        self._update()

    def _median(self) -> float:
        n = min(self._reports, SAMPLES)
        if n == 0:
            return 0.0
        return float(sorted(self._samples[:n])[n // 2])

    def _update(self) -> None:
        lag = self._lag()
        now = self._clock()
        if not self._settled(lag):
            self._unsettled_at = now
        if not self.overloaded:
            why = self._past(lag)
            if why:
                self.overloaded, self._why = True, why
                # Tipped over again soon after admitting again: be calm for longer before the next admissions.
                soon = now - self._ended_at < self._calm_seconds
                self._calm_seconds = (min(MAX_CALM_SECONDS, 2 * self._calm_seconds) if soon else self._base_calm)
                self._metrics.overloaded(True)
                log_event(_log, logging.WARNING, "overloaded", f"past capacity ({why}): new leases, streams and "
                          f"waits are refused until it is served again", busy=round(self.busy, 3),
                          client_rtt_s=round(self.client_rtt, 3), lag_s=round(lag, 3),
                          calm_s=self._calm_seconds)
        elif now - self._unsettled_at >= self._calm_seconds:
            self.overloaded, self._ended_at = False, now
            self._metrics.overloaded(False)
            log_event(_log, logging.INFO, "overload_end", "back within capacity: new leases, streams and waits are "
                      "admitted", busy=round(self.busy, 3), client_rtt_s=round(self.client_rtt, 3), lag_s=round(lag, 3))

    def _past(self, lag: float) -> str:
        """Why the figures say past capacity ("" when they do not)."""
        if self._busy_high and self.busy >= self._busy_high:
            return f"event loop busy {self.busy:.2f} of each second, --{FLAGS['max_loop_busy']} {self._busy_high:g}"
        if self._rtt_high and self.client_rtt >= self._rtt_high:
            return (f"clients' keepalive round trip {self.client_rtt:.3f} s, --{FLAGS['max_client_rtt']} "
                    f"{self._rtt_high:g}")
        if self._lag_high and lag > self._lag_high:
            return f"{lag:.3f} s behind, --{FLAGS['max_lag']} {self._lag_high:g}"
        return ""

    def _settled(self, lag: float) -> bool:
        """Whether every signal is below its low mark now (the last window's busy and median, the lag)."""
        return ((not self._busy_high or not self._busy or self._busy[-1] < LOW_MARK * self._busy_high)
                and (not self._rtt_high or not self._rtt or self._rtt[-1] < LOW_MARK * self._rtt_high)
                and (not self._lag_high or lag <= LOW_MARK * self._lag_high))

    # ------------------------------------------------------------------ admission

    def admit(self, call: str) -> None:
        """Refuse a newcomer while past capacity: ``call`` is a new lease, stream or wait.

        Args:
            call: what is asked, for the message (``LeaseGrant``, ``KeepAlive``, ``Acquire``, ...).

        Raises:
            ResourceExhausted: reason OVERLOADED, ``retry_delay`` :data:`RETRY_SECONDS`.
        """
        if self.overloaded:
            raise ResourceExhausted(
                f"{call} refused: this coordinator is past its capacity ({self._why}); the leases it keeps are "
                f"served first: retry in {RETRY_SECONDS:g} s or on another coordinator", reason=_OVERLOADED,
                retry_delay=RETRY_SECONDS)


def _smallest(figures: deque[float]) -> float:
    return min(figures) if len(figures) == figures.maxlen else 0.0

