"""The coordinator's traces: a SERVER span per call, and the OTLP export of ``fencepost serve``.

:class:`GrpcServerTracing` is a ``grpc.aio.ServerInterceptor``, the sibling
of :class:`~.interceptor.GrpcServerMetrics`: it wraps each method's handler the
same way (same handler kind, so that grpc.aio runs it the same way; the
health service's endless ``Watch`` keeps streaming) and takes the status of
a call from the same rules (:func:`~.interceptor.status_of_return`,
:func:`~.interceptor.status_of_raise`): the status the caller received, also
for ``abort`` (grpc.aio raises after sending it) and for a call the client
cancelled or whose deadline passed. (opentelemetry-instrumentation-grpc's
aio server interceptor, 0.66b2, records an aborted call as OK and breaks
the health Watch stream; it is not used.)

Each call is a SERVER span named ``<package.Service>/<Method>``
(``fencepost.v1.LockService/Acquire``, ``grpc.health.v1.Health/Check``),
child of the W3C trace context the caller sent in its metadata
(``traceparent``; the global propagator, ``OTEL_PROPAGATORS``); a health
call only when its caller sent one (probes send none, every few seconds:
a trace each would flood the backend). The span is current
while the handler runs: the etcd requests made for the call are its
children (:mod:`..etcd.calls`), and the log events of the call carry its
trace id (:func:`~.events.caller`). Attributes: ``rpc.system``,
``rpc.service``, ``rpc.method``, ``rpc.grpc.status_code``; for LockService
calls ``fencepost.lock.name`` (unless ``lock_names`` is False),
``fencepost.lease_id``, ``fencepost.token`` and ``fencepost.request_id``
from the request, and
``fencepost.outcome`` (``granted``, ``held``, ``released``, ...; for a
refusal the ErrorReason name its status carries), with the granted token
or lease id from the response (see :mod:`fencepost.client.tracing`). A
stream's span lasts as long as the stream.

:func:`export_from_environment` is what ``fencepost serve`` does: an SDK
``TracerProvider`` with a ``BatchSpanProcessor`` and the OTLP exporter when
``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is
set (and ``OTEL_SDK_DISABLED`` is not ``true``), nothing otherwise. The
exporter and the SDK read the standard variables themselves
(``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``,
``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_TRACES_SAMPLER``, ...);
``service.name`` is ``fencepost-coordinator`` unless they name one.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Tracer, TracerProvider

from fencepost.client.tracing import (
    OUTCOME,
    REQUEST_ID,
    Tracing,
    error_outcome,
    extract,
    response_facts,
    rpc_attributes,
    set_rpc_status,
)
from fencepost.client.v1 import details

from .interceptor import WrappingInterceptor, is_async, rpc_type, split_method, status_of_raise, status_of_return

__all__ = ["DEFAULT_SERVICE_NAME", "ENDPOINT_VARIABLES", "GrpcServerTracing", "TraceExport", "TracingUnavailable",
           "export_from_environment"]

#: ``service.name`` of the coordinator's spans unless OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES names one.
DEFAULT_SERVICE_NAME = "fencepost-coordinator"
#: The variables that turn the OTLP export on (either one).
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")

_LOCK_SERVICE = "fencepost.v1.LockService"
_HEALTH_SERVICE = "grpc.health.v1.Health"


class GrpcServerTracing(WrappingInterceptor):
    """Makes a SERVER span of every call (see the module's docstring).

    Install it first (outermost) with ``grpc.aio.server(interceptors=[tracing, ...])``,
    so that its span is current in the interceptors after it and in the handler.

    Args:
        tracer: The tracer of the spans.
        lock_names: Record ``fencepost.lock.name``; False leaves lock names out.
    """

    def __init__(self, tracer: Tracer, *, lock_names: bool = True) -> None:
        self._tracer = tracer
        self._tracing = Tracing(lock_names=lock_names)
        super().__init__()

    def _wrap(self, full_method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """``handler`` wrapped to make the call's SERVER span."""
        return _Call(self._tracer, self._tracing, full_method).wrap(handler)


class _Call:
    """The spans of one method: its name, attributes, and the wrapped behaviours."""

    def __init__(self, tracer: Tracer, tracing: Tracing, full_method: str) -> None:
        self.tracer = tracer
        self.tracing = tracing
        service, self.method = split_method(full_method)
        self.name = f"{service}/{self.method}"
        self.attributes = rpc_attributes(service, self.method)
        self.locks = service == _LOCK_SERVICE
        self.health = service == _HEALTH_SERVICE

    def start(self, request: Any, context: grpc.aio.ServicerContext) -> Span | None:
        """Start the call's span, child of the caller's context; ``request`` None for a streamed request.

        Returns None (no span) for a health call whose caller sent no trace context: probes.
        """
        parent = extract(context.invocation_metadata())
        if self.health and not trace.get_current_span(parent).get_span_context().is_valid:
            return None
        attributes = dict(self.attributes)
        if self.locks and request is not None and hasattr(request, "DESCRIPTOR"):
            fields = request.DESCRIPTOR.fields_by_name
            attributes.update(self.tracing.lock_attributes(
                request.name if "name" in fields else None, request.lease_id if "lease_id" in fields else None,
                request.token if "token" in fields else None))
            if "request_id" in fields and request.request_id:
                attributes[REQUEST_ID] = request.request_id
        return self.tracer.start_span(self.name, context=parent, kind=SpanKind.SERVER, attributes=attributes)

    def end(self, span: Span, code: grpc.StatusCode, context: grpc.aio.ServicerContext,
            response: Any = None) -> None:
        """Record the call's status (and its outcome) and end its span."""
        try:
            if code == grpc.StatusCode.OK:
                set_rpc_status(span, code, server=True)
                if self.locks and response is not None:
                    span.set_attributes(response_facts(self.method, response))
            else:
                set_rpc_status(span, code, server=True, message=context.details())
                if self.locks:
                    # The ErrorInfo reason of an abort_with_status, from the trailing metadata it set.
                    span.set_attribute(OUTCOME, error_outcome(details.parse(context).reason, code))
        finally:
            span.end()

    def wrap(self, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """``handler`` with each call in a span (plain-function handlers, which grpc.aio runs in threads, as they are)."""
        kind = rpc_type(handler.request_streaming, handler.response_streaming)
        behaviour = {"unary": handler.unary_unary, "server_stream": handler.unary_stream,
                     "client_stream": handler.stream_unary, "bidi_stream": handler.stream_stream}[kind]
        if not is_async(behaviour):
            return handler
        unary_request = not handler.request_streaming
        if inspect.isasyncgenfunction(behaviour):
            wrapped = self._generator(behaviour, unary_request)
        else:
            wrapped = self._coroutine(behaviour, unary_request)
        make = {"unary": grpc.unary_unary_rpc_method_handler, "server_stream": grpc.unary_stream_rpc_method_handler,
                "client_stream": grpc.stream_unary_rpc_method_handler,
                "bidi_stream": grpc.stream_stream_rpc_method_handler}[kind]
        return make(wrapped, request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer)

    def _coroutine(self, inner: Any, unary_request: bool) -> Any:
        """A coroutine function's wrapper: the span is current for the whole handler (one task)."""
        async def coroutine(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
            span = self.start(request_or_iterator if unary_request else None, context)
            if span is None:
                return await inner(request_or_iterator, context)
            token = otel_context.attach(trace.set_span_in_context(span))
            try:
                response = await inner(request_or_iterator, context)
            except BaseException as exc:
                self.end(span, status_of_raise(exc, context), context)
                raise
            finally:
                otel_context.detach(token)
            self.end(span, status_of_return(context), context, response)
            return response

        return coroutine

    def _generator(self, inner: Any, unary_request: bool) -> Any:
        """An async generator function's wrapper.

        The span is made current for each step of the inner generator only,
        attached and detached within one step of the outer one: an async
        generator may be closed from another task (its finaliser), where a
        context attached across a ``yield`` could not be detached.
        """
        async def generator(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            span = self.start(request_or_iterator if unary_request else None, context)
            if span is None:
                async with contextlib.aclosing(inner(request_or_iterator, context)) as responses:
                    async for response in responses:
                        yield response
                return
            current = trace.set_span_in_context(span)
            try:
                async with contextlib.aclosing(inner(request_or_iterator, context)) as responses:
                    while True:
                        token = otel_context.attach(current)
                        try:
                            response = await anext(responses)
                        except StopAsyncIteration:
                            break
                        finally:
                            otel_context.detach(token)
                        yield response
            except BaseException as exc:
                self.end(span, status_of_raise(exc, context), context)
                raise
            self.end(span, status_of_return(context), context)

        return generator


class TracingUnavailable(RuntimeError):
    """Traces are asked for (an OTLP endpoint variable is set) but the SDK or the exporter is not installed."""


@dataclass
class TraceExport:
    """The tracer provider ``fencepost serve`` set up, exporting over OTLP.

    Attributes:
        provider: The SDK ``TracerProvider`` (its BatchSpanProcessor sends to the exporter).
        endpoint: Where the spans go, as the variables say (for the start-up line).
        protocol: ``grpc`` or ``http/protobuf``.
    """

    provider: TracerProvider
    endpoint: str
    protocol: str

    def shutdown(self) -> None:
        """Send the spans still queued and stop the exporter (at most the exporter's timeout, 10 s by default)."""
        self.provider.shutdown()  # type: ignore[attr-defined]


_EXTRA = "install fencepost[tracing] (opentelemetry-sdk and opentelemetry-exporter-otlp-proto-grpc)"


def export_from_environment(environ: Mapping[str, str]) -> TraceExport | None:
    """Set up the OTLP export of traces as the standard OpenTelemetry variables say, or nothing.

    On when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``
    is set and not empty, unless ``OTEL_SDK_DISABLED`` is ``true``. The
    protocol is ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` or
    ``OTEL_EXPORTER_OTLP_PROTOCOL``: ``grpc`` (the default; the
    ``tracing`` extra) or ``http/protobuf`` (needs
    opentelemetry-exporter-otlp-proto-http). The provider is not made global
    here: the caller passes it to the Coordinator.

    Args:
        environ: The process's environment (``os.environ``); the SDK and the
            exporter read the other variables from ``os.environ`` themselves.

    Returns:
        The export, or None when traces are off.

    Raises:
        TracingUnavailable: traces are asked for but the SDK or the exporter
            is not installed, or the protocol is not one of those above.
    """
    endpoint = next((environ[name] for name in reversed(ENDPOINT_VARIABLES) if environ.get(name)), None)
    if endpoint is None or environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    variables = " or ".join(name for name in ENDPOINT_VARIABLES if environ.get(name))
    protocol = (environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "grpc").strip().lower()
    if protocol not in ("grpc", "http/protobuf"):
        raise TracingUnavailable(f"{variables} is set, with the OTLP protocol {protocol!r}: only grpc and "
                                 f"http/protobuf are supported")
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise TracingUnavailable(f"{variables} is set but the OpenTelemetry SDK is not installed ({exc}): "
                                 f"{_EXTRA}, or unset it") from exc
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[no-redef]
                OTLPSpanExporter,
            )
    except ImportError as exc:
        package = "opentelemetry-exporter-otlp-proto-" + ("grpc" if protocol == "grpc" else "http")
        extra = _EXTRA if protocol == "grpc" else f"install {package}"
        raise TracingUnavailable(f"{variables} is set but the OTLP exporter ({package}) is not installed "
                                 f"({exc}): {extra}, or unset it") from exc
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    provider = SdkTracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return TraceExport(provider, endpoint, protocol)
