"""Regression guard for speed (issue 11): short forms of the benchmark suite's P1 and P3, as ratios.

Never an absolute time: each figure is compared with the same work done
directly on etcd in the same test, on the same etcd, so that a slow or busy
machine moves both. The thresholds sit well under the ratios measured when
they were set: the test fails on a change that makes the coordinator
several times slower, not on noise. Set on 2026-12-01 from runs on the 2-core
machine: P1 0.36 to 0.41 (AsyncLockClient over calls on the stream; 0.15
when its calls were unary), P3 2.3 to 3.3.

- P1: acquire + release cycles per second of 16 AsyncLockClient users, each
  on its own lock name, through a ``fencepost serve`` child process, against
  16 tasks making the same two etcd Txns directly.
- P3: hand-off latency (p50): from the holder's release call to the waiter's
  grant, through the coordinator, against a waiter that watches the holder's
  key on etcd itself and then reads that it is first (what the coordinator
  does for its waiters).

``FENCEPOST_SPEED_GUARD_SECONDS`` lengthens P1's measurement (default 2 s per side).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from fencepost.client import AsyncLockClient
from fencepost.client.v1 import etcdops
from fencepost.client.v1.etcd import rpc_pb2, rpc_pb2_grpc
from fencepost.coordinator.process.embedded import EmbeddedEtcd

from .conftest import CoordinatorProcess, wait_for

#: P1: the coordinator's cycles/s must stay above this fraction of etcd-direct's (measured: see the docstring).
P1_MIN_RATIO = 0.2
#: P3: the coordinator's hand-off p50 must stay below this multiple of etcd-direct's.
P3_MAX_RATIO = 10.0
#: Concurrent users in P1.
P1_CLIENTS = 16
#: Hand-offs measured in P3 (each side).
P3_ROUNDS = 15

SECONDS = float(os.environ.get("FENCEPOST_SPEED_GUARD_SECONDS", "2"))


async def _rate(users: int, seconds: float, cycle: Callable[[int], Awaitable[None]]) -> float:
    """Cycles per second of ``users`` tasks each running ``cycle(i)`` in a loop for ``seconds``."""
    done = [0] * users
    until = time.perf_counter() + seconds

    async def loop(i: int) -> None:
        while time.perf_counter() < until:
            await cycle(i)
            done[i] += 1

    started = time.perf_counter()
    await asyncio.gather(*(loop(i) for i in range(users)))
    return sum(done) / (time.perf_counter() - started)


async def _direct_cycles(endpoint: str, prefix: str) -> float:
    async with grpc.aio.insecure_channel(endpoint) as channel:
        kv, leases = rpc_pb2_grpc.KVStub(channel), rpc_pb2_grpc.LeaseStub(channel)
        lease = (await leases.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=30))).ID
        plans = []
        for i in range(P1_CLIENTS):
            lock = f"{prefix}direct/{i}/".encode()
            key = lock + f"{lease:016x}".encode()
            plans.append((lock, key, [etcdops.get(key, keys_only=True), etcdops.holder_of(lock)]))

        async def cycle(i: int) -> None:
            lock, key, reads = plans[i]
            put = etcdops.txn([etcdops.is_absent(key)], [etcdops.put(key, lease_id=lease), etcdops.holder_of(lock)],
                              reads)
            token = (await kv.Txn(put, timeout=10)).header.revision
            await kv.Txn(etcdops.txn([etcdops.is_owner(key, token)], [etcdops.delete(key)], reads), timeout=10)

        try:
            return await _rate(P1_CLIENTS, SECONDS, cycle)
        finally:
            await leases.LeaseRevoke(rpc_pb2.LeaseRevokeRequest(ID=lease), timeout=10)


async def _coordinator_cycles(address: str) -> float:
    async with AsyncLockClient(address) as client:
        async def cycle(i: int) -> None:
            async with client.lock(f"guard/{i}", ttl=30):
                pass

        await cycle(0)  # the session's lease and stream, before the clock starts
        return await _rate(P1_CLIENTS, SECONDS, cycle)


async def _direct_handoffs(endpoint: str, prefix: str) -> list[float]:
    """Hand-off on etcd itself: the waiter watches the holder's key, then reads that its own key is first."""
    async with grpc.aio.insecure_channel(endpoint) as channel:
        kv, leases, watch = (rpc_pb2_grpc.KVStub(channel), rpc_pb2_grpc.LeaseStub(channel),
                             rpc_pb2_grpc.WatchStub(channel))
        holder = (await leases.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=30))).ID
        waiter = (await leases.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=30))).ID
        times = []
        try:
            for round_ in range(P3_ROUNDS):
                lock = f"{prefix}handoff/{round_}/".encode()
                held, queued = lock + f"{holder:016x}".encode(), lock + f"{waiter:016x}".encode()
                await kv.Put(rpc_pb2.PutRequest(key=held, lease=holder))
                put = await kv.Put(rpc_pb2.PutRequest(key=queued, lease=waiter))
                created = put.header.revision
                requests: asyncio.Queue[Any] = asyncio.Queue()
                await requests.put(rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(
                    key=held, start_revision=created + 1, filters=[rpc_pb2.WatchCreateRequest.NOPUT])))

                async def outgoing() -> Any:
                    while True:
                        yield await requests.get()

                stream = watch.Watch(outgoing())
                first = await stream.read()
                assert first.created
                released_at = time.perf_counter()
                await kv.DeleteRange(rpc_pb2.DeleteRangeRequest(key=held))
                while True:
                    event = await stream.read()
                    if event.events:
                        break
                first_key = await kv.Range(etcdops.holder_of(lock).request_range)
                assert bytes(first_key.kvs[0].key) == queued
                times.append(time.perf_counter() - released_at)
                stream.cancel()
                await kv.DeleteRange(rpc_pb2.DeleteRangeRequest(key=queued))
        finally:
            for lease in (holder, waiter):
                await leases.LeaseRevoke(rpc_pb2.LeaseRevokeRequest(ID=lease), timeout=10)
        return times


