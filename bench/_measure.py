"""Cycle loops (P1, P2) and hand-offs (P3) over any peer of ``_peers``.

Every measurement makes its users first (not timed), runs one warm-up
cycle per user (first calls open channels, grant leases, create parent
znodes), then times. Async users run as tasks on the bench's event loop;
sync users in one thread each of the bench process (they share its GIL).
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from _peers import close_quietly

#: How many users are made at once (a coordinator or ZooKeeper flooded with session setups refuses some).
SETUP_CONCURRENCY = 16


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (0-100) of ``values``; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


@dataclass
class Loops:
    """What one run of cycle loops measured: cycles, elapsed seconds, per-call latencies in seconds."""

    cycles: int = 0
    seconds: float = 0.0
    #: CPU seconds the ``cpu`` probe of :func:`cycle_loops` counted over the timed loops (0.0 without a probe).
    cpu_seconds: float = 0.0
    acquire: list[float] = field(default_factory=list)
    release: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        """Cycles per second."""
        return self.cycles / self.seconds if self.seconds else 0.0


async def make_users(peer: Any, n: int) -> list[Any]:
    """``n`` users of ``peer``, made at most SETUP_CONCURRENCY at a time."""
    gate = asyncio.Semaphore(SETUP_CONCURRENCY)

    async def one(i: int) -> Any:
        async with gate:
            return await peer.user(i)

    return list(await asyncio.gather(*(one(i) for i in range(n))))


async def close_users(peer: Any, users: list[Any]) -> None:
    """Close every user, ignoring failures."""
    if peer.sync:
        await asyncio.gather(*(close_quietly(u.close, sync=True) for u in users))
    else:
        await asyncio.gather(*(close_quietly(u.close()) for u in users))


async def cycle_loops(peer: Any, n: int, seconds: float, name_of: Callable[[int], str],
                      cpu: Callable[[], float] | None = None) -> Loops:
    """``n`` users each looping acquire + release of ``name_of(i)`` for ``seconds``.

    Args:
        peer: a peer of ``_peers``.
        n: concurrent users.
        seconds: how long the loops run (a cycle under way at the end finishes).
        name_of: user index -> lock name (distinct names, or shared: contended).
        cpu: a server's CPU seconds so far (e.g. the coordinator's), read when
            the timed loops start and end (not around the users' set-up); None for none.

    Returns:
        The cycles, the elapsed seconds (until the last loop ended), every
        acquire and release latency, and the CPU seconds ``cpu`` counted meanwhile.
    """
    users = await make_users(peer, n)
    probe = cpu or (lambda: 0.0)
    try:
        if peer.sync:
            return await asyncio.to_thread(_sync_loops, users, seconds, name_of, probe)
        return await _async_loops(users, seconds, name_of, probe)
    finally:
        await close_users(peer, users)


async def _async_loops(users: list[Any], seconds: float, name_of: Callable[[int], str],
                       cpu: Callable[[], float]) -> Loops:
    async def warm(i: int) -> None:
        await users[i].release(name_of(i), await users[i].acquire(name_of(i)))

    await asyncio.gather(*(warm(i) for i in range(len(users))))
    out = Loops()
    clock = time.perf_counter
    deadline = clock() + seconds

    async def loop(i: int) -> None:
        user, name = users[i], name_of(i)
        acq, rel = out.acquire.append, out.release.append
        while clock() < deadline:
            t0 = clock()
            grant = await user.acquire(name)
            t1 = clock()
            await user.release(name, grant)
            acq(t1 - t0)
            rel(clock() - t1)

    used = cpu()
    start = clock()
    await asyncio.gather(*(loop(i) for i in range(len(users))))
    out.seconds = clock() - start
    out.cpu_seconds = cpu() - used
    out.cycles = len(out.acquire)
    return out


def _sync_loops(users: list[Any], seconds: float, name_of: Callable[[int], str], cpu: Callable[[], float]) -> Loops:
    n = len(users)
    barrier = threading.Barrier(n + 1)
    acquires: list[list[float]] = [[] for _ in range(n)]
    releases: list[list[float]] = [[] for _ in range(n)]
    failures: list[BaseException] = []
    deadline = [0.0]
    clock = time.perf_counter

    def loop(i: int) -> None:
        user, name = users[i], name_of(i)
        try:
            user.release(name, user.acquire(name))  # warm-up
        except BaseException as exc:  # reported below; the barrier must still be reached
            failures.append(exc)
        barrier.wait()
        acq, rel = acquires[i].append, releases[i].append
        try:
            while clock() < deadline[0]:
                t0 = clock()
                grant = user.acquire(name)
                t1 = clock()
                user.release(name, grant)
                acq(t1 - t0)
                rel(clock() - t1)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    deadline[0] = 1e18
    barrier.wait()  # every warm-up done
    used = cpu()
    start = clock()
    deadline[0] = start + seconds
    for t in threads:
        t.join()
    if failures:
        raise failures[0]
    out = Loops(seconds=clock() - start, cpu_seconds=cpu() - used)
    for a, r in zip(acquires, releases, strict=True):
        out.acquire += a
        out.release += r
    out.cycles = len(out.acquire)
    return out


# ------------------------------------------------------------------------------------------------ P3 hand-off


async def handoffs(peer: Any, samples: int, name: str, warmup: int = 3) -> list[float]:
    """Seconds from the holder's release call to the queued waiter's grant, ``samples`` times.

    Two users take turns: one holds ``name``, the other calls acquire and is
    seen queued (``peer.queued(name)``; a peer that cannot tell, redis-py's
    Lock, is given 0.15 s, more than its 0.1 s poll), then the holder
    releases after a random pause (0 to 0.1 s for a polling peer, so that the
    release falls anywhere in its poll period; none for the others). The
    waiter notes the time its acquire returned; the roles then swap.
    """
    a, b = await make_users(peer, 2)
    clock = time.perf_counter
    polls = not hasattr(peer, "queued")
    out: list[float] = []
    pending: asyncio.Future[Any] | None = None
    try:
        holder, waiter = a, b
        grant = await call(peer, holder.acquire, name)
        for k in range(samples + warmup):
            if peer.sync:
                def wait_grant(w: Any = waiter) -> tuple[Any, float]:
                    g = w.acquire(name)
                    return g, clock()
                pending = asyncio.ensure_future(asyncio.to_thread(wait_grant))
            else:
                async def wait_grant_async(w: Any = waiter) -> tuple[Any, float]:
                    g = await w.acquire(name)
                    return g, clock()
                pending = asyncio.ensure_future(wait_grant_async())
            if polls:
                await asyncio.sleep(0.15 + random.uniform(0, 0.1))
            else:
                await wait_until(lambda: peer.queued(name), pending)
            if peer.sync:
                def release(h: Any = holder, g: Any = grant) -> float:
                    t = clock()
                    h.release(name, g)
                    return t
                t0 = await asyncio.to_thread(release)
            else:
                t0 = clock()
                await holder.release(name, grant)
            grant, t1 = await asyncio.wait_for(pending, 30)
            if k >= warmup:
                out.append(t1 - t0)
            holder, waiter = waiter, holder
        await call(peer, holder.release, name, grant)
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
        await close_users(peer, [a, b])
    return out


async def call(peer: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` of one of ``peer``'s users: awaited for an async peer, in a thread for a sync one."""
    return await asyncio.to_thread(fn, *args) if peer.sync else await fn(*args)


async def wait_until(probe: Callable[[], Any], pending: asyncio.Future[Any], timeout: float = 30.0) -> None:
    """Poll the async ``probe`` every 2 ms until it is true; fail early if ``pending`` ended (it raised)."""
    deadline = time.monotonic() + timeout
    while not await probe():
        if pending.done():
            pending.result()  # raises what the waiter raised
            raise RuntimeError("the waiter was granted while the lock was held")
        if time.monotonic() > deadline:
            raise TimeoutError("the waiter never showed up queued")
        await asyncio.sleep(0.002)
