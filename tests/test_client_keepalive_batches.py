"""The Python client renews its leases in batches when the coordinator serves them (issue 23).

Unit tests (a hand-moved clock, a fake outbox): the renewal schedule sends a
lease at its period and takes along every lease due within a quarter of its
own; what ``send_keepalives`` puts on the wire with and without the
coordinator's announcement (secrets per entry in a batch, on the message for
a single keepalive; batches split at the limit); acks in a
LeaseKeepAliveAcks moving each lease's deadline from its own send time.
Against a real coordinator and etcd: a client holding three leases of
different TTLs renews them with batched messages (the coordinator's
``fencepost_keepalive_batch_size``) and keeps its holds over several TTLs;
against a coordinator that does not announce batches it sends single
keepalives only.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fencepost.client import AsyncLockClient
from fencepost.client._leases.calls import CALLS_METADATA, Outbox
from fencepost.client._leases.lease import Lease
from fencepost.client._leases.renewals import EARLY, Renewals
from fencepost.client.v1 import lock_pb2 as pb
from fencepost.client.v1.keys import MAX_KEEPALIVES_PER_BATCH
from fencepost.coordinator.api import keepalive as coordinator_keepalive
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.process.embedded import EmbeddedEtcd

from .client_fakes import FakeClock, Parts
from .metrics_scrape import scrape

WITH_BATCHES = ((CALLS_METADATA, "acquire,release,withdraw,keepalives"),)
WITHOUT_BATCHES = ((CALLS_METADATA, "acquire,release,withdraw"),)


# ---------------------------------------------------------------- unit: the schedule


def test_renewals_when_leases_of_other_ttls_come_close() -> None:
    """A lease is due one period after its last send; leases due within a quarter of their own period go
    along (early), the others wait; a lost lease is forgotten."""
    clock = FakeClock(0.0)
    sent: list[list[int]] = []
    renewals = Renewals(clock, 1 / 3, lambda leases: sent.append([lease.lease_id for lease in leases]))
    a, b, c = (Lease(i, ttl, 0.0, clock=clock) for i, ttl in ((1, 3), (2, 6), (3, 12)))  # periods 1, 2, 4 s
    for lease in (a, b, c):
        renewals.add(lease)
    assert renewals.due(0.0) == [a, b, c] and renewals.delay(0.0) == 0.0
    renewals.renewed([a, b, c], 0.0)
    assert renewals.delay(0.0) == pytest.approx(1.0) and renewals.due(0.7) == []
    assert renewals.due(1.0) == [a]  # b is due at 2.0: 1 s away, more than a quarter of its 2 s period
    renewals.renewed([a], 1.0)
    assert renewals.due(2.0) == [a, b]  # both due at 2.0
    renewals.renewed([a, b], 2.0)
    assert renewals.due(3.0) == [a, c]  # c is due at 4.0: within a quarter of its 4 s period (1 s)
    renewals.renewed([a, c], 3.0)
    assert renewals.delay(3.0) == pytest.approx(1.0)  # a at 4.0 (b at 4.0, c at 7.0)
    assert renewals.due(4.0) == [a, b]
    b.mark_lost("LEASE_EXPIRED")
    assert renewals.due(4.0) == [a] and renewals.delay(5.0) == 0.0


async def test_renewals_run_sends_due_leases_in_one_go() -> None:
    """The one task sends the leases due together in one call, never sooner than a period allows (real time,
    short TTLs; it waits for the fourth send, not for a time)."""
    loop = asyncio.get_running_loop()
    sent: list[tuple[float, list[int]]] = []
    fourth = asyncio.Event()

    def send(leases: list[Lease]) -> None:
        sent.append((loop.time(), [lease.lease_id for lease in leases]))
        if len(sent) >= 4:
            fourth.set()

    renewals = Renewals(loop.time, 0.1, send)
    a, b = Lease(1, 1, loop.time(), clock=loop.time), Lease(2, 1, loop.time(), clock=loop.time)  # periods 0.1 s
    renewals.add(a)
    renewals.add(b)
    task = asyncio.ensure_future(renewals.run())
    try:
        await asyncio.wait_for(fourth.wait(), 10)
    finally:
        renewals.stop()
        await asyncio.wait_for(task, 5)
    assert all(ids == [1, 2] for _, ids in sent), sent
    gaps = [later - earlier for (earlier, _), (later, _) in zip(sent, sent[1:])]
    assert min(gaps) >= 0.1 * (1 - EARLY) - 1e-3, gaps  # a renewal at most a quarter period early


# ---------------------------------------------------------------- unit: the wire form


def announced(parts: Parts, metadata: Any) -> Outbox:
    outbox: Outbox = asyncio.Queue()
    parts.stream.outbox = outbox
    parts.stream.calls.opened(outbox)
    parts.stream.calls.announced(outbox, metadata)
    return outbox


def drained(outbox: Outbox) -> list[pb.KeepAliveRequest]:
    messages = [outbox.get_nowait() for _ in range(outbox.qsize())]
    assert None not in messages
    return messages  # type: ignore[return-value]


async def test_send_keepalives_when_the_coordinator_serves_batches() -> None:
    """Several leases go as one ``keepalives`` message, each entry with its own secret and request id; one
    lease alone goes as a ``keepalive`` with the secret on the message, as before."""
    parts = Parts()
    leases = [Lease(77 + i, 10, 0.0, clock=parts.clock, secret=f"s{i}") for i in range(3)]
    outbox = announced(parts, WITH_BATCHES)
    parts.stream.send_keepalives(leases)
    parts.stream.send_keepalives(leases[:1])
    first, second = drained(outbox)
    assert first.WhichOneof("request") == "keepalives" and not first.lease_secret
    entries = first.keepalives.keepalives
    assert [(e.lease_id, e.lease_secret) for e in entries] == [(77, "s0"), (78, "s1"), (79, "s2")]
    assert {e.request_id: parts.stream.pending[e.request_id][0] for e in entries} == {
        e.request_id: lease for e, lease in zip(entries, leases)}
    assert second.WhichOneof("request") == "keepalive" and second.lease_secret == "s0"
    assert not second.keepalive.lease_secret


async def test_send_keepalives_when_the_coordinator_does_not_serve_batches() -> None:
    """Without ``keepalives`` in the announcement (or before it), each lease is a ``keepalive`` of its own."""
    for metadata in (WITHOUT_BATCHES, ()):
        parts = Parts()
        leases = [Lease(77 + i, 10, 0.0, clock=parts.clock, secret=f"s{i}") for i in range(3)]
        outbox = announced(parts, metadata)
        parts.stream.send_keepalives(leases)
        messages = drained(outbox)
        assert [(m.WhichOneof("request"), m.keepalive.lease_id, m.lease_secret) for m in messages] == [
            ("keepalive", 77, "s0"), ("keepalive", 78, "s1"), ("keepalive", 79, "s2")]


async def test_send_keepalives_splits_at_the_limit() -> None:
    """More leases than a batch may hold go as several batches of at most MAX_KEEPALIVES_PER_BATCH."""
    parts = Parts()
    leases = [Lease(1000 + i, 10, 0.0, clock=parts.clock) for i in range(MAX_KEEPALIVES_PER_BATCH + 2)]
    outbox = announced(parts, WITH_BATCHES)
    parts.stream.send_keepalives(leases)
    assert [len(m.keepalives.keepalives) for m in drained(outbox)] == [MAX_KEEPALIVES_PER_BATCH, 2]


async def test_dispatch_when_acks_come_together() -> None:
    """Each ack of a LeaseKeepAliveAcks is applied as a single one: by request id, each lease's deadline from
    its own keepalive's send time; one with ttl 0 loses only its lease."""
    parts = Parts(FakeClock(0.0))
    a, b, c = (parts.lease(lease_id=i, ttl=ttl) for i, ttl in ((1, 10), (2, 20), (3, 30)))
    announced(parts, WITH_BATCHES)
    parts.clock.now = 2.0
    parts.stream.send_keepalives([a])
    parts.clock.now = 4.0
    parts.stream.send_keepalives([b, c])
    ids = {lease.lease_id: rid for rid, (lease, _) in parts.stream.pending.items()}
    parts.clock.now = 5.0
    parts.stream.dispatch(pb.KeepAliveResponse(keepalives=pb.LeaseKeepAliveAcks(acks=[
        pb.LeaseKeepAliveAck(lease_id=1, request_id=ids[1], ttl_seconds=10),
        pb.LeaseKeepAliveAck(lease_id=2, request_id=ids[2], ttl_seconds=20),
        pb.LeaseKeepAliveAck(lease_id=3, request_id=ids[3], ttl_seconds=0)])))
    assert a.deadline == pytest.approx(2.0 + 10 - 1.0) and b.deadline == pytest.approx(4.0 + 20 - 1.0)
    assert c.lost_reason == "LEASE_EXPIRED" and not a.lost and not b.lost and parts.stream.pending == {}


