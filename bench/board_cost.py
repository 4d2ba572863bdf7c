"""What an open lock board costs the coordinator: its CPU seconds with N held locks, with and without a board.

A coordinator (``fencepost serve --http-listen``, own process) on an embedded
etcd; N leases each hold one lock (TTL long enough that no renewal runs).
Then twice ``--seconds``: the coordinator's CPU seconds (user + system,
/proc) with no board open, then with one board's event stream open (read as a
browser would). Also the page's weight (``/``, its script and style) and the
size of the first snapshot. Prints one JSON object.

    python bench/board_cost.py --locks 1000 --seconds 30 [--churn 20]

``--churn N``: meanwhile, N acquire/release cycles a second of one more lock.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _procs import cpu_seconds, free_port, start_coordinator, stop  # noqa: E402

from fencepost.client.v1 import lock_pb2, lock_pb2_grpc  # noqa: E402
from fencepost.coordinator.process.embedded import EmbeddedEtcd  # noqa: E402


async def hold(address: str, locks: int) -> None:
    """``locks`` leases, each holding lock ``board-bench/<i>``."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = lock_pb2_grpc.LockServiceStub(channel)
        gate = asyncio.Semaphore(50)

        async def one(i: int) -> None:
            async with gate:
                lease = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=600))
                held = await stub.Acquire(lock_pb2.AcquireRequest(name=f"board-bench/{i:04d}", lease_id=lease.lease_id),
                                          metadata=(("fencepost-lease-secret", lease.lease_secret),))
                assert held.acquired

        await asyncio.gather(*(one(i) for i in range(locks)))


async def churn(address: str, per_second: float) -> None:
    """Acquire and release lock ``board-bench/churn`` ``per_second`` times a second, until cancelled."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = lock_pb2_grpc.LockServiceStub(channel)
        lease = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=600))
        owned = (("fencepost-lease-secret", lease.lease_secret),)
        while True:
            held = await stub.Acquire(lock_pb2.AcquireRequest(name="board-bench/churn", lease_id=lease.lease_id),
                                      metadata=owned)
            await stub.Release(lock_pb2.ReleaseRequest(name="board-bench/churn", lease_id=lease.lease_id,
                                                       token=held.token), metadata=owned)
            await asyncio.sleep(1 / per_second)


async def measure(pid: int, address: str, base: str, seconds: float, per_second: float) -> dict[str, float | int]:
    churning = asyncio.ensure_future(churn(address, per_second)) if per_second else None
    try:
        return await _measure(pid, base, seconds)
    finally:
        if churning is not None:
            churning.cancel()


async def _measure(pid: int, base: str, seconds: float) -> dict[str, float | int]:
    async with aiohttp.ClientSession() as session:
        weight = 0
        for path in ("/", "/board/board.js", "/board/board.css"):
            async with session.get(base + path) as answer:
                weight += len(await answer.read())
        idle_start = cpu_seconds(pid)
        await asyncio.sleep(seconds)
        idle = cpu_seconds(pid) - idle_start
        open_start = cpu_seconds(pid)
        snapshot = 0
        received = 0
        async with session.get(base + "/board/events") as answer:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                try:
                    line = await asyncio.wait_for(answer.content.readline(), deadline - time.monotonic())
                except TimeoutError:
                    break
                received += len(line)
                if not snapshot and line.startswith(b"data: "):
                    snapshot = len(line)
        board = cpu_seconds(pid) - open_start
    return {"page_bytes": weight, "snapshot_bytes": snapshot, "stream_bytes": received,
            "cpu_seconds_without_board": round(idle, 2), "cpu_seconds_with_board": round(board, 2),
            "board_cpu_seconds": round(board - idle, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--locks", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--churn", type=float, default=0.0, help="acquire/release cycles a second meanwhile")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, EmbeddedEtcd(Path(tmp)) as etcd:
        port = free_port()
        proc, address = start_coordinator(etcd.endpoint, "/board-bench/", "--http-listen", f"127.0.0.1:{port}",
                                         "--max-lease-grant-rate", "100000", "--max-acquire-rate", "100000",
                                         "--max-leases-per-caller", "100000")
        try:
            asyncio.run(hold(address, args.locks))
            result = asyncio.run(measure(proc.pid, address, f"http://127.0.0.1:{port}", args.seconds,
                                         args.churn))
        finally:
            stop(proc)
    print(json.dumps({"locks": args.locks, "seconds": args.seconds, "churn_per_second": args.churn, **result}))


if __name__ == "__main__":
    main()
