"""The real LockService on a plain ``grpc.aio`` server: a unix socket, TLS, or both.

``fencepost.coordinator.process.coordinator.Coordinator`` binds plaintext TCP only; the
client's unix-socket and TLS tests need the same service behind other
ports. :class:`LockServer` wires the coordinator's parts (etcd layer,
deletion watcher, leases, locks, servicer, health) exactly as
``Coordinator.start()`` does, on a real etcd, and binds them where a test
asks, with the credentials it asks for. It can be stopped and started
again on the same address with other credentials (a certificate rotated,
or broken), keeping its etcd client, so that the leases of the clients
survive.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from fencepost.client.v1 import lock_pb2_grpc
from fencepost.client.v1.keys import Keys
from fencepost.coordinator.api.service import LockService
from fencepost.coordinator.etcd import EtcdClient
from fencepost.coordinator.process.coordinator import SERVER_OPTIONS
from fencepost.coordinator.process.health import SERVICE_NAME
from fencepost.coordinator.recipes.lease import Leases
from fencepost.coordinator.recipes.lock import LockManager
from fencepost.coordinator.recipes.watch import DeleteWatcher


class LockServer:
    """LockService and grpc.health.v1 on one address, plaintext or TLS; restartable.

    Args:
        etcd_endpoint: ``host:port`` of the test etcd.
        prefix: The test's etcd key prefix.
    """

    def __init__(self, etcd_endpoint: str, prefix: str) -> None:
        self._endpoint = etcd_endpoint
        self._keys = Keys(prefix)
        self._etcd: EtcdClient | None = None
        self._watcher: DeleteWatcher | None = None
        self._server: grpc.aio.Server | None = None
        self._service: LockService | None = None
        self.address = ""

    async def start(self, bind: str, credentials: grpc.ServerCredentials | None = None) -> str:
        """Serve on ``bind`` (``127.0.0.1:0``, ``unix:/abs/path``); TLS when ``credentials`` is given.

        Returns:
            The address a client dials: ``127.0.0.1:PORT`` (the bound port), or ``bind`` for a unix socket.
        """
        assert self._server is None, "stop() first"
        if self._etcd is None:
            self._etcd = EtcdClient([self._endpoint])
            await self._etcd.connect()
            self._watcher = DeleteWatcher(self._etcd, self._keys)
            self._watcher.start()
        assert self._watcher is not None
        self._service = LockService(Leases(self._etcd), LockManager(self._etcd, self._keys, self._watcher),
                                    self._watcher, self._keys)
        server = grpc.aio.server(options=SERVER_OPTIONS)
        lock_pb2_grpc.add_LockServiceServicer_to_server(self._service, server)
        servicer = health.aio.HealthServicer()
        await servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
        if credentials is None:
            port = server.add_insecure_port(bind)
        else:
            port = server.add_secure_port(bind, credentials)
        assert port != 0, f"cannot bind {bind}"
        await server.start()
        self._server = server
        self.address = bind if bind.startswith("unix:") else f"{bind.rsplit(':', 1)[0]}:{port}"
        return self.address

    async def stop(self) -> None:
        """Stop serving (streams end with SHUTTING_DOWN); the etcd client stays for a restart."""
        if self._service is not None:
            self._service.enter_graceful_shutdown()
        if self._server is not None:
            await self._server.stop(0)
        self._server = None

    async def close(self) -> None:
        """Stop serving and close the etcd client."""
        await self.stop()
        if self._watcher is not None:
            await self._watcher.close()
        if self._etcd is not None:
            await self._etcd.close()


#: ``await start(credentials=None, bind="127.0.0.1:0")``: a started LockServer.
Start = Callable[..., Awaitable[LockServer]]


@pytest.fixture
async def serve(etcd: Any, prefix: str) -> AsyncIterator[Start]:
    """Start LockServers on the test etcd and prefix: ``await serve(credentials, bind)``; all closed after the test."""
    servers: list[LockServer] = []

    async def start(credentials: grpc.ServerCredentials | None = None, bind: str = "127.0.0.1:0") -> LockServer:
        server = LockServer(etcd.endpoint, prefix)
        servers.append(server)
        await server.start(bind, credentials)
        return server

    try:
        yield start
    finally:
        for server in servers:
            await server.close()
