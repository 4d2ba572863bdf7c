"""The coordinator: gRPC server, health service, shutdown (``fencepost serve`` is :mod:`.serve`).

``Coordinator`` wires the etcd layer, the deletion watcher, the lease and
lock modules and the servicer into one grpc.aio server. It holds no lock state
of its own: several replicas can serve the same etcd cluster and prefix.

Shutdown (SIGTERM/SIGINT, or ``stop()``): health turns NOT_SERVING, KeepAlive
streams end with UNAVAILABLE/SHUTTING_DOWN so clients reconnect, in-flight
calls get ``grace_seconds`` to finish. Clients' leases are never revoked: a
restarted coordinator (or sidecar) must not drop its clients' locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from fencepost.client.errors import FencepostError
from fencepost.client.v1 import lock_pb2, lock_pb2_grpc
from fencepost.client.v1.keys import Keys

from .etcd import EtcdAuth, EtcdClient, EtcdTls, check_endpoints
from .lease import Leases
from .lock import LockManager
from .lock_metrics import NO_METRICS
from .metrics_server import MetricsEndpoint
from .service import LockService
from .watch import DeleteWatcher

_log = logging.getLogger("fencepost.coordinator")

DEFAULT_LISTEN = "127.0.0.1:7420"
#: ``HOST:PORT`` of ``--listen``: a host name, an IPv4 address or a bracketed IPv6 address, and a port.
_LISTEN = re.compile(r"^(?:\[[0-9A-Fa-f:.]+(?:%[A-Za-z0-9_.-]+)?\]|[A-Za-z0-9_.-]+):(?P<port>[0-9]{1,5})$")
DEFAULT_PREFIX = "/fencepost/locks/"
SERVICE_NAME = "fencepost.v1.LockService"
#: How often the health monitor checks etcd, in seconds.
HEALTH_INTERVAL = 1.0

#: Server channel options. Clients ping every 20 s at most (see the client);
#: the server accepts pings down to 5 s apart, also without calls in flight,
#: so that idle streams are never closed with GOAWAY "too_many_pings".
SERVER_OPTIONS = [
    # Never share the port with another process: two coordinators on one port
    # behind different etcds would grant the same lock twice.
    ("grpc.so_reuseport", 0),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_ping_strikes", 0),
]


def check_listen(listen: str) -> str:
    """Check the address to serve on: ``HOST:PORT``, the port 0 (pick a free one) to 65535.

    gRPC itself takes ``127.0.0.1`` as ``127.0.0.1:443``; this refuses it.

    Args:
        listen: e.g. ``127.0.0.1:7420``, ``0.0.0.0:7420``, ``localhost:7420``, ``[::1]:7420``.

    Returns:
        ``listen`` unchanged.

    Raises:
        ValueError: not of that form (no port, a port that is not a number or
            above 65535, an IPv6 address without brackets).
    """
    match = _LISTEN.match(listen) if isinstance(listen, str) else None
    if match is None or int(match.group("port")) > 65535:
        raise ValueError(f"listen address {listen!r} is not HOST:PORT with a port 0 to 65535 "
                         f"(e.g. 127.0.0.1:7420, 0.0.0.0:7420, [::1]:7420; port 0 picks a free one)")
    return listen


class Coordinator:
    """A Fencepost coordinator serving LockService on one address.

    Args:
        etcd_endpoints: etcd client endpoints, ``host:port`` each (a host name
            or an address; ``https://`` or ``http://`` may prefix it).
        listen: ``HOST:PORT`` to serve on; port 0 picks a free port.
        prefix: the etcd key prefix of all locks.
        grace_seconds: how long ``stop()`` lets in-flight calls finish.
        server_options: extra gRPC server channel options, applied over
            ``SERVER_OPTIONS`` (same key: the extra value wins). For tests and
            tuning, e.g. a stricter ``grpc.http2.min_recv_ping_interval_without_data_ms``.
        etcd_tls: TLS (mTLS with a client certificate) to etcd; None for plaintext.
        etcd_auth: etcd user and password when etcd has auth enabled.
        metrics_listen: ``HOST:PORT`` to serve Prometheus metrics on, over
            HTTP at ``/metrics`` (see :mod:`.metrics_server`); None for no
            metrics (no interceptor, nothing counted).

    Raises:
        ValueError: no endpoint, a malformed one, or ``http://`` endpoints with
            ``etcd_tls``; ``listen`` or ``metrics_listen`` not ``HOST:PORT``.
    """

    def __init__(self, etcd_endpoints: Sequence[str], *, listen: str = DEFAULT_LISTEN,
                 prefix: str = DEFAULT_PREFIX, grace_seconds: float = 5.0,
                 server_options: Sequence[tuple[str, int | str]] = (), etcd_tls: EtcdTls | None = None,
                 etcd_auth: EtcdAuth | None = None,
                 metrics_listen: str | None = None) -> None:
        check_endpoints(etcd_endpoints, etcd_tls)
        check_listen(listen)
        # Metrics (--metrics-listen), off by default: see .metrics_server.
        self._metrics = MetricsEndpoint(check_listen(metrics_listen)) if metrics_listen is not None else None
        self._endpoints = list(etcd_endpoints)
        self._etcd_tls = etcd_tls
        self._etcd_auth = etcd_auth
        self._listen = listen
        self._keys = Keys(prefix)
        self._grace = grace_seconds
        extra = dict(server_options)
        self._server_options = [(k, v) for k, v in SERVER_OPTIONS if k not in extra] + list(extra.items())
        self._etcd: EtcdClient | None = None
        self._server: grpc.aio.Server | None = None
        self._health = health.aio.HealthServicer()
        self._tasks: list[asyncio.Task[None]] = []
        self._service: LockService | None = None
        self._watcher: DeleteWatcher | None = None
        self.port = 0

    @property
    def address(self) -> str:
        """``HOST:PORT`` the coordinator serves on (after ``start()``)."""
        return f"{self._listen.rsplit(':', 1)[0]}:{self.port}"

    @property
    def metrics_address(self) -> str | None:
        """``HOST:PORT`` of the ``/metrics`` endpoint (after ``start()``); None without ``metrics_listen``."""
        return self._metrics.address if self._metrics is not None else None

    async def start(self) -> int:
        """Connect to etcd, bind and start serving.

        An unreachable etcd is not an error: the coordinator serves with
        health NOT_SERVING until etcd answers.

        Returns:
            The bound port.

        Raises:
            RuntimeError: the address (or the metrics address, bound first)
                could not be bound, or etcd refused the coordinator's credentials.
        """
        if self._metrics is not None:
            self._metrics.start()
        counted = self._metrics.locks if self._metrics is not None else NO_METRICS
        self._etcd = EtcdClient(self._endpoints, tls=self._etcd_tls, auth=self._etcd_auth, metrics=counted)
        try:
            await self._etcd.connect()
        except FencepostError as exc:
            raise RuntimeError(exc.message) from exc
        self._watcher = DeleteWatcher(self._etcd, self._keys, metrics=counted)
        leases = Leases(self._etcd)
        locks = LockManager(self._etcd, self._keys, self._watcher, metrics=counted)
        self._service = LockService(leases, locks, self._watcher, self._keys, metrics=counted)
        server = grpc.aio.server(options=self._server_options,
                                 interceptors=[self._metrics.grpc] if self._metrics is not None else None)
        lock_pb2_grpc.add_LockServiceServicer_to_server(self._service, server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        if self._metrics is not None:
            self._metrics.grpc.initialize([lock_pb2.DESCRIPTOR.services_by_name["LockService"],
                                           health_pb2.DESCRIPTOR.services_by_name["Health"]])
        try:
            self.port = server.add_insecure_port(self._listen)
        except RuntimeError as exc:
            raise RuntimeError(f"cannot listen on {self._listen}: {exc}") from exc
        if self.port == 0:
            raise RuntimeError(f"cannot listen on {self._listen}")
        await self._set_health(False)
        await server.start()
        self._server = server
        self._watcher.start()
        self._tasks.append(asyncio.create_task(self._monitor_etcd(), name="fencepost-health"))
        return self.port

    async def stop(self, grace: float | None = None) -> None:
        """Stop serving: health NOT_SERVING, end streams, let calls finish.

        Args:
            grace: seconds in-flight calls may take; default ``grace_seconds``.

        Leases and locks in etcd are left alone.
        """
        await self._health.enter_graceful_shutdown()
        if self._service is not None:
            self._service.enter_graceful_shutdown()
        if self._server is not None:
            await self._server.stop(self._grace if grace is None else grace)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self._watcher is not None:
            await self._watcher.close()
        if self._etcd is not None:
            await self._etcd.close()
        if self._metrics is not None:
            await self._metrics.stop()

    async def wait_closed(self) -> None:
        """Wait until the server has stopped."""
        if self._server is not None:
            await self._server.wait_for_termination()

    async def _set_health(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        await self._health.set("", status)
        await self._health.set(SERVICE_NAME, status)

    async def _monitor_etcd(self) -> None:
        """Keep health SERVING while etcd answers a linearizable read, NOT_SERVING otherwise."""
        assert self._etcd is not None
        serving: bool | None = None
        said: tuple[bool, str | None] | None = None
        while True:
            # Two tries of 1 s (the HEALTH rule): the second goes to the next
            # member, so one frozen member of a healthy cluster is not an outage.
            ok = await self._etcd.healthy(self._keys.prefix)
            if ok != serving:
                serving = ok
                await self._set_health(ok)
            # Logged once per change, also when an unreachable etcd comes back
            # refusing the coordinator (health stays NOT_SERVING meanwhile).
            state = (ok, None if ok else self._etcd.refusal)
            if state != said:
                said = state
                if ok:
                    _log.info("etcd reachable: SERVING")
                elif state[1] is not None:
                    who = f"user {self._etcd.user!r}" if self._etcd.user else "no --etcd-user"
                    _log.warning("etcd refuses the coordinator (%s, %s): NOT_SERVING until it accepts it",
                                 state[1], who)
                else:
                    _log.warning("etcd unreachable: NOT_SERVING")
            await asyncio.sleep(HEALTH_INTERVAL)
