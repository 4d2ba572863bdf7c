"""Observing an election against a real etcd and in-process coordinators: every leader in order, across
coordinator restarts and outages, resumed after a revision (compacted or not), refused when etcd is gone."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import grpc
import pytest
from etcd3aio import Etcd3Client

from fencepost.client import AsyncLockClient, LeaderInfo
from fencepost.client.v1 import lock_pb2

from .conftest import error_info


async def test_observe_bad_input_names_the_field(stub: Any) -> None:
    """Observe refuses a bad election or a negative after_revision with the field named."""
    for request, field in ((lock_pb2.ObserveRequest(election=""), "election"),
                           (lock_pb2.ObserveRequest(election="e", after_revision=-1), "after_revision")):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in stub.Observe(request, timeout=5):
                pass
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        info = error_info(caught.value)
        assert info is not None and info.metadata["field"] == field


async def _collect(client: AsyncLockClient, election: str, into: list[LeaderInfo | None],
                   changed: asyncio.Event) -> None:
    async for info in client.observe(election):
        into.append(info)
        changed.set()


async def _seen(seen: list[LeaderInfo | None], changed: asyncio.Event, n: int) -> None:
    while sum(1 for s in seen if s is not None) < n:
        changed.clear()
        await asyncio.wait_for(changed.wait(), 10)


async def test_observe_sees_every_leader_in_order_across_a_coordinator_restart(etcd: Any, prefix: str) -> None:
    """An observer sees each leader and value once, in order, also when its coordinator stops and it resumes on
    another with after_revision while the leader changes meanwhile."""
    from fencepost.coordinator.process.coordinator import Coordinator

    first = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix)
    second = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix)
    await asyncio.wait_for(first.start(), 20)
    await asyncio.wait_for(second.start(), 20)
    stopped = False
    try:
        there = f"127.0.0.1:{second.port}"
        async with AsyncLockClient([f"127.0.0.1:{first.port}", there]) as watcher, \
                AsyncLockClient(there) as one, AsyncLockClient(there) as two:
            seen: list[LeaderInfo | None] = []
            changed = asyncio.Event()
            observer = asyncio.create_task(_collect(watcher, "obs", seen, changed))
            await asyncio.wait_for(changed.wait(), 10)
            assert seen == [None]  # the first item: the state at the start
            a = await one.campaign("obs", b"a1", timeout=5)
            await _seen(seen, changed, 1)
            await a.proclaim(b"a2")
            await _seen(seen, changed, 2)
            queued = asyncio.create_task(two.campaign("obs", b"b1", timeout=20))
            await asyncio.wait_for(first.stop(grace=0), 20)  # the observer's coordinator goes
            stopped = True
            await a.resign()  # the leader changes while the observer is away
            b = await asyncio.wait_for(queued, 10)
            await b.proclaim(b"b2")
            await _seen(seen, changed, 4)
            await b.resign()
            await asyncio.wait_for(_until_none(seen, changed), 10)
            observer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await observer
        leaders = [(s.token, s.value) for s in seen if s is not None]
        assert leaders == [(a.token, b"a1"), (a.token, b"a2"), (b.token, b"b1"), (b.token, b"b2")], seen
        assert seen[-1] is None and b.token > a.token
        assert [s.revision for s in seen if s is not None] == sorted(s.revision for s in seen if s is not None)
    finally:
        if not stopped:
            await asyncio.wait_for(first.stop(grace=0), 20)
        await asyncio.wait_for(second.stop(grace=0), 20)


async def test_observe_waits_out_outages_longer_than_connect_timeout(etcd: Any, prefix: str) -> None:
    """Once accepted, an observation goes on through coordinator outages longer than connect_timeout, and
    through a second outage after a quiet spell (a resumed Observe that receives nothing is still up: its
    initial metadata says so); the change made after them is seen."""
    from fencepost.coordinator.process.coordinator import Coordinator

    coordinator = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix)
    await asyncio.wait_for(coordinator.start(), 20)
    address = f"127.0.0.1:{coordinator.port}"
    try:
        async with AsyncLockClient(address, connect_timeout=1.0) as watcher:
            seen: list[LeaderInfo | None] = []
            changed = asyncio.Event()
            observer = asyncio.create_task(_collect(watcher, "outages", seen, changed))
            await asyncio.wait_for(changed.wait(), 10)
            for outage, quiet in ((2.5, 1.5), (0.2, 0.0)):  # seconds down (connect_timeout is 1 s), then up
                await asyncio.wait_for(coordinator.stop(grace=0), 20)
                await asyncio.sleep(outage)  # the outage itself is what is tested
                coordinator = Coordinator([etcd.endpoint], listen=address, prefix=prefix)
                await asyncio.wait_for(coordinator.start(), 20)
                await asyncio.sleep(quiet)  # nothing changes meanwhile: the resumed Observe sends nothing
                assert not observer.done(), observer
            async with AsyncLockClient(address) as candidate:
                lead = await candidate.campaign("outages", b"after", timeout=5)
                await asyncio.wait_for(_seen(seen, changed, 1), 15)
                assert [(s.token, s.value) for s in seen if s is not None] == [(lead.token, b"after")]
                await lead.resign()
            observer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await observer
    finally:
        await asyncio.wait_for(coordinator.stop(grace=0), 20)


async def _until_none(seen: list[LeaderInfo | None], changed: asyncio.Event) -> None:
    while not seen or seen[-1] is not None:
        changed.clear()
        await changed.wait()


async def test_observe_resumes_after_a_revision(address: str, stub: Any) -> None:
    """Observe with after_revision sends nothing for that revision and every change after it."""
    async with AsyncLockClient(address) as client:
        lead = await client.campaign("resume", b"x", timeout=5)
        stream = stub.Observe(lock_pb2.ObserveRequest(election="resume"), timeout=10)
        first = await stream.read()
        assert first.leader.token == lead.token and first.leader.value == b"x" and not first.compacted
        stream.cancel()
        await lead.proclaim(b"y")
        await lead.proclaim(b"z")
        resumed = stub.Observe(lock_pb2.ObserveRequest(election="resume", after_revision=first.revision), timeout=10)
        got = [await resumed.read(), await resumed.read()]
        resumed.cancel()
        assert [m.leader.value for m in got] == [b"y", b"z"]
        assert first.revision < got[0].revision < got[1].revision
        await lead.resign()


async def test_observe_after_a_compacted_revision_says_so(address: str, stub: Any,
                                                          etcd_client: Etcd3Client) -> None:
    """Resuming after a revision etcd has compacted gives the current state first, marked compacted."""
    async with AsyncLockClient(address) as client:
        lead = await client.campaign("compacted", b"v1", timeout=5)
        stream = stub.Observe(lock_pb2.ObserveRequest(election="compacted"), timeout=10)
        first = await stream.read()
        stream.cancel()
        await lead.proclaim(b"v2")
        await lead.proclaim(b"v3")
        assert etcd_client.kv is not None
        head = (await etcd_client.kv.get(b"/", count_only=True, timeout=5)).header.revision
        await etcd_client.kv.compact(int(head), physical=True, timeout=10)
        resumed = stub.Observe(lock_pb2.ObserveRequest(election="compacted", after_revision=first.revision),
                               timeout=10)
        got = await resumed.read()
        resumed.cancel()
        assert got.compacted and got.leader.value == b"v3" and got.leader.token == lead.token
        assert got.revision >= head
        await lead.resign()


async def test_observe_refused_from_the_start_gives_up_after_connect_timeout(prefix: str) -> None:
    """A coordinator whose etcd is unreachable refuses each Observe (ETCD_UNAVAILABLE): before any acceptance,
    the observation gives up after connect_timeout with that error, as Leader would; it retried forever when a
    refused Observe counted as accepted."""
    import socket

    from fencepost.client import Unavailable
    from fencepost.coordinator.process.coordinator import Coordinator

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        nowhere = f"127.0.0.1:{probe.getsockname()[1]}"  # no etcd there once closed
    coord = Coordinator([nowhere], listen="127.0.0.1:0", prefix=prefix)
    await asyncio.wait_for(coord.start(), 20)
    try:
        async with AsyncLockClient(f"127.0.0.1:{coord.port}", connect_timeout=1.0) as client:
            with pytest.raises(Unavailable) as caught:
                await asyncio.wait_for(anext(client.observe("nowhere")), 15)
            assert caught.value.reason == "ETCD_UNAVAILABLE", caught.value
    finally:
        await asyncio.wait_for(coord.stop(grace=0), 20)


@pytest.mark.parametrize("compact", [True, False], ids=["compacted", "not-compacted"])
async def test_observe_when_history_compacted_flags_the_gap(etcd: Any, prefix: str, etcd_client: Etcd3Client,
                                                           compact: bool) -> None:
    """Leaders L, M, N come and go while an observer's only coordinator is down: when etcd compacted past M
    meanwhile, the resumed observe (async, and the sync client's observe and on_leader) reports N with
    ``skipped`` set (it jumped from L to N silently before); without compaction it reports L, M, N, none
    flagged."""
    from fencepost.client import LockClient
    from fencepost.coordinator.process.coordinator import Coordinator

    first = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix)
    second = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix)
    await asyncio.wait_for(first.start(), 20)
    await asyncio.wait_for(second.start(), 20)
    observed_at = f"127.0.0.1:{first.port}"
    sync_client = LockClient(observed_at)
    called: list[LeaderInfo | None] = []
    try:
        async with AsyncLockClient(observed_at) as watcher, AsyncLockClient(f"127.0.0.1:{second.port}") as cands:
            seen: list[LeaderInfo | None] = []
            changed = asyncio.Event()
            observer = asyncio.create_task(_collect(watcher, "gap", seen, changed))
            sync_changes = await asyncio.to_thread(sync_client.observe, "gap")
            sync_got: list[LeaderInfo | None] = []
            sync_seen = asyncio.create_task(asyncio.to_thread(_read_until, sync_changes, b"N", sync_got))
            on_leader = await asyncio.to_thread(sync_client.on_leader, "gap", called.append)
            l_lead = await cands.campaign("gap", b"L", timeout=5)
            await _seen(seen, changed, 1)
            await _until(lambda: any(c is not None for c in called))
            # Every observer has L before its coordinator goes (the sync one too: it reads in its own thread).
            await _until(lambda: any(s is not None and s.value == b"L" for s in list(sync_got)))
            await asyncio.wait_for(first.stop(grace=0), 20)  # the observers' only coordinator goes
            await l_lead.resign()
            m_lead = await cands.campaign("gap", b"M", timeout=5)
            await m_lead.resign()
            n_lead = await cands.campaign("gap", b"N", timeout=5)
            if compact:
                assert etcd_client.kv is not None
                head = (await etcd_client.kv.get(b"/", count_only=True, timeout=5)).header.revision
                await etcd_client.kv.compact(int(head), physical=True, timeout=10)
            first = Coordinator([etcd.endpoint], listen=observed_at, prefix=prefix)
            await asyncio.wait_for(first.start(), 20)
            await asyncio.wait_for(_until_token(seen, changed, n_lead.token), 20)
            await _until(lambda: any(c is not None and c.token == n_lead.token for c in called))
            from_sync = await asyncio.wait_for(sync_seen, 20)
            await n_lead.resign()
            observer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await observer
            on_leader.stop()
            sync_changes.close()
        expected = [(b"L", False), (b"N", True)] if compact else [(b"L", False), (b"M", False), (b"N", False)]
        assert [(s.value, s.skipped) for s in seen if s is not None] == expected, seen
        assert [(c.value, c.skipped) for c in called if c is not None] == expected, called
        assert [(s.value, s.skipped) for s in from_sync if s is not None] == expected, from_sync
        assert [s.token for s in seen if s is not None][-1] == n_lead.token > m_lead.token > l_lead.token
    finally:
        sync_client.close()
        await asyncio.wait_for(first.stop(grace=0), 20)
        await asyncio.wait_for(second.stop(grace=0), 20)


def _read_until(changes: Any, value: bytes, got: list[LeaderInfo | None]) -> list[LeaderInfo | None]:
    """The items of a sync observe iterator up to the first leader of ``value`` (in a thread), appended to
    ``got`` as they come (so the test can wait for one) and returned."""
    for info in changes:
        got.append(info)
        if info is not None and info.value == value:
            break
    return got


async def _until(condition: Any, timeout: float = 20) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def _until_token(seen: list[LeaderInfo | None], changed: asyncio.Event, token: int) -> None:
    while not any(s is not None and s.token == token for s in seen):
        changed.clear()
        await changed.wait()
