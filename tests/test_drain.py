"""Graceful drain (issue 25, item 3): a coordinator stopped together with its application lets it release first.

A sidecar coordinator and its application get SIGTERM at once (a pod's
containers, ``docker compose stop``). The coordinator drains for
``--drain-seconds`` (:meth:`~fencepost.coordinator.process.coordinator.Coordinator.drain`):
readiness NOT_SERVING, newcomers refused with UNAVAILABLE / DRAINING, while
releases, resigns, permit releases, lease revokes and keepalives are served;
so the application's releases succeed and the waiters elsewhere get the lock
at once, not at the lease's TTL. Against a real etcd and real coordinator
processes.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from etcd3aio import Etcd3Client
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fencepost.client import AsyncLockClient
from fencepost.client.v1 import details, lock_pb2
from fencepost.client.v1.keys import Keys
from fencepost.client.v1.kinds import election_lock, semaphore_queue
from fencepost.coordinator.process.coordinator import Coordinator

from .child_processes import ChildProcess, CoordinatorProcess
from .conftest import list_keys, wait_for
from .owned_stub import OwnedStub

#: The TTL of the application's leases: a waiter that gets the lock only at the TTL fails the bounds below.
TTL = 15.0
#: How soon after SIGTERM a waiter elsewhere must get what the application held (far below TTL).
SOON = 6.0


def draining(err: grpc.aio.AioRpcError) -> bool:
    """Whether ``err`` is UNAVAILABLE / DRAINING with a RetryInfo of 1 s."""
    status = details.parse(err)
    return (status.code, status.reason, status.retry_delay) == (grpc.StatusCode.UNAVAILABLE, "DRAINING", 1.0)


async def health(address: str, service: str) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        response = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5)
        return int(response.status)


@pytest.fixture
async def pair(etcd: Any, prefix: str) -> AsyncIterator[tuple[Coordinator, Coordinator]]:
    """Two in-process coordinators on the same etcd and prefix (A is the one that drains)."""
    coords = [Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix, grace_seconds=0) for _ in range(2)]
    for coord in coords:
        await asyncio.wait_for(coord.start(), 20)
    try:
        yield coords[0], coords[1]
    finally:
        for coord in coords:
            await asyncio.wait_for(coord.stop(grace=0), 20)


async def test_drain_refuses_newcomers_and_serves_releases_revokes_and_keepalives(
        pair: tuple[Coordinator, Coordinator]) -> None:
    """Draining: readiness NOT_SERVING (liveness SERVING); LeaseGrant, a new KeepAlive stream, a waiting and a
    try-once Acquire refused with UNAVAILABLE / DRAINING + RetryInfo 1 s; the open stream's keepalives, Release,
    the queued waiter's grant and LeaseRevoke served; the drain ends once no stream is left."""
    coord, _ = pair
    address = f"127.0.0.1:{coord.port}"
    await wait_for(lambda: coord.about.serving, 10, 0.05, "the coordinator serving")
    async with grpc.aio.insecure_channel(address) as channel:
        stub = OwnedStub(channel)
        holder = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10))
        waiter = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10))
        stream = stub.KeepAlive()
        await stream.write(lock_pb2.KeepAliveRequest(
            keepalive=lock_pb2.LeaseKeepAlive(lease_id=holder.lease_id, request_id=1)))
        assert (await asyncio.wait_for(stream.read(), 10)).keepalive.ttl_seconds > 0
        held = await stub.Acquire(lock_pb2.AcquireRequest(name="res", lease_id=holder.lease_id))
        waiting = asyncio.ensure_future(stub.Acquire(lock_pb2.AcquireRequest(
            name="res", lease_id=waiter.lease_id, wait_ms=30_000), timeout=40))
        await wait_for(lambda: _waiters(stub, "res", 1), 10, 0.02, "the waiter queued")

        interrupted = asyncio.Event()
        drain = asyncio.ensure_future(coord.drain(60, interrupted=interrupted))
        await wait_for(lambda: not coord.about.serving, 10, 0.01, "readiness NOT_SERVING")
        assert await health(address, "") == health_pb2.HealthCheckResponse.NOT_SERVING
        assert await health(address, "liveness") == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.aio.AioRpcError) as grant:
            await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10))
        assert draining(grant.value), grant.value
        newcomer = stub.KeepAlive()
        with pytest.raises(grpc.aio.AioRpcError) as opened:
            await asyncio.wait_for(newcomer.read(), 10)
        assert draining(opened.value), opened.value
        for wait_ms in (1000, 0):
            with pytest.raises(grpc.aio.AioRpcError) as acquire:
                await stub.Acquire(lock_pb2.AcquireRequest(name="other", lease_id=holder.lease_id, wait_ms=wait_ms))
            assert draining(acquire.value), acquire.value

        await stream.write(lock_pb2.KeepAliveRequest(
            keepalive=lock_pb2.LeaseKeepAlive(lease_id=holder.lease_id, request_id=2)))
        ack = await asyncio.wait_for(stream.read(), 10)
        assert ack.keepalive.request_id == 2 and ack.keepalive.ttl_seconds > 0
        await stub.Release(lock_pb2.ReleaseRequest(name="res", lease_id=holder.lease_id, token=held.token))
        granted = await asyncio.wait_for(waiting, 20)  # the wait queued before the drain is served
        assert granted.acquired and granted.token > held.token
        for lease_id in (holder.lease_id, waiter.lease_id):
            assert (await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease_id))).found
        assert not drain.done()
        stream.cancel()
        assert await asyncio.wait_for(drain, 10) == "no_streams"


