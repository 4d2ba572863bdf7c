"""The coordinator's listeners: its gRPC server, the health-only port, and the HTTP/JSON API's port.

- :func:`lock_server`: the grpc.aio server of ``--listen``: LockService
  (:func:`~..api.decode.add_lock_service`), ``grpc.health.v1``, and gRPC
  server reflection (``grpc.reflection.v1alpha``, so that grpcurl and grpcui
  list and call LockService without the proto file), behind the
  coordinator's interceptors (traces, metrics);
- :func:`health_server`: the plaintext ``--health-listen`` server, health only;
- :func:`bind`: adds an address to a gRPC server, claiming a Unix socket's
  path first (:class:`~.listen.UnixSocketClaim`);
- :func:`http_server`: the ``--http-listen`` server (:mod:`..http`), the API's
  routes on the coordinator's own event loop, with the gRPC port's TLS files
  (:meth:`~.tls.ServerCertificates.ssl_context`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from fencepost.client.v1 import lock_pb2

from ..api.decode import add_lock_service
from ..telemetry.endpoint import MetricsEndpoint
from .listen import UnixSocketClaim, unix_socket_path
from .tls import ServerCertificates

if TYPE_CHECKING:  # aiohttp is imported only by a coordinator that serves HTTP
    from ..http import HttpServer, RouteModule

__all__ = ["SERVED_NAMES", "bind", "health_server", "http_server", "lock_server"]

#: The services the coordinator's port serves, as gRPC server reflection lists them.
SERVED_NAMES = (lock_pb2.DESCRIPTOR.services_by_name["LockService"].full_name,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME)


def lock_server(service: Any, health: Any, options: Sequence[tuple[str, Any]], interceptors: Sequence[Any],
                metrics: MetricsEndpoint | None) -> grpc.aio.Server:
    """The gRPC server of ``--listen`` (not bound yet): LockService, health and reflection.

    Args:
        service: the LockService servicer.
        health: the health servicer.
        options: the server's channel options.
        interceptors: the server's interceptors, outermost first.
        metrics: the metrics endpoint whose gRPC series are created at 0; None without metrics.
    """
    server = grpc.aio.server(options=options, interceptors=list(interceptors) or None)
    add_lock_service(service, server)  # the generated registration, checking UTF-8
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection(SERVED_NAMES, server)
    if metrics is not None:
        metrics.grpc.initialize([lock_pb2.DESCRIPTOR.services_by_name["LockService"],
                                 health_pb2.DESCRIPTOR.services_by_name["Health"]])
    return server


def health_server(health: Any, options: Sequence[tuple[str, Any]], interceptors: Sequence[Any]) -> grpc.aio.Server:
    """The plaintext server of ``--health-listen`` (not bound yet): ``grpc.health.v1`` only."""
    server = grpc.aio.server(options=options, interceptors=list(interceptors) or None)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    return server


def http_server(service: Any, interceptors: Sequence[Any], listen: str, *, certificates: ServerCertificates | None,
                max_body_bytes: int, grace_seconds: float, claims: list[UnixSocketClaim],
                modules: Sequence[RouteModule] = (), instance_id: str = "", reuse_port: bool = False) -> HttpServer:
    """The HTTP/JSON API's server on ``listen`` (not started): the ``/v1`` routes, the lock board, then ``modules``.

    Args:
        service: the LockService servicer that answers every route.
        interceptors: the gRPC server's interceptors (each call is traced and counted as its RPC).
        listen: ``HOST:PORT`` or ``unix:/ABSOLUTE/PATH`` (checked); a socket path is claimed here.
        certificates: the gRPC port's TLS files (TLS, and mTLS with a client CA); None for plaintext.
        max_body_bytes: the largest request body.
        grace_seconds: how long its ``stop()`` lets running requests end.
        claims: where a Unix socket's claim is appended.
        modules: more route modules on the same app.
        instance_id: the coordinator's, sent in the ``Fencepost-Instance`` header of every answer ("": none).
        reuse_port: bind with ``SO_REUSEPORT`` (``--workers``: every worker serves the port).
    """
    from ..http import INSTANCE_HEADER, Api, Board, HttpServer, make_app

    path = unix_socket_path(listen)
    if path is not None:
        claim = UnixSocketClaim(path)
        claim.claim()
        claims.append(claim)
    app = make_app([Api(service, interceptors), Board(service, interceptors), *modules],
                   max_body_bytes=max_body_bytes, headers={INSTANCE_HEADER: instance_id} if instance_id else None)
    return HttpServer(app, listen, ssl_context=certificates.ssl_context() if certificates is not None else None,
                      grace_seconds=grace_seconds, reuse_port=reuse_port)
