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
- ``coordinator-client``: the same through fencepost.client.AsyncLockClient
  (Acquire and Release as messages on its KeepAlive stream, which the
  coordinator serves).
- ``coordinator-client-unary``: ``coordinator-client`` with
  ``stream_calls=False``: Acquire and Release as unary calls. Only run when
  asked for with ``--kind``.
- ``coordinator-client-shared``: ``coordinator-client`` with one
  AsyncLockClient shared by the N clients (one process whose tasks take
  locks, as a service does): their calls share its KeepAlive stream, where
  calls queued together go as one message (batched calls). Only run when
  asked for with ``--kind``.
- ``coordinator-stub-metrics``: ``coordinator-stub`` on a second coordinator
  started with ``--metrics-listen`` (the gRPC metrics interceptor and the
  ``fencepost_*`` metrics on): the cost of metrics is its ratio to
  ``coordinator-stub``. Only run when asked for with ``--kind``.
- ``coordinator-stub-data-dir``: ``coordinator-stub`` on a coordinator started
  with ``--data-dir`` (a temporary directory): the cost of keeping the highest
  token in ``tokens.json`` is its ratio to ``coordinator-stub``. Only run
  when asked for with ``--kind``.

Each of N concurrent clients loops on its own lock name for --seconds. The
figure of merit is the ratio to ``etcd-direct`` measured in the same run. For
the coordinator kinds, the coordinator process's CPU time per cycle (user +
system, from /proc) is printed too: steadier than cycles per second when the
machine is saturated.

Usage:
    python bench/cycles.py --clients 1 --clients 64 --seconds 5
    python bench/cycles.py --kind coordinator-stub --kind coordinator-stub-metrics
    python bench/cycles.py --kind coordinator-stub --kind coordinator-stub-data-dir
    python bench/cycles.py --kind coordinator-client --kind coordinator-client-unary
    python bench/cycles.py --kind coordinator-client --kind coordinator-client-shared --clients 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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
from fencepost.coordinator.process.embedded import EmbeddedEtcd

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


def start_coordinator(endpoint: str, prefix: str, *extra: str) -> tuple[subprocess.Popen[str], str]:
    """``fencepost serve`` in a child process on a free port: (the process, its address)."""
    coordinator = subprocess.Popen(
        [sys.executable, "-m", "fencepost.client.cli", "serve", "--listen", "127.0.0.1:0",
         "--etcd-endpoints", endpoint, "--prefix", prefix, "--log-level", "WARNING", *extra],
        stdout=subprocess.PIPE, text=True,
    )
    assert coordinator.stdout is not None
    for line in coordinator.stdout:
        if line.startswith("fencepost: listening on "):
            return coordinator, line.split()[-1]
    raise RuntimeError("the coordinator did not start")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds so far of process ``pid`` and its live descendants (``serve --workers``; Linux /proc)."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    total = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    for task in tasks:
        try:
            children = open(f"/proc/{pid}/task/{task}/children").read().split()
        except OSError:
            continue
        total += sum(cpu_seconds(int(child)) for child in children)
    return total


#: The kinds run when ``--kind`` is not given.
DEFAULT_KINDS = ["etcd-direct", "etcd3aio-direct", "etcd3aio-lock", "coordinator-stub", "coordinator-client"]
#: The kinds run only when asked for with ``--kind``.
ON_REQUEST_KINDS = ["coordinator-client-unary", "coordinator-client-shared", "coordinator-stub-metrics",
                    "coordinator-stub-data-dir"]


