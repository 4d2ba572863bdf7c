"""The lock board in a real browser (issue 24 item 4): Debian's headless Chromium, a real coordinator and etcd.

Chromium is installed with apt-get when missing (tests/browser.py). With
``FENCEPOST_BOARD_SCREENSHOT=PATH`` the test also saves what the page shows
(docs/img/board.png is made so).
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from fencepost.client import AsyncLockClient, StaleTokenError
from fencepost.client.fencing import SqlGuard
from fencepost.client.v1 import lock_pb2
from fencepost.coordinator.admission.access import Policy
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.process.embedded import EmbeddedEtcd

from .browser import Browser, chromium_path
from .http_callers import HttpCaller
from .test_http_twins import acquire, grant, revoke, start

#: Longest wait for the page to show something, seconds (a loss must show within 1 s: asserted apart).
PAGE_SECONDS = 20.0


@pytest.fixture(scope="module")
def chromium() -> str:
    return chromium_path()


@pytest.fixture
async def served(etcd: EmbeddedEtcd, prefix: str) -> AsyncIterator[Coordinator]:
    coordinator = await start(etcd, prefix)
    try:
        yield coordinator
    finally:
        await asyncio.wait_for(coordinator.stop(grace=0), 20)


async def shown(browser: Browser, expression: str, *, within: float = PAGE_SECONDS) -> Any:
    """The value of ``expression`` in the page once it is truthy; fail after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        value = await browser.evaluate(expression)
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"the page did not show {expression} within {within} s")
        await asyncio.sleep(0.02)


def token_of(key: str) -> str:
    return f"document.querySelector('tr[data-key={json.dumps(key)}] td.token')?.textContent"


def ended(token: int) -> str:
    return (f"[...document.querySelectorAll('#timeline li.t-ended')].filter(li => li.textContent.includes("
            f"'token {token}')).map(li => li.dataset.reason)[0]")


def ttl_of(key: str) -> str:
    """The TTL left the page shows for ``key`` ("?" until the lease's TTL is read)."""
    return f"document.querySelector('tr[data-key={json.dumps(key)}]')?.cells[4].textContent"


async def test_board_shows_holders_and_losses_live(served: Coordinator, chromium: str) -> None:
    """The page shows a holder's token, its waiter, an election and a semaphore; a loss (its lease revoked) appears in the timeline
    within 1 s, as ``revoked``, and a lease left to run out as ``expired``; the prefix filter hides other names."""
    async with aiohttp.ClientSession() as session, Browser(chromium) as browser:
        base = f"http://{served.http_address}"
        call = HttpCaller(session, base)
        holder, waiter, other = await grant(call, ttl=30), await grant(call, ttl=30), await grant(call, ttl=15)
        held = await acquire(call, holder, "invoice:42")
        waiting = asyncio.ensure_future(acquire(call, waiter, "invoice:42", wait_ms=60_000))
        await acquire(call, other, "report:daily")
        await call("Campaign", lock_pb2.CampaignRequest(election="scheduler", lease_id=other.lease_id,
                                                        value=b"node-b"), other.lease_secret)
        await call("AcquirePermit", lock_pb2.AcquirePermitRequest(name="db-pool", lease_id=other.lease_id,
                                                                  permits=4), other.lease_secret)
        await browser.open(f"{base}/")
        assert await shown(browser, token_of("invoice:42")) == str(held.token)
        assert await shown(browser, "document.querySelector('tr[data-key=\"invoice:42\"]')"
                                    f".cells[5].textContent.startsWith('{waiter.lease_id}/')")
        assert "node-b" in await shown(browser, "document.querySelector('#elections tbody').textContent")
        assert "db-pool" in await shown(browser, "document.querySelector('#semaphores tbody').textContent")
        assert await browser.evaluate("document.querySelectorAll('button.revoke').length") == 0  # no policy

        await revoke(call, holder)  # its lease ends: the hold is lost
        revoked = time.monotonic()
        assert await shown(browser, ended(held.token), within=PAGE_SECONDS) == "revoked"
        assert time.monotonic() - revoked < 1.0, "the loss took over 1 s to appear on the page"
        assert "revoked by LeaseRevoke" in await shown(browser, "document.querySelector('#timeline').textContent")
        taken = await waiting

        expiring = await grant(call, ttl=3)  # never renewed: its lease runs out
        doomed = await acquire(call, expiring, "invoice:43")
        assert await shown(browser, f"{ttl_of('invoice:43')} !== '?' && {ttl_of('invoice:43')}")
        assert await shown(browser, ended(doomed.token), within=PAGE_SECONDS) == "expired"
        assert await shown(browser, token_of("invoice:42")) == str(taken.token)
        if os.environ.get("FENCEPOST_BOARD_SCREENSHOT"):
            await asyncio.sleep(1.5)  # TTLs read
            await browser.screenshot(Path(os.environ["FENCEPOST_BOARD_SCREENSHOT"]))

        await browser.open(f"{base}/?prefix=report:")
        assert await shown(browser, token_of("report:daily"))
        assert await browser.evaluate(token_of("invoice:42")) is None
        await revoke(call, waiter, other)


