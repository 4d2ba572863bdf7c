"""What an open lock board costs the coordinator: its CPU seconds with N held locks, with and without a board.

A coordinator (``fencepost serve --http-listen``, own process) on an embedded
etcd; N leases each hold one lock (TTL long enough that no renewal runs).
Then twice ``--seconds``: the coordinator's CPU seconds (user + system,
/proc) with no board open, then with one board's event stream open (read as a
browser would). Also the page's weight (``/``, its script and style) and the
size of the first snapshot. Prints one JSON object.

    python bench/board_cost.py --locks 1000 --seconds 30
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


async def measure(pid: int, base: str, seconds: float) -> dict[str, float | int]:
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
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, EmbeddedEtcd(Path(tmp)) as etcd:
        port = free_port()
        proc, address = start_coordinator(etcd.endpoint, "/board-bench/", "--http-listen", f"127.0.0.1:{port}",
                                         "--max-lease-grant-rate", "100000", "--max-acquire-rate", "100000",
                                         "--max-leases-per-caller", "100000")
        try:
            asyncio.run(hold(address, args.locks))
            result = asyncio.run(measure(proc.pid, f"http://127.0.0.1:{port}", args.seconds))
        finally:
            stop(proc)
    print(json.dumps({"locks": args.locks, "seconds": args.seconds, **result}))


if __name__ == "__main__":
    main()