async def _queued(client: AsyncLockClient, name: str) -> bool:
    return (await client.describe(name)).waiter_count >= 1


async def _coordinator_handoffs(address: str) -> list[float]:
    times = []
    async with AsyncLockClient(address) as holder, AsyncLockClient(address) as waiter:
        for round_ in range(P3_ROUNDS):
            name = f"handoff/{round_}"
            held = await holder.acquire(name, ttl=30)
            queued = asyncio.ensure_future(waiter.acquire(name, ttl=30))
            # Queued once the coordinator lists the waiter (the lock's own description says so).
            await wait_for(lambda: _queued(holder, name), 10, 0.001, "the waiter queued")
            released_at = time.perf_counter()
            await held.release()
            granted = await queued
            times.append(time.perf_counter() - released_at)
            await granted.release()
    return times


async def test_p1_cycles_and_p3_handoff_stay_near_etcd(etcd: EmbeddedEtcd, coordinator_process: CoordinatorProcess,
                                                        capsys: Any) -> None:
    address = coordinator_process.start()
    prefix = f"/guard/{uuid.uuid4().hex}/"
    direct = await _direct_cycles(etcd.endpoint, prefix)
    through = await _coordinator_cycles(address)
    direct_p50 = statistics.median(await _direct_handoffs(etcd.endpoint, prefix))
    handoff_p50 = statistics.median(await _coordinator_handoffs(address))
    with capsys.disabled():
        print(f"\nspeed guard: P1 {through:.0f} vs etcd-direct {direct:.0f} cycles/s (ratio {through / direct:.2f}, "
              f"floor {P1_MIN_RATIO}); P3 hand-off p50 {handoff_p50 * 1e3:.2f} ms vs etcd-direct "
              f"{direct_p50 * 1e3:.2f} ms (ratio {handoff_p50 / direct_p50:.1f}, ceiling {P3_MAX_RATIO})",
              file=sys.stderr)  # stderr: an xdist worker's stdout never reaches the terminal
    assert through / direct >= P1_MIN_RATIO, (through, direct)
    assert handoff_p50 / direct_p50 <= P3_MAX_RATIO, (handoff_p50, direct_p50)
