"""The ``/v1`` routes: each HTTP request served by the LockService servicer method of its row, as a gRPC call is.

:class:`Api` is the route module of the API (see :func:`.server.make_app`):
one handler for every path under ``/v1``, which finds the request's row
of :data:`.routes.ROUTES`, builds the RPC's request message from the JSON
body or the query (:func:`.routes.request_of`) and the call's context from
the request (:func:`.context.context_of`), and runs the servicer's method
wrapped by the coordinator's interceptors (:func:`served_handlers`), exactly
as grpc.aio would: the same validation, access policy, ownership, limits,
capacity and drain, token floor, request ids, logs, ``grpc_server_*``
metrics (under the RPC's name) and trace spans. The answer is the response
message in canonical JSON (every field, also those at their default:
``"acquired": false``), or the call's status (:mod:`.status`).

A request with a body must be ``Content-Type: application/json``: a
browser page cannot send that across origins without a CORS preflight,
which this server never grants, so a page a user visits cannot act on the
coordinator in the user's name.

A caller that goes away (its connection closes) while its call runs
cancels the call (aiohttp's ``handler_cancellation``), as a cancelled gRPC
call is; for Acquire, AcquirePermit and Campaign the row's ``withdraw``
call is then run at once for the same lease and name (Withdraw; ReleasePermit
and Resign with token 0): what the call left, a place in the queue or a
grant that could not be answered, is removed, since an HTTP caller cannot
come back to that call; so is a grant whose connection closed while it was
made. Those withdrawals are awaited before the server stops.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc
from aiohttp import web
from google.protobuf.message import Message

from fencepost.client.errors import FencepostError, InvalidArgument
from fencepost.client.v1 import lock_pb2

from ..api.stream_calls import CallAborted
from .context import HttpCallContext, context_of
from .events import Events
from .routes import Route, match, request_of, request_type
from .status import JSON, Answer, answer_of, plain_status, refusal, response

__all__ = ["Api", "SERVICE", "served_handlers"]

_log = logging.getLogger(__name__)

#: The service every route calls.
SERVICE = "fencepost.v1.LockService"
_METHODS = lock_pb2.DESCRIPTOR.services_by_name["LockService"].methods


def served_handlers(service: Any, interceptors: Sequence[Any]) -> dict[str, Callable[..., Any]]:
    """Every LockService method of ``service``, wrapped by ``interceptors`` as a call of it on the gRPC port is.

    Args:
        service: the LockService servicer.
        interceptors: the server's interceptors, outermost first
            (:class:`~..telemetry.interceptor.WrappingInterceptor` subclasses; others are skipped).

    Returns:
        Method name -> its behaviour: ``async (request, context) -> response`` for a unary
        method, an async generator function for a streaming one.
    """
    from ..telemetry.interceptor import WrappingInterceptor

    handlers: dict[str, Callable[..., Any]] = {}
    for method in _METHODS:
        behaviour = getattr(service, method.name)
        if method.client_streaming:
            handler = grpc.stream_stream_rpc_method_handler(behaviour)
        elif method.server_streaming:
            handler = grpc.unary_stream_rpc_method_handler(behaviour)
        else:
            handler = grpc.unary_unary_rpc_method_handler(behaviour)
        for interceptor in reversed(interceptors):
            if isinstance(interceptor, WrappingInterceptor):
                handler = interceptor.wrapped_handler(f"/{SERVICE}/{method.name}", handler)
        handlers[method.name] = handler.stream_stream or handler.unary_stream or handler.unary_unary
    return handlers


class Api:
    """The API's route module: ``/v1/...`` answered by the servicer (see the module docstring).

    Args:
        service: the LockService servicer.
        interceptors: the coordinator's server interceptors (tracing, metrics), outermost first.
        heartbeat_seconds: how often an event stream with nothing to say sends a comment line.
    """

    def __init__(self, service: Any, interceptors: Sequence[Any] = (), *, heartbeat_seconds: float = 15.0) -> None:
        self._handlers = served_handlers(service, interceptors)
        self._events = Events(service, self._handlers, heartbeat_seconds=heartbeat_seconds)
        self._withdrawals: set[asyncio.Task[None]] = set()

    def __call__(self, app: web.Application) -> None:
        """Add the routes to ``app`` (and, at its cleanup, wait for the withdrawals still running)."""
        app.router.add_route("*", r"/v1/{tail:[\s\S]*}", self.dispatch)  # "." would miss a newline
        app.on_cleanup.append(self._finish)

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        """Serve one request under ``/v1``."""
        try:
            found, allowed = match(request.method, request.raw_path.split("?", 1)[0])
            if found is None:
                if allowed:
                    return response(plain_status(grpc.StatusCode.UNIMPLEMENTED, f"{request.method} is not served on "
                                               f"{request.path}; use {', '.join(allowed)}"), status=405,
                                  headers={"Allow": ", ".join(allowed)})
                return response(plain_status(grpc.StatusCode.NOT_FOUND, f"no route {request.method} {request.path} "
                                           f"(docs/http.md lists them)"))
            route = found.route
            message = request_of(route, await _data(request, route), found.fields, query=route.method != "POST")
            context = context_of(request)
        except FencepostError as exc:
            return response(refusal(exc))
        except _Refused as refused:
            return response(refused.answer, status=refused.http_status)
        if route.stream is not None:
            return await self._events.serve(request, route, message, context)
        return await self._call(request, route, message, context)

    async def _call(self, request: web.Request, route: Route, message: Message, context: HttpCallContext
                    ) -> web.Response:
        """Run a unary call; on the caller's departure (before or as it ends), its row's withdrawal."""
        try:
            result = await self._handlers[route.rpc](message, context)
        except CallAborted as aborted:
            return response(answer_of(aborted.status))
        except asyncio.CancelledError:
            if route.withdraw is not None:
                self._withdraw_later(route, message, context)
            raise
        if route.withdraw is not None and (request.transport is None or request.transport.is_closing()):
            self._withdraw_later(route, message, context)  # gone as it was answered: the grant cannot reach it
        return response(result)

    def _withdraw_later(self, route: Route, message: Message, context: HttpCallContext) -> None:
        """Run ``route``'s withdrawal for the lease and name of ``message`` (its caller is gone)."""
        assert route.withdraw is not None
        withdrawal = getattr(lock_pb2, f"{route.withdraw}Request")()
        for name in ("name", "election", "lease_id"):
            if name in withdrawal.DESCRIPTOR.fields_by_name:
                setattr(withdrawal, name, getattr(message, name))
        call: Callable[[Any, Any], Awaitable[Any]] = self._handlers[route.withdraw]

        async def withdraw() -> None:
            try:
                await call(withdrawal, HttpCallContext(context.peer(), context.auth_context(),
                                                       context.invocation_metadata(), None))
            except CallAborted as aborted:
                _log.info("%s after a %s whose caller went away was refused: %s", route.withdraw, route.rpc,
                          aborted.status.details)

        task = asyncio.ensure_future(withdraw())
        self._withdrawals.add(task)
        task.add_done_callback(self._withdrawals.discard)

    async def _finish(self, app: web.Application) -> None:
        """Wait for the withdrawals still running (the server stops)."""
        if self._withdrawals:
            await asyncio.gather(*self._withdrawals, return_exceptions=True)


