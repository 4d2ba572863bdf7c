"""Counting against the limits (:mod:`.limits`): :class:`LimitTracker` refuses a call past one.

Every limit is counted by this coordinator replica alone, in its memory:
a caller spreading its calls over N replicas gets N times each limit.

What is counted, and when it stops counting:

- a **lease** granted here counts against its caller and the total from the
  grant until it is revoked here, a keepalive through this coordinator finds
  it gone, or its TTL passes after its grant or its last keepalive through
  this coordinator (checked lazily, at the next grant or refusal). A lease
  kept alive only through another replica so stops counting here after one
  TTL;
- the **holds and waits of a lease**: the holds of that lease granted here
  and not yet ended (followed by :class:`~..recipes.holds.HoldTracker`), plus its
  Acquire calls in progress here. An Acquire of a lock the lease already
  holds (idempotent) is never refused by this limit;
- the **streams** of a caller: its KeepAlive and Observe streams open here;
- the **rates**: a token bucket per caller and call (LeaseGrant, Acquire),
  ``rate`` tokens a second up to ``burst``; each call takes one. A bucket
  left to fill up is forgotten; at most :data:`MAX_TRACKED_CALLERS` buckets
  per call are kept (the least recently used one goes first: its caller then
  starts again with a full bucket).

Memory: one entry per lease counted (at most ``max-leases``; none when both
lease limits are off), per lease with
Acquire calls in progress, per caller with leases or streams, and at most
:data:`MAX_TRACKED_CALLERS` buckets per rate and :data:`MAX_LOG_ENTRIES`
log-suppression entries: bounded whatever the callers do.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from fencepost.client.errors import LimitExceeded

from .limits import FLAGS, Limits

__all__ = ["LOG_INTERVAL_SECONDS", "MAX_TRACKED_CALLERS", "LimitTracker", "TokenBucket"]

_log = logging.getLogger(__name__)

#: Most callers whose rate buckets are kept, per rate (the least recently used goes first).
MAX_TRACKED_CALLERS = 10_000
#: A refusal is logged at most once per caller and limit in this many seconds (the others are counted).
LOG_INTERVAL_SECONDS = 10.0
#: Most (caller, limit) pairs whose last logged refusal is remembered.
MAX_LOG_ENTRIES = 10_000


class TokenBucket:
    """A token bucket (``rate`` tokens a second, up to ``burst``), full when made.

    Args:
        burst: the bucket's size, and its tokens at the start.
        now: the clock reading at the start, in seconds.
    """

    __slots__ = ("_at", "_tokens")

    def __init__(self, burst: float, now: float) -> None:
        self._tokens = float(burst)
        self._at = now

    def take(self, rate: float, burst: float, now: float) -> float:
        """Take one token if there is one.

        Args:
            rate: tokens added per second (> 0).
            burst: most tokens held.
            now: the clock reading, in seconds (monotonic).

        Returns:
            0.0 when a token was taken; else the seconds until one will be there.
        """
        self._fill(rate, burst, now)
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0.0
        return (1.0 - self._tokens) / rate

    def full(self, rate: float, burst: float, now: float) -> bool:
        """Whether the bucket has filled up by ``now`` (it can then be forgotten)."""
        self._fill(rate, burst, now)
        return self._tokens >= burst

    def _fill(self, rate: float, burst: float, now: float) -> None:
        if now > self._at:
            self._tokens = min(float(burst), self._tokens + (now - self._at) * rate)
            self._at = now


class _Rate:
    """The buckets of one rate limit, one per caller, bounded."""

    def __init__(self, flag: str, rate: float, burst: int, clock: Callable[[], float]) -> None:
        self.flag = flag
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, caller: str) -> float:
        """One call of ``caller``: 0.0 when allowed, else the seconds until one would be."""
        if self.rate <= 0:
            return 0.0
        now = self._clock()
        # Forget the buckets that filled up, least recently used first (the likeliest to be full).
        while self._buckets:
            oldest = next(iter(self._buckets))
            if oldest == caller or not self._buckets[oldest].full(self.rate, self.burst, now):
                break
            del self._buckets[oldest]
        bucket = self._buckets.get(caller)
        if bucket is None:
            bucket = self._buckets[caller] = TokenBucket(self.burst, now)
            while len(self._buckets) > MAX_TRACKED_CALLERS:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(caller)
        return bucket.take(self.rate, self.burst, now)


@dataclass(slots=True)
class _Lease:
    caller: str
    expires: float  # clock reading after which it no longer counts (TTL since its grant or last keepalive here)


class LimitTracker:
    """Counts what each caller and lease holds on this coordinator, and refuses past :class:`Limits`.

    Not thread-safe: used from the coordinator's event loop only.

    Args:
        limits: the limits.
        holds_of: the holds granted here to a lease and not yet ended: lease id
            -> count (:meth:`..recipes.holds.HoldTracker.holds_of`).
        holds: whether (lock name, lease id) is a hold granted here and not yet
            ended (:meth:`..recipes.holds.HoldTracker.holds`).
        clock: the monotonic clock, seconds (injected in tests).
    """

    def __init__(self, limits: Limits, *, holds_of: Callable[[int], int] = lambda _lease_id: 0,
                 holds: Callable[[str, int], bool] = lambda _name, _lease_id: False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._holds_of = holds_of
        self._holds = holds
        self._clock = clock
        self._lease_rate = _Rate(FLAGS["lease_grant_rate"], limits.lease_grant_rate, limits.lease_grant_burst, clock)
        self._acquire_rate = _Rate(FLAGS["acquire_rate"], limits.acquire_rate, limits.acquire_burst, clock)
        self._leases: dict[int, _Lease] = {}  # lease id -> its caller and expiry
        self._expiries: list[tuple[float, int]] = []  # (expiry when pushed, lease id): one entry per lease
        self._by_caller: dict[str, int] = {}  # caller -> its leases counted (granted, or being granted)
        self._pending = 0  # LeaseGrant calls past their check, not yet answered by etcd
        self._acquiring: dict[int, int] = {}  # lease id -> Acquire calls in progress here
        self._streams: dict[str, int] = {}  # caller -> KeepAlive streams open here
        self._logged: OrderedDict[tuple[str, str], list[float]] = OrderedDict()  # -> [last logged at, suppressed]

    # ------------------------------------------------------------------ counts (for tests and ServerInfo)

    @property
    def lease_count(self) -> int:
        """Leases counted now (granted here, not known to have ended), with those being granted."""
        self._sweep(self._clock())
        return len(self._leases) + self._pending

    def leases_of(self, caller: str) -> int:
        """Leases counted now against ``caller``."""
        self._sweep(self._clock())
        return self._by_caller.get(caller, 0)

    @property
    def tracked(self) -> dict[str, int]:
        """The size of each structure kept (its memory): leases, callers, buckets, log entries."""
        return {"leases": len(self._leases), "expiries": len(self._expiries), "callers": len(self._by_caller),
                "acquiring": len(self._acquiring), "streams": len(self._streams),
                "lease_grant_buckets": len(self._lease_rate), "acquire_buckets": len(self._acquire_rate),
                "log_entries": len(self._logged)}

    # ------------------------------------------------------------------ leases

    @contextlib.contextmanager
    def lease_grant(self, caller: str) -> Iterator[Callable[[int, int], None]]:
        """A LeaseGrant of ``caller``: check its limits, and count the lease it grants.

        Use as ``with tracker.lease_grant(caller) as granted: ...; granted(lease_id, ttl)``:
        the lease counts from the check (so concurrent calls cannot pass the
        limit together); if ``granted`` is not called before the block ends
        (the grant failed), it no longer counts.

        Raises:
            LimitExceeded: ``max-leases-per-caller``, ``max-leases``, or (with a
                ``retry_delay``) ``max-lease-grant-rate``.
        """
        limits = self.limits
        if not limits.max_leases_per_caller and not limits.max_leases:  # nothing to count: keep nothing
            self._rate(self._lease_rate, caller, "LeaseGrant")
            yield lambda _lease_id, _ttl_seconds: None
            return
        now = self._clock()
        self._sweep(now)
        mine = self._by_caller.get(caller, 0)
        if limits.max_leases_per_caller and mine >= limits.max_leases_per_caller:
            raise _exceeded("max_leases_per_caller", limits.max_leases_per_caller,
                            f"{mine} leases granted by this coordinator are live")
        total = len(self._leases) + self._pending
        if limits.max_leases and total >= limits.max_leases:
            raise _exceeded("max_leases", limits.max_leases,
                            f"{total} leases granted by this coordinator are live (all callers)")
        self._rate(self._lease_rate, caller, "LeaseGrant")
        self._by_caller[caller] = mine + 1
        self._pending += 1
        done = False

        def granted(lease_id: int, ttl_seconds: int) -> None:
            nonlocal done
            if done:
                return
            done = True
            self._pending -= 1
            if lease_id in self._leases:  # cannot be (etcd ids are unique); never count one twice
                self._uncount(caller)
                return
            expires = self._clock() + ttl_seconds
            self._leases[lease_id] = _Lease(caller, expires)
            heapq.heappush(self._expiries, (expires, lease_id))

        try:
            yield granted
        finally:
            if not done:
                done = True
                self._pending -= 1
                self._uncount(caller)

    def kept_alive(self, lease_id: int, ttl_seconds: int) -> None:
        """A keepalive through this coordinator found ``lease_id`` with ``ttl_seconds`` left (<= 0: gone)."""
        lease = self._leases.get(lease_id)
        if lease is None:
            return
        if ttl_seconds <= 0:
            self.lease_ended(lease_id)
        else:
            lease.expires = self._clock() + ttl_seconds  # its heap entry is moved when it comes up

    def lease_ended(self, lease_id: int) -> None:
        """``lease_id`` is gone (revoked here, or a keepalive found it gone): it no longer counts."""
        lease = self._leases.pop(lease_id, None)
        if lease is not None:
            self._uncount(lease.caller)  # its heap entry is dropped when it comes up

    def _uncount(self, caller: str) -> None:
        left = self._by_caller.get(caller, 0) - 1
        if left <= 0:
            self._by_caller.pop(caller, None)
        else:
            self._by_caller[caller] = left

    def _sweep(self, now: float) -> None:
        """Drop the leases whose TTL has passed since their grant or last keepalive here."""
        heap = self._expiries
        while heap and heap[0][0] <= now:
            _, lease_id = heapq.heappop(heap)
            lease = self._leases.get(lease_id)
            if lease is None:
                continue  # ended meanwhile
            if lease.expires > now:
                heapq.heappush(heap, (lease.expires, lease_id))  # kept alive since: its new expiry
            else:
                del self._leases[lease_id]
                self._uncount(lease.caller)
        # Entries of ended leases stay until they come up: at most one per lease granted within a TTL.
        if len(heap) > 2 * len(self._leases) + 1024:
            self._expiries = [(lease.expires, lease_id) for lease_id, lease in self._leases.items()]
            heapq.heapify(self._expiries)

    # ------------------------------------------------------------------ acquires

    @contextlib.contextmanager
    def acquiring(self, caller: str, name: str, lease_id: int) -> Iterator[None]:
        """An Acquire by ``caller`` of lock ``name`` for ``lease_id``, counted while the block runs.

        Raises:
            LimitExceeded: ``max-holds-per-lease`` (unless the lease already
                holds ``name``), or (with a ``retry_delay``) ``max-acquire-rate``.
        """
        limit = self.limits.max_holds_per_lease
        if limit and not self._holds(name, lease_id):
            count = self._holds_of(lease_id) + self._acquiring.get(lease_id, 0)
            if count >= limit:
                raise _exceeded("max_holds_per_lease", limit,
                                f"lease {lease_id:#x} has {count} holds and waits through this coordinator",
                                name=name, lease_id=lease_id)
        self._rate(self._acquire_rate, caller, "Acquire", name=name, lease_id=lease_id)
        self._acquiring[lease_id] = self._acquiring.get(lease_id, 0) + 1
        try:
            yield
        finally:
            left = self._acquiring[lease_id] - 1
            if left <= 0:
                del self._acquiring[lease_id]
            else:
                self._acquiring[lease_id] = left

    # ------------------------------------------------------------------ streams

    def stream_opened(self, caller: str) -> None:
        """A KeepAlive stream of ``caller`` opens: count it (call :meth:`stream_closed` when it ends).

        Raises:
            LimitExceeded: ``max-streams-per-caller`` (the stream is not counted).
        """
        limit = self.limits.max_streams_per_caller
        open_now = self._streams.get(caller, 0)
        if limit and open_now >= limit:
            raise _exceeded("max_streams_per_caller", limit, f"{open_now} streams (KeepAlive, Observe) of this caller are open")
        self._streams[caller] = open_now + 1

    def stream_closed(self, caller: str) -> None:
        """A KeepAlive stream :meth:`stream_opened` counted has ended."""
        left = self._streams.get(caller, 0) - 1
        if left <= 0:
            self._streams.pop(caller, None)
            if not self._streams:
                self._streams = {}  # a dict keeps its largest table: give it back once empty
        else:
            self._streams[caller] = left

    # ------------------------------------------------------------------ rates and the log

    def _rate(self, rate: _Rate, caller: str, call: str, *, name: str | None = None,
              lease_id: int | None = None) -> None:
        wait = rate.take(caller)
        if wait > 0:
            raise LimitExceeded(
                f"limit {rate.flag} ({_number(rate.rate)}/s) reached: {call} calls of this caller past a burst "
                f"of {rate.burst}; retry in {wait:.3f} s", name=name, lease_id=lease_id, limit=rate.flag,
                value=f"{_number(rate.rate)}/s", retry_delay=round(wait, 3) or 0.001)

    def log_refusal(self, caller: str, limit: str | None) -> int | None:
        """Whether to log a refusal of ``caller`` at ``limit`` now: once per :data:`LOG_INTERVAL_SECONDS`.

        Returns:
            None: do not log it (it is counted); else the refusals of that caller
            and limit not logged since the last line.
        """
        now = self._clock()
        key = (caller, limit or "")
        entry = self._logged.get(key)
        if entry is not None and now - entry[0] < LOG_INTERVAL_SECONDS:
            entry[1] += 1
            return None
        suppressed = int(entry[1]) if entry is not None else 0
        self._logged[key] = [now, 0]
        self._logged.move_to_end(key)
        while self._logged:  # forget the entries whose interval is over (oldest first), and past the bound
            oldest = next(iter(self._logged.items()))
            if len(self._logged) <= MAX_LOG_ENTRIES and (oldest[1][1] or now - oldest[1][0] < LOG_INTERVAL_SECONDS):
                break
            self._logged.popitem(last=False)
        return suppressed


def _number(value: float) -> str:
    return f"{value:g}"


def _exceeded(field: str, value: float, why: str, *, name: str | None = None,
              lease_id: int | None = None) -> LimitExceeded:
    flag = FLAGS[field]
    return LimitExceeded(f"limit {flag} ({_number(value)}) reached: {why}", name=name, lease_id=lease_id,
                         limit=flag, value=_number(value))
