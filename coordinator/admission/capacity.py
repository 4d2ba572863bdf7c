"""Whether this coordinator is past its capacity: then it refuses newcomers, so that what it admitted is served.

A coordinator is one Python process whose work runs on one event loop
thread. Past what that thread can do, messages wait in gRPC's receive
buffers, where no queue of ours sees them, and every holder's keepalives
are answered later and later until clients declare their holds lost: the
load then degrades everyone instead of being refused at the door.
:class:`Capacity` tells that condition from four signals:

- **loop busy**: the CPU time of the event loop thread per wall second
  (``time.thread_time``, read in that thread at each of
  :class:`.overload.LoopLag`'s measurements). A saturated loop is the
  capacity of the process, whatever the backlog's shape, and seen before the
  backlog grows. A pause (SIGSTOP, a stalled machine) or other processes
  taking the CPU make it smaller, never larger. (The process's CPU time,
  gRPC's threads included, is no signal: a coordinator serving lock cycles
  as fast as its clients ask reads 0.9 and more while every call is answered
  in time; it only tells whether the process had CPU to spare, below.)
- **client round trip**: the round trip each client measured for its
  previous acknowledged keepalive on its stream (``KeepAliveRequest.last_rtt_ms``,
  0 or absent: unknown): what clients experience, including the time their
  messages waited unread in gRPC's buffers. The median of a window's reports,
  so that a few slow clients (their own network, their own pause) do not
  count; a window without reports counts as 0.
- **keepalive wait**: how long each keepalive message waited before the
  coordinator read it (in the network and gRPC's buffers), from the send
  time its client puts in it (``KeepAliveRequest.sent_ms``, see
  :class:`..api.stream.KeepAliveStream`): the backlog as it forms, with no
  renewal period of delay. The median of a window's messages.
- **lag** (:class:`.overload.LoopLag`, ``--max-lag``): the loop's lateness,
  the oldest keepalive waiting for etcd, answers waiting to be sent.

Each of the first three is measured over windows of :data:`WINDOW` seconds;
its figure is the smallest of the last :data:`WINDOWS` windows (sustained:
one busy moment or one slow window does not count). The coordinator is
**past capacity** from the moment a figure reaches its high mark
(``--max-loop-busy``, ``--max-client-rtt``, ``--max-keepalive-wait``,
``--max-lag``; 0 turns a signal off) until every signal (each window's loop busy and median, the lag at each
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

Refusing newcomers does not take back what was admitted, and a lease adds
its keepalives only from its first renewal on, up to a third of its TTL
after its grant: a coordinator that let grants in whenever it was calm
would admit, in each calm spell, leases whose renewals tip it over later,
until what it admitted alone is more than it can serve. So it also learns a
**lease ceiling** (additive-increase/multiplicative-decrease, as TCP's
congestion window, RFC 5681): on entering the condition the ceiling becomes
:data:`BACKOFF` times the leases it then carries (the leases kept alive
through its streams, plus those granted in the last :data:`RAISE_SECONDS`,
whose renewals may not have started); outside the condition a LeaseGrant is
refused (OVERLOADED) while that many are carried; after :data:`RAISE_SECONDS`
calm in which a grant was refused at the ceiling, it rises by
:data:`RAISE`, but for :data:`TIPPED_SECONDS` after tipping over never
above :data:`BACKOFF` of what it carried then (the leases admitted stay:
each rise to the level that tipped it over, and the fall after it, would
leave it carrying a little more than before, a ratchet into overload).

The condition is seen late for leases: their renewals start a third of a
TTL after their grants, so a rush of grants is admitted before the loop
shows its cost. The **process busy** figure (``--max-process-busy``: the
CPU seconds of the whole process, gRPC's threads included, per wall second,
the smallest of the last windows) is seen first: it counts the reading of
messages in gRPC's threads, which the loop's own figure does not. While it
is at its mark, the ceiling is set to (or lowered to) :data:`BACKOFF` times
the leases carried (never below :data:`MIN_PROCESS_CEILING`), as on
entering the condition, and rises only while the process is below
:data:`LOW_MARK` of it, in proportion to the room left (the busy a lease
adds is about constant: a process at a third of the low mark may triple
its leases), at most :data:`MAX_RAISE` times at once. It refuses only
LeaseGrant, never streams or waits: a coordinator serving lock cycles as
fast as they come reads 0.9 and more while every call is answered in time,
and its callers' waits must go on being served. No ceiling until one of the
two first happens. Before and beside it, a **grant ramp** (TCP's slow start
in spirit, RFC 5681) bounds how fast leases are taken on: the leases
granted in the last :data:`RAISE_SECONDS` (whose renewals may not show
yet) stay below :attr:`Capacity.ramp`, what the room left under the low
mark allows (at least :data:`MIN_RAMP`; the busiest of the last windows), so that a rush of grants cannot
take on much more than the process has room for before the figures show
it.

Metrics: ``fencepost_loop_busy_ratio``, ``fencepost_process_busy_ratio``,
``fencepost_keepalive_client_rtt_seconds``, ``fencepost_keepalive_wait_seconds`` (the figures),
``fencepost_lease_ceiling`` (0: none) and ``fencepost_overloaded`` (0 or 1); refusals are counted in
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

__all__ = ["BACKOFF", "CALM_WINDOWS", "LOW_MARK", "MAX_CALM_SECONDS", "MAX_RAISE", "MIN_CEILING",
           "MIN_PROCESS_CEILING", "MIN_RAMP", "RAISE", "RAISE_SECONDS", "RETRY_SECONDS", "SAMPLES", "SPARE_BUSY",
           "TIPPED_SECONDS", "WINDOW", "WINDOWS", "Capacity"]

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
#: The lease ceiling on entering the condition, as a fraction of the leases carried then.
BACKOFF = 0.9
#: The lease ceiling's growth after a calm spell in which grants were refused at it...
RAISE = 1.1
#: ... of this many seconds (more than a third of the usual TTL: the new leases' renewals have started).
RAISE_SECONDS = 5.0
#: ... at most this much at once, while the process is far below --max-process-busy (in proportion).
MAX_RAISE = 2.0
#: The lowest ceiling the process busy sets: fewer leases than this do not saturate a coordinator (something
#: else does, lock cycles for example, and refusing leases would not relieve it).
MIN_PROCESS_CEILING = 1000
#: Leases that may always be granted in RAISE_SECONDS, whatever the ramp (200 a second).
MIN_RAMP = 1000
#: For this many seconds after tipping over, the ceiling rises to at most BACKOFF of the leases carried then.
TIPPED_SECONDS = 60.0
#: Below this many CPU seconds per second (the whole process's), the coordinator had CPU to spare.
SPARE_BUSY = 0.7
#: The lowest lease ceiling.
MIN_CEILING = 100
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
        process_clock: the CPU seconds of the whole process (``time.process_time``): whether it had CPU to spare.
        window: seconds per window.
        windows: windows per figure.
        calm: windows every signal must stay below its low mark to leave the condition.
    """

    def __init__(self, limits: Limits | None = None, *, clock: Callable[[], float] = time.monotonic,
                 cpu_clock: Callable[[], float] = time.thread_time, window: float = WINDOW,
                 process_clock: Callable[[], float] = time.process_time,
                 windows: int = WINDOWS, calm: int = CALM_WINDOWS) -> None:
        limits = limits if limits is not None else Limits()
        self._busy_high = limits.max_loop_busy
        self._rtt_high = limits.max_client_rtt
        self._wait_high = limits.max_keepalive_wait
        self._process_high = limits.max_process_busy
        self._lag_high = limits.max_lag
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._window = window
        self._base_calm = self._calm_seconds = calm * window
        self._ended_at = -math.inf  # when the condition last ended
        self._unsettled_at = clock()  # the last measurement at which a signal was at or above its low mark
        self._busy: deque[float] = deque(maxlen=windows)
        self._rtt: deque[float] = deque(maxlen=windows)
        self._wait: deque[float] = deque(maxlen=windows)
        self._samples = [0] * SAMPLES
        self._reports = 0  # round trips reported in the current window
        self._waits = [0] * SAMPLES
        self._waited = 0  # keepalive messages' waits in the current window
        self._kept: Callable[[], int] = lambda: 0
        self._grants: deque[float] = deque()  # when leases were granted, the last RAISE_SECONDS
        self._raised_at = -math.inf  # when the ceiling last changed
        self._pressed = False  # a grant was refused at the ceiling since it last changed
        self._tipped, self._tipped_at = 0, -math.inf  # the leases carried when it last tipped over, and when
        self._started = clock()
        self._cpu_started = cpu_clock()
        self._process_clock = process_clock
        self._process_started = process_clock()
        self._process_busy = 0.0  # the process's CPU seconds per second in the last window
        self._process: deque[float] = deque(maxlen=windows)
        self._lag: Callable[[], float] = lambda: 0.0
        self._lag_parts: Callable[[], tuple[float, float, float]] = lambda: (0.0, 0.0, 0.0)
        self._metrics = NO_METRICS
        self._why = ""
        #: Whether the coordinator is past its capacity now.
        self.overloaded = False
        #: Windows closed so far.
        self.windows = 0
        #: The lease ceiling (see the module docstring); None before the condition first started.
        self.ceiling: int | None = None

    def follow(self, lag: LoopLag, metrics: LockMetrics = NO_METRICS, kept: Callable[[], int] = lambda: 0) -> None:
        """Measure at each of ``lag``'s measurements (in the loop thread), with its figure as a signal.

        Args:
            lag: the coordinator's lag monitor (its ticker drives the windows).
            metrics: where the figures and the condition are set.
            kept: the number of leases kept alive through this coordinator's streams now.
        """
        self._lag = lambda: lag.seconds
        self._lag_parts = lambda: lag.parts
        self._metrics = metrics
        self._kept = kept
        lag.subscribe(self.tick)

    # ------------------------------------------------------------------ the signals

    def reported(self, rtt_ms: int) -> None:
        """A client's round trip of its previous acknowledged keepalive, ``rtt_ms`` milliseconds (> 0).

        Called for every keepalive message that carries one: constant work, no allocation.
        """
        i = self._reports
        self._samples[i & (SAMPLES - 1)] = rtt_ms
        self._reports = i + 1

    def waited(self, wait_ms: int) -> None:
        """A keepalive message waited ``wait_ms`` milliseconds (>= 0) before it was read.

        Called for every keepalive message that carries its send time: constant work, no allocation.
        """
        i = self._waited
        self._waits[i & (SAMPLES - 1)] = wait_ms
        self._waited = i + 1

    def granted(self) -> None:
        """A lease was granted here: it counts as carried (for the ceiling) from now on."""
        self._grants.append(self._clock())

    @property
    def carried(self) -> int:
        """The leases this coordinator carries: kept alive through its streams, plus those granted in the last
        :data:`RAISE_SECONDS` (a lease granted then may be counted twice: on the safe side)."""
        return self._kept() + len(self._grants)

    @property
    def ramp(self) -> float:
        """The leases that may be granted in :data:`RAISE_SECONDS` (inf with ``--max-process-busy`` 0): at least
        :data:`MIN_RAMP`, else as many more than the leases kept as would bring the process busy (its last window)
        to :data:`LOW_MARK` of its mark (its busiest of the last windows), at least :data:`RAISE` - 1 of them."""
        if not self._process_high:
            return math.inf
        room = LOW_MARK * self._process_high / max(self._busiest(), 0.01) - 1
        return max(MIN_RAMP, self._kept() * max(RAISE - 1, room))

    @property
    def keepalive_wait(self) -> float:
        """The keepalive wait figure, in seconds: the smallest median of the last windows (0.0 until there are as
        many as it needs)."""
        return _smallest(self._wait)

    @property
    def busy(self) -> float:
        """The loop busy figure: the smallest CPU seconds per wall second of the last windows (0.0 until there
        are as many as it needs)."""
        return _smallest(self._busy)

    @property
    def process_busy(self) -> float:
        """The process busy figure: the smallest CPU seconds of the whole process per wall second of the last
        windows (0.0 until there are as many as it needs)."""
        return _smallest(self._process)

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
            cpu, process = self._cpu_clock(), self._process_clock()
            self._busy.append(min(1.0, max(0.0, (cpu - self._cpu_started) / elapsed)))
            self._process_busy, self._process_started = (process - self._process_started) / elapsed, process
            self._process.append(self._process_busy)
            self._rtt.append(_median(self._samples, self._reports) / 1000.0)
            self._wait.append(_median(self._waits, self._waited) / 1000.0)
            self._started, self._cpu_started, self._reports, self._waited = now, cpu, 0, 0
            self.windows += 1
            self._metrics.capacity(self.busy, self.client_rtt, self.keepalive_wait, self.ceiling or 0,
                                   self.process_busy)
        while self._grants and self._grants[0] < now - RAISE_SECONDS:
            self._grants.popleft()
        self._update()
        if self._process_high and self.process_busy >= self._process_high:
            lowered = max(MIN_PROCESS_CEILING, int(BACKOFF * self.carried))
            if self.ceiling is None or lowered < self.ceiling:
                self._set_ceiling(lowered, now, f"the process busy {self.process_busy:.2f} of each second, "
                                                f"--{FLAGS['max_process_busy']} {self._process_high:g}")
        elif (self.ceiling is not None and self._pressed and not self.overloaded
                and now - max(self._raised_at, self._ended_at) >= RAISE_SECONDS
                and (not self._process_high or self._busiest() < LOW_MARK * self._process_high)):
            # Never back up to where it last tipped over, for a while: leases admitted stay, so each rise
            # up to there and the fall after it would leave a few more than the coordinator serves.
            raised = int(self.ceiling * self._raise_factor()) + 1
            if now - self._tipped_at < TIPPED_SECONDS:
                raised = min(raised, int(BACKOFF * self._tipped))
            if raised > self.ceiling:
                self._set_ceiling(raised, now, "raised after a calm spell")

    def _raise_factor(self) -> float:
        """How much the ceiling rises: :data:`RAISE`, or more while the process is far below its mark (the load
        taken on grows with the leases: up to the low mark, at most doubled)."""
        if not self._process_high:
            return RAISE
        return min(MAX_RAISE, max(RAISE, LOW_MARK * self._process_high / max(self._busiest(), 0.01)))

    def _busiest(self) -> float:
        """The process's busiest window of the last ones (to take on more: on the safe side)."""
        return max(self._process, default=self._process_busy)

    def _set_ceiling(self, ceiling: int, now: float, why: str) -> None:
        self.ceiling, self._raised_at, self._pressed = ceiling, now, False
        self._metrics.capacity(self.busy, self.client_rtt, self.keepalive_wait, ceiling, self.process_busy)
        log_event(_log, logging.INFO, "lease_ceiling", f"lease ceiling {ceiling} ({why}): LeaseGrant is refused while "
                  f"this coordinator carries that many leases", ceiling=ceiling, carried=self.carried)

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
                loop_late, etcd_wait, send_wait = self._lag_parts()
                spare = self._process_busy < SPARE_BUSY
                if why == self._lag_why(lag) and etcd_wait > max(loop_late, send_wait) and spare:
                    pass  # etcd is behind while this process has CPU to spare: the leases carried did not do it
                else:
                    self._tipped, self._tipped_at = self.carried, now
                    self._set_ceiling(max(MIN_CEILING, int(BACKOFF * min(self._tipped, self.ceiling or math.inf))),
                                      now, "past capacity")
                log_event(_log, logging.WARNING, "overloaded", f"past capacity ({why}): new leases, streams and "
                          f"waits are refused until it is served again", busy=round(self.busy, 3),
                          client_rtt_s=round(self.client_rtt, 3), keepalive_wait_s=round(self.keepalive_wait, 3),
                          lag_s=round(lag, 3), lag_parts_s=[round(part, 3) for part in self._lag_parts()],
                          calm_s=self._calm_seconds, ceiling=self.ceiling)
        elif now - self._unsettled_at >= self._calm_seconds:
            self.overloaded, self._ended_at = False, now
            self._metrics.overloaded(False)
            log_event(_log, logging.INFO, "overload_end", "back within capacity: new leases, streams and waits are "
                      "admitted", busy=round(self.busy, 3), client_rtt_s=round(self.client_rtt, 3),
                      keepalive_wait_s=round(self.keepalive_wait, 3), lag_s=round(lag, 3), ceiling=self.ceiling)

    def _past(self, lag: float) -> str:
        """Why the figures say past capacity ("" when they do not)."""
        if self._busy_high and self.busy >= self._busy_high:
            return f"event loop busy {self.busy:.2f} of each second, --{FLAGS['max_loop_busy']} {self._busy_high:g}"
        if self._rtt_high and self.client_rtt >= self._rtt_high:
            return (f"clients' keepalive round trip {self.client_rtt:.3f} s, --{FLAGS['max_client_rtt']} "
                    f"{self._rtt_high:g}")
        if self._wait_high and self.keepalive_wait >= self._wait_high:
            return (f"keepalives wait {self.keepalive_wait:.3f} s to be read, --{FLAGS['max_keepalive_wait']} "
                    f"{self._wait_high:g}")
        return self._lag_why(lag)

    def _lag_why(self, lag: float) -> str:
        """Why the lag says past capacity ("" when it does not)."""
        if self._lag_high and lag > self._lag_high:
            return f"{lag:.3f} s behind, --{FLAGS['max_lag']} {self._lag_high:g}"
        return ""

    def _settled(self, lag: float) -> bool:
        """Whether every signal is below its low mark now (the last window's busy and median, the lag)."""
        return ((not self._busy_high or not self._busy or self._busy[-1] < LOW_MARK * self._busy_high)
                and (not self._rtt_high or not self._rtt or self._rtt[-1] < LOW_MARK * self._rtt_high)
                and (not self._wait_high or not self._wait or self._wait[-1] < LOW_MARK * self._wait_high)
                and (not self._lag_high or lag <= LOW_MARK * self._lag_high))

    # ------------------------------------------------------------------ admission

    def admit(self, call: str, lease: bool = False) -> None:
        """Refuse a newcomer while past capacity: ``call`` is a new lease, stream or wait; a new lease at the ceiling.

        Args:
            call: what is asked, for the message (``LeaseGrant``, ``KeepAlive``, ``Acquire``, ...).
            lease: whether ``call`` asks for a new lease (refused at the lease ceiling too).

        Raises:
            ResourceExhausted: reason OVERLOADED, ``retry_delay`` :data:`RETRY_SECONDS`.
        """
        if self.overloaded:
            why = f"past its capacity ({self._why})"
        elif lease and self.ceiling is not None and self.carried >= self.ceiling:
            self._pressed = True
            why = f"at its lease ceiling ({self.ceiling} leases, learned when it was last past its capacity)"
        elif lease and len(self._grants) >= self.ramp:
            why = (f"granting leases faster than their renewals show their cost ({len(self._grants)} in the last "
                   f"{RAISE_SECONDS:g} s)")
        else:
            return
        raise ResourceExhausted(
            f"{call} refused: this coordinator is {why}; the leases it keeps are served first: retry in "
            f"{RETRY_SECONDS:g} s or on another coordinator", reason=_OVERLOADED, retry_delay=RETRY_SECONDS)


def _median(samples: list[int], count: int) -> float:
    """The median of the first ``count`` of ``samples`` (a ring of :data:`SAMPLES`); 0.0 for none."""
    n = min(count, SAMPLES)
    if n == 0:
        return 0.0
    return float(sorted(samples[:n])[n // 2])


def _smallest(figures: deque[float]) -> float:
    return min(figures) if len(figures) == figures.maxlen else 0.0

