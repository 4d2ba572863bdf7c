"""Acquire/release cycles per second: through the coordinator vs directly on etcd.

Runs in one process against one etcd (embedded, or --etcd-endpoints):
- ``etcd-direct``: the same cycle done directly on etcd over the generated
  etcd stubs on a plain grpc.aio channel, with the same two Txns the
  coordinator makes (built by ``fencepost.client.v1.etcdops``): one that puts
  the contender key on a lease granted once and reads the holder, one that
  deletes it if its create revision is the token. This is the baseline.
- ``etcd3aio-direct``: the same two Txns through etcd3aio (its public
  ``kv.txn`` and ``txn_op_*``/``txn_compare_*`` builders): the baseline that
  ``docs/benchmarks.md`` recorded before the coordinator had its own etcd
  layer, kept so that old and new ratios can be compared.
- ``etcd3aio-lock``: etcd3aio's own Lock recipe (its public ``lock()`` API; a
  lease granted and revoked per lock), for reference.
- ``coordinator-stub``: Acquire + Release through a coordinator (``fencepost
  serve`` in a child process, as deployed), over the generated grpc.aio stub,
  one session lease per client.
- ``coordinator-client``: the same through fencepost.client.AsyncLockClient.

Each of N concurrent clients loops on its own lock name for --seconds. The
figure of merit is the ratio to ``etcd-direct`` measured in the same run.

Usage:
    python bench/cycles.py --clients 1 --clients 64 --seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable

import grpc
from etcd3aio import Etcd3Client

from fencepost.client import AsyncLockClient
from fencepost.client.v1 import etcdops, lock_pb2, lock_pb2_grpc
from fencepost.client.v1.etcd import rpc_pb2, rpc_pb2_grpc
from fencepost.client.v1.keys import prefix_end
from fencepost.coordinator.embedded import EmbeddedEtcd

Cycle = Callable[[int], Awaitable[None]]


async def run_clients(n: int, seconds: float, make: Callable[[int], Awaitable[tuple[Cycle, Callable[[], Awaitable[None]]]]]) -> float:
    """Run n clients looping their cycle for ``seconds``; return cycles per second."""
    setups = [await make(i) for i in range(n)]
    counts = [0] * n
    deadline = time.perf_counter() + seconds

    async def loop(i: int) -> None:
        cycle = setups[i][0]
        while time.perf_counter() < deadline:
            await cycle(i)
            counts[i] += 1

    start = time.perf_counter()
    await asyncio.gather(*(loop(i) for i in range(n)))
    elapsed = time.perf_counter() - start
    for _, close in setups:
        await close()
    return sum(counts) / elapsed


async def bench(endpoint: str, clients: list[int], seconds: float) -> dict[str, dict[str, float]]:
    prefix = f"/bench/{uuid.uuid4().hex}/"
    coordinator = subprocess.Popen(
        [sys.executable, "-m", "fencepost.client.cli", "serve", "--listen", "127.0.0.1:0",
         "--etcd-endpoints", endpoint, "--prefix", prefix, "--log-level", "WARNING"],
        stdout=subprocess.PIPE, text=True,
    )
    address = ""
    assert coordinator.stdout is not None
    for line in coordinator.stdout:
        if line.startswith("fencepost: listening on "):
            address = line.split()[-1]
            break
    if not address:
        raise RuntimeError("the coordinator did not start")
    etcd = Etcd3Client([endpoint])
    await etcd.connect()
    channel = grpc.aio.insecure_channel(f"dns:///{endpoint}")
    kv, leases = rpc_pb2_grpc.KVStub(channel), rpc_pb2_grpc.LeaseStub(channel)
    results: dict[str, dict[str, float]] = {}

    async def direct(i: int) -> tuple[Cycle, Callable[[], Awaitable[None]]]:
        lease = (await leases.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=30))).ID
        lock = f"{prefix}direct/{i}/".encode()
        key = lock + f"{lease:016x}".encode()
        reads = [etcdops.get(key, keys_only=True), etcdops.holder_of(lock)]

        async def cycle(_: int) -> None:
            put = etcdops.txn([etcdops.is_absent(key)], [etcdops.put(key, lease_id=lease), etcdops.holder_of(lock)],
                              reads)
            token = (await kv.Txn(put, timeout=5)).header.revision
            await kv.Txn(etcdops.txn([etcdops.is_owner(key, token)], [etcdops.delete(key)], reads), timeout=5)

        async def close() -> None:
            await leases.LeaseRevoke(rpc_pb2.LeaseRevokeRequest(ID=lease), timeout=5)

        return cycle, close

    async def direct_etcd3aio(i: int) -> tuple[Cycle, Callable[[], Awaitable[None]]]:
        assert etcd.kv is not None and etcd.lease is not None
        kvs = etcd.kv
        lease = (await etcd.lease.grant(30)).ID
        lock = f"{prefix}direct3aio/{i}/".encode()
        key = lock + f"{lease:016x}".encode()
        first = kvs.txn_op_get(lock, range_end=prefix_end(lock))
        first.request_range.sort_order = first.request_range.ASCEND
        first.request_range.sort_target = first.request_range.CREATE
        first.request_range.limit = 1
        first.request_range.keys_only = True
        mine = kvs.txn_op_get(key)
        mine.request_range.keys_only = True

        async def cycle(_: int) -> None:
            absent = kvs.txn_compare_create_revision(key, 0)
            put = await kvs.txn([absent], [kvs.txn_op_put(key, b"", lease=lease), first], [mine, first])
            token = put.header.revision
            await kvs.txn([kvs.txn_compare_create_revision(key, token)], [kvs.txn_op_delete(key)], [mine, first])

        async def close() -> None:
            assert etcd.lease is not None
            await etcd.lease.revoke(lease)

        return cycle, close

    async def recipe(i: int) -> tuple[Cycle, Callable[[], Awaitable[None]]]:
        async def cycle(_: int) -> None:
            async with etcd.lock(f"{prefix}recipe/{i}", ttl=30):
                pass

        async def close() -> None:
            return None

        return cycle, close

    async def stub(i: int) -> tuple[Cycle, Callable[[], Awaitable[None]]]:
        channel = grpc.aio.insecure_channel(address)
        s = lock_pb2_grpc.LockServiceStub(channel)
        lease = (await s.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=30))).lease_id
        name = f"stub/{i}"

        async def cycle(_: int) -> None:
            r = await s.Acquire(lock_pb2.AcquireRequest(name=name, lease_id=lease, wait_forever=True))
            await s.Release(lock_pb2.ReleaseRequest(name=name, lease_id=lease, token=r.token))

        async def close() -> None:
            await s.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease))
            await channel.close()

        return cycle, close

    async def client(i: int) -> tuple[Cycle, Callable[[], Awaitable[None]]]:
        c = AsyncLockClient(address)
        await c.__aenter__()
        name = f"client/{i}"

        async def cycle(_: int) -> None:
            async with c.lock(name, ttl=30):
                pass

        async def close() -> None:
            await c.close()

        return cycle, close

    kinds = {"etcd-direct": direct, "etcd3aio-direct": direct_etcd3aio, "etcd3aio-lock": recipe,
             "coordinator-stub": stub, "coordinator-client": client}
    for n in clients:
        row: dict[str, float] = {}
        for kind, make in kinds.items():
            row[kind] = await run_clients(n, seconds, make)
        results[str(n)] = row
    await etcd.close()
    await channel.close()
    coordinator.terminate()
    coordinator.wait(timeout=30)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, action="append", help="concurrent clients (repeatable; default 1 and 64)")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per measurement (default 5)")
    parser.add_argument("--etcd-endpoints", help="use this etcd instead of an embedded one")
    args = parser.parse_args()
    clients = args.clients or [1, 64]
    if args.etcd_endpoints:
        results = asyncio.run(bench(args.etcd_endpoints, clients, args.seconds))
    else:
        with tempfile.TemporaryDirectory() as tmp, EmbeddedEtcd(tmp) as etcd:
            results = asyncio.run(bench(etcd.endpoint, clients, args.seconds))
    print(f"{'clients':>7} {'kind':<20} {'cycles/s':>10} {'vs etcd-direct':>15} {'vs etcd3aio-direct':>18}")
    for n, row in results.items():
        base, old_base = row["etcd-direct"], row["etcd3aio-direct"]
        for kind, rate in row.items():
            print(f"{n:>7} {kind:<20} {rate:>10.1f} {rate / base:>15.2f} {rate / old_base:>18.2f}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
