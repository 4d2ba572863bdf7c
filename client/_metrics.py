"""Client-side metrics: what a lock client and the fencing guards report to a prometheus_client registry.

Off unless asked for: a client or guard made with ``metrics=registry`` (a
``prometheus_client.CollectorRegistry``) records into it; without one it
records nothing and prometheus_client is never imported (it is not a
dependency of the client). Two clients, or two guards, given the same
registry share one set of metric objects (prometheus_client refuses a second
registration of a name): the counts add up.

=======================================  =========  ===========  ================================================
metric                                   type       labels       meaning
=======================================  =========  ===========  ================================================
fencepost_client_acquires_total          counter    outcome      acquire and try_acquire calls, by outcome:
                                                                 granted, held (try_acquire found it held),
                                                                 timeout, error, cancelled
fencepost_client_acquire_wait_seconds    histogram               from the call to its grant (granted ones)
fencepost_client_losses_total            counter    reason       holds lost (each once), by reason: NOT_HOLDER,
                                                                 LEASE_EXPIRED, DEADLINE, STALE_TOKEN, ...
fencepost_client_keepalive_rtt_seconds   histogram               from sending a keepalive on the stream to its
                                                                 acknowledgement
fencepost_guard_writes_total             counter    storage      writes a guard's statement accepted
fencepost_guard_stale_rejections_total   counter    storage      writes a guard refused (StaleTokenError)
fencepost_guard_token_ahead_total        counter    storage      of those, refused although the writer still
                                                                 held its lock: the stored token was ahead of
                                                                 the lock service (StoredTokenAheadError)
=======================================  =========  ===========  ================================================

``storage``: ``sqlite``, ``postgresql``, ``mysql``, ``redis``, ``etcd``,
``dynamodb``, ``s3`` (a DB-API driver SqlGuard does not know: its module name).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, ContextManager

from .errors import InvalidArgument, LockHeld, LockTimeout

__all__ = ["ACQUIRE_OUTCOMES", "ACQUIRE_WAIT_BUCKETS", "KEEPALIVE_RTT_BUCKETS", "NO_CLIENT_METRICS",
           "NO_GUARD_METRICS", "ClientMetrics", "GuardMetrics", "client_metrics", "guard_metrics"]

#: Every ``outcome`` label value of ``fencepost_client_acquires_total``.
ACQUIRE_OUTCOMES = ("granted", "held", "timeout", "error", "cancelled")

#: ``fencepost_client_acquire_wait_seconds`` upper bounds, seconds (the coordinator's, and one round trip).
ACQUIRE_WAIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                        300.0)

#: ``fencepost_client_keepalive_rtt_seconds`` upper bounds, seconds: a keepalive answered later than
#: TTL/3 puts its lease at risk (1 s of a 3 s TTL).
KEEPALIVE_RTT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

_lock = threading.Lock()
_clients: weakref.WeakKeyDictionary[Any, ClientMetrics] = weakref.WeakKeyDictionary()
_guards: weakref.WeakKeyDictionary[Any, tuple[Any, Any]] = weakref.WeakKeyDictionary()


def _registry(registry: Any) -> Any:
    """Check that ``registry`` is a prometheus_client registry (importing prometheus_client now).

    Raises:
        InvalidArgument: field ``metrics``: prometheus_client is not installed, or ``registry`` is not a
            ``CollectorRegistry``.
    """
    try:
        from prometheus_client import CollectorRegistry
    except ImportError as exc:
        raise InvalidArgument("metrics needs prometheus-client (pip install prometheus-client)",
                              field="metrics") from exc
    if not isinstance(registry, CollectorRegistry):
        raise InvalidArgument(f"metrics must be a prometheus_client.CollectorRegistry or None, got {registry!r}",
                              field="metrics")
    return registry


class ClientMetrics:
    """The lock client's metrics in one registry (see the module's table).

    Made by :func:`client_metrics`, one per registry.

    Args:
        registry: a ``prometheus_client.CollectorRegistry``.
    """

    def __init__(self, registry: Any) -> None:
        from prometheus_client import Counter, Histogram

        acquires = Counter("fencepost_client_acquires_total", "Lock acquire calls of Fencepost clients, by outcome.",
                           ["outcome"], registry=registry)
        self._acquires = {outcome: acquires.labels(outcome) for outcome in ACQUIRE_OUTCOMES}
        self._wait = Histogram("fencepost_client_acquire_wait_seconds",
                               "Seconds from a Fencepost client's acquire call to its grant.",
                               buckets=ACQUIRE_WAIT_BUCKETS, registry=registry)
        self._losses = Counter("fencepost_client_losses_total", "Holds a Fencepost client lost, by reason.",
                               ["reason"], registry=registry)
        self._rtt = Histogram("fencepost_client_keepalive_rtt_seconds",
                              "Seconds from sending a keepalive on the KeepAlive stream to its acknowledgement.",
                              buckets=KEEPALIVE_RTT_BUCKETS, registry=registry)

    def acquired(self, outcome: str, wait_seconds: float | None = None) -> None:
        """An acquire call ended with ``outcome`` (one of :data:`ACQUIRE_OUTCOMES`), granted after ``wait_seconds``."""
        self._acquires[outcome].inc()
        if wait_seconds is not None:
            self._wait.observe(wait_seconds)

    def acquiring(self, clock: Callable[[], float]) -> ContextManager[None]:
        """Count the acquire call in the ``with`` body by how it ends (see :data:`ACQUIRE_OUTCOMES`).

        Args:
            clock: the monotonic clock of the wait, in seconds.
        """
        return self._acquiring(clock)

    @contextlib.contextmanager
    def _acquiring(self, clock: Callable[[], float]) -> Iterator[None]:
        started = clock()
        try:
            yield
        except LockHeld:
            self.acquired("held")
            raise
        except LockTimeout:
            self.acquired("timeout")
            raise
        except asyncio.CancelledError:
            self.acquired("cancelled")
            raise
        except BaseException:
            self.acquired("error")
            raise
        self.acquired("granted", clock() - started)

    def lost(self, reason: str) -> None:
        """A hold was lost, for ``reason`` (an ErrorReason name, or ``DEADLINE``)."""
        self._losses.labels(reason).inc()

    def keepalive_answered(self, rtt_seconds: float) -> None:
        """A keepalive was acknowledged ``rtt_seconds`` after it was queued on the stream."""
        self._rtt.observe(rtt_seconds)


class _NoClientMetrics(ClientMetrics):
    """Records nothing (no registry given)."""

    def __init__(self) -> None:  # registers nothing, imports nothing
        pass

    def acquired(self, outcome: str, wait_seconds: float | None = None) -> None:
        pass

    def acquiring(self, clock: Callable[[], float]) -> ContextManager[None]:
        return contextlib.nullcontext()

    def lost(self, reason: str) -> None:
        pass

    def keepalive_answered(self, rtt_seconds: float) -> None:
        pass


#: The metrics of a client made without a registry: records nothing.
NO_CLIENT_METRICS: ClientMetrics = _NoClientMetrics()


def client_metrics(registry: Any | None) -> ClientMetrics:
    """The client metrics in ``registry``, registered on first use; :data:`NO_CLIENT_METRICS` for None.

    Raises:
        InvalidArgument: field ``metrics``: not a ``CollectorRegistry``, or prometheus-client is missing;
            a metric of the same name but another kind is already registered there.
    """
    if registry is None:
        return NO_CLIENT_METRICS
    registry = _registry(registry)
    with _lock:
        found = _clients.get(registry)
        if found is None:
            try:
                found = _clients[registry] = ClientMetrics(registry)
            except ValueError as exc:  # "Duplicated timeseries": registered by something else
                raise InvalidArgument(f"metrics: {exc}", field="metrics") from exc
        return found


class GuardMetrics:
    """One guard's counters: its accepted and refused writes, labelled with its ``storage``.

    Made by :func:`guard_metrics`.
    """

    def __init__(self, writes: Any, stale: Any, ahead: Any) -> None:
        self._writes = writes
        self._stale = stale
        self._ahead = ahead

    def accepted(self) -> None:
        """The guard's statement accepted a write."""
        self._writes.inc()

    def rejected(self) -> None:
        """The guard refused a write with a stale fencing token."""
        self._stale.inc()

    def ahead(self) -> None:
        """The guard refused a write whose writer still held its lock (the stored token was ahead)."""
        self._ahead.inc()


