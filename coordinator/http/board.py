"""The lock board: ``GET /`` on the HTTP port, every lock, election and semaphore shown live in a browser.

:class:`Board` is a route module (:func:`.server.make_app`) serving:

- ``GET /``: the page (``board/index.html``), its script and style under
  ``GET /board/{file}``; the files ship in the package (no CDN, no build
  step: plain JavaScript);
- ``GET /board/events?prefix=P``: one Server-Sent Events stream per open
  page: first a ``snapshot`` event (every lock whose name starts with ``P``
  and the recent timeline), then a ``change`` event at most every quarter
  of a second with the entries that changed (``null``: gone) and the new
  timeline items (:mod:`.board_feed` gives their shapes); a comment line
  every ``heartbeat_seconds`` when nothing happens.

All open pages share one :class:`.board_feed.BoardFeed`: one etcd watch of
the lock prefix while at least one page is open, none otherwise.

The board is read-only, except for a caller the access policy allows
``admin`` on some name (an operator): its page offers Revoke on each hold
(after a confirmation), which is ``POST /v1/{locks|elections|semaphores}/{name}:revoke``
of the API, checked and audited as AdminRevoke is (an ``access`` event,
first, tells the page ``mayRevoke``). Opening its stream is a ListLocks of ``P`` for the
access policy (the same call as on the gRPC port: the same refusal, logs
and metrics), and it shows only the names that call may show (an election's
or a semaphore's by its public name).
"""

from __future__ import annotations

import asyncio
import json
from importlib import resources
from typing import Any

from aiohttp import web

from fencepost.client.errors import FencepostError
from fencepost.client.v1 import lock_pb2

from ..admission.access import ADMIN
from ..admission.identity import caller_of
from ..api.stream_calls import CallAborted
from .board_feed import BoardFeed
from .calls import served_handlers
from .context import context_of
from .events import EVENT_STREAM
from .status import answer_of, refusal, response

__all__ = ["Board"]

#: The page's files: name -> media type.
FILES = {"index.html": "text/html", "board.js": "text/javascript", "board.css": "text/css"}


class Board:
    """The lock board's route module (see the module docstring).

    Args:
        service: the LockService servicer (its ``lock_view`` and ``admission``).
        interceptors: the coordinator's server interceptors (the policy's ListLocks is counted as on gRPC).
        heartbeat_seconds: the longest silence on an open board's event stream.
        flush_seconds: how often changes are sent to the open boards.
    """

    def __init__(self, service: Any, interceptors: Any = (), *, heartbeat_seconds: float = 15.0,
                 flush_seconds: float = 0.25) -> None:
        self.feed = BoardFeed(*service.lock_view, reports=service.stale_writes, flush_seconds=flush_seconds)
        self._access = service.admission.access
        self._list = served_handlers(service, interceptors)["ListLocks"]
        self._heartbeat = heartbeat_seconds
        self._files = {name: resources.files(__package__).joinpath("board", name).read_bytes() for name in FILES}

    def __call__(self, app: web.Application) -> None:
        """Add the board's routes to ``app``."""
        app.router.add_get("/", self.page)
        app.router.add_get("/board/events", self.events)
        app.router.add_get("/board/{file}", self.file)

    async def page(self, request: web.Request) -> web.Response:
        """The page."""
        return self._answer("index.html")

    async def file(self, request: web.Request) -> web.Response:
        """One of the page's files (404 for another name)."""
        name = request.match_info["file"]
        if name not in FILES:
            raise web.HTTPNotFound(text=f"the board has no file {name!r}")
        return self._answer(name)

    def _may_revoke(self, context: Any) -> bool:
        """Whether the page offers Revoke: a policy is in force and lets the caller ``admin`` some name.

        AdminRevoke itself checks the name (``POST /v1/.../{name}:revoke``, audited); without a policy
        it is refused to every caller, so the page offers nothing.
        """
        policy = self._access.policy
        return policy is not None and policy.allows_some(caller_of(context).identity, ADMIN)

    def _answer(self, name: str) -> web.Response:
        return web.Response(body=self._files[name], content_type=FILES[name], charset="utf-8",
                            headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"})

    async def events(self, request: web.Request) -> web.StreamResponse:
        """The board's event stream: a ``snapshot``, then ``change`` events (see the module docstring)."""
        prefix = request.query.get("prefix", "")
        try:
            context = context_of(request)
            await self._list(lock_pb2.ListLocksRequest(prefix=prefix, page_size=1), context)
            visible = self._access.lister(context, prefix)
        except CallAborted as aborted:
            return response(answer_of(aborted.status))
        except FencepostError as exc:  # a bad timeout header, the policy's refusal
            return response(refusal(exc))

        may_revoke = self._may_revoke(context)

        def shows(_: str, name: str) -> bool:
            return name.startswith(prefix) and (visible is None or visible(name))

        stream = web.StreamResponse(headers={"Content-Type": EVENT_STREAM, "Cache-Control": "no-cache",
                                             "X-Accel-Buffering": "no"})
        await stream.prepare(request)
        await stream.write(f"event: access\ndata: {json.dumps({'mayRevoke': may_revoke})}\n\n".encode())
        subscriber = await self.feed.subscribe(shows)
        try:
            while True:
                try:
                    name, payload = await asyncio.wait_for(subscriber.queue.get(), self._heartbeat)
                except TimeoutError:
                    await stream.write(b": ping\n\n")
                    continue
                await stream.write(f"event: {name}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n".encode())
        finally:
            await self.feed.unsubscribe(subscriber)
