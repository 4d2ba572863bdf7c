"""Health and etcd outages: the coordinator follows etcd's availability."""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path

import grpc
import pytest
import trustme
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fencepost.client import AsyncLockClient
from fencepost.client.v1 import lock_pb2
from fencepost.coordinator.process.embedded import EmbeddedEtcd

from .conftest import describe_waiters_is, error_info, wait_for
from .tls_helpers import call_fails, install_server_cert
from .owned_stub import OwnedStub


async def _health(address: str, service: str = "") -> int:
    async with grpc.aio.insecure_channel(address) as chan:
        stub = health_pb2_grpc.HealthStub(chan)
        try:
            resp = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
        except grpc.aio.AioRpcError as exc:
            pytest.fail(f"health Check failed: {exc.code()} {exc.details()}")
        return int(resp.status)


async def test_health_follows_etcd(tmp_path: Path, prefix: str) -> None:
    """Health is SERVING with etcd up, NOT_SERVING while it is down, SERVING again once it is back."""
    from fencepost.coordinator.process.coordinator import Coordinator

    own_etcd = EmbeddedEtcd(tmp_path / "etcd")
    await asyncio.to_thread(own_etcd.start)
    coord = Coordinator([own_etcd.endpoint], listen="127.0.0.1:0", prefix=prefix)
    try:
        await asyncio.wait_for(coord.start(), 20)
        address = f"127.0.0.1:{coord.port}"
        serving = health_pb2.HealthCheckResponse.SERVING
        not_serving = health_pb2.HealthCheckResponse.NOT_SERVING

        async def status_is(want: int, service: str = "") -> bool:
            return await _health(address, service) == want

        await wait_for(lambda: status_is(serving), 10, 0.1, "SERVING at start")
        assert await _health(address, "fencepost.v1.LockService") == serving
        assert await _health(address, "liveness") == serving

        await asyncio.to_thread(own_etcd.stop)
        await wait_for(lambda: status_is(not_serving), 15, 0.1, "NOT_SERVING with etcd stopped")
        assert await _health(address, "fencepost.v1.LockService") == not_serving
        assert await _health(address, "liveness") == serving  # the process is alive: no restart by a probe

        await asyncio.to_thread(own_etcd.start)
        await wait_for(lambda: status_is(serving), 20, 0.1, "SERVING with etcd back")
        assert await _health(address, "fencepost.v1.LockService") == serving

        # And it serves locks again.
        async with AsyncLockClient(address) as client:
            h = await client.acquire("after-etcd-restart", ttl=5.0, timeout=10.0)
            await h.release()
    finally:
        await asyncio.wait_for(coord.stop(grace=0), 20)
        await asyncio.to_thread(own_etcd.stop)


async def test_acquire_while_etcd_is_down_is_unavailable(tmp_path: Path, prefix: str) -> None:
    """With etcd down, a LeaseGrant fails UNAVAILABLE (ETCD_UNAVAILABLE) rather than hanging."""
    from fencepost.coordinator.process.coordinator import Coordinator

    own_etcd = EmbeddedEtcd(tmp_path / "etcd")
    await asyncio.to_thread(own_etcd.start)
    coord = Coordinator([own_etcd.endpoint], listen="127.0.0.1:0", prefix=prefix)
    try:
        await asyncio.wait_for(coord.start(), 20)
        await asyncio.to_thread(own_etcd.stop)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{coord.port}") as chan:
            stub = OwnedStub(chan)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=5), timeout=15)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE, (info.value.code(), info.value.details())
        detail = error_info(info.value)
        assert detail is not None and detail.reason == "ETCD_UNAVAILABLE"
    finally:
        await asyncio.wait_for(coord.stop(grace=0), 20)
        await asyncio.to_thread(own_etcd.stop)


def _watch_failures(caplog: pytest.LogCaptureFixture, level: int | None = None) -> list[logging.LogRecord]:
    """The lock watch's failure records (each restart is one, at DEBUG when not worth a WARNING)."""
    return [r for r in caplog.records
            if r.name == "fencepost.coordinator.recipes.watch"
            and ("failed" in r.getMessage() or "failing" in r.getMessage())
            and (level is None or r.levelno == level)]


