"""The coordinator's own metrics (``fencepost_*``): grants, releases, refusals, keepalives, etcd.

Every value is this coordinator's view: what the calls it served and the
etcd requests it sent did, not the whole cluster's (several coordinators
serve one etcd; add them up in Prometheus). No label carries a lock name or
a lease id: the label values are fixed sets.

==================================  =========  ==================  ==============================================
metric                              type       labels              meaning
==================================  =========  ==================  ==============================================
fencepost_grants_total              counter                        Acquire calls that granted the lock
fencepost_acquire_wait_seconds      histogram                      from an Acquire's start to its grant
fencepost_releases_total            counter                        Release calls that released a hold
fencepost_refusals_total            counter    reason              calls refused, by ErrorReason name, and
                                                                   LOCK_HELD for a try-acquire finding it held
fencepost_waiting_acquires          gauge                          Acquire calls with a wait in progress
fencepost_watched_holds             gauge                          holds watched by KeepAlive streams
fencepost_keepalives_total          counter                        keepalives received on KeepAlive streams
fencepost_etcd_request_seconds      histogram  operation           each etcd request, answered or failed
fencepost_etcd_errors_total         counter    operation, code     etcd requests that failed, by gRPC code
fencepost_watch_restarts_total      counter                        restarts of the lock watch
==================================  =========  ==================  ==============================================

``docs/operations.md`` ("Metrics") explains each one. :data:`NO_METRICS`
is the same interface recording nothing, the default of every module that
takes one, so that they have no branch for "metrics off".
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fencepost.client.v1.details import ErrorReason

from .metrics import GO_CODE_NAMES

__all__ = ["ACQUIRE_WAIT_BUCKETS", "ETCD_BUCKETS", "ETCD_OPERATIONS", "LOCK_HELD", "NO_METRICS", "LockMetrics",
           "REFUSAL_REASONS"]

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

#: ``fencepost_etcd_request_seconds`` upper bounds, seconds (the per-request
#: deadlines are 0.5 s for a keepalive, 1 s for the health read, 5 s otherwise).
ETCD_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class LockMetrics:
    """The ``fencepost_*`` metrics of one coordinator, registered on ``registry``.

    Args:
        registry: where to register them (the coordinator's own, not the global one).

    Raises:
        ValueError: a metric of the same name is already in ``registry``.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._grants = Counter("fencepost_grants_total", "Acquire calls that granted the lock (this coordinator's).",
                               registry=registry)
        self._wait = Histogram("fencepost_acquire_wait_seconds",
                               "Seconds from an Acquire call's start to its grant, waited or not.",
                               buckets=ACQUIRE_WAIT_BUCKETS, registry=registry)
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
                                   "Keepalives received on KeepAlive streams and forwarded to etcd.", registry=registry)
        seconds = Histogram("fencepost_etcd_request_seconds",
                            "Seconds of each etcd request until its answer or failure, by operation.",
                            ["operation"], buckets=ETCD_BUCKETS, registry=registry)
        self._etcd_seconds = {op: seconds.labels(op) for op in ETCD_OPERATIONS}
        self._etcd_errors = Counter("fencepost_etcd_errors_total",
                                    "etcd requests that failed, by operation and gRPC status code.",
                                    ["operation", "code"], registry=registry)
        self._watch_restarts = Counter("fencepost_watch_restarts_total",
                                       "Restarts of the coordinator's watch of the lock prefix (etcd failure or "
                                       "compaction).", registry=registry)

    def granted(self, wait_seconds: float) -> None:
        """An Acquire granted the lock, ``wait_seconds`` after the call started."""
        self._grants.inc()
        self._wait.observe(wait_seconds)

    def released(self) -> None:
        """A Release released a hold."""
        self._releases.inc()

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

    def keepalive(self) -> None:
        """A keepalive arrived on a KeepAlive stream."""
        self._keepalives.inc()

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

    def watch_restarted(self) -> None:
        """The lock watch is restarting after a failure or a compaction."""
        self._watch_restarts.inc()


class _NoMetrics(LockMetrics):
    """:class:`LockMetrics` that records nothing (metrics off)."""

    def __init__(self) -> None:  # registers nothing
        pass

    def granted(self, wait_seconds: float) -> None:
        pass

    def released(self) -> None:
        pass

    def refused(self, reason: str) -> None:
        pass

    def waiting_acquires(self, delta: int) -> None:
        pass

    def watched_holds(self, delta: int) -> None:
        pass

    def keepalive(self) -> None:
        pass

    def etcd_request(self, operation: str, seconds: float, code: object = None) -> None:
        pass

    def etcd_failed(self, operation: str, code: object) -> None:
        pass

    def watch_restarted(self) -> None:
        pass


#: The default of every module that takes a :class:`LockMetrics`: records nothing.
NO_METRICS: LockMetrics = _NoMetrics()
