"""A flood of KeepAlive streams, then of distinct lock names: the coordinator's memory before, at the peak, and after.

Starts an embedded etcd (or uses ``--etcd-endpoints``) and a coordinator in
a child process (this file, ``--child``) that runs with ``tracemalloc`` on
and answers memory probes on its stdin: the Python heap traced now and at
its peak, the resident memory (VmRSS), and the same after glibc's
``malloc_trim(0)`` (freed arenas given back to the system). Then:

1. **streams**: ``--connections`` connections each grant one lease and open
   ``--streams`` / ``--connections`` KeepAlive streams that each send one
   keepalive for it; once every stream was answered (an ack) or ended (its
   status and reason are counted), all are cancelled by the client;
2. **names**: ``--names`` distinct lock names, each acquired and released
   once (one lease per connection), then left idle.

After each flood the coordinator is left idle for ``--idle-seconds`` (its
per-name memory forgets after 30 s for deletions and 60 s for hand-offs)
before the "after" probe. ``--max-streams`` and ``--max-streams-per-caller``
are passed to the coordinator (defaults: 10,000 and 100); its capacity
limits (``--max-lag`` and the like) are off unless ``--capacity``.

    python bench/memory_flood.py --streams 10000 --connections 200 --names 14000

Diagnostics: ``MEMORY_FLOOD_DETAILS=1`` counts failed streams by their
message, ``MEMORY_FLOOD_LOG=FILE`` writes the coordinator's INFO log (its
``stream_open`` lines count the streams that reached it),
``MEMORY_FLOOD_TOP=1`` prints the files holding the most traced memory after
the idle period, ``MEMORY_FLOOD_NO_TRACE=1`` runs the coordinator without
tracemalloc (RSS alone; the heap figures are then 0).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import ctypes
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from fencepost.client.v1 import details, lock_pb2, lock_pb2_grpc
from fencepost.coordinator.admission.ownership import SECRET_METADATA


def rss_kib() -> int:
    """This process's VmRSS, in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def rss_parts_kib() -> dict[str, int]:
    """This process's resident memory by mapping kind (KiB): ``heap`` (glibc's main arena, brk), ``anon``
    (anonymous mappings: glibc's other arenas, Python's object arenas, thread stacks), ``file`` (code, data)."""
    parts = {"heap": 0, "anon": 0, "file": 0}
    kind = "file"
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and len(fields) >= 5 and not fields[0].endswith(":"):
            name = fields[5] if len(fields) > 5 else ""
            kind = "heap" if name == "[heap]" else "anon" if not name or name.startswith("[") else "file"
        elif fields and fields[0] == "Rss:":
            parts[kind] += int(fields[1])
    return parts


