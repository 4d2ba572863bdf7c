"""The coordinator's ``/metrics`` endpoint (``fencepost serve --metrics-listen HOST:PORT``).

:class:`MetricsEndpoint` owns one ``prometheus_client.CollectorRegistry``
holding the gRPC server metrics (:mod:`.interceptor`), the ``fencepost_*``
metrics (:mod:`.metrics`) and prometheus_client's standard process,
platform and garbage-collector collectors, and serves it over plain HTTP
with prometheus_client's own server (a thread beside the event loop; the
metrics are thread-safe). ``stop()`` closes the listening socket, so the
port is free again once it returns.

The exposition has no ``*_created`` series: prometheus_client adds one to
every counter and histogram, client_golang (and so go-grpc-prometheus)
exposes none, and they would double the series of every counter.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable, Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    Metric,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.registry import Collector

from .certificates import expiry_gauge
from .interceptor import GrpcServerMetrics
from .metrics import LockMetrics

__all__ = ["MetricsEndpoint"]


class _WithoutCreated(Collector):
    """``registry`` as the exposition sees it: without the ``<name>_created`` samples of counters and histograms."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            created = family.name + "_created"
            if family.type in ("counter", "histogram", "summary") and any(s.name == created for s in family.samples):
                kept = Metric(family.name, family.documentation, family.type, family.unit)
                kept.samples = [s for s in family.samples if s.name != created]
                family = kept
            yield family

    def restricted_registry(self, names: Iterable[str]) -> _WithoutCreated:
        """The same view of prometheus_client's ``?name[]=`` restriction."""
        return _WithoutCreated(self._registry.restricted_registry(names))  # type: ignore[arg-type]


class MetricsEndpoint:
    """The coordinator's metrics and the HTTP server that exposes them on ``/metrics``.

    Args:
        listen: ``HOST:PORT`` (port 0 picks a free one), already checked by
            :func:`~..process.coordinator.check_listen`; a bracketed IPv6 address is served
            on IPv6.
        name_prefixes: lock-name prefixes labelled on their own (``prefix``) in
            the grant, wait and hold metrics (see :class:`~.metrics.LockMetrics`).

    Attributes:
        registry: the registry of all the coordinator's metrics.
        grpc: the gRPC server interceptor (install it on the grpc.aio server).
        locks: the ``fencepost_*`` metrics (hand it to the lock, lease, stream,
            watch and etcd modules).
        certificate_expiry: the certificate expiry gauge (see :mod:`.certificates`).
        port: the bound port after :meth:`start`.

    Raises:
        ValueError: ``listen`` has no port; a bad name prefix.
    """

    def __init__(self, listen: str, name_prefixes: Iterable[str] = ()) -> None:
        host, sep, port = listen.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"metrics address {listen!r} is not HOST:PORT")
        self._listen = listen
        self._host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        self._wanted_port = int(port)
        self.registry = CollectorRegistry(auto_describe=True)  # so that ?name[]= finds the standard collectors too
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.grpc = GrpcServerMetrics(self.registry)
        self.locks = LockMetrics(self.registry, name_prefixes)
        self.certificate_expiry = expiry_gauge(self.registry)
        self.port = 0
        self._httpd: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        """``HOST:PORT`` the metrics are served on (after :meth:`start`)."""
        return f"{self._listen.rpartition(':')[0]}:{self.port}"

    def start(self) -> int:
        """Bind and serve ``/metrics`` in a daemon thread.

        Returns:
            The bound port.

        Raises:
            RuntimeError: the address cannot be bound (in use, not an address of this host).
        """
        try:
            self._httpd, self._thread = start_http_server(self._wanted_port, self._host,
                                                          registry=_WithoutCreated(self.registry))
        except OSError as exc:
            raise RuntimeError(f"cannot serve metrics on {self._listen}: {exc.strerror or exc}") from exc
        self.port = int(self._httpd.server_port)
        return self.port

    async def stop(self) -> None:
        """Stop serving and close the listening socket (the port is free once this returns); idempotent."""
        httpd, thread, self._httpd, self._thread = self._httpd, self._thread, None, None
        if httpd is None:
            return
        await asyncio.to_thread(httpd.shutdown)  # waits for serve_forever's poll (0.5 s at most)
        httpd.server_close()
        if thread is not None:
            await asyncio.to_thread(thread.join)
