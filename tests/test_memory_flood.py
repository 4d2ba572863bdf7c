"""Floods of streams and of distinct lock names leave no per-stream or per-name state behind (issue 25, item 9).

A coordinator with ``--max-streams`` small refuses the streams beyond it
with RESOURCE_EXHAUSTED / TOO_MANY_STREAMS; once the flood's streams end,
and once distinct names used once each have been idle past the watch's
deletion window and the hand-off memory, every per-stream and per-name
table of :meth:`Coordinator.state_sizes` is back at its size before.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import time
import uuid
from typing import Any

import grpc
import pytest

from fencepost.client.v1 import details, lock_pb2, lock_pb2_grpc
from fencepost.coordinator.admission.limits import Limits
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.recipes import holds, watch

from .conftest import wait_for
from .owned_stub import OwnedStub

#: Tables that count per-stream or per-name state (the leases' own entries stay while the leases live).
PER_FLOOD = ("streams", "keepalive_streams", "deletions", "subscriptions", "holds", "hold_ends", "grant_times",
             "limits_streams", "limits_acquiring")


@pytest.fixture
async def small(etcd: Any, prefix: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A coordinator allowing 1,000 streams, whose deletion window and hand-off memory last 1 s."""
    monkeypatch.setattr(watch, "WINDOW_SECONDS", 1.0)
    monkeypatch.setattr(holds, "HANDOFF_MEMORY_SECONDS", 1.0)
    limits = Limits(max_streams=1000, max_streams_per_caller=0, lease_grant_rate=0, acquire_rate=0,
                    max_lag=0, max_loop_busy=0, max_client_rtt=0, max_keepalive_wait=0)
    coord = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix, limits=limits)
    await asyncio.wait_for(coord.start(), 20)
    try:
        yield coord
    finally:
        await asyncio.wait_for(coord.stop(grace=0), 20)


def _flood_sizes(coord: Coordinator) -> dict[str, int]:
    sizes = coord.state_sizes()
    return {k: sizes[k] for k in PER_FLOOD}


async def test_stream_flood_when_past_max_streams_refuses_typed_and_frees_state(small: Coordinator) -> None:
    """2,000 streams against --max-streams 1,000: the rest get TOO_MANY_STREAMS, and all state goes after."""
    before = _flood_sizes(small)
    channels = [grpc.aio.insecure_channel(small.address, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(20)]
    calls: list[Any] = []
    try:
        stubs = [OwnedStub(c) for c in channels]
        lease = await stubs[0].LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=60), timeout=30)
        keepalive = lock_pb2.KeepAliveRequest(keepalive=lock_pb2.LeaseKeepAlive(lease_id=lease.lease_id))

        async def one(i: int) -> str:
            call = lock_pb2_grpc.LockServiceStub(channels[i % len(channels)]).KeepAlive()
            calls.append(call)
            try:
                await call.write(keepalive.__class__(keepalive=keepalive.keepalive,
                                                     lease_secret=lease.lease_secret))
                answer = await call.read()
                if answer is not grpc.aio.EOF:
                    return "acked"
            except grpc.aio.AioRpcError:
                pass
            code = await call.code()
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                info = details.parse(grpc.aio.AioRpcError(code, await call.initial_metadata(),
                                                          await call.trailing_metadata(), await call.details()))
                return f"RESOURCE_EXHAUSTED/{info.reason}"
            return code.name

        outcomes: list[str] = []
        for start in range(0, 2000, 250):  # in waves: the client's own gRPC stays within its means
            outcomes += await asyncio.gather(*(one(i) for i in range(start, start + 250)))
        assert outcomes.count("acked") == 1000, sorted(set(outcomes))
        assert outcomes.count("RESOURCE_EXHAUSTED/TOO_MANY_STREAMS") == 1000, sorted(set(outcomes))
        assert small.state_sizes()["streams"] == 1000
    finally:
        for call in calls:
            call.cancel()
        for c in channels:
            await c.close()
    await wait_for(lambda: _flood_sizes(small) == before, 60, what="per-stream state back to its size before")


