"""Batched keepalives on the KeepAlive stream, coordinator side (issue 23): raw stubs, a real coordinator, a real etcd.

A ``keepalives`` message (LeaseKeepAlives) is served as N keepalives of
their own: one ack per entry with its request id, the entry's secret (else
the message's) checked, a foreign lease refusing the stream as a single
keepalive does, a gone lease answered with ttl <= 0. Acks ready together go
as one LeaseKeepAliveAcks only on a stream that sent a batch; more than
MAX_KEEPALIVES_PER_BATCH entries refuse the stream (INVALID_ARGUMENT naming
``keepalives``). The merging itself is also tested without gRPC
(:class:`~fencepost.coordinator.api.outbox.StreamOutbox`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from fencepost.client.v1 import lock_pb2, lock_pb2_grpc
from fencepost.client.v1.keys import MAX_KEEPALIVES_PER_BATCH
from fencepost.coordinator.api.outbox import StreamOutbox

from .conftest import assert_invalid_field
from .owned_stub import SECRETS, OwnedStub
from .test_ownership import assert_denied


async def grant(stub: OwnedStub, ttl: int = 30) -> int:
    return (await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=ttl), timeout=5)).lease_id


def batch(*entries: tuple[int, int], secrets: bool = True, secret: str = "") -> lock_pb2.KeepAliveRequest:
    """A ``keepalives`` message of (lease id, request id) entries, each with its lease's secret when ``secrets``."""
    return lock_pb2.KeepAliveRequest(lease_secret=secret, keepalives=lock_pb2.LeaseKeepAlives(keepalives=[
        lock_pb2.LeaseKeepAlive(lease_id=lease, request_id=rid, lease_secret=SECRETS.get(lease, "") if secrets else "")
        for lease, rid in entries]))


def acks_of(response: lock_pb2.KeepAliveResponse) -> list[lock_pb2.LeaseKeepAliveAck]:
    """The acks one response carries (one for ``keepalive``, several for ``keepalives``)."""
    kind = response.WhichOneof("response")
    assert kind in ("keepalive", "keepalives"), response
    return [response.keepalive] if kind == "keepalive" else list(response.keepalives.acks)


async def read_by_request_id(stream: Any, count: int, items_of: Callable[[lock_pb2.KeepAliveResponse], list[Any]]
                             ) -> tuple[dict[int, Any], list[str]]:
    """Read responses until ``count`` items (``items_of`` each) came: (request id -> item, each response's kind)."""
    items: dict[int, Any] = {}
    kinds = []
    while len(items) < count:
        response = await asyncio.wait_for(stream.read(), 10)
        kinds.append(response.WhichOneof("response"))
        for item in items_of(response):
            assert item.request_id not in items, f"request id {item.request_id} answered twice"
            items[item.request_id] = item
    return items, kinds


async def read_acks(stream: Any, count: int) -> tuple[dict[int, lock_pb2.LeaseKeepAliveAck], list[str]]:
    """Read responses until ``count`` acks came: (request id -> ack, the kind of each response)."""
    return await read_by_request_id(stream, count, acks_of)


async def test_a_batch_is_answered_one_ack_per_lease(stub: OwnedStub) -> None:
    """A batch of 3 leases: one ack per entry, each with its request id, its lease and a TTL > 0."""
    leases = [await grant(stub, ttl) for ttl in (10, 20, 30)]
    stream = stub.KeepAlive()
    await stream.write(batch(*((lease, 100 + i) for i, lease in enumerate(leases))))
    acks, _ = await read_acks(stream, 3)
    assert sorted(acks) == [100, 101, 102]
    for i, lease in enumerate(leases):
        assert acks[100 + i].lease_id == lease and 0 < acks[100 + i].ttl_seconds <= (10, 20, 30)[i]
    stream.cancel()


async def test_the_stream_announces_batches(stub: OwnedStub) -> None:
    """The initial metadata lists ``keepalives`` beside the calls, before any message is sent."""
    stream = stub.KeepAlive()
    metadata = dict(await asyncio.wait_for(stream.initial_metadata(), 10))
    assert "keepalives" in metadata["fencepost-stream-calls"].split(",")
    stream.cancel()