async def test_log_when_etcd_stays_unreachable(tmp_path: Path, prefix: str, caplog: pytest.LogCaptureFixture,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """With etcd out of reach the watch restarts every 0.05-2 s but warns once, then at most every
    REPEAT_INTERVAL; health says NOT_SERVING once; one line each when etcd is back."""
    from fencepost.coordinator.process.coordinator import Coordinator
    from fencepost.coordinator.recipes import watch

    monkeypatch.setattr(watch, "REPEAT_INTERVAL", 2.0)
    caplog.set_level(logging.DEBUG, logger="fencepost.coordinator")
    own_etcd = EmbeddedEtcd(tmp_path / "etcd")
    await asyncio.to_thread(own_etcd.start)
    await asyncio.to_thread(own_etcd.stop)  # its ports are kept: it comes back on the same endpoint
    coord = Coordinator([own_etcd.endpoint], listen="127.0.0.1:0", prefix=prefix)
    try:
        await asyncio.wait_for(coord.start(), 20)

        def reminders() -> int:
            return sum("still failing" in r.getMessage() for r in _watch_failures(caplog, logging.WARNING))

        await wait_for(lambda: reminders() >= 2, 30, 0.05, "two reminders of the watch failing")
        warned = _watch_failures(caplog, logging.WARNING)
        assert len(warned) == 3 and "lock watch failed" in warned[0].getMessage(), [r.getMessage() for r in warned]
        assert all(b.created - a.created >= 2.0 - 0.05 for a, b in zip(warned, warned[1:], strict=False))
        assert len(_watch_failures(caplog)) > len(warned)  # the other restarts were at DEBUG
        said = [r.getMessage() for r in caplog.records if r.name == "fencepost.coordinator"]
        assert said == ["etcd unreachable: NOT_SERVING"], said

        await asyncio.to_thread(own_etcd.start)
        await wait_for(lambda: any("lock watch running again" in r.getMessage() for r in caplog.records), 30, 0.05,
                       "the watch to say it runs again")
        await wait_for(lambda: any("etcd reachable: SERVING" in r.getMessage() for r in caplog.records), 30, 0.05,
                       "health to say SERVING")
        assert sum("lock watch running again" in r.getMessage() for r in caplog.records) == 1
    finally:
        await asyncio.wait_for(coord.stop(grace=0), 20)
        await asyncio.to_thread(own_etcd.stop)


# ---------------------------------------------------------------- the plaintext health listener


async def test_health_listener_when_the_main_port_requires_client_certificates(
        etcd: EmbeddedEtcd, prefix: str, tmp_path: Path) -> None:
    """With mTLS on the main port, the health listener answers grpc.health.v1 in plaintext without a certificate
    (the kubelet's probe), and nothing else: LockService there is UNIMPLEMENTED."""
    from fencepost.coordinator.process.coordinator import Coordinator
    from fencepost.coordinator.process.tls import ServerTls

    ca = trustme.CA()
    install_server_cert(ca, tmp_path)
    ca.cert_pem.write_to_path(tmp_path / "client-ca.pem")
    coord = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix, health_listen="127.0.0.1:0",
                        tls=ServerTls(tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "client-ca.pem"))
    try:
        await asyncio.wait_for(coord.start(), 20)
        health_address = coord.health_address
        assert health_address is not None and coord.health_port not in (0, coord.port)
        serving = health_pb2.HealthCheckResponse.SERVING
        await wait_for(lambda: _status_is(health_address, serving), 10, 0.1, "SERVING on the health listener")
        assert await _health(health_address, "fencepost.v1.LockService") == serving
        async with grpc.aio.insecure_channel(health_address) as chan:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await OwnedStub(chan).Describe(lock_pb2.DescribeRequest(name="x"), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        # The main port itself refuses a client without a certificate.
        assert await call_fails(coord.address, grpc.ssl_channel_credentials(ca.cert_pem.bytes())) == \
            grpc.StatusCode.UNAVAILABLE
    finally:
        await asyncio.wait_for(coord.stop(grace=0), 20)


async def test_health_listener_when_a_client_calls_lock_service_there(etcd: EmbeddedEtcd, prefix: str) -> None:
    """A LockService call to the plaintext health-only port fails saying that port does not serve LockService:
    from the Python clients (FencepostError with code UNIMPLEMENTED) and from ``fencepost status NAME`` (exit 1,
    one line), not with gRPC's "Method not found!"."""
    import fencepost.client as fc
    from fencepost.coordinator.process.coordinator import Coordinator

    from .cli_helpers import assert_one_line_error, run_cli

    coord = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix, health_listen="127.0.0.1:0")
    try:
        await asyncio.wait_for(coord.start(), 20)
        health_address = coord.health_address
        assert health_address is not None
        says = (f"the server at {health_address} does not serve fencepost.v1.LockService "
                "(is it a health-only port, --health-listen?)")
        async with AsyncLockClient(health_address, connect_timeout=5) as client:
            with pytest.raises(fc.FencepostError) as info:
                await client.describe("x")
        assert info.value.code == grpc.StatusCode.UNIMPLEMENTED and info.value.message == says, info.value
        with fc.LockClient(health_address, connect_timeout=5) as sync_client:
            with pytest.raises(fc.FencepostError) as sync_info:
                await asyncio.to_thread(sync_client.try_acquire, "x")
        assert sync_info.value.message == says, sync_info.value
        result = await run_cli("status", "x", "--address", health_address)
        assert result.rc == 1, result
        assert_one_line_error(result, says)
        assert "Method not found" not in result.err, result
    finally:
        await asyncio.wait_for(coord.stop(grace=0), 20)


