"""A client opening leases in a loop from many connections: the coordinator's memory, with and without limits.

Starts an embedded etcd (or uses ``--etcd-endpoints``) and ``fencepost
serve`` in a child process, then floods it with LeaseGrant calls over the
raw stub from ``--connections`` connections (each its own HTTP/2
connection, so each its own caller without mTLS), one call in flight per
connection, never revoking, never backing off:

1. until every connection has been refused (RESOURCE_EXHAUSTED), or
   ``--max-flood-seconds`` have passed (the case with limits off);
2. then ``--seconds`` more of the same loop, refused or not.

It reports the coordinator's resident memory from ``/proc/PID/status``
(VmRSS at start, after phase 1, at the end; VmHWM, the peak), the leases
granted, the refusals by limit, and the refusal lines the coordinator
logged. Extra ``fencepost serve`` flags follow ``--`` (``-- --max-leases 0
...``); ``--limits-off`` sets every limit that can be off to 0.

    python bench/lease_flood.py --connections 50 --seconds 10
    python bench/lease_flood.py --connections 50 --seconds 10 --limits-off --max-flood-seconds 60
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import grpc
import grpc.aio


from fencepost.client.v1 import details, lock_pb2, lock_pb2_grpc
from fencepost.coordinator.admission.limits import FLAGS, Limits
from fencepost.coordinator.process.embedded import EmbeddedEtcd

#: Every limit that can be off, off.
OFF = [f"--{FLAGS[name]}=0" for name in FLAGS
       if name not in ("lease_grant_burst", "acquire_burst", "max_message_bytes")]


def status_kib(pid: int, field: str) -> int:
    """A ``kB`` field of ``/proc/PID/status`` (VmRSS, VmHWM), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def start_coordinator(endpoint: str, prefix: str, extra: list[str]) -> tuple[subprocess.Popen[str], str, list[str]]:
    """``fencepost serve`` in a child process: (the process, its address, its stderr lines as they come)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "fencepost.client.cli", "serve", "--listen", "127.0.0.1:0", "--etcd-endpoints",
         endpoint, "--prefix", prefix, "--log-format", "json", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()  # type: ignore[arg-type]
    for line in proc.stdout:
        if line.startswith("fencepost: listening on "):
            return proc, line.split()[-1], lines
    raise RuntimeError(f"the coordinator did not start: {''.join(lines)[-2000:]}")


async def flood(address: str, connections: int, ttl: int, max_flood: float, seconds: float, pid: int) -> dict:
    """Run the two phases; return the figures."""
    channels = [grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(connections)]
    stubs = [lock_pb2_grpc.LockServiceStub(c) for c in channels]
    for channel in channels:
        await asyncio.wait_for(channel.channel_ready(), 10)
    granted = [0] * connections
    refused: collections.Counter[str] = collections.Counter()
    errors: collections.Counter[str] = collections.Counter()
    first_refusal: list[float | None] = [None] * connections
    samples: list[int] = []
    start = time.monotonic()
    stop_at = [start + max_flood]  # moved once every connection has been refused
    phase1_end: list[float | None] = [None]
    rss_after_phase1: list[int | None] = [None]

    async def loop(i: int) -> None:
        request = lock_pb2.LeaseGrantRequest(ttl_seconds=ttl)
        while time.monotonic() < stop_at[0]:
            try:
                await stubs[i].LeaseGrant(request, timeout=30)
                granted[i] += 1
            except grpc.aio.AioRpcError as err:
                if err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    errors[err.code().name] += 1
                    continue
                refused[details.parse(err).metadata.get("limit", "?")] += 1
                if first_refusal[i] is None:
                    first_refusal[i] = time.monotonic() - start
                    if all(t is not None for t in first_refusal) and phase1_end[0] is None:
                        phase1_end[0] = time.monotonic()
                        rss_after_phase1[0] = status_kib(pid, "VmRSS")
                        stop_at[0] = min(stop_at[0], phase1_end[0] + seconds)

    async def sample() -> None:
        while True:
            samples.append(status_kib(pid, "VmRSS"))
            await asyncio.sleep(0.5)

    sampler = asyncio.create_task(sample())
    try:
        await asyncio.gather(*(loop(i) for i in range(connections)))
    finally:
        sampler.cancel()
        for channel in channels:
            await channel.close()
    end = time.monotonic()
    if phase1_end[0] is None:  # never refused everywhere (limits off): phase 1 was the whole run
        phase1_end[0], rss_after_phase1[0] = end, status_kib(pid, "VmRSS")
    return {
        "connections": connections, "ttl_seconds": ttl,
        "leases_granted": sum(granted), "leases_per_connection_max": max(granted),
        "refused_by_limit": dict(refused), "other_errors": dict(errors),
        "phase1_seconds": round(phase1_end[0] - start, 1), "total_seconds": round(end - start, 1),
        "rss_after_flood_kib": rss_after_phase1[0], "rss_end_kib": status_kib(pid, "VmRSS"),
        "rss_sampled_max_kib": max(samples) if samples else None,
    }


async def run(endpoint: str, args: argparse.Namespace, extra: list[str], etcd_pid: int | None = None) -> dict:
    """Start the coordinator, flood it, stop it; the figures (with the embedded etcd's RSS when ``etcd_pid``)."""
    prefix = f"/bench/{uuid.uuid4().hex}/"
    proc, address, log_lines = start_coordinator(endpoint, prefix, extra)
    try:
        await asyncio.sleep(1.0)  # let the coordinator settle (imports done, etcd connected) before the first figure
        rss_start = status_kib(proc.pid, "VmRSS")
        etcd_start = status_kib(etcd_pid, "VmRSS") if etcd_pid else None
        figures = await flood(address, args.connections, args.ttl, args.max_flood_seconds, args.seconds, proc.pid)
        figures["rss_start_kib"] = rss_start
        figures["rss_peak_kib"] = status_kib(proc.pid, "VmHWM")
        if etcd_pid:
            figures["etcd_rss_start_kib"] = etcd_start
            figures["etcd_rss_end_kib"] = status_kib(etcd_pid, "VmRSS")
    finally:
        proc.terminate()
        proc.wait(30)
    figures["refusal_log_lines"] = sum(1 for line in log_lines if '"LIMIT_EXCEEDED"' in line)
    figures["serve_flags"] = extra
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=50, help="connections flooding at once (default 50)")
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="seconds to go on once every connection was refused (default 10)")
    parser.add_argument("--max-flood-seconds", type=float, default=120.0,
                        help="longest first phase, for limits off (default 120)")
    parser.add_argument("--ttl", type=int, default=600, help="TTL of each lease, seconds (default 600)")
    parser.add_argument("--limits-off", action="store_true", help="serve with every limit that can be off at 0")
    parser.add_argument("--etcd-endpoints", help="use this etcd instead of an embedded one")
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"] + (OFF if args.limits_off else [])
    if args.etcd_endpoints:
        figures = asyncio.run(run(args.etcd_endpoints, args, extra))
    else:
        with tempfile.TemporaryDirectory() as tmp, EmbeddedEtcd(Path(tmp)) as etcd:
            figures = asyncio.run(run(etcd.endpoint, args, extra, etcd.pid))
    figures["defaults"] = {FLAGS[k]: v for k, v in vars(Limits()).items()} if not extra else None
    for key, value in figures.items():
        print(f"{key:>28}: {value}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
