"""gRPC server metrics for grpc.aio, with go-grpc-prometheus's names, labels and help texts.

:class:`GrpcServerMetrics` is a ``grpc.aio.ServerInterceptor`` that records,
for every call of a registered method, unary and streaming alike, the five
server metrics of go-grpc-prometheus (``server_metrics.go``,
``server_reporter.go`` and ``util.go`` of github.com/grpc-ecosystem/go-grpc-prometheus),
so that dashboards and alerts written for Go gRPC servers work unchanged:

================================  =========  ============================================
metric                            type       labels
================================  =========  ============================================
grpc_server_started_total         counter    grpc_type, grpc_service, grpc_method
grpc_server_handled_total         counter    grpc_type, grpc_service, grpc_method, grpc_code
grpc_server_msg_received_total    counter    grpc_type, grpc_service, grpc_method
grpc_server_msg_sent_total        counter    grpc_type, grpc_service, grpc_method
grpc_server_handling_seconds      histogram  grpc_type, grpc_service, grpc_method
================================  =========  ============================================

- ``grpc_type`` is ``unary``, ``client_stream``, ``server_stream`` or
  ``bidi_stream``; ``/pkg.Service/Method`` gives ``grpc_service``
  ``pkg.Service`` and ``grpc_method`` ``Method``.
- ``grpc_code`` is the status code as Go's ``codes.Code.String()`` spells it
  (``OK``, ``Canceled``, ``InvalidArgument``, ``FailedPrecondition``, ...),
  not Python's ``grpc.StatusCode`` names: see :data:`GO_CODE_NAMES`.
- The status counted is the one the client receives: OK on a normal return,
  or the code set with ``context.set_code``; for ``context.abort`` and
  ``abort_with_status`` (grpc.aio raises ``AbortError`` out of the handler
  after sending the status) the code the abort set; for any other exception
  escaping the handler the code set on the context if any, else UNKNOWN (as
  grpc.aio itself sends); for a handler cancelled because the client
  cancelled the call CANCELLED, or DEADLINE_EXCEEDED when the call's deadline
  has passed.
- Messages are counted as Go counts them: a unary request as one message
  received at the start; a unary response as one message sent when the call
  ends OK; a streamed message when grpc has taken it (an async generator's
  item once grpc asks for the next one, a ``context.write`` once it
  returns); a streamed request when the handler gets it, from the request
  iterator or ``context.read()``.
- ``grpc_server_handling_seconds`` (seconds from the handler's start to its
  end, go-grpc-prometheus's default buckets, Prometheus's ``DefBuckets``) is
  opt-in in go-grpc-prometheus (``EnableHandlingTimeHistogram``); here it is
  on unless ``handling_time_histogram=False``. For a stream it is the
  stream's lifetime.
- :meth:`GrpcServerMetrics.initialize` creates every series of the given
  services at 0 (all 17 codes for ``grpc_server_handled_total``), as
  go-grpc-prometheus's ``InitializeMetrics`` does.
- Calls of methods that no service implements (UNIMPLEMENTED) are not
  counted, as in Go; neither are handlers that are plain functions (grpc.aio
  runs those in a thread pool; the coordinator registers none).

The handler that ``continuation`` returns is wrapped with the same handler
type and serializers; the wrapped behaviour is the same kind of callable as
the original (coroutine function, or async generator function), because
grpc.aio decides how to run a handler by that kind. A server-streaming
handler that writes with ``context.write`` and runs for ever (the aio health
service's ``Watch``) keeps working: it gets a thin proxy of its context
whose ``write`` and ``read`` count. Wrapped handlers are cached per method,
so a call costs a few counter increments and one histogram observation.

:class:`~.tracing.GrpcServerTracing` (a SERVER span per call) wraps handlers
the same way and takes a call's status from the same functions,
:func:`status_of_return` and :func:`status_of_raise`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from prometheus_client import CollectorRegistry, Counter, Histogram

__all__ = ["GO_CODE_NAMES", "GO_DEFAULT_BUCKETS", "GrpcServerMetrics", "WrappingInterceptor", "is_async", "rpc_type", "split_method",
           "status_of_raise", "status_of_return"]

#: ``grpc_code`` label values: each status code as Go's ``codes.Code.String()`` spells it.
GO_CODE_NAMES: dict[grpc.StatusCode, str] = {
    grpc.StatusCode.OK: "OK",
    grpc.StatusCode.CANCELLED: "Canceled",
    grpc.StatusCode.UNKNOWN: "Unknown",
    grpc.StatusCode.INVALID_ARGUMENT: "InvalidArgument",
    grpc.StatusCode.DEADLINE_EXCEEDED: "DeadlineExceeded",
    grpc.StatusCode.NOT_FOUND: "NotFound",
    grpc.StatusCode.ALREADY_EXISTS: "AlreadyExists",
    grpc.StatusCode.PERMISSION_DENIED: "PermissionDenied",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "ResourceExhausted",
    grpc.StatusCode.FAILED_PRECONDITION: "FailedPrecondition",
    grpc.StatusCode.ABORTED: "Aborted",
    grpc.StatusCode.OUT_OF_RANGE: "OutOfRange",
    grpc.StatusCode.UNIMPLEMENTED: "Unimplemented",
    grpc.StatusCode.INTERNAL: "Internal",
    grpc.StatusCode.UNAVAILABLE: "Unavailable",
    grpc.StatusCode.DATA_LOSS: "DataLoss",
    grpc.StatusCode.UNAUTHENTICATED: "Unauthenticated",
}

#: go-grpc-prometheus's ``grpc_server_handling_seconds`` buckets (client_golang's ``prometheus.DefBuckets``), seconds.
GO_DEFAULT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

_LABELS = ("grpc_type", "grpc_service", "grpc_method")


def rpc_type(request_streaming: bool, response_streaming: bool) -> str:
    """The ``grpc_type`` label of a method: ``unary``, ``client_stream``, ``server_stream`` or ``bidi_stream``."""
    if request_streaming:
        return "bidi_stream" if response_streaming else "client_stream"
    return "server_stream" if response_streaming else "unary"


def split_method(full_method: str) -> tuple[str, str]:
    """``/pkg.Service/Method`` -> (``pkg.Service``, ``Method``); ("unknown", "unknown") without a ``/`` (as Go)."""
    service, sep, method = full_method.lstrip("/").partition("/")
    return (service, method) if sep else ("unknown", "unknown")


class _Series:
    """The children of one method's series, bound once (labels() costs a dict lookup under a lock)."""

    __slots__ = ("started", "received", "sent", "handled", "seconds")

    def __init__(self, metrics: GrpcServerMetrics, kind: str, service: str, method: str) -> None:
        self.started = metrics.started.labels(kind, service, method)
        self.received = metrics.received.labels(kind, service, method)
        self.sent = metrics.sent.labels(kind, service, method)
        self.handled = {code: metrics.handled.labels(kind, service, method, name)
                        for code, name in GO_CODE_NAMES.items()}
        self.seconds = metrics.seconds.labels(kind, service, method) if metrics.seconds is not None else None

    def done(self, code: grpc.StatusCode, started: float) -> None:
        """Count the call as handled with ``code``; ``started`` is its ``time.perf_counter()`` at the start."""
        self.handled[code].inc()
        if self.seconds is not None:
            self.seconds.observe(time.perf_counter() - started)


