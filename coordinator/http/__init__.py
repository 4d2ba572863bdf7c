"""The HTTP/JSON API of ``fencepost serve --http-listen`` (docs/http.md).

- :mod:`.routes`: the one table of paths, each answered by a LockService RPC, and how a
  request's JSON body, query and path become the RPC's request message;
- :mod:`.calls`: the ``/v1`` route module, serving each request with the servicer's own method (same
  checks, logs, metrics and traces as on the gRPC port); a caller that goes away withdraws its acquire;
- :mod:`.events`: Server-Sent Events: a hold's end, an election's leaders;
- :mod:`.context`: the servicer's view of a request (peer, client certificate, lease secret, deadline);
- :mod:`.status`: a call's gRPC status as an HTTP status, a ``google.rpc.Status`` body and Retry-After;
- :mod:`.board`, :mod:`.board_feed`: the lock board, ``GET /``: every hold shown live in a browser;
- :mod:`.server`: the aiohttp app built from route modules, served on the coordinator's event loop.
"""

from .board import Board
from .calls import Api, served_handlers
from .routes import ROUTES, Route
from .server import INSTANCE_HEADER, HttpServer, RouteModule, make_app
from .status import HTTP_STATUS

__all__ = ["HTTP_STATUS", "INSTANCE_HEADER", "ROUTES", "Api", "Board", "HttpServer", "Route", "RouteModule", "make_app", "served_handlers"]