async def bench(endpoint: str, clients: list[int], seconds: float, only: list[str] | None = None,
                serve_args: list[str] | None = None, own_connections: bool = False
                ) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """Cycles per second by client count and kind, and the coordinator's CPU microseconds per cycle.

    ``serve_args`` go to ``fencepost serve`` (e.g. ``--workers 2``, ``--loop asyncio``); with
    ``own_connections`` each stub client opens a connection of its own (else gRPC shares one between
    channels to the same address, and so one ``--workers`` worker would serve them all).
    """
    prefix = f"/bench/{uuid.uuid4().hex}/"
    coordinator, address = start_coordinator(endpoint, prefix, *(serve_args or []))
    metered, metered_address = None, ""
    if only and "coordinator-stub-metrics" in only:
        metered, metered_address = start_coordinator(endpoint, prefix, "--metrics-listen", "127.0.0.1:0")
    kept, kept_address, kept_dir = None, "", tempfile.TemporaryDirectory(prefix="fencepost-bench-")
    if only and "coordinator-stub-data-dir" in only:
        kept, kept_address = start_coordinator(endpoint, prefix, "--data-dir", kept_dir.name)
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

    async def stub(i: int, target: str = address, kind: str = "stub") -> tuple[Cycle, Callable[[], Awaitable[None]]]:
        channel = grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)]
                                            if own_connections else None)
        s = lock_pb2_grpc.LockServiceStub(channel)
        granted = await s.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=30))
        lease = granted.lease_id
        owner = (("fencepost-lease-secret", granted.lease_secret),)  # the lease's owner presents its secret
        name = f"{kind}/{i}"

        async def cycle(_: int) -> None:
            r = await s.Acquire(lock_pb2.AcquireRequest(name=name, lease_id=lease, wait_forever=True), metadata=owner)
            await s.Release(lock_pb2.ReleaseRequest(name=name, lease_id=lease, token=r.token), metadata=owner)

        async def close() -> None:
            await s.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease), metadata=owner)
            await channel.close()

        return cycle, close

    async def client(i: int, stream_calls: bool = True) -> tuple[Cycle, Callable[[], Awaitable[None]]]:
        c = AsyncLockClient(address, stream_calls=stream_calls)
        await c.__aenter__()
        name = f"client/{i}" if stream_calls else f"client-unary/{i}"

        async def cycle(_: int) -> None:
            async with c.lock(name, ttl=30):
                pass

        async def close() -> None:
            await c.close()

        return cycle, close

    async def client_unary(i: int) -> tuple[Cycle, Callable[[], Awaitable[None]]]:
        return await client(i, stream_calls=False)

    shared: list[AsyncLockClient] = []  # the one client of coordinator-client-shared, while it runs

    async def client_shared(i: int) -> tuple[Cycle, Callable[[], Awaitable[None]]]:
        if not shared:
            shared.append(AsyncLockClient(address))
            await shared[0].__aenter__()
        c = shared[0]
        name = f"client-shared/{i}"

        async def cycle(_: int) -> None:
            async with c.lock(name, ttl=30):
                pass

        async def close() -> None:
            if shared and shared[0] is c:
                shared.clear()
                await c.close()

        return cycle, close

    async def stub_metrics(i: int) -> tuple[Cycle, Callable[[], Awaitable[None]]]:
        return await stub(i, metered_address, "stub-metrics")

    async def stub_data_dir(i: int) -> tuple[Cycle, Callable[[], Awaitable[None]]]:
        return await stub(i, kept_address, "stub-data-dir")

    kinds = {"etcd-direct": direct, "etcd3aio-direct": direct_etcd3aio, "etcd3aio-lock": recipe,
             "coordinator-stub": stub, "coordinator-client": client, "coordinator-client-unary": client_unary,
             "coordinator-client-shared": client_shared,
             "coordinator-stub-metrics": stub_metrics, "coordinator-stub-data-dir": stub_data_dir}
    # etcd-direct first: the baseline of every ratio.
    chosen = ["etcd-direct", *(k for k in (only or DEFAULT_KINDS) if k != "etcd-direct")]
    serving = {"coordinator-stub": coordinator, "coordinator-client": coordinator,
               "coordinator-client-unary": coordinator, "coordinator-client-shared": coordinator,
               "coordinator-stub-metrics": metered, "coordinator-stub-data-dir": kept}
    cpu: dict[str, dict[str, float]] = {}
    for n in clients:
        row: dict[str, float] = {}
        cpu[str(n)] = {}
        for kind in chosen:
            process = serving.get(kind)
            before = cpu_seconds(process.pid) if process is not None else 0.0
            started = time.perf_counter()
            row[kind] = await run_clients(n, seconds, kinds[kind])
            if process is not None:
                cycles = row[kind] * (time.perf_counter() - started)
                cpu[str(n)][kind] = (cpu_seconds(process.pid) - before) / cycles * 1e6
        results[str(n)] = row
    await etcd.close()
    await channel.close()
    for process in (coordinator, metered, kept):
        if process is not None:
            process.terminate()
            process.wait(timeout=30)
    kept_dir.cleanup()
    return results, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, action="append", help="concurrent clients (repeatable; default 1 and 64)")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per measurement (default 5)")
    parser.add_argument("--etcd-endpoints", help="use this etcd instead of an embedded one")
    parser.add_argument("--kind", action="append", choices=[*DEFAULT_KINDS, *ON_REQUEST_KINDS],
                        help="run only this kind (repeatable; etcd-direct, the baseline, always runs; default: "
                             f"all but {' and '.join(ON_REQUEST_KINDS)})")
    parser.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                        help="an argument for the coordinator's fencepost serve (repeatable), e.g. "
                             "--serve-arg=--workers=2 or --serve-arg=--loop=asyncio")
    parser.add_argument("--own-connections", action="store_true",
                        help="give each coordinator-stub client a connection of its own (needed for serve --workers "
                             "to spread them; by default gRPC shares one connection between the stub clients)")
    args = parser.parse_args()
    clients = args.clients or [1, 64]
    if args.etcd_endpoints:
        results, cpu = asyncio.run(bench(args.etcd_endpoints, clients, args.seconds, args.kind, args.serve_arg,
                                         args.own_connections))
    else:
        with tempfile.TemporaryDirectory() as tmp, EmbeddedEtcd(tmp) as etcd:
            results, cpu = asyncio.run(bench(etcd.endpoint, clients, args.seconds, args.kind, args.serve_arg,
                                             args.own_connections))
    print(f"{'clients':>7} {'kind':<24} {'cycles/s':>10} {'vs etcd-direct':>15} {'vs etcd3aio-direct':>18} "
          f"{'coordinator CPU us/cycle':>24}")
    for n, row in results.items():
        base, old_base = row["etcd-direct"], row.get("etcd3aio-direct")
        for kind, rate in row.items():
            old = f"{rate / old_base:>18.2f}" if old_base else f"{'':>18}"
            used = f"{cpu[n][kind]:>24.0f}" if kind in cpu[n] else ""
            print(f"{n:>7} {kind:<24} {rate:>10.1f} {rate / base:>15.2f} {old} {used}".rstrip())
    print(json.dumps(results))
    print(json.dumps({"coordinator_cpu_us_per_cycle": cpu}))


if __name__ == "__main__":
    main()
