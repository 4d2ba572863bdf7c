"""The lock board's page and event stream (issue 24 item 3): real etcd, a real coordinator serving HTTP.

The page in a real browser is tests/test_board_browser.py; here, what the stream tells.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from fencepost.client.v1 import lock_pb2
from fencepost.client.v1.keys import Keys
from fencepost.coordinator.etcd import EtcdClient
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.process.embedded import EmbeddedEtcd
from fencepost.coordinator.recipes.tokens import recover

from .http_callers import HttpCaller, events, next_event
from .test_http_twins import acquire, grant, revoke, start


@pytest.fixture
async def board(etcd: EmbeddedEtcd, prefix: str) -> AsyncIterator[tuple[Coordinator, aiohttp.ClientSession, str]]:
    coordinator = await start(etcd, prefix)
    try:
        async with aiohttp.ClientSession() as session:
            yield coordinator, session, f"http://{coordinator.http_address}"
    finally:
        await asyncio.wait_for(coordinator.stop(grace=0), 20)


async def changes_until(stream: AsyncIterator[tuple[str, dict[str, Any]]], done: Any) -> dict[str, Any]:
    """The ``change`` events of ``stream`` merged until ``done(merged)`` holds."""
    merged: dict[str, Any] = {"locks": {}, "timeline": []}
    while not done(merged):
        name, data = await next_event(stream)
        assert name == "change", name
        merged["locks"].update(data["locks"])
        merged["timeline"] += data["timeline"]
        merged["nowMs"] = data["nowMs"]
    return merged


async def snapshot_of(stream: AsyncIterator[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """The first ``snapshot`` of a board's stream, after its ``access`` event (no Revoke: there is no policy)."""
    assert await next_event(stream) == ("access", {"mayRevoke": False})
    name, snapshot = await next_event(stream)
    assert name == "snapshot"
    return snapshot


def merged_now(merged: dict[str, Any]) -> int:
    return int(merged["nowMs"])


async def test_page_and_its_files_are_served(board: tuple[Coordinator, aiohttp.ClientSession, str]) -> None:
    _, session, base = board
    async with session.get(f"{base}/") as page:
        assert page.status == 200 and page.content_type == "text/html"
        assert "/board/board.js" in await page.text()
    for name, media in (("board.js", "text/javascript"), ("board.css", "text/css")):
        async with session.get(f"{base}/board/{name}") as answer:
            assert (answer.status, answer.content_type) == (200, media)
    async with session.get(f"{base}/board/secrets.txt") as answer:
        assert answer.status == 404


async def test_stream_tells_holders_waiters_and_their_ends(board: tuple[Coordinator, aiohttp.ClientSession, str]
                                                           ) -> None:
    """A snapshot with the held lock, then changes: a waiter queued, the holder's release handing off, an expiry
    by revoke; each end in the timeline with its reason. A lock outside the prefix is never told."""
    coordinator, session, base = board
    call = HttpCaller(session, base)
    first, second = await grant(call), await grant(call, ttl=20)
    held = await acquire(call, first, "invoice:1")
    assert held.acquired
    await acquire(call, first, "other")
    async with session.get(f"{base}/board/events", params={"prefix": "invoice:"}) as answer:
        assert answer.status == 200 and answer.content_type == "text/event-stream"
        stream = events(answer)
        snapshot = await snapshot_of(stream)
        [lock] = snapshot["locks"]
        assert (lock["kind"], lock["name"], lock["holder"]["lease"], lock["holder"]["token"], lock["waiters"]) == (
            "lock", "invoice:1", str(first.lease_id), str(held.token), [])
        assert lock["holder"]["sinceMs"] is not None

        waiting = asyncio.ensure_future(acquire(call, second, "invoice:1", wait_ms=20_000))
        merged = await changes_until(stream, lambda m: (m["locks"].get("invoice:1") or {}).get("waiters"))
        assert [w["lease"] for w in merged["locks"]["invoice:1"]["waiters"]] == [str(second.lease_id)]

        await call("Release", lock_pb2.ReleaseRequest(name="invoice:1", lease_id=first.lease_id, token=held.token),
                   first.lease_secret)
        taken = await waiting
        merged = await changes_until(stream, lambda m: len(m["timeline"]) >= 2)
        assert [(t["what"], t["reason"], t["exact"], t["by"], t["token"]) for t in merged["timeline"]] == [
            ("ended", "released", True, "Release", str(held.token)), ("granted", None, None, None, str(taken.token))]
        assert merged["locks"]["invoice:1"]["holder"]["lease"] == str(second.lease_id)
        merged = await changes_until(stream, lambda m: (m["locks"].get("invoice:1") or {}).get("holder", {})
                                     .get("ttl"))
        holder = merged["locks"]["invoice:1"]["holder"]
        assert holder["ttl"] == 20 and 0 < holder["expiresMs"] - merged_now(merged) <= 20_000

        await revoke(call, second)
        merged = await changes_until(stream, lambda m: m["timeline"])
        assert [(t["what"], t["reason"], t["exact"], t["by"], t["name"]) for t in merged["timeline"]] == [
            ("ended", "revoked", True, "LeaseRevoke", "invoice:1")]
        assert merged["locks"] == {"invoice:1": None}
    await revoke(call, first)