async def _waiters(stub: OwnedStub, name: str, n: int) -> bool:
    return (await stub.Describe(lock_pb2.DescribeRequest(name=name), timeout=5)).waiter_count == n


async def test_a_client_refused_as_draining_gets_its_lock_through_the_next_address(
        pair: tuple[Coordinator, Coordinator]) -> None:
    """A client given [A, B], A draining: its LeaseGrant (and stream) go to B at once, and it gets its lock."""
    busy, spare = pair
    busy.about.serving = True
    drain = asyncio.ensure_future(busy.drain(60))  # no stream: returns at once, A keeps refusing
    assert await asyncio.wait_for(drain, 10) == "no_streams"
    started = time.monotonic()
    async with AsyncLockClient([f"127.0.0.1:{busy.port}", f"127.0.0.1:{spare.port}"]) as client:
        handle = await client.acquire("through-b", ttl=10, timeout=30)
        assert handle.token > 0 and handle.is_valid() and client.address == f"127.0.0.1:{spare.port}"
        await handle.release()
    assert time.monotonic() - started < 5.0  # at once, not after the RetryInfo's rounds


@pytest.mark.parametrize("drain", ["-1", "nan", "soon", "4000"])
def test_serve_when_drain_seconds_is_out_of_range(drain: str) -> None:
    """`fencepost serve` refuses a negative, NaN, non-numeric or huge --drain-seconds with exit 2, naming the flag."""
    from .child_processes import child_env

    result = subprocess.run([sys.executable, "-m", "fencepost.client.cli", "serve", "--drain-seconds", drain],
                            capture_output=True, text=True, timeout=30, env=child_env())
    assert result.returncode == 2 and "--drain-seconds" in result.stderr, result.stderr


def test_drain_when_started_refuses_newcomers_and_names_the_time_left() -> None:
    """Drain.admit returns before start() and raises UNAVAILABLE / DRAINING (RetryInfo 1 s) after it, saying
    how long the drain has left (injected clock)."""
    from fencepost.client.errors import Unavailable
    from fencepost.coordinator.admission.drain import Drain

    clock = [100.0]
    drain = Drain(clock=lambda: clock[0])
    drain.admit("Acquire")
    drain.start(10)
    clock[0] = 104.0
    with pytest.raises(Unavailable) as refused:
        drain.admit("Acquire")
    assert (refused.value.reason, refused.value.retry_delay) == ("DRAINING", 1.0)
    assert "Acquire refused" in refused.value.message and "6.0 s" in refused.value.message
    drain.start(60)  # a second start keeps the first end
    clock[0] = 200.0
    with pytest.raises(Unavailable, match="0.0 s"):
        drain.admit("LeaseGrant")


# ---------------------------------------------------------------- the application and its sidecar, SIGTERM at once

APP = """
import asyncio, signal, sys, time
from fencepost.client import AsyncLockClient

async def main(address):
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with AsyncLockClient(address) as client:
        lock = await client.acquire("x", ttl=%(ttl)s, timeout=20)
        permit = await client.semaphore("s", 1, ttl=%(ttl)s).acquire(timeout=20)
        leadership = await client.campaign("e", b"app", ttl=%(ttl)s, timeout=20)
        print("holding", flush=True)
        await stop.wait()
        started = time.monotonic()
        for what, handle in (("lock", lock), ("permit", permit), ("leadership", leadership)):
            try:
                await handle.release()
            except Exception as exc:
                print(f"{what} release failed: {type(exc).__name__}: {exc}", flush=True)
                sys.exit(1)
        print(f"released in {time.monotonic() - started:.3f} s", flush=True)
    print("closed", flush=True)

asyncio.run(main(sys.argv[1]))
"""