# ---------------------------------------------------------------- against a real coordinator


async def batch_sizes(coord: Coordinator) -> tuple[float, float, float]:
    """The coordinator's ``fencepost_keepalive_batch_size``: (messages, leases renewed, messages of one lease)."""
    metrics = await scrape(coord.metrics_address)
    count = metrics.value("fencepost_keepalive_batch_size_count") or 0.0
    total = metrics.value("fencepost_keepalive_batch_size_sum") or 0.0
    single = metrics.value("fencepost_keepalive_batch_size_bucket", le="1.0") or 0.0
    return count, total, single


async def hold_three_leases(coord: Coordinator, seconds: float) -> None:
    """Hold three locks under leases of TTL 2, 3 and 4 s for ``seconds``; every hold stays valid."""
    async with AsyncLockClient(coord.address) as client:
        handles = [await client.acquire(f"batch-{ttl}", ttl=float(ttl), timeout=5.0) for ttl in (2, 3, 4)]
        assert len({h.lease_id for h in handles}) == 3
        await asyncio.sleep(seconds)  # a measurement of renewals over several TTLs, not a synchronisation
        assert all(h.is_valid() and h.lost_reason is None for h in handles), [h.lost_reason for h in handles]
        for h in handles:
            await h.release()


async def test_a_client_renews_leases_of_three_ttls_in_batches(etcd: EmbeddedEtcd, prefix: str) -> None:
    """Three leases (TTL 2, 3, 4 s) held 8 s: the coordinator saw keepalive messages of several leases, fewer
    messages than leases renewed, and every hold stayed valid."""
    coord = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix, metrics_listen="127.0.0.1:0")
    await asyncio.wait_for(coord.start(), 20)
    try:
        await hold_three_leases(coord, 8.0)
        messages, leases, single = await batch_sizes(coord)
    finally:
        await asyncio.wait_for(coord.stop(grace=0), 20)
    # Unbatched, 8 s take about 8/0.67 + 8/1 + 8/1.33 = 26 messages for 26 renewals (measured batched: 19 for 30).
    assert leases >= 20, (messages, leases)
    assert messages - single >= 2 and leases > messages, (messages, leases, single)


async def test_a_client_sends_single_keepalives_when_batches_are_not_announced(
        etcd: EmbeddedEtcd, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A coordinator that announces the calls but not ``keepalives`` (as one before batches did) gets one
    lease per message, and the holds stay valid."""
    monkeypatch.setattr(coordinator_keepalive, "CALLS_METADATA", WITHOUT_BATCHES[0])
    coord = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix, metrics_listen="127.0.0.1:0")
    await asyncio.wait_for(coord.start(), 20)
    try:
        await hold_three_leases(coord, 5.0)
        messages, leases, single = await batch_sizes(coord)
    finally:
        await asyncio.wait_for(coord.stop(grace=0), 20)
    assert messages >= 10 and single == messages == leases, (messages, leases, single)