async def test_ends_served_elsewhere_are_inferred(board: tuple[Coordinator, aiohttp.ClientSession, str],
                                                  etcd: EmbeddedEtcd, prefix: str) -> None:
    """Holds ended through another coordinator: a revoke with TTL left is ``revoked``, a lease left to run out
    ``expired`` (both inferred from the lease's estimated expiry), a release ``key_deleted`` (its lease lives)."""
    _, session, base = board
    other = await start(etcd, prefix)
    try:
        call = HttpCaller(session, f"http://{other.http_address}")
        revoked, expiring, released = await grant(call, ttl=30), await grant(call, ttl=3), await grant(call, ttl=30)
        async with session.get(f"{base}/board/events", params={"prefix": "away:"}) as answer:
            stream = events(answer)
            await snapshot_of(stream)
            holds = {name: await acquire(call, lease, name)
                     for name, lease in (("away:revoked", revoked), ("away:expiring", expiring),
                                         ("away:released", released))}
            await changes_until(stream, lambda m: all((m["locks"].get(n) or {}).get("holder", {}).get("ttl")
                                                      for n in holds))  # each lease's expiry estimated
            await revoke(call, revoked)
            await call("Release", lock_pb2.ReleaseRequest(name="away:released", lease_id=released.lease_id,
                                                          token=holds["away:released"].token), released.lease_secret)
            merged = await changes_until(stream, lambda m: len(m["timeline"]) >= 3)  # the 3 s lease runs out
        ends = {t["name"]: (t["reason"], t["exact"], t["by"]) for t in merged["timeline"]}
        assert ends == {"away:revoked": ("revoked", False, None), "away:expiring": ("expired", False, None),
                        "away:released": ("key_deleted", True, None)}
        await revoke(call, released)
    finally:
        await asyncio.wait_for(other.stop(grace=0), 20)


async def test_keys_deleted_by_recover_tokens_are_told_so(board: tuple[Coordinator, aiohttp.ClientSession, str],
                                                        etcd: EmbeddedEtcd, prefix: str) -> None:
    """``fencepost admin recover-tokens`` deletes every lock key in the Txn that writes the token record: the board
    tells those ends exactly, ``key_deleted`` by ``recover-tokens``."""
    _, session, base = board
    call = HttpCaller(session, base)
    lease = await grant(call)
    held = await acquire(call, lease, "restored:1")
    async with session.get(f"{base}/board/events", params={"prefix": "restored:"}) as answer:
        stream = events(answer)
        assert [lock["name"] for lock in (await snapshot_of(stream))["locks"]] == ["restored:1"]
        layer = EtcdClient([etcd.endpoint])
        try:
            await recover(layer, Keys(prefix), held.token + 10)
        finally:
            await layer.close()
        merged = await changes_until(stream, lambda m: m["timeline"])
    assert [(t["what"], t["reason"], t["exact"], t["by"], t["token"]) for t in merged["timeline"]] == [
        ("ended", "key_deleted", True, "recover-tokens", str(held.token))]
    await revoke(call, lease)


async def test_elections_and_semaphores_are_shown(board: tuple[Coordinator, aiohttp.ClientSession, str]) -> None:
    _, session, base = board
    call = HttpCaller(session, base)
    lease = await grant(call)
    won = await call("Campaign", lock_pb2.CampaignRequest(election="leader", lease_id=lease.lease_id,
                                                          value=b"node-a"), lease.lease_secret)
    permit = await call("AcquirePermit", lock_pb2.AcquirePermitRequest(name="pool", lease_id=lease.lease_id,
                                                                       permits=3), lease.lease_secret)
    async with session.get(f"{base}/board/events") as answer:
        snapshot = await snapshot_of(events(answer))
    shown = {(e["kind"], e["name"], e["slot"]): e for e in snapshot["locks"]}
    election = shown["election", "leader", 0]
    assert (election["holder"]["token"], election["holder"]["value"]) == (str(won.token), "node-a")
    slot = shown["semaphore", "pool", permit.slot]
    assert slot["holder"]["token"] == str(permit.token)
    await revoke(call, lease)


async def test_boards_closed_and_opened_again_are_told_afresh(board: tuple[Coordinator, aiohttp.ClientSession, str]
                                                              ) -> None:
    """The last board closing stops the feed; the next one starts it again and sees what changed meanwhile."""
    _, session, base = board
    call = HttpCaller(session, base)
    lease = await grant(call)
    first = await acquire(call, lease, "again:1")
    for expected in (["again:1"], ["again:1", "again:2"]):
        async with session.get(f"{base}/board/events", params={"prefix": "again:"}) as one, \
                session.get(f"{base}/board/events", params={"prefix": "again:"}) as two:
            for answer in (one, two):
                snapshot = await snapshot_of(events(answer))
                assert [e["name"] for e in snapshot["locks"]] == expected
        await acquire(call, lease, "again:2")
    assert first.acquired
    await revoke(call, lease)