async def test_stream_flood_when_opened_at_once_every_refusal_is_typed(small: Coordinator) -> None:
    """4,000 streams opened at once from one process against --max-streams 1,000: each is acked or refused
    RESOURCE_EXHAUSTED / TOO_MANY_STREAMS; gRPC's core cancels none before the coordinator takes it (its
    default sheds calls the event loop has not taken yet past 1,000, at random, with no status)."""
    channels = [grpc.aio.insecure_channel(small.address, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(20)]
    calls: list[Any] = []
    try:
        lease = await OwnedStub(channels[0]).LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=120), timeout=30)
        keepalive = lock_pb2.KeepAliveRequest(keepalive=lock_pb2.LeaseKeepAlive(lease_id=lease.lease_id),
                                              lease_secret=lease.lease_secret)
        stubs = [lock_pb2_grpc.LockServiceStub(c) for c in channels]
        outcomes = await asyncio.gather(*(_stream_outcome(stubs[i % len(stubs)], keepalive, calls)
                                          for i in range(4000)))
        counted = {what: outcomes.count(what) for what in set(outcomes)}
        assert counted == {"acked": 1000, "RESOURCE_EXHAUSTED/TOO_MANY_STREAMS": 3000}, counted
    finally:
        for call in calls:
            call.cancel()
        for c in channels:
            await c.close()


#: A client process: one lease, then (after "go" on stdin) 200 KeepAlive streams over 10 connections at once;
#: prints each stream's outcome as test_memory_flood._stream_outcome does, as one JSON list.
STALL_CLIENT = r"""
import asyncio, json, sys
import grpc
from fencepost.client.v1 import details, lock_pb2, lock_pb2_grpc

async def main(address):
    channels = [grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(10)]
    stubs = [lock_pb2_grpc.LockServiceStub(c) for c in channels]
    lease = await stubs[0].LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=300), timeout=30)
    request = lock_pb2.KeepAliveRequest(keepalive=lock_pb2.LeaseKeepAlive(lease_id=lease.lease_id),
                                        lease_secret=lease.lease_secret)
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)

    async def one(i):
        call = stubs[i % 10].KeepAlive()
        try:
            await call.write(request)
            if await asyncio.wait_for(call.read(), 100) is not grpc.aio.EOF:
                return "acked"
        except grpc.aio.AioRpcError:
            pass
        finally:
            call.cancel()
        code = await call.code()
        return code.name + " (" + (await call.details()) + ")"

    print(json.dumps(await asyncio.gather(*(one(i) for i in range(200)))), flush=True)

asyncio.run(main(sys.argv[1]))
"""