@pytest.mark.parametrize("waiters_through", ["another", "the same"])
async def test_application_and_its_sidecar_stopped_at_once_release_and_the_waiters_get_it_soon(
        etcd: Any, prefix: str, tmp_path: Path, etcd_client: Etcd3Client, waiters_through: str) -> None:
    """The application (lock, permit, leadership on a TTL-15 s lease through its sidecar A, drain 10 s) and A get
    SIGTERM at once: the application's releases succeed, the waiters (through coordinator B, or through A and B)
    get the lock, the permit and the leadership well under the TTL, and A exits 0 after the drain."""
    sidecar = CoordinatorProcess(etcd.endpoint, prefix, tmp_path, drain_seconds=10)
    other = CoordinatorProcess(etcd.endpoint, prefix, tmp_path / "b", drain_seconds=0)
    (tmp_path / "b").mkdir()
    app: ChildProcess | None = None
    try:
        a, b = sidecar.start(), other.start()
        script = tmp_path / "app.py"
        script.write_text(APP % {"ttl": TTL})
        app = ChildProcess([sys.executable, str(script), a], log_path=tmp_path / "app.log")
        await app.await_line("^holding$", 30)
        addresses = [b] if waiters_through == "another" else [a, b]
        async with AsyncLockClient(addresses) as client:
            lock = asyncio.ensure_future(client.acquire("x", ttl=10, timeout=60))
            permit = asyncio.ensure_future(client.semaphore("s", 1, ttl=10).acquire(timeout=60))
            leadership = asyncio.ensure_future(client.campaign("e", b"waiter", ttl=10, timeout=60))
            await wait_for(lambda: _queued(etcd_client, prefix), 20, 0.05, "the three waiters queued")
            assert not (lock.done() or permit.done() or leadership.done())

            started = time.monotonic()
            app.signal(signal.SIGTERM)
            assert sidecar.child is not None
            sidecar.child.signal(signal.SIGTERM)
            handles = await asyncio.wait_for(asyncio.gather(lock, permit, leadership), TTL + 10)
            waited = time.monotonic() - started
            await app.await_line("^closed$", 20)
            assert app.proc.wait(timeout=10) == 0, app.log_tail()
            assert waited < SOON, f"the waiters got it {waited:.2f} s after SIGTERM (TTL {TTL:g} s)"
            for handle in handles:
                await handle.release()
        assert sidecar.child.proc.wait(timeout=20) == 0, sidecar.child.log_tail()
        assert any("draining for at most 10 s" in line for line in sidecar.child.output), sidecar.child.log_tail()
    finally:
        if app is not None:
            app.kill()
        sidecar.kill()
        other.kill()


async def _queued(etcd_client: Etcd3Client, prefix: str) -> bool:
    """Whether the lock "x", the semaphore "s"'s queue and the election "e" each have two keys in etcd (the
    application's hold and the waiter's place)."""
    keys, found = Keys(prefix), await list_keys(etcd_client, prefix)
    return all(sum(key.startswith(keys.lock_prefix(name)) for key in found) == 2
               for name in ("x", semaphore_queue("s"), election_lock("e")))


async def test_fencepost_run_stopped_with_its_coordinator_releases_cleanly(
        etcd: Any, prefix: str, tmp_path: Path) -> None:
    """``fencepost run`` and its coordinator (drain 10 s) get SIGTERM at once: run stops its command, releases
    (no "coordinator unavailable"), exits soon, and a waiter through another coordinator gets the lock at once."""
    from .child_processes import cli_env

    sidecar = CoordinatorProcess(etcd.endpoint, prefix, tmp_path, drain_seconds=10)
    other = CoordinatorProcess(etcd.endpoint, prefix, tmp_path / "b", drain_seconds=0)
    (tmp_path / "b").mkdir()
    run: ChildProcess | None = None
    try:
        a, b = sidecar.start(), other.start()
        run = ChildProcess([sys.executable, "-m", "fencepost.client.cli", "run", "job", "--ttl", str(int(TTL)),
                            "--address", a, "--", sys.executable, "-c",
                            "import time; print('started', flush=True); time.sleep(120)"],
                           log_path=tmp_path / "run.log", env=cli_env())
        await run.await_line("^started$", 30)
        async with AsyncLockClient(b) as client:
            waiting = asyncio.ensure_future(client.acquire("job", ttl=10, timeout=60))
            await wait_for(lambda: _lock_waiters(client, "job", 1), 20, 0.05, "the waiter queued")
            started = time.monotonic()
            run.signal(signal.SIGTERM)
            assert sidecar.child is not None
            sidecar.child.signal(signal.SIGTERM)
            handle = await asyncio.wait_for(waiting, TTL + 10)
            waited = time.monotonic() - started
            code = await asyncio.to_thread(run.proc.wait, 20)
            ran_for = time.monotonic() - started
            await handle.release()
        log = run.log_tail()
        assert waited < SOON, f"the waiter got it {waited:.2f} s after SIGTERM (TTL {TTL:g} s)\n{log}"
        assert "unavailable" not in log.lower(), log
        assert code in (128 + signal.SIGTERM, -signal.SIGTERM), log  # the command's own status: killed by SIGTERM
        assert ran_for < SOON, f"fencepost run exited {ran_for:.2f} s after SIGTERM\n{log}"
        assert sidecar.child.proc.wait(timeout=20) == 0, sidecar.child.log_tail()
    finally:
        if run is not None:
            run.kill()
        sidecar.kill()
        other.kill()


async def _lock_waiters(client: AsyncLockClient, name: str, n: int) -> bool:
    return (await client.describe(name)).waiter_count == n