class _NoGuardMetrics(GuardMetrics):
    """Records nothing (no registry given)."""

    def __init__(self) -> None:
        pass

    def accepted(self) -> None:
        pass

    def rejected(self) -> None:
        pass

    def ahead(self) -> None:
        pass


#: The metrics of a guard made without a registry: records nothing.
NO_GUARD_METRICS: GuardMetrics = _NoGuardMetrics()


def guard_metrics(registry: Any | None, storage: str) -> GuardMetrics:
    """The guard counters in ``registry`` for ``storage``; :data:`NO_GUARD_METRICS` for None.

    Args:
        registry: a ``prometheus_client.CollectorRegistry``, or None.
        storage: the ``storage`` label (``postgresql``, ``redis``, ...).

    Raises:
        InvalidArgument: field ``metrics``: as :func:`client_metrics`.
    """
    if registry is None:
        return NO_GUARD_METRICS
    registry = _registry(registry)
    from prometheus_client import Counter

    with _lock:
        families = _guards.get(registry)
        if families is None:
            try:
                families = _guards[registry] = (
                    Counter("fencepost_guard_writes_total", "Writes a Fencepost fencing guard accepted.",
                            ["storage"], registry=registry),
                    Counter("fencepost_guard_stale_rejections_total",
                            "Writes a Fencepost fencing guard refused for a stale fencing token.",
                            ["storage"], registry=registry),
                    Counter("fencepost_guard_token_ahead_total",
                            "Writes a Fencepost fencing guard refused although the writer still held its lock: "
                            "the stored token was ahead of the lock service.",
                            ["storage"], registry=registry))
            except ValueError as exc:
                raise InvalidArgument(f"metrics: {exc}", field="metrics") from exc
        writes, stale, ahead = families
        return GuardMetrics(writes.labels(storage), stale.labels(storage), ahead.labels(storage))
