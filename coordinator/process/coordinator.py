"""The coordinator: gRPC server, health service (:mod:`.health`), shutdown (``fencepost serve`` is :mod:`.main`).

``Coordinator`` wires the etcd layer, the deletion watcher, the lease and
lock modules and the servicer into one grpc.aio server. It holds no lock state
of its own: several replicas can serve the same etcd cluster and prefix.

It listens on ``HOST:PORT`` or a Unix socket (:mod:`.listen`), in plaintext
or with TLS or mTLS whose certificate is reloaded without dropping
established streams (:mod:`.tls`), and serves gRPC server reflection there
(grpcurl and grpcui need no proto file). A second, plaintext listener may
serve only ``grpc.health.v1`` (``health_listen``), for probes that cannot
present a client certificate, such as the kubelet's gRPC probe; a third,
``http_listen``, the HTTP/JSON API (:mod:`..http`) with the same TLS files,
answered by the same servicer on the same event loop (:mod:`.servers`).

Drain (``drain()``, after ``fencepost serve``'s first SIGTERM/SIGINT; see
:mod:`..admission.drain`): readiness NOT_SERVING, newcomers refused (DRAINING),
the rest served until the period passes, no stream is left, or a 2nd signal.

Shutdown (after the drain, or ``stop()``): health turns NOT_SERVING, KeepAlive
streams end with UNAVAILABLE/SHUTTING_DOWN so clients reconnect, in-flight
calls get ``grace_seconds`` to finish. Clients' leases are never revoked: a
restarted coordinator (or sidecar) must not drop its clients' locks.

Traces (:mod:`..telemetry.tracing`): with a tracer provider (given, or the global one when it is not the API's
default), each call is a SERVER span, child of the caller's W3C trace context, and each etcd request made for it a
CLIENT span under it; independent of metrics. Without one, no interceptor is installed and nothing is traced.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from opentelemetry.trace import TracerProvider

from fencepost.client.tracing import Tracing
from fencepost.client.errors import FencepostError
from fencepost.client.v1.keys import Keys

from ..admission.access import Access, Policy
from ..admission.limits import Limits
from ..admission.capacity import Capacity
from ..admission.overload import LoopLag
from ..api.server_info import About
from ..api.service import LockService
from ..etcd import EtcdAuth, EtcdClient, EtcdTls, check_endpoints
from ..recipes.delay_census import DelayCensus
from ..recipes.lease import Leases
from ..recipes.lock import LockManager
from ..recipes.high_water import FILE_NAME, HighWaterFile
from ..recipes.tokens import TokenFloor
from ..recipes.watch import DeleteWatcher
from ..telemetry.certificates import CertificateExpiry
from ..telemetry.endpoint import MetricsEndpoint
from ..telemetry.events import log_event
from ..telemetry.metrics import NO_METRICS
from ..telemetry.tracing import GrpcServerTracing
from .health import Health
from .listen import UnixSocketClaim, bind, check_listen, same_address, unix_socket_path
from .parts import CoordinatorParts
from .servers import health_server, http_server, lock_server
from .tls import ServerCertificates, ServerTls

if TYPE_CHECKING:
    from ..http import HttpServer, RouteModule

_log = logging.getLogger("fencepost.coordinator")

DEFAULT_LISTEN = "127.0.0.1:7420"
DEFAULT_PREFIX = "/fencepost/locks/"

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

#: How often a drain checks whether a stream is left, in seconds.
DRAIN_POLL_SECONDS = 0.1

__all__ = ["DEFAULT_LISTEN", "DEFAULT_PREFIX", "SERVER_OPTIONS", "Coordinator", "check_listen"]


class Coordinator(CoordinatorParts):
    """A Fencepost coordinator serving LockService on one address.

    Args:
        etcd_endpoints: etcd client endpoints, ``host:port`` each (a host name
            or an address; ``https://`` or ``http://`` may prefix it).
        listen: ``HOST:PORT`` to serve on (port 0 picks a free port), or a Unix
            socket, ``unix:/ABSOLUTE/PATH`` or ``unix:///ABSOLUTE/PATH`` (see
            :func:`~.listen.check_listen`). A socket file left at the path by
            a dead coordinator is removed at ``start()``.
        prefix: the etcd key prefix of all locks.
        grace_seconds: how long ``stop()`` lets in-flight calls finish.
        server_options: extra gRPC server channel options, applied over
            ``SERVER_OPTIONS`` (same key: the extra value wins). For tests and
            tuning, e.g. a stricter ``grpc.http2.min_recv_ping_interval_without_data_ms``.
        etcd_tls: TLS (mTLS with a client certificate) to etcd; None for plaintext.
        etcd_auth: etcd user and password when etcd has auth enabled.
        tls: TLS, or mTLS with ``tls.client_ca``, on ``listen``; None for
            plaintext. The files are read here, and again at a new handshake
            after they change on disk or after :meth:`reload_tls`.
        health_listen: a second address (same forms as ``listen``) served in
            plaintext with only the ``grpc.health.v1`` service, reporting the
            same status as ``listen``; None for none.
        metrics_listen: ``HOST:PORT`` to serve Prometheus metrics on, over
            HTTP at ``/metrics`` (see :mod:`..telemetry.endpoint`); None for no
            metrics (no interceptor, nothing counted).
        metrics_name_prefixes: lock-name prefixes whose grants, waits and
            holds get their own ``prefix`` label (1 to 256 bytes each, at most
            100); every other name is labelled ``prefix=""``. Only with
            ``metrics_listen``.
        etcd_embedded: whether ``etcd_endpoints`` is an etcd the caller runs
            for this coordinator alone (``fencepost serve`` without
            ``--etcd-endpoints``); reported by ServerInfo only.
        tracer_provider: the OpenTelemetry tracer provider of the spans; None
            for the global one. Looked up at ``start()``: while it is the
            API's default (no SDK set up), nothing is traced.
        trace_lock_names: record lock names on spans (``fencepost.lock.name``);
            False leaves them out.
        policy: the access policy (:mod:`..admission.access`): which client-certificate
            identities may take which actions on which lock names; None lets
            every caller do everything. Meant for mTLS (``tls.client_ca``):
            without it every caller is anonymous.
        limits: the limits on callers, leases, streams, waiters and message
            size (:mod:`..admission.limits`); None for the defaults. Its
            ``max_message_bytes`` is the server's ``grpc.max_receive_message_length``
            unless ``server_options`` sets that.
        etcd_batch_max: most lock Txns of different locks sent to etcd as one
            Txn when they arrive while one is in flight (:mod:`..etcd.batch`);
            0 sends each alone.
        loop_lag: the overload monitor whose figure ``limits.max_lag`` refuses
            new leases past (:mod:`..admission.overload`), started and stopped
            with the coordinator; None for one that measures this process's
            event loop and the etcd layer's keepalive backlog.
        capacity: tells when the coordinator is past its capacity and refuses
            newcomers (:mod:`..admission.capacity`), measured at each of
            ``loop_lag``'s measurements; None for one with ``limits``' marks.
        data_dir: an existing directory where the coordinator keeps, across
            restarts, the highest token it may have handed out (``tokens.json``,
            :mod:`..recipes.high_water`): after a restart it refuses to grant
            while etcd is below it. None keeps it in memory only.
        http_listen: ``HOST:PORT`` or ``unix:/ABSOLUTE/PATH`` to serve the HTTP/JSON API on
            (:mod:`..http`, docs/http.md), with ``tls`` as on ``listen``; None for none.
        http_routes: more route modules on the HTTP app (after the API's ``/v1`` routes).

    Raises:
        ValueError: no endpoint, a malformed one, or ``http://`` endpoints with
            ``etcd_tls``; ``listen`` or ``health_listen`` not one of the forms
            above, or both the same; ``metrics_listen`` not ``HOST:PORT``; a
            bad metrics name prefix, or prefixes without ``metrics_listen``;
            ``http_listen`` not one of the forms of ``listen``, or another listener's address.
        TlsFileError: (a ValueError) a file of ``tls`` cannot be used; the
            message names it.
    """

    def __init__(self, etcd_endpoints: Sequence[str], *, listen: str = DEFAULT_LISTEN,
                 prefix: str = DEFAULT_PREFIX, grace_seconds: float = 5.0,
                 server_options: Sequence[tuple[str, int | str]] = (), etcd_tls: EtcdTls | None = None,
                 etcd_auth: EtcdAuth | None = None, tls: ServerTls | None = None,
                 health_listen: str | None = None, metrics_listen: str | None = None,
                 metrics_name_prefixes: Sequence[str] = (), etcd_embedded: bool = False,
                 tracer_provider: TracerProvider | None = None, trace_lock_names: bool = True,
                 policy: Policy | None = None, limits: Limits | None = None, etcd_batch_max: int = 64,
                 loop_lag: LoopLag | None = None, capacity: Capacity | None = None,
                 data_dir: Path | None = None, http_listen: str | None = None,
                 http_routes: Sequence[RouteModule] = ()) -> None:
        check_endpoints(etcd_endpoints, etcd_tls)
        check_listen(listen)
        if health_listen is not None:
            check_listen(health_listen)
            if same_address(listen, health_listen):
                raise ValueError(f"the health listener {health_listen!r} must differ from the listen address")
        if http_listen is not None:
            check_listen(http_listen)
            if any(same_address(http_listen, other) for other in (listen, health_listen) if other is not None):
                raise ValueError(f"the HTTP listener {http_listen!r} must differ from the other listen addresses")
        self._health_listen = health_listen
        self._http_listen, self._http_routes = http_listen, tuple(http_routes)
        self._http: HttpServer | None = None
        # Metrics (--metrics-listen), off by default: see ..telemetry.endpoint.
        if metrics_name_prefixes and metrics_listen is None:
            raise ValueError("metrics name prefixes need metrics_listen")
        self._metrics = (MetricsEndpoint(check_listen(metrics_listen), metrics_name_prefixes)
                         if metrics_listen is not None else None)
        self._tracing = Tracing(tracer_provider, lock_names=bool(trace_lock_names))
        self._certificates = ServerCertificates(tls) if tls is not None else None
        self._access = Access(policy)
        self._socket_path = unix_socket_path(listen)
        self._endpoints = list(etcd_endpoints)
        self._etcd_tls = etcd_tls
        self._etcd_auth = etcd_auth
        self._etcd_batch_max = etcd_batch_max
        watched = {role: path for role, path in (
            ("serving", tls.cert if tls is not None else None),
            ("etcd_client", etcd_tls.files[1] if etcd_tls is not None and len(etcd_tls.files) > 1 else None))
            if path is not None}
        #: The expiry of its serving and etcd client certificates: a metric, warnings 7 days ahead.
        self.certificate_expiry = CertificateExpiry(
            watched, self._metrics.certificate_expiry if self._metrics is not None else None)
        self._listen = listen
        self._keys = Keys(prefix)
        #: What ServerInfo reports of this coordinator (instance id, addresses, readiness, ...).
        self.about = About(prefix=self._keys.prefix.decode(), endpoints=self._endpoints, embedded=etcd_embedded)
        self._grace = grace_seconds
        self.limits = limits if limits is not None else Limits()
        extra = {**self.limits.grpc_options(), **dict(server_options)}
        self._server_options = [(k, v) for k, v in SERVER_OPTIONS if k not in extra] + list(extra.items())
        self._etcd: EtcdClient | None = None
        self._server: grpc.aio.Server | None = None
        self._health_server: grpc.aio.Server | None = None
        self._health = Health(self.about)
        self._tasks: list[asyncio.Task[None]] = []
        self._service: LockService | None = None
        self._watcher: DeleteWatcher | None = None
        self._locks: LockManager | None = None
        self._tokens: TokenFloor | None = None
        #: The high-water mark kept in ``data_dir`` (None without one); read at ``start()``.
        self.high_water = HighWaterFile(data_dir / FILE_NAME, self._keys.prefix.decode()) if data_dir else None
        self._loop_lag = loop_lag
        self._capacity = capacity
        self._claims: list[UnixSocketClaim] = []
        #: The bound TCP port after ``start()``; 0 for a Unix socket.
        self.port = 0
        #: The health listener's bound TCP port after ``start()``; 0 for a Unix socket or no health listener.
        self.health_port = 0

    @property
    def address(self) -> str:
        """The address the coordinator serves on: ``HOST:PORT`` (after ``start()``) or ``unix:/ABSOLUTE/PATH``."""
        if self._socket_path is not None:
            return f"unix:{self._socket_path}"
        return f"{self._listen.rsplit(':', 1)[0]}:{self.port}"

    @property
    def health_address(self) -> str | None:
        """The health listener's address, as :attr:`address` (after ``start()``); None without one."""
        if self._health_listen is None:
            return None
        path = unix_socket_path(self._health_listen)
        if path is not None:
            return f"unix:{path}"
        return f"{self._health_listen.rsplit(':', 1)[0]}:{self.health_port}"

    @property
    def http_address(self) -> str | None:
        """The HTTP/JSON API's address, as :attr:`address` (after ``start()``); None without ``http_listen``."""
        return self._http.address if self._http is not None else None

    @property
    def tls(self) -> ServerTls | None:
        """The TLS files of the listener; None for plaintext."""
        return self._certificates.tls if self._certificates is not None else None

    def reload_tls(self) -> bool:
        """Re-read the TLS files now (``fencepost serve`` does on SIGHUP), changed on disk or not.

        New handshakes use them; established connections and their streams
        keep the certificate they were made with. Changed files are also
        taken up without this, at the next handshake.

        Returns:
            True when the files were good; False when one cannot be used: the
            certificate in use stays, and a warning names the file.

        Raises:
            RuntimeError: the coordinator was made without ``tls``.
        """
        if self._certificates is None:
            raise RuntimeError("the coordinator serves without TLS: no files to reload")
        return self._certificates.reload()

    @property
    def policy(self) -> Policy | None:
        """The access policy in force; None for none."""
        return self._access.policy

    def reload_policy(self) -> bool:
        """Re-read the access policy's file now (``fencepost serve`` does on SIGHUP).

        Calls that start after this use the new policy. A file that cannot be
        used keeps the policy in force, and a warning (event
        ``policy_not_reloaded``) names the file and the problem.

        Returns:
            True when the new policy is in force; False when the old one stays.

        Raises:
            RuntimeError: the coordinator was made without a policy, or with one not read from a file.
        """
        return self._access.reload()

    @property
    def metrics_address(self) -> str | None:
        """``HOST:PORT`` of the ``/metrics`` endpoint (after ``start()``); None without ``metrics_listen``."""
        return self._metrics.address if self._metrics is not None else None

    async def start(self) -> int:
        """Connect to etcd, bind and start serving.

        An unreachable etcd is not an error: the coordinator serves with
        health NOT_SERVING until etcd answers.

        Returns:
            The bound TCP port; 0 for a Unix socket.

        Raises:
            RuntimeError: the address (or the metrics address, bound first)
                could not be bound (for a Unix socket: its directory is missing,
                another coordinator or process serves on it, or the path is not
                a socket), etcd refused the coordinator's credentials, or the
                high-water file in ``data_dir`` cannot be read.
        """
        try:
            if self.high_water is not None:
                self.high_water.load()
        except ValueError as exc:
            raise RuntimeError(str(exc)) from exc
        if self._metrics is not None:
            self._metrics.start()
        counted = self._metrics.locks if self._metrics is not None else NO_METRICS
        tracer = self._tracing.tracer()
        interceptors: list[grpc.aio.ServerInterceptor] = []
        if tracer is not None:  # first: its span is current in the metrics interceptor and the handler
            interceptors.append(GrpcServerTracing(tracer, lock_names=self._tracing.lock_names))
        if self._metrics is not None:
            interceptors.append(self._metrics.grpc)
        self._etcd = EtcdClient(self._endpoints, tls=self._etcd_tls, auth=self._etcd_auth, metrics=counted,
                                tracer=tracer, batch_max=self._etcd_batch_max)
        try:
            await self._etcd.connect()
        except FencepostError as exc:
            raise RuntimeError(exc.message) from exc
        self._watcher = DeleteWatcher(self._etcd, self._keys, metrics=counted)
        leases = Leases(self._etcd)
        # Every Range and Txn answer's header goes past the token floor: it refuses if etcd's revisions go back.
        self._tokens = self._etcd.headers = TokenFloor(self._etcd, self._keys, self.high_water)
        locks = self._locks = LockManager(self._etcd, self._keys, self._watcher, metrics=counted,
                                          tokens=self._tokens, max_waiters=self.limits.max_waiters or 2**63)
        self._service = LockService(leases, locks, self._watcher, self._keys, metrics=counted, about=self.about,
                                    access=self._access, limits=self.limits, loop_lag=self._loop_lag,
                                    capacity=self._capacity)
        self._service.intercepted_by(interceptors)
        self._service.loop_lag.start()
        server = lock_server(self._service, self._health.servicer, self._server_options, interceptors, self._metrics)
        credentials = self._certificates.credentials() if self._certificates is not None else None
        self.port = bind(server, self._listen, self._claims, credentials)
        health = None
        if self._health_listen is not None:
            health = health_server(self._health.servicer, self._server_options, interceptors)
            self.health_port = bind(health, self._health_listen, self._claims)
        await self._health.start()
        if health is not None:
            await health.start()
            self._health_server = health
        await server.start()
        self._server = server
        if self._http_listen is not None:
            self._http = http_server(self._service, interceptors, self._http_listen, certificates=self._certificates,
                                     max_body_bytes=self.limits.max_message_bytes, grace_seconds=self._grace,
                                     claims=self._claims, modules=self._http_routes,
                                     instance_id=self.about.instance_id,
                                     reuse_port=dict(self._server_options).get("grpc.so_reuseport") == 1)
            await self._http.start()
        self.about.listen_address = self.address
        self.about.health_address = self.health_address or ""
        self.about.metrics_address = self.metrics_address or ""
        self.about.http_address = self.http_address or ""
        self.about.started = time.monotonic()
        self._watcher.start()
        if self.high_water is not None:
            self.high_water.start()
        self._tasks.append(asyncio.create_task(self._health.monitor(self._etcd, self._tokens), name="fencepost-health"))
        if self.certificate_expiry.files:
            self._tasks.append(asyncio.create_task(self.certificate_expiry.run(), name="fencepost-certificate-expiry"))
        if self._metrics is not None:  # fencepost_lock_delays
            self._tasks.append(asyncio.create_task(DelayCensus(self._etcd, self._keys, counted).run(), name="census"))
        return self.port

    async def drain(self, seconds: float, *, interrupted: asyncio.Event | None = None) -> str:
        """Drain before :meth:`stop`: refuse newcomers, keep serving what ends or keeps state (see the module).

        Readiness turns NOT_SERVING (liveness stays SERVING); LeaseGrant, new
        KeepAlive streams, Acquire, AcquirePermit and Campaign are refused
        with UNAVAILABLE / DRAINING; Release, ReleasePermit, Resign, Withdraw,
        LeaseRevoke, the open streams' keepalives and the waits already queued
        are served. Returns when ``seconds`` passed, when no KeepAlive or
        Observe stream is left (no client keeps anything alive here), or when
        ``interrupted`` is set; the caller then calls :meth:`stop`.

        Args:
            seconds: the longest drain, in seconds (>= 0).
            interrupted: set to end the drain at once (a second SIGTERM).

        Returns:
            Why it ended: ``"elapsed"``, ``"no_streams"`` or ``"interrupted"``.
        """
        loop = asyncio.get_running_loop()
        ends_at = loop.time() + seconds
        streams = self.open_streams
        log_event(_log, logging.INFO, "drain", f"draining for at most {seconds:g} s: new leases, streams and "
                  f"acquires refused (DRAINING), releases, revokes and keepalives served; {streams} streams open",
                  drain_s=seconds, streams=streams)
        await self._health.enter_drain()
        if self._service is not None:
            self._service.enter_drain(seconds)
        interrupted = interrupted if interrupted is not None else asyncio.Event()
        ended = "elapsed"
        while loop.time() < ends_at:
            if interrupted.is_set():
                ended = "interrupted"
                break
            if self.open_streams == 0:
                ended = "no_streams"
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(interrupted.wait(), min(DRAIN_POLL_SECONDS, max(0.0, ends_at - loop.time())))
        log_event(_log, logging.INFO, "drain_end", f"drain ended ({ended}); {self.open_streams} streams open",
                  ended=ended, streams=self.open_streams)
        return ended

    @property
    def open_streams(self) -> int:
        """The KeepAlive and Observe streams being served (0 before ``start()``)."""
        return self._service.open_streams if self._service is not None else 0

    async def stop(self, grace: float | None = None) -> None:
        """Stop serving: health NOT_SERVING (on the health listener too), end streams, let calls finish.

        Args:
            grace: seconds in-flight calls may take; default ``grace_seconds``.

        Leases and locks in etcd are left alone.
        """
        grace = self._grace if grace is None else grace
        if self._server is not None:
            streams = self._service.open_streams if self._service is not None else 0
            log_event(_log, logging.INFO, "shutdown", f"shutting down: {streams} KeepAlive streams to end, "
                      f"{grace:g} s for calls in flight (leases are kept)", grace_s=grace, streams=streams)
        await self._health.enter_graceful_shutdown()
        if self._service is not None:
            self._service.enter_graceful_shutdown()
        # Both ports within the one grace: calls in flight end on each.
        await asyncio.gather(*(server.stop(grace) for server in (self._server,) if server is not None),
                             *(http.stop(grace) for http in (self._http,) if http is not None))
        if self._health_server is not None:  # NOT_SERVING there too until the main server has stopped
            await self._health_server.stop(0)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self._service is not None:
            await self._service.close()
        if self._locks is not None:
            await self._locks.close()
        if self._watcher is not None:
            await self._watcher.close()
        if self._etcd is not None:
            await self._etcd.close()
        if self.high_water is not None:  # the last rise, after every etcd answer
            await self.high_water.close()
        for claim in self._claims:  # after the server stopped: gRPC has removed the socket files
            claim.release()
        self._claims.clear()
        if self._metrics is not None:
            await self._metrics.stop()

    async def wait_closed(self) -> None:
        """Wait until the server has stopped."""
        if self._server is not None:
            await self._server.wait_for_termination()
