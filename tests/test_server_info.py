"""ServerInfo against a real etcd and an in-process coordinator: identity, etcd fields, counts.

The frozen-etcd case (ServerInfo answers within its deadline with the etcd
part unavailable) is in test_deadlines.py, which owns an etcd it freezes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.metadata
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from fencepost.client import AsyncLockClient, EtcdInfo, FencepostError, LockClient, ServerInfo
from fencepost.client.v1 import lock_pb2, lock_pb2_grpc
from fencepost.coordinator.api.server_info import About, redact_endpoint
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.process.embedded import EmbeddedEtcd

from .conftest import describe_waiters_is, wait_for


async def _info(stub: lock_pb2_grpc.LockServiceStub) -> lock_pb2.ServerInfoResponse:
    return await stub.ServerInfo(lock_pb2.ServerInfoRequest(), timeout=5)


@contextlib.asynccontextmanager
async def _keepalive_stream(stub: lock_pb2_grpc.LockServiceStub) -> AsyncIterator[
        tuple[asyncio.Queue[lock_pb2.KeepAliveRequest | None], Any]]:
    """A raw KeepAlive stream: (the queue its requests are read from, the call)."""
    out: asyncio.Queue[lock_pb2.KeepAliveRequest | None] = asyncio.Queue()

    async def requests() -> AsyncIterator[lock_pb2.KeepAliveRequest]:
        while (item := await out.get()) is not None:
            yield item

    call = stub.KeepAlive(requests())
    try:
        yield out, call
    finally:
        call.cancel()


async def test_server_info_reports_version_identity_addresses_and_etcd(
    coordinator: Coordinator, address: str, stub: lock_pb2_grpc.LockServiceStub, etcd: EmbeddedEtcd, prefix: str
) -> None:
    """Version is the package's, the ids are etcd's single member's, the addresses and prefix the coordinator's."""
    await wait_for(lambda: coordinator.about.serving, 10, what="the coordinator SERVING")
    resp = await _info(stub)
    assert resp.version == importlib.metadata.version("fencepost")
    assert len(resp.instance_id) == 16 and int(resp.instance_id, 16) >= 0
    assert resp.uptime_seconds > 0
    assert resp.listen_address == address
    assert resp.health_address == "" and resp.metrics_address == "" and resp.http_address == ""
    assert resp.key_prefix == prefix
    assert resp.serving is True
    e = resp.etcd
    assert list(e.endpoints) == [etcd.endpoint] and e.embedded is False
    assert e.available is True and e.error == "", e.error
    assert e.server_version.startswith("3.5."), e.server_version
    assert e.cluster_id != 0 and e.member_id != 0
    assert e.leader == e.member_id  # one member: it leads
    assert e.raft_term >= 1 and e.raft_index > 0 and e.db_size_bytes > 0 and e.revision > 0
    assert (resp.contender_keys, resp.held_locks, resp.waiters) == (0, 0, 0)
    assert (resp.keepalive_streams, resp.keepalive_leases, resp.watched_holds, resp.waiting_acquires) == (0, 0, 0, 0)
    again = await _info(stub)
    assert again.instance_id == resp.instance_id and again.uptime_seconds > resp.uptime_seconds


async def test_server_info_counts_follow_a_hold_a_waiter_and_a_stream(
    address: str, stub: lock_pb2_grpc.LockServiceStub
) -> None:
    """A held lock, a waiter and a KeepAlive stream show in the counts; the revision grows with the acquire."""
    before = await _info(stub)
    holder = (await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=30), timeout=5)).lease_id
    waiter = (await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=30), timeout=5)).lease_id
    try:
        granted = await stub.Acquire(lock_pb2.AcquireRequest(name="jobs/a", lease_id=holder), timeout=5)
        assert granted.acquired
        held = await _info(stub)
        assert held.etcd.revision >= granted.token > before.etcd.revision
        assert (held.contender_keys, held.held_locks, held.waiters) == (1, 1, 0)

        async with _keepalive_stream(stub) as (out, call):
            # The watch is read before the keepalive, so once the keepalive is answered both are counted.
            out.put_nowait(lock_pb2.KeepAliveRequest(watch=lock_pb2.WatchHold(
                name="jobs/a", lease_id=holder, token=granted.token)))
            out.put_nowait(lock_pb2.KeepAliveRequest(keepalive=lock_pb2.LeaseKeepAlive(lease_id=holder, request_id=1)))
            ack = await asyncio.wait_for(call.read(), 5)
            assert ack.keepalive.request_id == 1 and ack.keepalive.ttl_seconds > 0

            wait = asyncio.ensure_future(stub.Acquire(lock_pb2.AcquireRequest(
                name="jobs/a", lease_id=waiter, wait_ms=30_000), timeout=35))
            try:
                await wait_for(lambda: describe_waiters_is(stub, "jobs/a", 1), 10, what="one waiter on jobs/a")
                busy = await _info(stub)
                assert (busy.keepalive_streams, busy.keepalive_leases, busy.watched_holds) == (1, 1, 1)
                assert busy.waiting_acquires == 1
                assert (busy.contender_keys, busy.held_locks, busy.waiters) == (2, 1, 1)
                assert busy.etcd.revision > held.etcd.revision
            finally:
                await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=holder), timeout=5)
                assert (await asyncio.wait_for(wait, 10)).acquired  # the waiter is granted
        await wait_for(lambda: _idle(stub), 10, what="the stream's end counted")
        after = await _info(stub)
        assert (after.contender_keys, after.held_locks, after.waiters) == (1, 1, 0)
    finally:
        for lease in (holder, waiter):
            await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease), timeout=5)


async def _idle(stub: lock_pb2_grpc.LockServiceStub) -> bool:
    info = await _info(stub)
    return (info.keepalive_streams, info.watched_holds, info.waiting_acquires) == (0, 0, 0)


async def test_server_info_from_the_clients(address: str, etcd: EmbeddedEtcd, prefix: str) -> None:
    """LockClient.server_info() and AsyncLockClient.server_info() return a ServerInfo with typed fields."""
    async with AsyncLockClient(address) as client:
        handle = await client.acquire("inv:1", ttl=10.0, timeout=5.0)
        info = await client.server_info()
        await handle.release()
    assert isinstance(info, ServerInfo) and isinstance(info.etcd, EtcdInfo)
    assert info.version == importlib.metadata.version("fencepost")
    assert isinstance(info.uptime, float) and info.uptime > 0
    assert info.key_prefix == prefix and info.listen_address == address
    assert info.health_address is None and info.metrics_address is None and info.http_address is None
    assert info.etcd.available and info.etcd.error is None
    assert info.etcd.endpoints == (etcd.endpoint,)
    assert info.etcd.revision is not None and info.etcd.revision >= handle.token
    assert (info.contender_keys, info.held_locks, info.waiters) == (1, 1, 0)
    assert info.keepalive_streams == 1 and info.watched_holds == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.version = "x"  # type: ignore[misc]

    def sync() -> ServerInfo:
        with LockClient(address) as c:
            return c.server_info()

    again = await asyncio.to_thread(sync)
    assert again.instance_id == info.instance_id and again.held_locks == 0


async def test_server_info_when_server_does_not_implement_it_raises_unimplemented() -> None:
    """A gRPC server without LockService (here: only health) answers UNIMPLEMENTED, raised as FencepostError."""
    from grpc_health.v1 import health, health_pb2_grpc

    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with AsyncLockClient(f"127.0.0.1:{port}", connect_timeout=2) as client:
            with pytest.raises(FencepostError) as err:
                await client.server_info()
        assert err.value.code == grpc.StatusCode.UNIMPLEMENTED, err.value
    finally:
        await server.stop(0)


@pytest.mark.parametrize(
    ("given", "shown"),
    [
        ("etcd1:2379", "etcd1:2379"),
        ("https://user:secret@etcd1:2379", "https://etcd1:2379"),
        ("http://root@10.0.0.5:2379/", "http://10.0.0.5:2379/"),
        ("u:p@[::1]:2379", "[::1]:2379"),
        ("dns:///etcd.example:2379", "dns:///etcd.example:2379"),
    ],
)
def test_redact_endpoint_strips_credentials(given: str, shown: str) -> None:
    """An endpoint is reported without any user:password part."""
    assert redact_endpoint(given) == shown
    assert "secret" not in About(prefix="/p/", endpoints=[given]).endpoints[0]


async def test_server_info_names_the_http_address(etcd: EmbeddedEtcd, prefix: str) -> None:
    """With ``http_listen``, ServerInfo names the HTTP/JSON API's bound address: over gRPC, in the HTTP API's own
    JSON (``httpAddress``), in the client's ServerInfo and in ``fencepost status``'s lines."""
    import aiohttp

    from fencepost.client.cli.status import info_lines

    from .test_http_twins import start

    coordinator = await start(etcd, prefix)
    try:
        http = coordinator.http_address
        assert http is not None and not http.endswith(":0")
        async with grpc.aio.insecure_channel(coordinator.address) as channel:
            assert (await _info(lock_pb2_grpc.LockServiceStub(channel))).http_address == http
        async with aiohttp.ClientSession() as session, session.get(f"http://{http}/v1/server") as answer:
            assert (await answer.json())["httpAddress"] == http
        async with AsyncLockClient(coordinator.address) as client:
            info = await client.server_info()
        assert info.http_address == http
        assert dict(info_lines(info))["listening"].endswith(f"(HTTP API and lock board {http})")
    finally:
        await asyncio.wait_for(coordinator.stop(grace=0), 20)
