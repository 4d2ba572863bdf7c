"""ReportStaleWrite (issue 24): a fencing guard's refused write, reported by the application, counted and shown.

Real etcd, a real coordinator (gRPC and HTTP), a real SQLite guard; the rate
limit as a unit test with an injected clock.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import grpc
import pytest

from fencepost.client import AsyncLockClient, LockClient, StaleTokenError
from fencepost.client.errors import LimitExceeded
from fencepost.client.fencing import SqlGuard
from fencepost.client.v1 import lock_pb2, lock_pb2_grpc
from fencepost.coordinator.admission.access import Policy
from fencepost.coordinator.api.stream_calls import StreamCallContext
from fencepost.coordinator.api.stale_writes import REPORT_BURST, REPORTS_PER_SECOND, StaleWrites
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.process.embedded import EmbeddedEtcd

from .http_callers import HttpCaller, events, next_event
from .metrics_scrape import scrape
from .test_http_twins import start


@pytest.fixture
async def served(etcd: EmbeddedEtcd, prefix: str) -> AsyncIterator[Coordinator]:
    coordinator = await start(etcd, prefix, metrics_listen="127.0.0.1:0")
    try:
        yield coordinator
    finally:
        await asyncio.wait_for(coordinator.stop(grace=0), 20)


def report(**fields: Any) -> lock_pb2.ReportStaleWriteRequest:
    return lock_pb2.ReportStaleWriteRequest(**{"name": "ledger:1", "token": 4, "current_token": 9,
                                               "storage": "postgresql", "record": "row 1", **fields})


BAD_FIELDS = [("name", {"name": "a\nb"}), ("token", {"token": 0}), ("current_token", {"current_token": -1}),
              ("storage", {"storage": "Postgres!"}), ("storage", {"storage": ""}), ("storage", {"storage": "a" * 33}),
              ("record", {"record": "r" * 129}), ("record", {"record": "line\nbreak"})]


async def test_bad_fields_are_refused_naming_the_field_on_both_ports(served: Coordinator) -> None:
    """Each bad field is INVALID_ARGUMENT / INVALID_FIELD naming it, over gRPC and over HTTP (400)."""
    async with grpc.aio.insecure_channel(served.address) as channel, aiohttp.ClientSession() as session:
        stub = lock_pb2_grpc.LockServiceStub(channel)
        http = HttpCaller(session, f"http://{served.http_address}")
        for field, bad in BAD_FIELDS:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.ReportStaleWrite(report(**bad))
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, field
            assert f"{field} " in (refused.value.details() or ""), refused.value.details()
            failure = await http("ReportStaleWrite", report(**bad))
            assert (failure.http_status, failure.reason, failure.metadata.get("field")) == (400, "INVALID_FIELD",
                                                                                          field), bad
        assert await stub.ReportStaleWrite(report(name="", record="")) == lock_pb2.ReportStaleWriteResponse()
        assert await http("ReportStaleWrite", report(storage="my_store")) == lock_pb2.ReportStaleWriteResponse()
    metrics = await scrape(served.metrics_address)
    assert metrics.value("fencepost_stale_writes_reported_total", storage="postgresql") == 1.0
    assert metrics.value("fencepost_stale_writes_reported_total", storage="other") == 1.0


def test_reports_past_the_rate_are_refused_when_a_flood_comes() -> None:
    """A burst of reports is taken, the next one refused with LIMIT_EXCEEDED and a retry delay, then taken again."""
    now = [100.0]
    taken: list[Any] = []
    reports = StaleWrites(clock=lambda: now[0])
    reports.listen(taken.append)
    context = StreamCallContext("ipv4:127.0.0.1", {}, (), None)
    for _ in range(REPORT_BURST):
        reports.report(report(), context)
    with pytest.raises(LimitExceeded) as refused:
        reports.report(report(), context)
    assert refused.value.retry_delay == pytest.approx(1 / REPORTS_PER_SECOND)
    now[0] += 1.5 / REPORTS_PER_SECOND
    reports.report(report(), context)
    assert len(taken) == REPORT_BURST + 1


POLICY = """
[[allow]]
anonymous = true
actions = ["acquire", "release"]
names = ["ledger:*"]
"""


async def test_a_report_needs_acquire_on_its_lock(etcd: EmbeddedEtcd, prefix: str) -> None:
    """With a policy, a caller may report stale writes of the locks it may acquire, and of none it may not."""
    coordinator = await start(etcd, prefix, policy=Policy.from_text(POLICY))
    try:
        async with grpc.aio.insecure_channel(coordinator.address) as channel:
            stub = lock_pb2_grpc.LockServiceStub(channel)
            await stub.ReportStaleWrite(report(name="ledger:7"))
            await stub.ReportStaleWrite(report(name=""))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.ReportStaleWrite(report(name="payroll:7"))
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        await asyncio.wait_for(coordinator.stop(grace=0), 20)


def sqlite_guard(**options: Any) -> SqlGuard:
    conn = sqlite3.connect(":memory:", check_same_thread=False)
    conn.execute("CREATE TABLE ledger (id TEXT PRIMARY KEY, amount INTEGER, fencing_token INTEGER)")
    return SqlGuard(conn, "ledger", "id", commit=True, **options)


async def test_an_async_guard_hook_reports_a_refused_write(served: Coordinator) -> None:
    """A guard given ``client.stale_write_reporter()`` and lock handles: the stale write is refused as without the
    hook, and the coordinator's board hears it with the lock name, tokens, storage and record."""
    async with AsyncLockClient(served.address) as client, aiohttp.ClientSession() as session:
        guard = sqlite_guard(on_reject=client.stale_write_reporter())
        async with session.get(f"http://{served.http_address}/board/events") as answer:
            stream = events(answer)
            assert (await next_event(stream))[0] == "access"
            assert (await next_event(stream))[0] == "snapshot"
            old = await client.acquire("ledger:1", ttl=10)
            guard.upsert("row 1", old, {"amount": 1})
            await old.release()
            new = await client.acquire("ledger:1", ttl=10)
            guard.upsert("row 1", new, {"amount": 2})
            with pytest.raises(StaleTokenError) as refused:
                guard.upsert("row 1", old, {"amount": 3})
            assert (refused.value.storage, refused.value.name) == ("sqlite", "ledger:1")
            stale = await stale_writes_told(stream)
        assert stale == [{**stale[0], "name": "ledger:1", "token": str(old.token), "currentToken": str(new.token),
                          "storage": "sqlite", "record": "row 1"}]
        await new.release()
    metrics = await scrape(served.metrics_address)
    assert metrics.value("fencepost_stale_writes_reported_total", storage="sqlite") == 1.0