@pytest.mark.slow
async def test_stream_flood_when_the_event_loop_stalls_35_s_is_served_not_cancelled(small: Coordinator) -> None:
    """200 streams that reach the coordinator while its event loop is stalled for 35 s (as by CPU starvation)
    wait in gRPC's backlog and are then served: gRPC's default cancels a call left untaken 30 s, with no status."""
    client = await asyncio.create_subprocess_exec(sys.executable, "-c", STALL_CLIENT, small.address,
                                                  stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    assert client.stdin is not None and client.stdout is not None
    try:
        assert (await asyncio.wait_for(client.stdout.readline(), 30)).strip() == b"ready"
        client.stdin.write(b"go\n")
        await client.stdin.drain()
        time.sleep(35)  # the fault: this event loop (the coordinator's) does nothing; gRPC's threads go on
        outcomes = json.loads(await asyncio.wait_for(client.stdout.readline(), 100))
    finally:
        if client.returncode is None:
            client.kill()
        await client.wait()
    assert outcomes == ["acked"] * 200, {what: outcomes.count(what) for what in set(outcomes)}


async def _stream_outcome(stub: Any, keepalive: Any, calls: list[Any]) -> str:
    """Open a KeepAlive stream, send ``keepalive``: "acked", or how the stream ended (``CODE[/REASON]``)."""
    call = stub.KeepAlive()
    calls.append(call)
    try:
        await call.write(keepalive)
        if await call.read() is not grpc.aio.EOF:
            return "acked"
    except grpc.aio.AioRpcError:
        pass  # a write on a call that ended: its status says how
    code = await call.code()
    reason = details.parse(grpc.aio.AioRpcError(code, await call.initial_metadata(), await call.trailing_metadata(),
                                                await call.details())).reason
    return f"{code.name}/{reason}" if reason else f"{code.name} ({await call.details()})"


async def test_ended_streams_are_freed_without_the_cycle_collector(small: Coordinator) -> None:
    """50 KeepAlive streams served and cancelled with the cycle collector off: once they ended, no stream object
    is left (each was freed by its reference count: the stream and its renewals form no cycle)."""
    from fencepost.coordinator.api.stream import KeepAliveStream

    channel = grpc.aio.insecure_channel(small.address)
    calls: list[Any] = []
    gc.collect()
    gc.disable()
    try:
        lease = await OwnedStub(channel).LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=60), timeout=30)
        keepalive = lock_pb2.KeepAliveRequest(keepalive=lock_pb2.LeaseKeepAlive(lease_id=lease.lease_id),
                                              lease_secret=lease.lease_secret)
        stub = lock_pb2_grpc.LockServiceStub(channel)
        outcomes = await asyncio.gather(*(_stream_outcome(stub, keepalive, calls) for _ in range(50)))
        assert outcomes == ["acked"] * 50
        assert sum(isinstance(o, KeepAliveStream) for o in gc.get_objects()) >= 50
        for call in calls:
            call.cancel()
        calls.clear()
        await wait_for(lambda: small.state_sizes()["streams"] == 0, 30, what="the streams to end")
        await wait_for(lambda: not any(isinstance(o, KeepAliveStream) for o in gc.get_objects()), 10,
                       what="no stream object left")
    finally:
        gc.enable()
        for call in calls:
            call.cancel()
        await channel.close()


async def test_name_flood_when_idle_forgets_every_name(small: Coordinator) -> None:
    """3,000 distinct names acquired and released once: once idle, no table holds an entry for them."""
    before = _flood_sizes(small)
    channels = [grpc.aio.insecure_channel(small.address, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(20)]
    try:
        stubs = [OwnedStub(c) for c in channels]
        run = uuid.uuid4().hex[:8]

        async def worker(c: int) -> int:
            lease = await stubs[c].LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=60), timeout=30)
            done = 0
            for i in range(c, 3000, len(stubs)):
                name = f"{run}-{i}"
                for _ in range(5):  # etcd may time out on a loaded machine: Acquire and Release are retryable
                    try:
                        got = await stubs[c].Acquire(lock_pb2.AcquireRequest(name=name, lease_id=lease.lease_id),
                                                     timeout=60)
                        await stubs[c].Release(lock_pb2.ReleaseRequest(name=name, lease_id=lease.lease_id,
                                                                       token=got.token), timeout=60)
                        done += 1
                        break
                    except grpc.aio.AioRpcError as err:
                        if err.code() != grpc.StatusCode.UNAVAILABLE:
                            raise
            return done

        assert sum(await asyncio.gather(*(worker(c) for c in range(len(stubs))))) == 3000
        seen = small.state_sizes()
        assert seen["hold_ends"] > 0 and seen["deletions"] > 0  # the flood was remembered for a moment
    finally:
        for c in channels:
            await c.close()
    await wait_for(lambda: _flood_sizes(small) == before, 60, what="per-name state back to its size before")


def test_release_memory_when_glibc_keeps_freed_pages_gives_them_back() -> None:
    """100 MiB of 1 KiB blocks freed behind one block still held: glibc keeps the pages (RSS stays up) until
    release_memory trims them."""
    from pathlib import Path

    from fencepost.coordinator.api import memory

    def rss_mib() -> float:
        line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmRSS:"))
        return int(line.split()[1]) / 1024

    if memory.MALLOC_TRIM is None:
        pytest.skip("this C library has no malloc_trim")
    blocks = [bytearray(1024) for _ in range(100_000)]
    kept = bytearray(1024)  # above the freed ones: glibc cannot just lower the heap's top
    grown = rss_mib()
    del blocks
    freed = rss_mib()
    asyncio.run(memory.release_memory())
    trimmed = rss_mib()
    assert freed > grown - 20 and trimmed < freed - 50, (grown, freed, trimmed)
    del kept
