"""Server-Sent Events: a hold's end, and an election's leaders, streamed to an HTTP caller.

Two kinds of rows of :data:`.routes.ROUTES` answer with an event stream
(``text/event-stream``, the WHATWG HTML standard's "Server-sent events"):

- **watch** (``GET /v1/locks/{name}:watch?leaseId=L&token=T``, and the
  election's and semaphore's twins): the hold (name, lease, token) watched
  as a ``watch`` message on a KeepAlive stream of its own, served by the
  servicer's KeepAlive exactly as a gRPC client's stream is (admitted as a
  stream, counted against the stream limits, owned checks of the lease).
  The stream sends no keepalive: the coordinator never renews the lease
  (the caller does, with ``POST /v1/leases/{id}:keepalive``). Events:
  ``watching`` (the WatchHold, once the watch is in place), then one
  ``hold_ended`` (the HoldEnded: reason ``NOT_HOLDER`` when the hold's key
  was deleted: released, its lease expired or revoked, deleted by an
  operator; ``LEASE_EXPIRED``), after which the stream ends. A hold that had
  already ended when the watch began is told at once.
- **observe** (``GET /v1/elections/{election}:observe``): the Observe
  stream, one ``leader`` event per ObserveResponse, with the response's
  revision as the event ``id``: a client that reconnects with
  ``Last-Event-ID`` resumes after it (``afterRevision``).

A call refused before its stream is accepted (a bad field, the access
policy, the stream limits, capacity, a lease of another owner) is answered
like a unary call: its HTTP status and ``google.rpc.Status`` body. Once the
events have begun, a failure (the coordinator shutting down:
``UNAVAILABLE`` / ``SHUTTING_DOWN``) is an ``error`` event carrying that
body, and the stream ends. An idle stream sends a comment line every
``heartbeat_seconds``, so that proxies keep it and a vanished client is
noticed. The client's departure cancels the stream (its watch or etcd
watch ends with it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web
from google.protobuf.message import Message

from fencepost.client.errors import FencepostError, InvalidArgument, PermissionDenied
from fencepost.client.v1 import kinds, lock_pb2
from fencepost.client.v1.keys import MAX_PERMITS

from ..admission.identity import caller_of
from ..admission.ownership import secret_of
from ..api.stream_calls import CallAborted
from ..recipes.validate import validate_lease_id, validate_name, validate_token
from .context import HttpCallContext
from .routes import WATCH, Route
from .status import answer_of, refusal, response, to_json

__all__ = ["EVENT_STREAM", "Events"]

#: The media type of an event stream.
EVENT_STREAM = "text/event-stream"
#: How long a refused watch waits for its stream's own refusal (logged, counted) before answering without it.
REFUSAL_WAIT_SECONDS = 5.0


def _check_watch(hold: lock_pb2.WatchHold) -> None:
    """Refuse a watch the stream could not serve, before any event (it would end the stream).

    Raises:
        InvalidArgument: naming ``name``, ``lease_id``, ``token`` or ``slot``.
    """
    validate_name(hold.name)
    validate_lease_id(hold.lease_id)
    validate_token(hold.token)
    if hold.kind == lock_pb2.HOLD_KIND_SEMAPHORE and not 0 <= hold.slot < MAX_PERMITS:
        raise InvalidArgument(f"slot must be 0 to {MAX_PERMITS - 1}", field="slot")
    try:
        kinds.internal_name(hold.kind, hold.name, hold.slot)
    except ValueError as exc:
        raise InvalidArgument(f"kind {hold.kind} is not a HoldKind", field="kind") from exc


class Events:
    """Serves the rows of :data:`.routes.ROUTES` that stream (see the module docstring).

    Args:
        service: the LockService servicer (its ownership records, for a watch's lease).
        handlers: the servicer's methods as the interceptors wrap them (:func:`.calls.served_handlers`).
        heartbeat_seconds: the longest silence on an open event stream.
    """

    def __init__(self, service: Any, handlers: dict[str, Callable[..., Any]], *, heartbeat_seconds: float) -> None:
        self._owners = service.admission.owners
        self._handlers = handlers
        self._heartbeat = heartbeat_seconds

    async def serve(self, request: web.Request, route: Route, message: Any, context: HttpCallContext
                    ) -> web.StreamResponse:
        """Answer a streaming row: a hold's watch, or Observe."""
        if route.stream != WATCH:
            return await self._events(request, context, self._handlers[route.rpc](message, context), None,
                                      lambda r: ("leader", r, str(r.revision), False))
        try:
            _check_watch(message)
        except FencepostError as exc:
            return response(refusal(exc))
        done = asyncio.Event()

        async def requests() -> AsyncIterator[lock_pb2.KeepAliveRequest]:
            yield lock_pb2.KeepAliveRequest(watch=message, lease_secret=secret_of(context) or "")
            await done.wait()  # the stream stays open until the hold ended or the caller left

        async def owned() -> None:  # the stream checks too: this only holds the events back until it passed
            await self._owners.check(message.lease_id, caller_of(context), secret_of(context), "KeepAlive")

        try:
            return await self._events(request, context, self._handlers["KeepAlive"](requests(), context), owned,
                                      lambda r: ("hold_ended", r.hold_ended, None, True) if r.HasField("hold_ended")
                                      else None,
                                      first=("watching", to_json(message)), ended=done)
        finally:
            done.set()

    async def _events(self, request: web.Request, context: HttpCallContext, responses: Any,
                      before: Callable[[], Any] | None,
                      event_of: Callable[[Any], tuple[str, Message, str | None, bool] | None],
                      *, first: tuple[str, str] | None = None, ended: asyncio.Event | None = None
                      ) -> web.StreamResponse:
        """Stream ``responses`` as events once the call is accepted; a refusal before that is a plain answer.

        Args:
            responses: the call's responses (an async generator run by the servicer).
            before: awaited once the call is accepted, before the first event; its FencepostError refuses.
            event_of: a response -> (event name, the message told, event id, whether it is the last), or None
                for a response not told.
            first: an event sent first, once accepted.
            ended: set after the last event (the request stream then ends).
        """
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        async def pump() -> None:
            try:
                async for response in responses:
                    queue.put_nowait(("message", response))
                queue.put_nowait(("end", None))
            except CallAborted as aborted:
                queue.put_nowait(("aborted", aborted.status))

        pumping = asyncio.ensure_future(pump())
        try:
            pending = await self._accepted(context, queue)
            if pending is not None and pending[0] == "aborted":
                return response(answer_of(pending[1]))
            if before is not None:
                refused = await self._before(before, pumping, queue)
                if refused is not None:
                    return refused
            stream = web.StreamResponse(headers={"Content-Type": EVENT_STREAM, "Cache-Control": "no-cache",
                                                 "X-Accel-Buffering": "no"})
            await stream.prepare(request)
            if first is not None:
                await stream.write(_event(*first))
            while True:
                if pending is None:
                    try:
                        pending = await asyncio.wait_for(queue.get(), self._heartbeat)
                    except TimeoutError:
                        await stream.write(b": ping\n\n")
                        continue
                kind, item = pending
                pending = None
                if kind == "message":
                    told = event_of(item)
                    if told is not None:
                        name, payload, event_id, last = told
                        await stream.write(_event(name, to_json(payload), event_id))
                        if last and ended is not None:
                            ended.set()
                    continue
                if kind == "aborted":
                    await stream.write(_event("error", answer_of(item).text()))
                break
            await stream.write_eof()
            return stream
        finally:
            if ended is not None:
                ended.set()
            pumping.cancel()
            await asyncio.gather(pumping, return_exceptions=True)
            with contextlib.suppress(Exception):
                await responses.aclose()

    @staticmethod
    async def _accepted(context: HttpCallContext, queue: asyncio.Queue[tuple[str, Any]]) -> tuple[str, Any] | None:
        """Wait until the call is accepted or says something first; that first item, if any."""
        got = asyncio.ensure_future(queue.get())
        accepted = asyncio.ensure_future(context.accepted.wait())
        try:
            await asyncio.wait({got, accepted}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            accepted.cancel()
            if not got.done():
                got.cancel()
        return got.result() if got.done() and not got.cancelled() else None

    @staticmethod
    async def _before(before: Callable[[], Any], pumping: asyncio.Future[None],
                      queue: asyncio.Queue[tuple[str, Any]]) -> web.Response | None:
        """Run ``before``; its refusal as an answer (for a NOT_LEASE_OWNER: the stream's own refusal), else None."""
        try:
            await before()
            return None
        except PermissionDenied as exc:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(pumping), REFUSAL_WAIT_SECONDS)
            while not queue.empty():
                kind, item = queue.get_nowait()
                if kind == "aborted":
                    return response(answer_of(item))
            return response(refusal(exc))
        except FencepostError as exc:
            return response(refusal(exc))


def _event(name: str, data: str, event_id: str | None = None) -> bytes:
    """One event: ``event:``, an ``id:`` if given, one ``data:`` line (JSON has no line break), a blank line."""
    return (f"event: {name}\n" + (f"id: {event_id}\n" if event_id is not None else "") + f"data: {data}\n\n").encode()