def status_of_return(context: grpc.aio.ServicerContext) -> grpc.StatusCode:
    """The status of a call whose handler returned: OK, or what it set with ``context.set_code``."""
    code = context.code()
    return grpc.StatusCode.OK if code is None else code


def status_of_raise(exc: BaseException, context: grpc.aio.ServicerContext) -> grpc.StatusCode:
    """The status of a call whose handler raised ``exc``, as grpc.aio reports it to the client.

    Cancelled (the client cancelled, or its deadline passed and grpc.aio
    cancelled the handler): CANCELLED or DEADLINE_EXCEEDED. ``abort`` and
    ``abort_with_status`` set the code before raising; any other exception
    is sent as the code set on the context, or UNKNOWN.
    """
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
        remaining = context.time_remaining()
        if remaining is not None and remaining <= 0:
            return grpc.StatusCode.DEADLINE_EXCEEDED
        return grpc.StatusCode.CANCELLED
    code = context.code()
    return grpc.StatusCode.UNKNOWN if code is None or code == grpc.StatusCode.OK else code


class _CountingContext:
    """The handler's view of its ServicerContext: ``write`` and ``read`` also count; the rest is the context's."""

    __slots__ = ("_context", "_series")

    def __init__(self, context: grpc.aio.ServicerContext, series: _Series) -> None:
        self._context = context
        self._series = series

    async def write(self, message: Any) -> None:
        await self._context.write(message)
        self._series.sent.inc()

    async def read(self) -> Any:
        message = await self._context.read()
        if message is not grpc.aio.EOF:
            self._series.received.inc()
        return message

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


