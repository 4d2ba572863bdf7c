"""``fencepost_recipe_grants_total{recipe}``: each recipe's grants counted under its own label (a real etcd, a
real coordinator, a real scrape; the clients' own calls)."""

from __future__ import annotations

import asyncio

from fencepost.client import AsyncLockClient
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.process.embedded import EmbeddedEtcd
from fencepost.coordinator.telemetry.metrics import RECIPES

from .metrics_scrape import scrape


async def test_grants_are_counted_by_recipe(etcd: EmbeddedEtcd, prefix: str) -> None:
    """A lock, two readers, a multi-lock of three names, a permit and a leadership: counted 1, 2, 3, 1, 1 under
    lock, read, multilock, semaphore and election; every label value exists (0) before any grant."""
    coord = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix, metrics_listen="127.0.0.1:0")
    await asyncio.wait_for(coord.start(), 20)
    try:
        before = await scrape(coord.metrics_address)
        assert {r: before.value("fencepost_recipe_grants_total", recipe=r) for r in RECIPES} == {r: 0 for r in RECIPES}
        async with AsyncLockClient(coord.address) as a, AsyncLockClient(coord.address) as b:
            await (await a.acquire("plain", ttl=10)).release()
            readers = [await c.acquire("ledger", ttl=10, read=True) for c in (a, b)]
            for r in readers:
                await r.release()
            await (await a.acquire_all(["acct:1", "acct:2", "acct:3"], ttl=10)).release()
            await (await a.semaphore("pool", permits=2, ttl=10).acquire()).release()
            await (await a.campaign("leader", "me", ttl=10)).resign()
        s = await scrape(coord.metrics_address)
        assert s.by("fencepost_recipe_grants_total", "recipe") == {
            "lock": 1, "read": 2, "multilock": 3, "semaphore": 1, "election": 1}
        assert sum(s.by("fencepost_grants_total", "prefix").values()) == 8
    finally:
        await asyncio.wait_for(coord.stop(grace=0), 20)
