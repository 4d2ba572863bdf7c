"""The lock board shows a read-write lock's readers: every reader holding is a holder (``holder`` and
``readers``, each ``read``), waiters are marked ``read`` or not, and each reader's grant and end is told in the
timeline, its reason exact for a Release served here. Real etcd, a real coordinator serving HTTP."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from fencepost.client.v1 import lock_pb2

from .http_callers import HttpCaller, events
from .test_board import board, changes_until, snapshot_of  # noqa: F401  (board: a fixture)
from .test_http_twins import grant, revoke

READ = lock_pb2.LOCK_MODE_READ


async def _acquire(call: HttpCaller, lease: Any, mode: int, wait_ms: int = 0) -> Any:
    return await call("Acquire", lock_pb2.AcquireRequest(name="ledger", lease_id=lease.lease_id, wait_ms=wait_ms,
                                                         mode=mode), lease.lease_secret)


async def test_readers_are_holders_on_the_board(board: Any) -> None:  # noqa: F811
    _, session, base = board
    call = HttpCaller(session, base)
    a, b, w, late = [await grant(call) for _ in range(4)]
    ra, rb = await _acquire(call, a, READ), await _acquire(call, b, READ)
    assert ra.acquired and rb.acquired
    async with session.get(f"{base}/board/events", params={"prefix": "ledger"}) as answer:
        stream = events(answer)
        [lock] = (await snapshot_of(stream))["locks"]
        assert [(h["lease"], h["token"], h["read"]) for h in [lock["holder"], *lock["readers"]]] == [
            (str(a.lease_id), str(ra.token), True), (str(b.lease_id), str(rb.token), True)]
        assert lock["waiters"] == [] and all(h["sinceMs"] is not None for h in [lock["holder"], *lock["readers"]])

        writer = asyncio.ensure_future(_acquire(call, w, lock_pb2.LOCK_MODE_WRITE, wait_ms=20_000))
        merged = await changes_until(stream, lambda m: (m["locks"].get("ledger") or {}).get("waiters"))
        reader = asyncio.ensure_future(_acquire(call, late, READ, wait_ms=20_000))
        merged = await changes_until(stream, lambda m: len((m["locks"].get("ledger") or {}).get("waiters", [])) == 2)
        assert [(x["lease"], x["read"]) for x in merged["locks"]["ledger"]["waiters"]] == [
            (str(w.lease_id), False), (str(late.lease_id), True)]

        await call("Release", lock_pb2.ReleaseRequest(name="ledger", lease_id=b.lease_id, token=rb.token, mode=READ),
                   b.lease_secret)
        merged = await changes_until(stream, lambda m: m["timeline"])
        assert [(t["what"], t["reason"], t["exact"], t["by"], t["lease"], t["read"]) for t in merged["timeline"]] == [
            ("ended", "released", True, "Release", str(b.lease_id), True)]
        assert merged["locks"]["ledger"]["readers"] == [] and merged["locks"]["ledger"]["holder"]["read"]

        await call("Release", lock_pb2.ReleaseRequest(name="ledger", lease_id=a.lease_id, token=ra.token, mode=READ),
                   a.lease_secret)
        taken = await writer
        merged = await changes_until(stream, lambda m: len(m["timeline"]) >= 2)
        assert [(t["what"], t["lease"], t["read"]) for t in merged["timeline"]] == [
            ("ended", str(a.lease_id), True), ("granted", str(w.lease_id), False)]
        assert merged["locks"]["ledger"]["holder"]["token"] == str(taken.token)
        await call("Release", lock_pb2.ReleaseRequest(name="ledger", lease_id=w.lease_id, token=taken.token),
                   w.lease_secret)
        got = await reader
        merged = await changes_until(stream, lambda m: any(t["what"] == "granted" for t in m["timeline"]))
        assert [(t["what"], t["lease"], t["read"]) for t in merged["timeline"] if t["what"] == "granted"] == [
            ("granted", str(late.lease_id), True)]
        assert merged["locks"]["ledger"]["holder"]["token"] == str(got.token)
    await revoke(call, a, b, w, late)