async def test_a_stale_write_refused_by_a_guard_shows(served: Coordinator, chromium: str) -> None:
    """A SQL guard (SQLite) with the client's ``stale_write_reporter()`` refuses a stale write: the page shows it,
    with its storage, record, lock and tokens, within 1 s."""
    async with AsyncLockClient(served.address) as client, Browser(chromium) as browser:
        conn = sqlite3.connect(":memory:")
        conn.execute("CREATE TABLE invoices (id TEXT PRIMARY KEY, status TEXT, fencing_token INTEGER)")
        guard = SqlGuard(conn, "invoices", "id", commit=True, on_reject=client.stale_write_reporter())
        await browser.open(f"http://{served.http_address}/")
        old = await client.acquire("invoice:7", ttl=10)
        assert await shown(browser, token_of("invoice:7")) == str(old.token)
        guard.upsert("inv-7", old, {"status": "draft"})
        await old.release()
        new = await client.acquire("invoice:7", ttl=10)
        guard.upsert("inv-7", new, {"status": "paid"})
        with pytest.raises(StaleTokenError):
            guard.upsert("inv-7", old, {"status": "void"})
        refused = time.monotonic()
        told = await shown(browser, "document.querySelector('#timeline li.t-stale_write')?.textContent")
        assert time.monotonic() - refused < 1.0, "the stale write took over 1 s to appear on the page"
        assert f"sqlite record inv-7 lock invoice:7 token {old.token} < {new.token}" in told
        await new.release()


POLICY = """
[[allow]]
anonymous = true
actions = ["acquire", "release", "describe", "admin"]
names = ["*"]
"""


async def test_an_operator_revokes_from_the_page(etcd: EmbeddedEtcd, prefix: str, chromium: str) -> None:
    """With a policy that lets the caller ``admin``, the page offers Revoke; confirmed, the holder loses the lock
    (its lease revoked), shown in the timeline."""
    coordinator = await start(etcd, prefix, policy=Policy.from_text(POLICY))
    try:
        async with aiohttp.ClientSession() as session, Browser(chromium) as browser:
            base = f"http://{coordinator.http_address}"
            call = HttpCaller(session, base)
            lease = await grant(call, ttl=30)
            held = await acquire(call, lease, "job:7")
            await browser.open(f"{base}/")
            button = "document.querySelector('tr[data-key=\"job:7\"] button.revoke')"
            assert await shown(browser, f"!!{button}")
            await browser.evaluate(f"window.confirm = () => true, {button}.click(), true")
            assert await shown(browser, ended(held.token)) == "revoked"
            assert "revoked by AdminRevoke" in await shown(browser, "document.querySelector('#timeline').textContent")
            assert await shown(browser, f"!{button}")
            described = await call("Describe", lock_pb2.DescribeRequest(name="job:7"))
            assert not described.HasField("holder")
    finally:
        await asyncio.wait_for(coordinator.stop(grace=0), 20)


async def test_board_shows_readers_together(served: Coordinator, chromium: str) -> None:
    """A read-write lock held by two readers shows both leases and tokens, marked (read), and a waiting writer
    in its queue; a reader behind it is marked r."""
    async with aiohttp.ClientSession() as session, Browser(chromium) as browser:
        base = f"http://{served.http_address}"
        call = HttpCaller(session, base)
        a, b, w, late = [await grant(call, ttl=30) for _ in range(4)]
        read = lock_pb2.LOCK_MODE_READ
        ra, rb = [await call("Acquire", lock_pb2.AcquireRequest(name="ledger", lease_id=x.lease_id, mode=read),
                             x.lease_secret) for x in (a, b)]
        writer = asyncio.ensure_future(acquire(call, w, "ledger", wait_ms=60_000))
        await browser.open(f"{base}/")
        row = "document.querySelector('tr[data-key=\"ledger\"]')"
        assert await shown(browser, f"{row}?.cells[5].textContent.startsWith('{w.lease_id}/')")
        reader = asyncio.ensure_future(call("Acquire", lock_pb2.AcquireRequest(
            name="ledger", lease_id=late.lease_id, mode=read, wait_ms=60_000), late.lease_secret))
        assert await shown(browser, f"{row}?.cells[5].textContent.endsWith(' r')")
        assert await browser.evaluate(f"{row}.cells[1].textContent") == f"{a.lease_id}, {b.lease_id} (read)"
        assert await browser.evaluate(token_of("ledger")) == f"{ra.token}, {rb.token}"
        await revoke(call, a, b)
        taken = await writer
        assert await shown(browser, f"{token_of('ledger')} === '{taken.token}'")
        await revoke(call, w)
        await reader
        await revoke(call, late)