async def stale_writes_told(stream: AsyncIterator[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The ``stale_write`` items of a board's stream, from the first event that has any."""
    while True:
        _, data = await next_event(stream)
        stale = [t for t in data["timeline"] if t["what"] == "stale_write"]
        if stale:
            return stale


async def test_a_sync_guard_hook_never_changes_the_outcome(served: Coordinator) -> None:
    """A LockClient's hook, called from the writer's thread: the write is refused as without it, the report
    reaches the coordinator; once the client is closed the report is dropped, the write refused all the same."""
    guard = sqlite_guard()
    async with aiohttp.ClientSession() as session, \
            session.get(f"http://{served.http_address}/board/events") as answer:
        stream = events(answer)
        assert [(await next_event(stream))[0] for _ in range(2)] == ["access", "snapshot"]
        client = await asyncio.to_thread(LockClient, served.address)
        try:
            await asyncio.to_thread(client.connect)  # a client that never connected drops its reports
            guard.on_reject = client.stale_write_reporter()
            await asyncio.to_thread(guard.upsert, "row 1", 9, {"amount": 1})
            with pytest.raises(StaleTokenError):
                await asyncio.to_thread(guard.upsert, "row 1", 4, {"amount": 2})
            [told] = await stale_writes_told(stream)
            assert (told["name"], told["token"], told["currentToken"]) == ("", "4", "9")
        finally:
            await asyncio.to_thread(client.close)
    with pytest.raises(StaleTokenError):  # the client is closed: the hook drops the report, never raises
        guard.upsert("row 1", 3, {"amount": 2})
    assert (guard.rejected, guard.conn.execute("SELECT amount FROM ledger").fetchone()[0]) == (2, 1)