def pymalloc_kib() -> dict[str, int]:
    """Python's object allocator: its arenas mapped now and the bytes of the blocks in use in them (KiB), from
    ``sys._debugmallocstats()`` (written to fd 2, read back from a file)."""
    with tempfile.TemporaryFile("w+") as out:
        saved = os.dup(2)
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        found = {}
        for line in out:
            name, _, value = line.partition("=")
            found[name.strip()] = value.strip().replace(",", "")
    arenas = int(found.get("# arenas allocated current", "0"))
    return {"arenas_kib": arenas * (1024 if sys.version_info >= (3, 10) else 256),
            "in_blocks_kib": int(found.get("# bytes in allocated blocks", "0")) // 1024}


def probe(trim: bool) -> dict[str, Any]:
    """The memory figures of this process (KiB); with ``trim``, after ``malloc_trim(0)`` (glibc)."""
    if trim:
        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    current, peak = tracemalloc.get_traced_memory()
    return {"rss_kib": rss_kib(), "traced_kib": current // 1024, "traced_peak_kib": peak // 1024,
            "rss_parts_kib": rss_parts_kib(), "threads": len(os.listdir("/proc/self/task")),
            "pymalloc_kib": pymalloc_kib()}


async def child(endpoint: str, prefix: str, max_streams: int, per_caller: int, capacity: bool) -> None:
    """The coordinator under test: serves, and answers ``probe``/``trim``/``reset``/``sizes`` lines on stdin."""
    from fencepost.coordinator.admission.limits import Limits
    from fencepost.coordinator.process.coordinator import Coordinator

    if os.environ.get("MEMORY_FLOOD_LOG"):
        import logging
        logging.basicConfig(filename=os.environ["MEMORY_FLOOD_LOG"], level=logging.INFO)
    if not os.environ.get("MEMORY_FLOOD_NO_TRACE"):  # RSS without tracemalloc's own tables and blocks
        tracemalloc.start()
    off = {} if capacity else {"max_lag": 0, "max_loop_busy": 0, "max_client_rtt": 0, "max_keepalive_wait": 0}
    limits = Limits(max_streams=max_streams, max_streams_per_caller=per_caller, lease_grant_rate=0, acquire_rate=0,
                    **off)
    coord = Coordinator([endpoint], listen="127.0.0.1:0", prefix=prefix, limits=limits)
    await coord.start()
    print(f"listening {coord.address}", flush=True)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := (await reader.readline()).decode().strip():
        if line == "reset":
            tracemalloc.reset_peak()
            answer: dict[str, Any] = {}
        elif line == "top":
            stats = tracemalloc.take_snapshot().statistics("filename")[:8]
            answer = {"top": [[s.size // 1024, s.count, str(s.traceback)] for s in stats]}
        elif line == "sizes":
            answer = coord.state_sizes() if hasattr(coord, "state_sizes") else {}
        else:
            answer = probe(trim=line == "trim")
        print(json.dumps(answer), flush=True)
    await coord.stop(grace=0)


class Child:
    """The coordinator child process and its probes."""

    def __init__(self, endpoint: str, args: argparse.Namespace) -> None:
        prefix = f"/bench/{uuid.uuid4().hex}/"
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--child", "--etcd-endpoints", endpoint, "--prefix", prefix,
             "--max-streams", str(args.max_streams), "--max-streams-per-caller", str(args.max_streams_per_caller),
             *(["--capacity"] if args.capacity else [])],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.address = self.proc.stdout.readline().split()[-1]

    def ask(self, what: str) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def figures(self) -> dict[str, Any]:
        first = self.ask("probe")
        trimmed = self.ask("trim")
        return {**first, "collected_traced_kib": trimmed["traced_kib"], "trimmed_rss_kib": trimmed["rss_kib"],
                "trimmed_rss_parts_kib": trimmed["rss_parts_kib"], "threads": first["threads"],
                "pymalloc_kib": trimmed["pymalloc_kib"],
                "sizes": self.ask("sizes")}

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)


def outcome(err: grpc.aio.AioRpcError) -> str:
    """``CODE/REASON`` of a failed stream (``CODE`` alone when no ErrorInfo is attached)."""
    reason = details.parse(err).reason if err.code() != grpc.StatusCode.CANCELLED else ""
    if not reason and os.environ.get("MEMORY_FLOOD_DETAILS"):
        reason = (err.details() or "")[:60] + " " + (err.debug_error_string() or "")[-160:]
    return f"{err.code().name}/{reason}" if reason else err.code().name


async def leases(stubs: list[Any]) -> list[tuple[int, str]]:
    """One lease (id, secret) per connection, of a TTL longer than a flood (the names flood keeps none alive)."""
    answers = await asyncio.gather(*(s.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=900), timeout=60)
                                     for s in stubs))
    return [(a.lease_id, a.lease_secret) for a in answers]


async def stream_flood(stubs: list[Any], owned: list[tuple[int, str]], n: int) -> dict[str, int]:
    """Open ``n`` KeepAlive streams round-robin over the connections; their outcomes, counted."""
    outcomes: collections.Counter[str] = collections.Counter()
    all_answered = asyncio.Event()
    answered = [0]

    def done(what: str) -> None:
        outcomes[what] += 1
        answered[0] += 1
        if answered[0] == n:
            all_answered.set()

    async def one(i: int) -> None:
        started = time.monotonic()
        lease_id, secret = owned[i % len(owned)]
        request = lock_pb2.KeepAliveRequest(keepalive=lock_pb2.LeaseKeepAlive(lease_id=lease_id),
                                            lease_secret=secret)
        call = stubs[i % len(stubs)].KeepAlive()
        try:
            await asyncio.wait_for(call.write(request), 120)
            if await asyncio.wait_for(call.read(), 120) is grpc.aio.EOF:
                done(f"{(await call.code()).name}/{await call.details()}"[:120])
                return
            done("acked")
            await all_answered.wait()
        except grpc.aio.AioRpcError as err:
            after = (f" after {int(time.monotonic() - started) // 10 * 10}+ s"
                     if os.environ.get("MEMORY_FLOOD_DETAILS") else "")
            if err.code() == grpc.StatusCode.INTERNAL and os.environ.get("MEMORY_FLOOD_DETAILS"):
                done(f"write failed; call {(await call.code()).name}/{await call.details()}"[:120] + after)
            else:
                done(outcome(err) + after)
        except asyncio.TimeoutError:
            done("no answer in 120 s")
        except Exception:  # a write on a call that already ended: its status says why
            done(f"{(await call.code()).name}/{await call.details()}"[:120])
        finally:
            call.cancel()

    await asyncio.gather(*(one(i) for i in range(n)))
    return dict(outcomes)