class _CountingRequests:
    """A request iterator that counts each request the handler takes from it."""

    __slots__ = ("_requests", "_iterator", "_received")

    def __init__(self, requests: AsyncIterable[Any], received: Any) -> None:
        self._requests = requests
        self._iterator: AsyncIterator[Any] | None = None  # made on first use: the handler may read with context.read()
        self._received = received

    def __aiter__(self) -> _CountingRequests:
        return self

    async def __anext__(self) -> Any:
        if self._iterator is None:
            self._iterator = self._requests.__aiter__()
        message = await self._iterator.__anext__()
        self._received.inc()
        return message


class WrappingInterceptor(grpc.aio.ServerInterceptor):
    """A server interceptor that wraps each method's handler with :meth:`_wrap`, once per method.

    The wrapped handler is cached by the method's name and reused while
    ``continuation`` returns the same handler, so that a call costs one dict
    lookup here. Subclasses: :class:`GrpcServerMetrics`, and
    ``coordinator.tracing.GrpcServerTracing``.
    """

    def __init__(self) -> None:
        # full method -> (the handler continuation returned, its wrapped handler)
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails],
                                                             Awaitable[grpc.RpcMethodHandler]],
                                handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        """Return the method's handler, wrapped (None when no service has the method)."""
        handler = await continuation(handler_call_details)
        if handler is None:
            return None  # type: ignore[return-value]  # grpc.aio answers UNIMPLEMENTED
        method = handler_call_details.method
        method = method.decode() if isinstance(method, bytes) else method
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(method, handler)
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    def _wrap(self, full_method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """``handler`` of ``full_method`` (``/pkg.Service/Method``) wrapped: the subclass's own."""
        raise NotImplementedError

    def wrapped_handler(self, full_method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """``handler`` of ``full_method`` wrapped as a call of it would be, outside a server's dispatch.

        For calls the coordinator serves itself from another call's messages
        (Acquire, Release and Withdraw sent on a KeepAlive stream: see
        :mod:`..api.stream_calls`), so that they are counted and traced as their unary twins.
        """
        return self._wrap(full_method, handler)


class GrpcServerMetrics(WrappingInterceptor):
    """Records go-grpc-prometheus's server metrics for every call (see the module's docstring).

    Install it with ``grpc.aio.server(interceptors=[metrics])``; call
    :meth:`initialize` with the services registered on the server to create
    their series at 0.

    Args:
        registry: where the metrics are registered (not the global
            ``prometheus_client.REGISTRY``, so that each coordinator, and
            each test, has its own).
        handling_time_histogram: record ``grpc_server_handling_seconds``
            (opt-in in go-grpc-prometheus, on here).
        buckets: its upper bounds in seconds; default go-grpc-prometheus's.

    Raises:
        ValueError: a metric of the same name is already in ``registry``.
    """

    def __init__(self, registry: CollectorRegistry, *, handling_time_histogram: bool = True,
                 buckets: Iterable[float] = GO_DEFAULT_BUCKETS) -> None:
        self.started = Counter("grpc_server_started_total", "Total number of RPCs started on the server.",
                               _LABELS, registry=registry)
        self.handled = Counter("grpc_server_handled_total",
                               "Total number of RPCs completed on the server, regardless of success or failure.",
                               (*_LABELS, "grpc_code"), registry=registry)
        self.received = Counter("grpc_server_msg_received_total",
                                "Total number of RPC stream messages received on the server.",
                                _LABELS, registry=registry)
        self.sent = Counter("grpc_server_msg_sent_total", "Total number of gRPC stream messages sent by the server.",
                            _LABELS, registry=registry)
        self.seconds = Histogram(
            "grpc_server_handling_seconds",
            "Histogram of response latency (seconds) of gRPC that had been application-level handled by the server.",
            _LABELS, buckets=tuple(buckets), registry=registry) if handling_time_histogram else None
        self._series: dict[tuple[str, str, str], _Series] = {}
        super().__init__()

    def initialize(self, services: Iterable[ServiceDescriptor]) -> None:
        """Create every series of every method of ``services`` at 0 (go-grpc-prometheus's ``InitializeMetrics``).

        Args:
            services: the protobuf descriptors of the services registered on
                the server, e.g. ``lock_pb2.DESCRIPTOR.services_by_name["LockService"]``.
        """
        for service in services:
            for method in service.methods:
                self._series_of(rpc_type(method.client_streaming, method.server_streaming), service.full_name,
                                method.name)

    def _series_of(self, kind: str, service: str, method: str) -> _Series:
        key = (kind, service, method)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = _Series(self, kind, service, method)
        return series

    def _wrap(self, full_method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        kind = rpc_type(handler.request_streaming, handler.response_streaming)
        series = self._series_of(kind, *split_method(full_method))
        if kind == "unary":
            return _wrap_unary_unary(handler, series)
        if kind == "server_stream":
            return _wrap_unary_stream(handler, series)
        if kind == "client_stream":
            return _wrap_stream_unary(handler, series)
        return _wrap_stream_stream(handler, series)


def is_async(behaviour: Any) -> bool:
    """Whether a handler's behaviour runs on the event loop (a coroutine or async generator function)."""
    return inspect.iscoroutinefunction(behaviour) or inspect.isasyncgenfunction(behaviour)


def _wrap_unary_unary(handler: grpc.RpcMethodHandler, series: _Series) -> grpc.RpcMethodHandler:
    inner = handler.unary_unary
    if not is_async(inner):
        return handler

    async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        series.started.inc()
        series.received.inc()
        started = time.perf_counter()
        try:
            response = await inner(request, context)
        except BaseException as exc:
            series.done(status_of_raise(exc, context), started)
            raise
        code = status_of_return(context)
        series.done(code, started)
        if code == grpc.StatusCode.OK:
            series.sent.inc()
        return response

    return grpc.unary_unary_rpc_method_handler(unary_unary, request_deserializer=handler.request_deserializer,
                                               response_serializer=handler.response_serializer)


def _streaming(inner: Any, series: _Series, unary_request: bool) -> Any:
    """The wrapped behaviour of a method whose responses stream (server-streaming or bidi).

    An async generator function stays one (each item counted once grpc asks
    for the next, i.e. has sent it); a coroutine function (``context.write``
    style) stays one.
    """
    def wrap_requests(requests: Any) -> Any:
        return requests if unary_request else _CountingRequests(requests, series.received)

    def begin() -> float:
        series.started.inc()
        if unary_request:
            series.received.inc()
        return time.perf_counter()

    if inspect.isasyncgenfunction(inner):
        async def generator(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            started = begin()
            try:
                async with contextlib.aclosing(inner(wrap_requests(request_or_iterator),
                                                     _CountingContext(context, series))) as responses:
                    async for response in responses:
                        yield response
                        series.sent.inc()
            except BaseException as exc:
                series.done(status_of_raise(exc, context), started)
                raise
            series.done(status_of_return(context), started)

        return generator

    async def coroutine(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
        started = begin()
        try:
            result = await inner(wrap_requests(request_or_iterator), _CountingContext(context, series))
        except BaseException as exc:
            series.done(status_of_raise(exc, context), started)
            raise
        series.done(status_of_return(context), started)
        return result

    return coroutine


def _wrap_unary_stream(handler: grpc.RpcMethodHandler, series: _Series) -> grpc.RpcMethodHandler:
    if not is_async(handler.unary_stream):
        return handler
    return grpc.unary_stream_rpc_method_handler(_streaming(handler.unary_stream, series, True),
                                                request_deserializer=handler.request_deserializer,
                                                response_serializer=handler.response_serializer)


def _wrap_stream_stream(handler: grpc.RpcMethodHandler, series: _Series) -> grpc.RpcMethodHandler:
    if not is_async(handler.stream_stream):
        return handler
    return grpc.stream_stream_rpc_method_handler(_streaming(handler.stream_stream, series, False),
                                                 request_deserializer=handler.request_deserializer,
                                                 response_serializer=handler.response_serializer)


def _wrap_stream_unary(handler: grpc.RpcMethodHandler, series: _Series) -> grpc.RpcMethodHandler:
    inner = handler.stream_unary
    if not is_async(inner):
        return handler

    async def stream_unary(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        series.started.inc()
        started = time.perf_counter()
        try:
            response = await inner(_CountingRequests(requests, series.received), _CountingContext(context, series))
        except BaseException as exc:
            series.done(status_of_raise(exc, context), started)
            raise
        code = status_of_return(context)
        series.done(code, started)
        if code == grpc.StatusCode.OK:
            series.sent.inc()
        return response

    return grpc.stream_unary_rpc_method_handler(stream_unary, request_deserializer=handler.request_deserializer,
                                                response_serializer=handler.response_serializer)