async def _status_is(address: str, want: int, service: str = "") -> bool:
    return await _health(address, service) == want


async def test_health_listener_when_shutting_down(etcd: EmbeddedEtcd, prefix: str) -> None:
    """While stop() waits for an in-flight call, the health listener reports NOT_SERVING; after, it is closed."""
    from fencepost.coordinator.process.coordinator import Coordinator

    coord = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix, health_listen="127.0.0.1:0")
    stopping: asyncio.Task[None] | None = None
    try:
        await asyncio.wait_for(coord.start(), 20)
        health_address = coord.health_address
        assert health_address is not None
        await wait_for(lambda: _status_is(health_address, health_pb2.HealthCheckResponse.SERVING), 10, 0.1,
                       "SERVING on the health listener")
        async with grpc.aio.insecure_channel(coord.address) as chan:
            stub = OwnedStub(chan)
            holder = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10), timeout=5)
            waiter = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10), timeout=5)
            assert (await stub.Acquire(lock_pb2.AcquireRequest(name="busy", lease_id=holder.lease_id),
                                       timeout=5)).acquired
            blocked = stub.Acquire(lock_pb2.AcquireRequest(name="busy", lease_id=waiter.lease_id, wait_forever=True))
            await wait_for(lambda: describe_waiters_is(stub, "busy", 1), 10, 0.05, "the waiter to queue")
            stopping = asyncio.create_task(coord.stop(grace=30))
            await wait_for(lambda: _status_is(health_address, health_pb2.HealthCheckResponse.NOT_SERVING), 10, 0.05,
                           "NOT_SERVING on the health listener while stopping")
            assert await _health(health_address, "fencepost.v1.LockService") == \
                health_pb2.HealthCheckResponse.NOT_SERVING
            assert not stopping.done()
            blocked.cancel()  # the in-flight call ends: stop() can finish
            await asyncio.wait_for(stopping, 20)
        async with grpc.aio.insecure_channel(health_address) as chan:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await health_pb2_grpc.HealthStub(chan).Check(health_pb2.HealthCheckRequest(), timeout=2)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        if stopping is None:
            await asyncio.wait_for(coord.stop(grace=0), 20)


@pytest.mark.parametrize(("health_listen", "says"), [
    ("127.0.0.1", "HOST:PORT"),
    ("unix:relative.sock", "must be absolute"),
    ("127.0.0.1:7499", "must differ from the listen address"),
])
def test_health_listener_when_the_address_is_bad(health_listen: str, says: str, etcd: EmbeddedEtcd) -> None:
    """A malformed health listener address, or the listen address itself: ValueError at construction."""
    from fencepost.coordinator.process.coordinator import Coordinator

    with pytest.raises(ValueError, match=re.escape(says)):
        Coordinator([etcd.endpoint], listen="127.0.0.1:7499", health_listen=health_listen)