async def names_flood(stubs: list[Any], owned: list[tuple[int, str]], n: int) -> dict[str, int]:
    """Acquire and release ``n`` distinct lock names once each; the outcomes, counted."""
    outcomes: collections.Counter[str] = collections.Counter()
    run = uuid.uuid4().hex[:8]

    async def worker(c: int) -> None:
        lease_id, secret = owned[c]
        meta = ((SECRET_METADATA, secret),)
        for i in range(c, n, len(stubs)):
            name = f"flood-{run}-{i}"
            for attempt in range(5):  # etcd may time out on a loaded machine: Acquire and Release are retryable
                try:
                    got = await stubs[c].Acquire(lock_pb2.AcquireRequest(name=name, lease_id=lease_id),
                                                 metadata=meta, timeout=60)
                    await stubs[c].Release(lock_pb2.ReleaseRequest(name=name, lease_id=lease_id, token=got.token),
                                           metadata=meta, timeout=60)
                    outcomes["released"] += 1
                    break
                except grpc.aio.AioRpcError as err:
                    if err.code() != grpc.StatusCode.UNAVAILABLE or attempt == 4:
                        outcomes[outcome(err)] += 1
                        break
                    outcomes["retried after UNAVAILABLE"] += 1

    await asyncio.gather(*(worker(c) for c in range(len(stubs))))
    return dict(outcomes)


async def measure(coord: Child, args: argparse.Namespace, case: str) -> dict[str, Any]:
    """Baseline, the flood of ``case``, peak, and after ``--idle-seconds``."""
    channels = [grpc.aio.insecure_channel(coord.address, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(args.connections)]
    stubs = [lock_pb2_grpc.LockServiceStub(c) for c in channels]
    try:
        owned = await leases(stubs)
        baseline = coord.figures()
        coord.ask("reset")
        started = time.monotonic()
        if case == "streams":
            outcomes = await stream_flood(stubs, owned, args.streams)
        else:
            outcomes = await names_flood(stubs, owned, args.names)
        seconds = time.monotonic() - started
        peak = coord.ask("probe")
    finally:
        for c in channels:
            await c.close()
    await asyncio.sleep(args.idle_seconds)
    if os.environ.get("MEMORY_FLOOD_TOP"):
        print(json.dumps(coord.ask("top"), indent=1), file=sys.stderr)
    return {"case": case, "outcomes": outcomes, "flood_seconds": round(seconds, 1), "baseline": baseline,
            "peak": {"rss_kib": peak["rss_kib"], "traced_peak_kib": peak["traced_peak_kib"]},
            "after": coord.figures()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=10_000)
    parser.add_argument("--names", type=int, default=14_000)
    parser.add_argument("--connections", type=int, default=200)
    parser.add_argument("--runs", type=int, default=1, help="stream floods in a row")
    parser.add_argument("--idle-seconds", type=float, default=65.0)
    parser.add_argument("--max-streams", type=int, default=10_000)
    parser.add_argument("--max-streams-per-caller", type=int, default=100)
    parser.add_argument("--capacity", action="store_true",
                        help="keep the coordinator's capacity limits (--max-lag etc.; off by default: memory alone)")
    parser.add_argument("--etcd-endpoints", default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--prefix", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        asyncio.run(child(args.etcd_endpoints, args.prefix, args.max_streams, args.max_streams_per_caller,
                          args.capacity))
        return
    etcd = None
    if args.etcd_endpoints is None:
        from fencepost.coordinator.process.embedded import EmbeddedEtcd
        etcd = EmbeddedEtcd(Path(tempfile.mkdtemp(prefix="memory-flood-")))
        etcd.start()
    try:
        coord = Child(args.etcd_endpoints or etcd.endpoint, args)  # type: ignore[union-attr]
        try:
            results = [asyncio.run(measure(coord, args, "streams")) for _ in range(args.runs)]
            if args.names:
                results.append(asyncio.run(measure(coord, args, "names")))
        finally:
            coord.close()
    finally:
        if etcd is not None:
            etcd.stop()
    for r in results:
        print(json.dumps(r))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
