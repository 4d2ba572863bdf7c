"""OpenTelemetry traces: the tracer in use, the span names and attributes, the W3C context in gRPC metadata.

Shared by the clients and the coordinator. Only ``opentelemetry-api`` is
needed (a dependency of fencepost). Fencepost never configures a tracer
provider in a library: a :class:`Tracing` uses the one it was given, else
the application's global one (``opentelemetry.trace.set_tracer_provider``).
While that is the API's default (a proxy or no-op provider: no SDK was set
up), :meth:`Tracing.tracer` returns None after a check of a few attribute
reads, and no span, attribute or metadata is made.

Spans (names, kinds):

- ``fencepost.v1.LockService/<Method>``: each LockService call, a CLIENT
  span per attempt in the clients (retries are siblings under the operation
  span) and a SERVER span in the coordinator; ``grpc.health.v1.Health/<Method>``
  for health calls on the coordinator;
- ``fencepost.acquire`` and ``fencepost.release`` (INTERNAL): a client's
  whole acquire (its LeaseGrant, Acquire attempts, a Withdraw of an abandoned
  wait) and release;
- ``etcdserverpb.<Service>/<Method>`` (CLIENT): each request the
  coordinator sends to etcd for a call (see :mod:`fencepost.coordinator.etcd.calls`).

Attributes: ``rpc.system`` (``grpc``), ``rpc.service``, ``rpc.method``,
``rpc.grpc.status_code`` (the status the caller received, as an int), and
:data:`LOCK_NAME`, :data:`LEASE_ID`, :data:`TOKEN`, :data:`OUTCOME` where
they apply. The lock name is left out when ``lock_names`` is False (names
may carry customer ids). Span status: ERROR on a client span whose call did
not end OK, on a server span for the codes the OpenTelemetry conventions
name (UNKNOWN, DEADLINE_EXCEEDED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE,
DATA_LOSS): a refused Release is the caller's error, not the server's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

import grpc
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, Status, StatusCode, Tracer, TracerProvider

from .errors import FencepostError, LockHeld

__all__ = [
    "INSTRUMENTATION",
    "LEASE_ID",
    "LOCK_NAME",
    "OUTCOME",
    "REQUEST_ID",
    "TOKEN",
    "Tracing",
    "error_outcome",
    "extract",
    "failed",
    "inject",
    "recording_span",
    "response_facts",
    "rpc_attributes",
    "set_rpc_status",
]

#: The instrumentation scope of every fencepost span.
INSTRUMENTATION = "fencepost"
#: Span attribute: the lock name (left out when lock names are not traced).
LOCK_NAME = "fencepost.lock.name"
#: Span attribute: the lease id (int).
LEASE_ID = "fencepost.lease_id"
#: Span attribute: the fencing token the call carried or was granted (int).
TOKEN = "fencepost.token"
#: Span attribute: how the call ended: ``granted``, ``held``, ``released``, ``revoked``, ``withdrawn``,
#: ``not_found``, or the ErrorReason name of a refusal (``STALE_TOKEN``, ``ACQUIRE_TIMEOUT``, ...).
OUTCOME = "fencepost.outcome"
#: Span attribute: the call's request id (``request_id``: the same on each retry of one call), when it has one.
REQUEST_ID = "fencepost.request_id"

_PASSIVE = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)

#: Server span codes that are the server's error (OpenTelemetry's gRPC conventions).
_SERVER_ERRORS = frozenset({grpc.StatusCode.UNKNOWN, grpc.StatusCode.DEADLINE_EXCEEDED,
                            grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.INTERNAL,
                            grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DATA_LOSS})


class Tracing:
    """Whether, and with which tracer, to make spans.

    Args:
        provider: The tracer provider to use; None for the global one, looked
            up at each :meth:`tracer` call (an application may set it after
            making the client; see :func:`_global_provider`).
        lock_names: Record lock names (``fencepost.lock.name``) on spans.
    """

    __slots__ = ("_provider", "lock_names", "_seen", "_tracer")

    def __init__(self, provider: TracerProvider | None = None, *, lock_names: bool = True) -> None:
        self._provider = provider
        self.lock_names = lock_names
        self._seen: TracerProvider | None = None
        self._tracer: Tracer | None = None

    def tracer(self) -> Tracer | None:
        """The tracer to make spans with now; None while tracing is off (the API's default provider, or
        an SDK provider disabled by ``OTEL_SDK_DISABLED``)."""
        provider = self._provider if self._provider is not None else _global_provider()
        if provider is not self._seen:
            tracer = None if isinstance(provider, _PASSIVE) else provider.get_tracer(INSTRUMENTATION)
            self._tracer = None if tracer is None or isinstance(tracer, trace.NoOpTracer) else tracer
            self._seen = provider
        return self._tracer

    def lock_attributes(self, name: str | None = None, lease_id: int | None = None,
                        token: int | None = None) -> dict[str, Any]:
        """The ``fencepost.*`` attributes of a call: those given and non-zero, the name only with ``lock_names``."""
        attributes: dict[str, Any] = {}
        if name and self.lock_names:
            attributes[LOCK_NAME] = name
        if lease_id:
            attributes[LEASE_ID] = lease_id
        if token:
            attributes[TOKEN] = token
        return attributes


#: The global provider as last looked up (empty before the first look-up).
_global: list[TracerProvider] = []


def _global_provider() -> TracerProvider:
    """``opentelemetry.trace.get_tracer_provider()``, without its read of ``os.environ`` at every call.

    The first call asks OpenTelemetry, which also loads the provider that
    ``OTEL_PYTHON_TRACER_PROVIDER`` names, if set then. While the answer is
    the API's proxy (no provider set), each later call asks that proxy for a
    tracer, which costs no environment read: it is a ``ProxyTracer`` until an
    application sets a global provider (``set_tracer_provider``), and that
    provider's own tracer once it did; then OpenTelemetry is asked again. A
    global provider is set at most once (OpenTelemetry refuses a second), so
    the one found is kept. Not seen: ``OTEL_PYTHON_TRACER_PROVIDER`` set in
    ``os.environ`` by the process itself after the first call.
    """
    if _global:
        seen = _global[0]
        if not isinstance(seen, trace.ProxyTracerProvider) or isinstance(
                seen.get_tracer(INSTRUMENTATION), trace.ProxyTracer):
            return seen
    provider = trace.get_tracer_provider()
    _global[:] = [provider]
    return provider


def rpc_attributes(service: str, method: str) -> dict[str, Any]:
    """The ``rpc.*`` attributes of a gRPC call of ``service`` (``fencepost.v1.LockService``) and ``method``."""
    return {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method}


def set_rpc_status(span: Span, code: grpc.StatusCode, *, server: bool, message: str | None = None) -> None:
    """Record a call's status on its span: ``rpc.grpc.status_code``, and ERROR as the conventions say.

    Args:
        span: The call's span.
        code: The status the caller received.
        server: A SERVER span (only server faults are errors), else a CLIENT span (any code but OK).
        message: The status description of an error.
    """
    span.set_attribute("rpc.grpc.status_code", code.value[0])
    if code != grpc.StatusCode.OK and (not server or code in _SERVER_ERRORS):
        span.set_status(Status(StatusCode.ERROR, message or code.name))


def response_facts(method: str, response: Any) -> dict[str, Any]:
    """The ``fencepost.*`` attributes an OK answer of LockService ``method`` adds (outcome, token, lease id).

    Args:
        method: ``Acquire``, ``Release``, ``LeaseGrant``, ``LeaseRevoke``, ``Withdraw``, ... (others: none).
        response: The call's response message.
    """
    if method == "Acquire":
        if response.acquired:
            return {OUTCOME: "granted", TOKEN: int(response.token)}
        return {OUTCOME: "held"}
    if method == "Release":
        return {OUTCOME: "released"}
    if method == "LeaseGrant":
        return {OUTCOME: "granted", LEASE_ID: int(response.lease_id)}
    if method == "LeaseRevoke":
        return {OUTCOME: "revoked" if response.found else "not_found"}
    if method == "Withdraw":
        return {OUTCOME: "withdrawn" if response.found else "not_found"}
    return {}


def error_outcome(reason: str | None, code: grpc.StatusCode | None) -> str:
    """The ``fencepost.outcome`` of a failed call: its ErrorReason name, else its status code's name, else ERROR."""
    if reason:
        return reason
    return code.name if code is not None else "ERROR"


