"""Every address form the client and the CLI accept, against a real coordinator.

The parser (``fencepost.client._transport.wire.check_addresses``) accepts ``HOST:PORT``
(host name, IPv4, ``[IPv6]``), ``dns:///HOST:PORT`` and ``unix:/ABSOLUTE/PATH``
(or ``unix:///ABSOLUTE/PATH``); each form is used here for real: by the
asyncio and sync clients, and by ``fencepost status`` and ``fencepost run``.
The in-process coordinator listens on 127.0.0.1; the IPv6 and unix-socket
forms reach it through a byte-for-byte forwarder on ``[::1]`` or a unix
socket, and a LockService served on a unix socket only (tests/lock_servers.py)
is dialled directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fencepost.client import AsyncLockClient, InvalidArgument, LockClient

from .cli_helpers import run_cli
from .lock_servers import LockServer


class Forwarder:
    """Accepts connections on ``[::1]`` or a unix socket and copies bytes to and from 127.0.0.1:PORT."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.server: asyncio.AbstractServer | None = None
        self.writers: set[asyncio.StreamWriter] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.accepted = 0

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        self.writers.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
            self.writers.add(up_writer)
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.tasks.discard(task)

    async def start_tcp6(self) -> int:
        self.server = await asyncio.start_server(self._handle, "::1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def start_unix(self, path: str) -> None:
        self.server = await asyncio.start_unix_server(self._handle, path)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for writer in list(self.writers):
            writer.close()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for writer in list(self.writers):
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        if self.server is not None:
            await self.server.wait_closed()


@pytest.fixture
async def sockdir() -> AsyncIterator[str]:
    """A short directory for unix sockets (sun_path is at most 107 bytes)."""
    path = tempfile.mkdtemp(prefix="fp-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


#: Each form: {port} is the coordinator's, {port6} the [::1] forwarder's, {sock} the unix forwarder's socket.
FORMS: dict[str, str] = {
    "ipv4": "127.0.0.1:{port}",
    "host-name": "localhost:{port}",
    "dns-ipv4": "dns:///127.0.0.1:{port}",
    "dns-host-name": "dns:///localhost:{port}",
    "ipv6": "[::1]:{port6}",
    "dns-ipv6": "dns:///[::1]:{port6}",
    "unix": "unix:{sock}",
    "unix-absolute-uri": "unix://{sock}",
}


@pytest.fixture(params=list(FORMS), ids=list(FORMS))
async def target(request: pytest.FixtureRequest, coordinator: Any, sockdir: str) -> AsyncIterator[str]:
    """The in-process coordinator's address in one of the accepted forms."""
    form = FORMS[request.param]
    forwarder = Forwarder(coordinator.port)
    port6 = 0
    sock = os.path.join(sockdir, "coordinator.sock")
    if "{port6}" in form:
        port6 = await forwarder.start_tcp6()
    elif "{sock}" in form:
        await forwarder.start_unix(sock)
    try:
        yield form.format(port=coordinator.port, port6=port6, sock=sock)
    finally:
        await forwarder.close()
    if forwarder.server is not None:
        assert forwarder.accepted > 0, "the address did not go through the forwarder"


def _name() -> str:
    return f"addr:{uuid.uuid4().hex[:8]}"


async def test_clients_through_each_address_form(target: str) -> None:
    """The asyncio and the sync client take, describe and release a lock through the address."""
    name = _name()
    async with AsyncLockClient(target, connect_timeout=5.0) as client:
        assert client.addresses == (target,)
        handle = await client.acquire(name, ttl=5.0, timeout=5.0)
        info = await client.describe(name)
        assert info.held and info.holder_token == handle.token
        await handle.release()

    def sync() -> int:
        with LockClient(target, connect_timeout=5.0) as sync_client:
            held = sync_client.try_acquire(name, ttl=5.0)
            token = held.token
            held.release()
            return token

    assert await asyncio.to_thread(sync) > handle.token


async def test_cli_through_each_address_form(target: str) -> None:
    """fencepost status (with and without NAME) and fencepost run work through the address."""
    name = _name()
    health = await run_cli("status", "--address", target)
    assert health.rc == 0 and f"coordinator {target}: SERVING" in health.out, health
    st = await run_cli("status", name, "--json", "--address", target)
    assert st.rc == 0, st
    assert json.loads(st.out)["held"] is False
    ran = await run_cli("run", name, "--ttl", "3", "--address", target, "--",
                        "sh", "-c", 'echo "$FENCEPOST_ADDRESS $FENCEPOST_TOKEN"')
    assert ran.rc == 0, ran
    address, token = ran.out.split()
    assert address == target and int(token) > 0


async def test_client_when_unix_path_is_relative_refuses_it(sockdir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """unix:PATH with a relative PATH is InvalidArgument naming the address, also where the socket exists.

    It used to be resolved from the working directory: the same FENCEPOST_ADDRESS
    then named another socket (or none) in a ``fencepost run`` child that changed
    directory.
    """
    forwarder = Forwarder(0)
    await forwarder.start_unix(os.path.join(sockdir, "c.sock"))
    monkeypatch.chdir(sockdir)
    try:
        for cls in (AsyncLockClient, LockClient):
            with pytest.raises(InvalidArgument, match="relative socket path 'c.sock'") as info:
                cls("unix:c.sock")
            assert info.value.field == "address"
        result = await run_cli("status", "x", "--address", "unix:c.sock")
        assert result.rc == 2 and "relative socket path" in result.err, result
    finally:
        await forwarder.close()
    assert forwarder.accepted == 0


@pytest.fixture
async def unix_server(etcd: Any, prefix: str, sockdir: str) -> AsyncIterator[LockServer]:
    """The real LockService served by a grpc.aio server bound to a unix socket only."""
    server = LockServer(etcd.endpoint, prefix)
    await server.start(f"unix:{sockdir}/coordinator.sock")
    try:
        yield server
    finally:
        await server.close()


@pytest.mark.parametrize("form", ["unix:{path}", "unix://{path}"], ids=["unix:/path", "unix:///path"])
async def test_clients_dial_a_unix_socket_server(unix_server: LockServer, form: str) -> None:
    """A coordinator listening on a unix socket only is reached by both forms: asyncio and sync clients, and the CLI."""
    target = form.format(path=unix_server.address[len("unix:"):])
    name = _name()
    async with AsyncLockClient(target, connect_timeout=5.0) as client:
        handle = await client.acquire(name, ttl=5.0, timeout=5.0)
        assert (await client.describe(name)).holder_token == handle.token
        st = await run_cli("status", name, "--json", "--address", target)
        assert st.rc == 0 and json.loads(st.out)["token"] == handle.token, st
        await handle.release()

    def sync() -> bool:
        with LockClient(target, connect_timeout=5.0) as sync_client:
            return sync_client.describe(name).held

    assert await asyncio.to_thread(sync) is False


async def test_client_when_address_is_well_formed_but_unreachable_fails_with_unavailable(sockdir: str) -> None:
    """A valid form that nothing listens on is still Unavailable (after connect_timeout), not InvalidArgument."""
    from fencepost.client import Unavailable

    for target in (f"unix:{sockdir}/nothing.sock", "dns:///127.0.0.1:1"):
        client = AsyncLockClient(target, connect_timeout=1.0)
        with pytest.raises(Unavailable):
            await client.connect()
        await client.close()

