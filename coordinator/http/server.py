"""The HTTP server of ``fencepost serve --http-listen``: aiohttp's, on the coordinator's own event loop.

:func:`make_app` builds the aiohttp application from route modules: each
is a callable that adds its routes to the app (the API's is
:class:`.calls.Api`, every path under ``/v1``; another page, such as a lock
board, is one more module on the same app). Whatever a route raises, and
what aiohttp itself refuses (a body past ``client_max_size``: 413), is
answered with a ``google.rpc.Status`` JSON body too (:func:`statuses`).

:class:`HttpServer` serves an app on ``HOST:PORT`` (port 0 picks one) or a
Unix socket, in plaintext or with the ``ssl.SSLContext`` it is given (the
coordinator's own certificate and client CA: :mod:`..process.tls`). Its
handlers are cancelled when their client disconnects (aiohttp's
``handler_cancellation``), as gRPC cancels a call whose client went away;
no access log (each call logs its own events). ``stop()`` lets running
requests end within its grace, then cancels them.

Why aiohttp: it is asyncio-native, so its handlers run on the loop that
serves gRPC and call the servicer directly (no thread, no second loop), and
it is one dependency with its own server (no separate ASGI server).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
from aiohttp import web

from .status import plain_status, response

__all__ = ["INSTANCE_HEADER", "HttpServer", "RouteModule", "make_app", "statuses"]

_log = logging.getLogger(__name__)

#: The answer header naming the coordinator (its ServerInfo ``instance_id``) that served the request: behind one
#: port shared by ``--workers``, or a load balancer, which one answered.
INSTANCE_HEADER = "Fencepost-Instance"

#: A route module: adds its routes (and startup or shutdown hooks) to the app.
RouteModule = Callable[[web.Application], None]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: gRPC code of an HTTP error aiohttp raised, for its Status body (others: UNKNOWN).
_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND,
          405: grpc.StatusCode.UNIMPLEMENTED, 413: grpc.StatusCode.RESOURCE_EXHAUSTED}


#: The app's requests being served (their handler tasks): :meth:`HttpServer.stop` ends them within its grace.
RUNNING = web.AppKey("fencepost_running", set)


@web.middleware
async def statuses(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Answer aiohttp's own refusals and any failure of a handler with a ``google.rpc.Status`` body."""
    running: set[asyncio.Task[Any]] = request.app[RUNNING]
    task = asyncio.current_task()
    if task is not None:
        running.add(task)
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = _CODES.get(exc.status, grpc.StatusCode.UNKNOWN)
        return response(plain_status(code, exc.reason if exc.text is None else exc.text), status=exc.status)
    except Exception:
        _log.exception("%s %s failed", request.method, request.path)
        return response(plain_status(grpc.StatusCode.UNKNOWN, "the request failed in the coordinator"))
    finally:
        running.discard(task)  # type: ignore[arg-type]


def make_app(modules: Sequence[RouteModule], *, max_body_bytes: int = 4 * 1024 * 1024,
             headers: Mapping[str, str] | None = None) -> web.Application:
    """The HTTP application of ``modules``.

    Args:
        modules: route modules, each called once with the app.
        max_body_bytes: the largest request body taken (the gRPC port's ``--max-message-bytes``).
        headers: headers added to every answer (:data:`INSTANCE_HEADER`: which coordinator answered).
    """
    app = web.Application(client_max_size=max_body_bytes, middlewares=[statuses])
    app[RUNNING] = set()
    if headers:
        async def add_headers(_: web.Request, answer: web.StreamResponse) -> None:
            answer.headers.update(headers)

        app.on_response_prepare.append(add_headers)
    for module in modules:
        module(app)
    return app


class HttpServer:
    """Serves an aiohttp app on one address.

    Args:
        app: the application (:func:`make_app`).
        listen: ``HOST:PORT`` (port 0 picks one; a bracketed IPv6 host) or ``unix:/ABSOLUTE/PATH``,
            checked by the caller.
        ssl_context: TLS (and client certificates) on the port; None for plaintext.
        grace_seconds: how long ``stop()`` lets running requests end.
        reuse_port: bind ``HOST:PORT`` with ``SO_REUSEPORT``, so that other processes (``--workers``) serve it too.
    """

    def __init__(self, app: web.Application, listen: str, *, ssl_context: object | None = None,
                 grace_seconds: float = 5.0, reuse_port: bool = False) -> None:
        self._app = app
        self._reuse_port = reuse_port
        self._listen = listen
        self._ssl = ssl_context
        self._grace = grace_seconds
        self._runner: web.AppRunner | None = None
        self._site: web.BaseSite | None = None
        #: The bound TCP port after ``start()``; 0 for a Unix socket.
        self.port = 0

    @property
    def address(self) -> str:
        """``HOST:PORT`` (after ``start()``: the bound port) or ``unix:/ABSOLUTE/PATH``."""
        if self._listen.startswith("unix:"):
            return self._listen
        return f"{self._listen.rsplit(':', 1)[0]}:{self.port}"

    @property
    def scheme(self) -> str:
        """``https`` with TLS, else ``http``."""
        return "https" if self._ssl is not None else "http"

    async def start(self) -> int:
        """Bind and serve.

        Returns:
            The bound TCP port; 0 for a Unix socket.

        Raises:
            RuntimeError: the address cannot be bound (the message says why).
        """
        # Requests still running at stop() were ended by it: the runner's own wait has nothing left to wait for.
        runner = web.AppRunner(self._app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        site: web.BaseSite
        if self._listen.startswith("unix:"):
            path = self._listen[len("unix:"):].lstrip("/")
            site = web.UnixSite(runner, str(Path("/") / path), ssl_context=self._ssl)  # type: ignore[arg-type]
        else:
            host, port = self._listen.rsplit(":", 1)
            site = web.TCPSite(runner, host.strip("[]"), int(port), ssl_context=self._ssl,  # type: ignore[arg-type]
                               reuse_port=self._reuse_port)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise RuntimeError(f"cannot listen on {self._listen} (--http-listen): {exc.strerror or exc}") from exc
        self._runner, self._site = runner, site
        if not self._listen.startswith("unix:"):
            self.port = int(runner.addresses[0][1])
        return self.port

    async def stop(self, grace_seconds: float | None = None) -> None:
        """Stop accepting, let running requests end within the grace (then cancel them), close every connection.

        Args:
            grace_seconds: how long running requests may take; default the server's ``grace_seconds``.
        """
        if self._runner is None:
            return
        if self._site is not None:
            await self._site.stop()
        running: set[asyncio.Task[Any]] = self._app[RUNNING]
        if running:
            await asyncio.wait(set(running), timeout=self._grace if grace_seconds is None else grace_seconds)
        for task in list(running):
            task.cancel()
        await self._runner.cleanup()
        self._runner = self._site = None