class _Refused(Exception):
    """A request refused before any call (a body that is not JSON, of another media type)."""

    def __init__(self, answer: Answer, http_status: int | None = None) -> None:
        super().__init__(answer.body.get("message"))
        self.answer = answer
        self.http_status = http_status


async def _data(request: web.Request, route: Route) -> dict[str, Any]:
    """The request's fields before the path's: its JSON object (POST), or its query parameters.

    Raises:
        InvalidArgument: a body that is not one JSON object, a query parameter given twice.
        _Refused: a POST body that is not ``application/json`` (415).
    """
    if route.method != "POST":
        data: dict[str, Any] = {}
        for key, value in request.query.items():
            if key in data:
                raise InvalidArgument(f"the query gives {key} twice", field=key)
            data[key] = value
        resumed = request.headers.get("Last-Event-ID")  # an event stream's reconnect: after its last event
        if route.rpc == "Observe" and resumed and "afterRevision" not in data and "after_revision" not in data:
            data["afterRevision"] = resumed
        return data
    if request.content_type != JSON:
        raise _Refused(refusal(InvalidArgument(
            f"the body must be {JSON} (Content-Type: {request.content_type or 'none'}); curl: --json '{{...}}'")),
            415)
    body = await request.read()
    if not body.strip():
        return {}
    try:
        data = json.loads(body, object_pairs_hook=_once_each)
    except (ValueError, UnicodeDecodeError) as exc:
        field = getattr(exc, "field", None)
        raise InvalidArgument(f"the body is not JSON: {exc}" if field is None else str(exc), field=field) from None
    if not isinstance(data, dict):
        raise InvalidArgument(f"the body must be one JSON object (a {request_type(route).DESCRIPTOR.name}), "
                              f"not {_JSON_KINDS.get(type(data), 'a value')}")
    return data


#: How a JSON value that is not an object is named in a refusal.
_JSON_KINDS: dict[type, str] = {list: "an array", str: "a string", int: "a number", float: "a number",
                                bool: "a boolean", type(None): "null"}


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(f"the body gives {key} twice")
        self.field = key


def _once_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's members, refusing a name given twice (RFC 8259 leaves it to the reader; gRPC's own JSON
    mapping has one value per field)."""
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise _DuplicateKey(key)
        data[key] = value
    return data