def failed(span: Span, exc: BaseException) -> None:
    """Record on an operation's span (``fencepost.acquire``, ``fencepost.release``) that it raised ``exc``.

    LockHeld (a try found the lock held) is outcome ``held`` and no error;
    another FencepostError is its reason (or code) and ERROR; a cancellation
    is ``CANCELLED``.
    """
    if isinstance(exc, LockHeld):
        span.set_attribute(OUTCOME, "held")
        return
    if isinstance(exc, FencepostError):
        outcome = error_outcome(exc.reason, exc.code)
        if exc.lease_id:
            span.set_attribute(LEASE_ID, exc.lease_id)
    elif isinstance(exc, asyncio.CancelledError):
        outcome = grpc.StatusCode.CANCELLED.name
    else:
        outcome = type(exc).__name__
    span.set_attribute(OUTCOME, outcome)
    span.set_status(Status(StatusCode.ERROR, outcome))


def inject(metadata: Iterable[tuple[str, str]] | None = None) -> tuple[tuple[str, str], ...]:
    """``metadata`` plus the current context's propagation headers (W3C ``traceparent``, ``tracestate``, ...).

    Uses the global propagator (``OTEL_PROPAGATORS``; W3C trace context and baggage by default).

    Args:
        metadata: the call's own metadata, (key, value) pairs; None for none.
    """
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return (*(metadata or ()), *carrier.items())


def extract(metadata: Iterable[tuple[str, Any]] | None) -> Context:
    """The context a caller propagated in its call metadata (the root context when it sent none)."""
    carrier: Mapping[str, str] = {key: value for key, value in metadata or () if isinstance(value, str)}
    return propagate.extract(carrier)


def recording_span() -> Span | None:
    """The current span when it records (a span of a traced call is in progress), else None."""
    span = trace.get_current_span()
    return span if span.is_recording() else None

