"""The coordinator's own metrics (``fencepost_*``): grants, holds, releases, losses, refusals, keepalives, etcd.

Every value is this coordinator's view: what the calls it served and the
etcd requests it sent did, not the whole cluster's (several coordinators
serve one etcd; add them up in Prometheus). No label carries a lock name or
a lease id: the label values are fixed sets. ``prefix`` is "" unless the
operator names lock-name prefixes (``serve --metrics-name-prefix``): then it
is the longest of them that the lock name starts with. Elections' and
semaphores' holds (locks with internal names, :mod:`fencepost.client.v1.kinds`)
count by the election's or semaphore's own name: ``jobs/`` covers the lock,
the election and the semaphore named ``jobs/x`` alike. No label ever shows
a name.

==================================  =========  ==================  ==============================================
metric                              type       labels              meaning
==================================  =========  ==================  ==============================================
fencepost_grants_total              counter    prefix              Acquire calls that granted the lock
fencepost_recipe_grants_total       counter    recipe              the same grants by recipe (RECIPES)
fencepost_acquire_wait_seconds      histogram  prefix              from an Acquire's start to its grant
fencepost_hold_seconds              histogram  prefix              from a grant made here to the hold's end
fencepost_handoff_seconds           histogram  queued              from a hold's end seen here to the next
                                                                   grant of that name made here; queued="true"
                                                                   when that Acquire was already asking
fencepost_holds                     gauge                          holds granted here not known to have ended
fencepost_losses_total              counter    reason              holds granted here that ended: released,
                                                                   expired, revoked, key_deleted
fencepost_leases                    gauge                          leases kept alive through KeepAlive streams
                                                                   here (last answer: alive)
fencepost_releases_total            counter                        Release calls that released a hold
fencepost_refusals_total            counter    reason              calls refused, by ErrorReason name, and
                                                                   LOCK_HELD for a try-acquire finding it held
fencepost_waiting_acquires          gauge                          Acquire calls with a wait in progress
fencepost_watched_holds             gauge                          holds watched by KeepAlive streams
fencepost_keepalives_total          counter                        keepalives received on KeepAlive streams
                                                                   (one per lease, batched or not)
fencepost_keepalive_batch_size      histogram                      leases per keepalive message received (1: a
                                                                   single keepalive; more: a batch)
fencepost_stream_call_batch_size    histogram                      calls per message of calls received on
                                                                   KeepAlive streams (1: a single call)
fencepost_etcd_request_seconds      histogram  operation           each etcd request, answered or failed
fencepost_etcd_errors_total         counter    operation, code     etcd requests that failed, by gRPC code
fencepost_etcd_batch_size           histogram                      lock Txns per etcd Txn sent for them (1:
                                                                   alone; see etcd/batch.py)
fencepost_watch_restarts_total      counter                        restarts of the lock watch
fencepost_lag_seconds               gauge                          how far behind: the event loop's lateness or
                                                                   the oldest keepalive's wait for etcd, the
                                                                   smallest of the last 0.25 s (overload.py)
fencepost_loop_busy_ratio           gauge                          event loop thread CPU s per s (capacity.py)
fencepost_keepalive_client_rtt_...  gauge                          median keepalive round trip clients report
fencepost_keepalive_wait_seconds    gauge                          median wait of keepalives before read
fencepost_lease_ceiling             gauge                          leases carried before grants are refused
fencepost_overloaded                gauge                          1 while past capacity (capacity.py)
fencepost_lock_delays               gauge                          locks whose lock-delay runs, cluster-wide
fencepost_lock_delay_remaining_...  gauge                          the longest time left of those delays
fencepost_stale_writes_reported...  counter    storage             writes fencing guards refused, as reported
                                                                   to this coordinator (ReportStaleWrite)
==================================  =========  ==================  ==============================================

``docs/operations.md`` ("Metrics") explains each one. :data:`NO_METRICS`
is the same interface recording nothing, the default of every module that
takes one, so that they have no branch for "metrics off".
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fencepost.client.v1 import kinds
from fencepost.client.v1.details import ErrorReason
from fencepost.client.v1.keys import MAX_NAME_BYTES

from .interceptor import GO_CODE_NAMES

__all__ = ["ACQUIRE_WAIT_BUCKETS", "BATCH_BUCKETS", "KEEPALIVE_BATCH_BUCKETS", "END_REASONS", "ETCD_BUCKETS", "ETCD_OPERATIONS", "HANDOFF_BUCKETS", "HOLD_BUCKETS",
           "LOCK_HELD", "MAX_NAME_PREFIXES", "NO_METRICS", "LockMetrics", "REFUSAL_REASONS", "STORAGE_KINDS",
           "RECIPES", "check_name_prefixes", "recipe_of"]

#: The refusal reason of a try-acquire (wait 0) that finds the lock held: not an
#: ErrorReason (the call succeeds with ``acquired = false``); named after the
#: client's ``LockHeld`` exception.
LOCK_HELD = "LOCK_HELD"

#: Every ``reason`` label value of ``fencepost_refusals_total``.
REFUSAL_REASONS = (*(name for name in ErrorReason.keys() if name != "ERROR_REASON_UNSPECIFIED"), LOCK_HELD)

#: The ``operation`` label values of the etcd metrics: the etcd layer's
#: operations (``etcd.policy.Op``), each with its own retry rule.
ETCD_OPERATIONS = ("range", "txn", "lease_grant", "lease_revoke", "lease_ttl", "keepalive", "watch",
                   "authenticate", "health", "status")

#: ``fencepost_acquire_wait_seconds`` upper bounds, seconds: an uncontended grant
#: takes one etcd Txn (milliseconds); a contended one waits for the holder.
ACQUIRE_WAIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                        300.0)

#: ``fencepost_hold_seconds`` upper bounds, seconds: from a batch job's milliseconds to a leader's hours.
HOLD_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0)

#: ``fencepost_handoff_seconds`` upper bounds, seconds: a waiter is granted milliseconds after the
#: deletion reaches the coordinator; ends older than a minute are forgotten (:mod:`..recipes.holds`).
HANDOFF_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                   60.0)

#: Every ``reason`` label value of ``fencepost_losses_total``: how a hold granted
#: here ended. ``released``: a Release (or a Withdraw of a hold) served here;
#: ``expired``: its key was deleted with its lease, not revoked here;
#: ``revoked``: its lease was revoked through this coordinator; ``key_deleted``:
#: its key was deleted while its lease lived (a Release through another
#: coordinator, or someone deleting the key).
END_REASONS = ("released", "expired", "revoked", "key_deleted")
#: The ``recipe`` label values of ``fencepost_recipe_grants_total``: a lock (its writer), a read-write lock's
#: reader, a multi-lock's name (one per name of an AcquireAll), a semaphore's permit, an election's leadership.
RECIPES = ("lock", "read", "multilock", "semaphore", "election")
_RECIPE_OF_KIND = {kinds.HoldKind.HOLD_KIND_LOCK: "lock", kinds.HoldKind.HOLD_KIND_READ: "read",
                   kinds.HoldKind.HOLD_KIND_SEMAPHORE: "semaphore", kinds.HoldKind.HOLD_KIND_ELECTION: "election"}


def recipe_of(internal_name: str) -> str:
    """The :data:`RECIPES` value of a grant of lock ``internal_name`` (a reader's, a permit's, a leadership's
    internal name tells its recipe; a plain name is a lock's; a multi-lock's grants are told by their caller)."""
    return _RECIPE_OF_KIND.get(kinds.public_hold(internal_name).kind, "lock")
#: ``storage`` labels of fencepost_stale_writes_reported_total: the guards' storage kinds; any other is "other".
STORAGE_KINDS = ("sqlite", "postgresql", "mysql", "redis", "etcd", "dynamodb", "s3", "other")

#: Most ``--metrics-name-prefix`` values: each is a ``prefix`` label value.
MAX_NAME_PREFIXES = 100

#: ``fencepost_etcd_request_seconds`` upper bounds, seconds (the per-request
#: deadlines are 0.5 s for a keepalive, 1 s for the health read, 5 s otherwise).
ETCD_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

#: ``fencepost_etcd_batch_size`` upper bounds, lock Txns per etcd Txn (at most ``serve --etcd-batch-max``, 64).
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
#: ``fencepost_keepalive_batch_size`` buckets: leases per keepalive message, up to a full batch
#: (``fencepost.client.v1.keys.MAX_KEEPALIVES_PER_BATCH``, 500).
KEEPALIVE_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 500)
#: ``fencepost_stream_call_batch_size`` buckets: calls per message, up to a full batch
#: (``fencepost.client.v1.keys.MAX_CALLS_PER_BATCH``, 500).
CALL_BATCH_BUCKETS = KEEPALIVE_BATCH_BUCKETS


def check_name_prefixes(prefixes: Iterable[str]) -> tuple[str, ...]:
    """Check the lock-name prefixes that get a ``prefix`` label of their own.

    Args:
        prefixes: lock-name prefixes, 1 to 256 bytes of UTF-8 each, no control characters.

    Returns:
        The prefixes, duplicates dropped, in their first order.

    Raises:
        ValueError: an empty prefix, one too long or with a control character,
            or more than :data:`MAX_NAME_PREFIXES`.
    """
    kept: dict[str, None] = {}
    for prefix in prefixes:
        if not isinstance(prefix, str) or not prefix:
            raise ValueError(f"a metrics name prefix must be a non-empty string, not {prefix!r}")
        size = len(prefix.encode("utf-8", "surrogatepass"))
        if size > MAX_NAME_BYTES:
            raise ValueError(f"metrics name prefix {prefix[:40]!r}... is {size} bytes; at most {MAX_NAME_BYTES}")
        if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in prefix):
            raise ValueError(f"metrics name prefix {prefix!r} has a control character")
        kept[prefix] = None
    if len(kept) > MAX_NAME_PREFIXES:
        raise ValueError(f"{len(kept)} metrics name prefixes; at most {MAX_NAME_PREFIXES}")
    return tuple(kept)


class LockMetrics:
    """The ``fencepost_*`` metrics of one coordinator, registered on ``registry``.

    Args:
        registry: where to register them (the coordinator's own, not the global one).
        name_prefixes: lock-name prefixes (checked by :func:`check_name_prefixes`)
            whose grants, waits and holds are labelled ``prefix="<the prefix>"``;
            every other name is labelled ``prefix=""``.

    Raises:
        ValueError: a metric of the same name is already in ``registry``; a bad prefix.
    """

    def __init__(self, registry: CollectorRegistry, name_prefixes: Iterable[str] = ()) -> None:
        # Longest first, so that the most specific prefix a name starts with is its label.
        self._prefixes = sorted(check_name_prefixes(name_prefixes), key=len, reverse=True)
        grants = Counter("fencepost_grants_total", "Acquire calls that granted the lock (this coordinator's).",
                         ["prefix"], registry=registry)
        wait = Histogram("fencepost_acquire_wait_seconds",
                         "Seconds from an Acquire call's start to its grant, waited or not.",
                         ["prefix"], buckets=ACQUIRE_WAIT_BUCKETS, registry=registry)
        hold = Histogram("fencepost_hold_seconds",
                         "Seconds from a grant made by this coordinator to the end of that hold, as seen here.",
                         ["prefix"], buckets=HOLD_BUCKETS, registry=registry)
        labels = ("", *self._prefixes)
        self._grants = {p: grants.labels(p) for p in labels}
        recipe_grants = Counter("fencepost_recipe_grants_total",
                                "Grants made by this coordinator by recipe: lock, read (a read-write lock's reader), "
                                "multilock (one per name), semaphore, election.", ["recipe"], registry=registry)
        self._recipe_grants = {r: recipe_grants.labels(r) for r in RECIPES}
        self._wait = {p: wait.labels(p) for p in labels}
        self._hold = {p: hold.labels(p) for p in labels}
        handoff = Histogram("fencepost_handoff_seconds",
                            "Seconds from the end of a hold seen by this coordinator to its next grant of the same "
                            "lock name; queued: whether that Acquire call had started before the end.",
                            ["queued"], buckets=HANDOFF_BUCKETS, registry=registry)
        self._handoff = {True: handoff.labels("true"), False: handoff.labels("false")}
        self._holds = Gauge("fencepost_holds", "Holds granted by this coordinator not known to have ended.",
                            registry=registry)
        losses = Counter("fencepost_losses_total",
                         "Holds granted by this coordinator that ended, by how: released, expired, revoked, "
                         "key_deleted.", ["reason"], registry=registry)
        self._losses = {reason: losses.labels(reason) for reason in END_REASONS}
        self._leases = Gauge("fencepost_leases",
                             "Leases kept alive through KeepAlive streams on this coordinator whose last keepalive "
                             "found them alive.", registry=registry)
        self._releases = Counter("fencepost_releases_total", "Release calls that released a hold.",
                                 registry=registry)
        refusals = Counter("fencepost_refusals_total",
                           "Calls refused, by ErrorReason; LOCK_HELD: a try-acquire found the lock held.",
                           ["reason"], registry=registry)
        self._refusals = {reason: refusals.labels(reason) for reason in REFUSAL_REASONS}
        self._refusals_by_name = refusals
        self._waiting = Gauge(
            "fencepost_waiting_acquires",
            "Acquire calls with a wait (wait_ms > 0 or wait_forever) in progress on this coordinator.",
            registry=registry)
        self._watched = Gauge("fencepost_watched_holds",
                              "Holds that KeepAlive streams on this coordinator watch for their end.",
                              registry=registry)
        self._keepalives = Counter("fencepost_keepalives_total",
                                   "Keepalives received on KeepAlive streams and forwarded to etcd, one per lease "
                                   "(a batch of N counts N).", registry=registry)
        self._keepalive_batch = Histogram("fencepost_keepalive_batch_size",
                                          "Leases per keepalive message received on KeepAlive streams: 1 for a "
                                          "single keepalive, N for a batch of N.", buckets=KEEPALIVE_BATCH_BUCKETS,
                                          registry=registry)
        self._call_batch = Histogram("fencepost_stream_call_batch_size",
                                     "Calls (acquire, release, withdraw, cancel) per message of calls received on "
                                     "KeepAlive streams: 1 for a single call, N for a batch of N.",
                                     buckets=CALL_BATCH_BUCKETS, registry=registry)
        seconds = Histogram("fencepost_etcd_request_seconds",
                            "Seconds of each etcd request until its answer or failure, by operation.",
                            ["operation"], buckets=ETCD_BUCKETS, registry=registry)
        self._etcd_seconds = {op: seconds.labels(op) for op in ETCD_OPERATIONS}
        self._etcd_errors = Counter("fencepost_etcd_errors_total",
                                    "etcd requests that failed, by operation and gRPC status code.",
                                    ["operation", "code"], registry=registry)
        self._etcd_batch = Histogram("fencepost_etcd_batch_size",
                                     "Lock Txns (Acquire, Release, Withdraw) sent to etcd in one Txn: 1 when sent "
                                     "alone, more when batched.", buckets=BATCH_BUCKETS, registry=registry)
        stale = Counter("fencepost_stale_writes_reported_total",
                        "Writes that fencing guards refused for a stale fencing token, as their applications "
                        "reported them to this coordinator (ReportStaleWrite), by storage kind.",
                        ["storage"], registry=registry)
        self._stale_writes = {kind: stale.labels(kind) for kind in STORAGE_KINDS}
        self._watch_restarts = Counter("fencepost_watch_restarts_total",
                                       "Restarts of the coordinator's watch of the lock prefix (etcd failure or "
                                       "compaction).", registry=registry)
        self._loop_lag = Gauge("fencepost_lag_seconds",
                               "How far behind the coordinator is: the larger of its event loop's lateness and the "
                               "wait of the oldest keepalive forwarded to etcd, the smallest of the last 0.25 s; "
                               "above --max-lag, past capacity.", registry=registry)
        self._busy = Gauge("fencepost_loop_busy_ratio",
                           "CPU seconds of the event loop thread per wall second, the smallest of the last 1.5 s; "
                           "at --max-loop-busy, past capacity.", registry=registry)
        self._process_busy = Gauge("fencepost_process_busy_ratio",
                                   "CPU seconds of the whole process (gRPC's threads too) per wall second, the "
                                   "smallest of the last 1.5 s; at --max-process-busy, a lease ceiling.",
                                   registry=registry)
        self._client_rtt = Gauge("fencepost_keepalive_client_rtt_seconds",
                                 "The keepalive round trip clients report (median of each 0.5 s), the smallest of "
                                 "the last 1.5 s; at --max-client-rtt, past capacity.", registry=registry)
        self._keepalive_wait = Gauge("fencepost_keepalive_wait_seconds",
                                     "How long keepalive messages wait before the coordinator reads them (median of "
                                     "each 0.5 s, from their send time), the smallest of the last 1.5 s; at "
                                     "--max-keepalive-wait, past capacity.", registry=registry)
        self._lease_ceiling = Gauge("fencepost_lease_ceiling",
                                    "The leases this coordinator carries before it refuses LeaseGrant (learned when "
                                    "past capacity); 0: none yet.", registry=registry)
        self._lock_delays = Gauge("fencepost_lock_delays",
                                  "Locks whose lock-delay runs now (a holder was lost: no grant until it ends), in "
                                  "the whole cluster, counted in etcd every 5 s: the same on every coordinator.",
                                  registry=registry)
        self._lock_delay_left = Gauge("fencepost_lock_delay_remaining_seconds",
                                      "The longest time left of the running lock-delays, in seconds (0: none).",
                                      registry=registry)
        self._overloaded = Gauge("fencepost_overloaded",
                                 "1 while this coordinator is past its capacity (new leases, KeepAlive streams and "
                                 "waits refused with OVERLOADED), else 0.", registry=registry)

    def prefix_of(self, name: str) -> str:
        """The ``prefix`` label of lock ``name``: the longest configured prefix it starts with, else "".

        An internal name (an election's or a semaphore's lock) counts by its election's or semaphore's name.
        """
        if kinds.is_internal(name):
            name = kinds.public_hold(name).name
        for prefix in self._prefixes:
            if name.startswith(prefix):
                return prefix
        return ""

    def granted(self, name: str, wait_seconds: float, recipe: str = "lock") -> None:
        """An Acquire granted lock ``name`` (the grant of ``recipe``, one of :data:`RECIPES`:
        :func:`recipe_of`), ``wait_seconds`` after the call started."""
        prefix = self.prefix_of(name)
        self._grants[prefix].inc()
        self._wait[prefix].observe(wait_seconds)
        self._recipe_grants[recipe].inc()

    def hold_ended(self, name: str, held_seconds: float, reason: str) -> None:
        """A hold of ``name`` granted here ended after ``held_seconds``; ``reason`` is one of :data:`END_REASONS`."""
        self._hold[self.prefix_of(name)].observe(held_seconds)
        self._losses[reason].inc()

    def handed_off(self, seconds: float, queued: bool) -> None:
        """A grant made here came ``seconds`` after the end of the previous hold of its name.

        Args:
            seconds: from the end to the grant.
            queued: whether the granted Acquire call had started by the end (a
                waiter, or a call in flight); False when the lock was free when asked.
        """
        self._handoff[queued].observe(seconds)

    def holds(self, delta: int) -> None:
        """``delta`` (+1 or -n) holds granted here started, or ended (or were forgotten)."""
        self._holds.inc(delta)

    def leases(self, count: int) -> None:
        """``count`` leases are now kept alive through KeepAlive streams here."""
        self._leases.set(count)

    def released(self) -> None:
        """A Release released a hold."""
        self._releases.inc()

    def stale_write_reported(self, storage: str) -> None:
        """A guard's refused write was reported, from ``storage`` (not of :data:`STORAGE_KINDS`: ``other``)."""
        self._stale_writes.get(storage, self._stale_writes["other"]).inc()

    def refused(self, reason: str) -> None:
        """A call was refused with ``reason``, an ErrorReason name or :data:`LOCK_HELD`."""
        child = self._refusals.get(reason)
        if child is None:  # not one of REFUSAL_REASONS (none is today): still counted, never an error
            child = self._refusals[reason] = self._refusals_by_name.labels(reason)
        child.inc()

    def waiting_acquires(self, delta: int) -> None:
        """``delta`` (+1 or -1) Acquire calls with a wait started or ended."""
        self._waiting.inc(delta)

    def watched_holds(self, delta: int) -> None:
        """A KeepAlive stream started (+n) or stopped (-n) watching holds."""
        self._watched.inc(delta)

    def keepalives(self, leases: int) -> None:
        """A keepalive message arrived on a KeepAlive stream, for ``leases`` leases (1: a single keepalive)."""
        self._keepalives.inc(leases)
        self._keepalive_batch.observe(leases)

    def stream_calls(self, calls: int) -> None:
        """A message of calls arrived on a KeepAlive stream, with ``calls`` calls (1: a single call)."""
        self._call_batch.observe(calls)

    def etcd_request(self, operation: str, seconds: float, code: object = None) -> None:
        """An etcd request ended after ``seconds``; ``code`` is its gRPC status code when it failed.

        Args:
            operation: one of :data:`ETCD_OPERATIONS`.
            seconds: from sending it to its answer or failure.
            code: None when answered; else a ``grpc.StatusCode`` (its Go spelling
                is the label, as in ``grpc_code``) or a label value.
        """
        self._etcd_seconds[operation].observe(seconds)
        if code is not None:
            self._etcd_errors.labels(operation, GO_CODE_NAMES.get(code, str(code))).inc()  # type: ignore[call-overload]

    def etcd_failed(self, operation: str, code: object) -> None:
        """An etcd call failed without a request time to record (the watch stream broke)."""
        self._etcd_errors.labels(operation, GO_CODE_NAMES.get(code, str(code))).inc()  # type: ignore[call-overload]

    def etcd_batch(self, size: int) -> None:
        """One etcd Txn was sent for ``size`` lock Txns (1: alone)."""
        self._etcd_batch.observe(size)

    def watch_restarted(self) -> None:
        """The lock watch is restarting after a failure or a compaction."""
        self._watch_restarts.inc()

    def loop_lag(self, seconds: float) -> None:
        """The coordinator is now ``seconds`` behind (see :mod:`..admission.overload`)."""
        self._loop_lag.set(seconds)

    def capacity(self, busy: float, client_rtt: float, keepalive_wait: float = 0.0, ceiling: int = 0,
                 process_busy: float = 0.0) -> None:
        """The capacity figures (see :mod:`..admission.capacity`): loop ``busy`` and ``process_busy`` (CPU s per
        s), ``client_rtt`` and ``keepalive_wait`` (s), the lease ``ceiling`` (0: none)."""
        self._busy.set(busy)
        self._process_busy.set(process_busy)
        self._client_rtt.set(client_rtt)
        self._keepalive_wait.set(keepalive_wait)
        self._lease_ceiling.set(ceiling)

    def overloaded(self, past: bool) -> None:
        """The coordinator entered (True) or left (False) the past-capacity condition."""
        self._overloaded.set(1 if past else 0)

    def lock_delays(self, running: int, longest_left: int) -> None:
        """``running`` locks' lock-delays run now; the longest has ``longest_left`` seconds left."""
        self._lock_delays.set(running)
        self._lock_delay_left.set(longest_left)


class _NoMetrics(LockMetrics):
    """:class:`LockMetrics` that records nothing (metrics off)."""

    def __init__(self) -> None:  # registers nothing
        pass

    def prefix_of(self, name: str) -> str:
        return ""

    def granted(self, name: str, wait_seconds: float, recipe: str = "lock") -> None:
        pass

    def hold_ended(self, name: str, held_seconds: float, reason: str) -> None:
        pass

    def handed_off(self, seconds: float, queued: bool) -> None:
        pass

    def holds(self, delta: int) -> None:
        pass

    def leases(self, count: int) -> None:
        pass

    def released(self) -> None:
        pass

    def refused(self, reason: str) -> None:
        pass

    def stale_write_reported(self, storage: str) -> None:
        pass

    def waiting_acquires(self, delta: int) -> None:
        pass

    def watched_holds(self, delta: int) -> None:
        pass

    def keepalives(self, leases: int) -> None:
        pass

    def stream_calls(self, calls: int) -> None:
        pass

    def etcd_request(self, operation: str, seconds: float, code: object = None) -> None:
        pass

    def etcd_failed(self, operation: str, code: object) -> None:
        pass

    def etcd_batch(self, size: int) -> None:
        pass

    def watch_restarted(self) -> None:
        pass

    def loop_lag(self, seconds: float) -> None:
        pass

    def capacity(self, busy: float, client_rtt: float, keepalive_wait: float = 0.0, ceiling: int = 0,
                 process_busy: float = 0.0) -> None:
        pass

    def overloaded(self, past: bool) -> None:
        pass

    def lock_delays(self, running: int, longest_left: int) -> None:
        pass


#: The default of every module that takes a :class:`LockMetrics`: records nothing.
NO_METRICS: LockMetrics = _NoMetrics()
