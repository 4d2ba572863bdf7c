"""P5: a holder process killed with SIGKILL; seconds until the queued waiter is granted.

Each kill: start ``bench/_holder.py`` (its own process, its own process
group) on a fresh lock name, wait for its ``ready``, queue a waiter of the
same peer in the bench process and see it queued, wait a random part of one
keepalive period (0 to TTL/3, so that the kill falls anywhere between two
renewals), then SIGKILL the holder and time until the waiter's acquire
returns. Kills run in a few lanes at once, started a little apart, so that
20 kills at TTL 10 s take about a minute, not four.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import _procs
from _measure import call, close_users, make_users, wait_until

HOLDER = str(Path(__file__).with_name("_holder.py"))


def holder_args(peer: Any, name: str) -> tuple[str, str, str]:
    """(holder mode, its target, the lock as the holder names it) for a waiter of ``peer`` on ``name``."""
    if peer.kind == "etcd-direct":
        return "etcd-direct", peer.endpoint, f"{peer.prefix}{name}/"
    if peer.kind == "kazoo-lock":
        return "kazoo", peer.hosts, peer.path(name)
    if peer.kind == "redis-lock":
        return "redis", str(peer.port), f"{peer.prefix}{name}"
    return "fencepost", peer.address, name


async def takeovers(peer: Any, ttl: float, kills: int, tag: str, lanes: int = 5) -> dict[str, Any]:
    """``kills`` take-overs with holder TTL (session timeout, lock timeout) ``ttl`` seconds.

    Returns:
        {"samples_s": [...], "holder_ttl_s": what the holder was granted or negotiated}
    """
    lanes = max(1, min(lanes, kills))
    waiters = await make_users(peer, lanes)
    samples: list[float] = []
    granted_ttl: list[str] = []
    clock = time.perf_counter

    async def one(waiter: Any, name: str) -> None:
        mode, target, lock = holder_args(peer, name)
        proc = subprocess.Popen([sys.executable, HOLDER, mode, target, lock, str(ttl)], stdout=subprocess.PIPE,
                                text=True, start_new_session=True)
        try:
            assert proc.stdout is not None
            line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
            if not line.startswith("ready"):
                raise RuntimeError(f"the {mode} holder did not start")
            granted_ttl.append(line.split()[1])

            async def wait_grant() -> tuple[Any, float]:
                if peer.sync:
                    def blocking() -> tuple[Any, float]:
                        g = waiter.acquire(name)
                        return g, clock()
                    return await asyncio.to_thread(blocking)
                g = await waiter.acquire(name)
                return g, clock()

            pending = asyncio.ensure_future(wait_grant())
            if hasattr(peer, "queued"):
                await wait_until(lambda: peer.queued(name), pending)
            else:
                await asyncio.sleep(0.15)  # redis-py's waiter has tried once and polls every 0.1 s
            await asyncio.sleep(random.uniform(0, ttl / 3))
            t0 = clock()
            os.kill(proc.pid, signal.SIGKILL)
            grant, t1 = await asyncio.wait_for(pending, ttl + 60)
            samples.append(t1 - t0)
            await call(peer, waiter.release, name, grant)
        finally:
            _procs.stop(proc)

    async def lane(j: int) -> None:
        await asyncio.sleep(j * max(0.5, ttl / 3 / lanes))
        for k in range(j, kills, lanes):
            await one(waiters[j], f"{tag}/{k}")

    try:
        await asyncio.gather(*(lane(j) for j in range(lanes)))
    finally:
        await close_users(peer, waiters)
    return {"samples_s": samples, "holder_ttl_s": sorted(set(granted_ttl))}