async def test_acks_are_merged_only_on_a_stream_that_sent_a_batch(stub: OwnedStub) -> None:
    """400 keepalives in two batches come back in fewer than 400 messages (acks ready together merged);
    the same 400 as single keepalives on another stream come back as 400 single acks."""
    leases = [await grant(stub) for _ in range(4)]
    n = 400
    entries = [(leases[i % 4], i + 1) for i in range(n)]
    batched = stub.KeepAlive()
    await batched.write(batch(*entries[:n // 2]))
    await batched.write(batch(*entries[n // 2:]))
    acks, kinds = await read_acks(batched, n)
    assert sorted(acks) == list(range(1, n + 1)) and all(ack.ttl_seconds > 0 for ack in acks.values())
    assert "keepalives" in kinds and len(kinds) < n, f"{len(kinds)} messages for {n} acks"
    batched.cancel()

    single = stub.KeepAlive()
    for lease, rid in entries:
        await single.write(lock_pb2.KeepAliveRequest(keepalive=lock_pb2.LeaseKeepAlive(lease_id=lease, request_id=rid)))
    acks, kinds = await read_acks(single, n)
    assert sorted(acks) == list(range(1, n + 1))
    assert set(kinds) == {"keepalive"} and len(kinds) == n
    single.cancel()


async def test_a_lease_not_owned_inside_a_batch_refuses_the_stream(stub: OwnedStub, channel: grpc.aio.Channel) -> None:
    """An entry for a lease the caller does not own (no secret) ends the stream with PERMISSION_DENIED /
    NOT_LEASE_OWNER, as a single keepalive does; the owned entries beside it change nothing of that."""
    own, foreign = await grant(stub), await grant(stub)
    stream = lock_pb2_grpc.LockServiceStub(channel).KeepAlive()  # a caller presenting no secret of its own
    await stream.write(lock_pb2.KeepAliveRequest(keepalives=lock_pb2.LeaseKeepAlives(keepalives=[
        lock_pb2.LeaseKeepAlive(lease_id=own, request_id=1, lease_secret=SECRETS[own]),
        lock_pb2.LeaseKeepAlive(lease_id=foreign, request_id=2),
    ])))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        while True:
            acks_of(await asyncio.wait_for(stream.read(), 10))  # the owned entry's ack may come first
    assert_denied(info.value, foreign)


async def test_entries_secrets_are_honoured(stub: OwnedStub, channel: grpc.aio.Channel) -> None:
    """Each entry's own secret serves its lease; an entry without one uses the message's lease_secret."""
    a, b, c = await grant(stub), await grant(stub), await grant(stub)
    stream = lock_pb2_grpc.LockServiceStub(channel).KeepAlive()  # no secret added by the stub
    await stream.write(lock_pb2.KeepAliveRequest(lease_secret=SECRETS[c], keepalives=lock_pb2.LeaseKeepAlives(
        keepalives=[lock_pb2.LeaseKeepAlive(lease_id=a, request_id=1, lease_secret=SECRETS[a]),
                    lock_pb2.LeaseKeepAlive(lease_id=b, request_id=2, lease_secret=SECRETS[b]),
                    lock_pb2.LeaseKeepAlive(lease_id=c, request_id=3)])))
    acks, _ = await read_acks(stream, 3)
    assert {rid: (ack.lease_id, ack.ttl_seconds > 0) for rid, ack in acks.items()} == {
        1: (a, True), 2: (b, True), 3: (c, True)}
    # A single keepalive may carry the secret inside its LeaseKeepAlive too (on a new stream: checked again).
    again = lock_pb2_grpc.LockServiceStub(channel).KeepAlive()
    await again.write(lock_pb2.KeepAliveRequest(
        keepalive=lock_pb2.LeaseKeepAlive(lease_id=a, request_id=9, lease_secret=SECRETS[a])))
    assert (await asyncio.wait_for(again.read(), 10)).keepalive.ttl_seconds > 0
    for s in (stream, again):
        s.cancel()


async def test_a_batch_over_the_limit_refuses_the_stream(stub: OwnedStub) -> None:
    """More than MAX_KEEPALIVES_PER_BATCH entries end the stream with INVALID_ARGUMENT naming ``keepalives``;
    a full batch is served."""
    lease = await grant(stub)
    stream = stub.KeepAlive()
    await stream.write(batch(*((lease, i + 1) for i in range(MAX_KEEPALIVES_PER_BATCH))))
    acks, _ = await read_acks(stream, MAX_KEEPALIVES_PER_BATCH)
    assert len(acks) == MAX_KEEPALIVES_PER_BATCH
    await stream.write(batch(*((lease, 1000 + i) for i in range(MAX_KEEPALIVES_PER_BATCH + 1))))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await asyncio.wait_for(stream.read(), 10)
    assert_invalid_field(info.value, "keepalives")


async def test_an_unknown_or_gone_lease_in_a_batch_is_answered_ttl_0(stub: OwnedStub) -> None:
    """A revoked lease and an id etcd never granted are each answered with ttl <= 0; the live one beside
    them with ttl > 0; and the stream goes on (an empty batch is answered with nothing)."""
    live, gone = await grant(stub), await grant(stub)
    await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=gone), timeout=5)
    unknown = 0x7F00_0000_0000_0001
    stream = stub.KeepAlive()
    await stream.write(batch())
    await stream.write(batch((live, 1), (gone, 2), (unknown, 3)))
    acks, _ = await read_acks(stream, 3)
    assert acks[1].ttl_seconds > 0 and acks[2].ttl_seconds <= 0 and acks[3].ttl_seconds <= 0
    assert (acks[2].lease_id, acks[3].lease_id) == (gone, unknown)
    await stream.write(batch((live, 4)))
    acks, _ = await read_acks(stream, 1)
    assert acks[4].ttl_seconds > 0
    stream.cancel()


# ---------------------------------------------------------------- unit: the outbox's merging


async def test_outbox_merges_acks_ready_together_only_when_batched() -> None:
    """Consecutive acks ready together go as one LeaseKeepAliveAcks once batched; any other answer between
    them splits them, and the end comes after what was queued. Not batched: one message per ack."""
    for batched in (False, True):
        outbox = StreamOutbox()
        outbox.batched = batched
        outbox.put_ack(1, 1, 10)
        outbox.put_ack(2, 2, 10)
        outbox.put(lock_pb2.KeepAliveResponse(hold_ended=lock_pb2.HoldEnded(name="x", lease_id=1, token=5)))
        outbox.put_ack(3, 3, 0)
        outbox.end()
        taken = []
        while (response := await outbox.take()) is not None:
            taken.append(response)
        kinds = [r.WhichOneof("response") for r in taken]
        if batched:
            assert kinds == ["keepalives", "hold_ended", "keepalive"]
            assert [(a.lease_id, a.request_id) for a in taken[0].keepalives.acks] == [(1, 1), (2, 2)]
        else:
            assert kinds == ["keepalive", "keepalive", "hold_ended", "keepalive"]
        assert taken[-1].keepalive.ttl_seconds == 0


async def test_outbox_merges_at_most_a_full_batch_and_tells_the_oldest_wait() -> None:
    """At most MAX_KEEPALIVES_PER_BATCH acks per message; a late merged message tells on_late once."""
    late: list[float] = []
    outbox = StreamOutbox(on_late=late.append)
    outbox.batched = True
    for i in range(MAX_KEEPALIVES_PER_BATCH + 3):
        outbox.put_ack(7, i, 10)
    await asyncio.sleep(0.06)  # longer than LATE_SECONDS
    first, second = await outbox.take(), await outbox.take()
    assert first is not None and second is not None
    assert (len(first.keepalives.acks), len(second.keepalives.acks)) == (MAX_KEEPALIVES_PER_BATCH, 3)
    assert len(late) == 2 and min(late) > 0.05
