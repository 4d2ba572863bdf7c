"""Unit tests of the keepalive stream's dispatch and of release classification, over a fake transport.

Behaviour against a real coordinator is tested elsewhere (test_locks.py, tests/faults/).
"""

from __future__ import annotations

import asyncio

import pytest

import fencepost.client as fc
from fencepost.client.errors import REASON_DEADLINE, from_rpc_error
from fencepost.client.v1 import lock_pb2 as pb
from fencepost.client.v1.details import ErrorReason, reason_name

from .client_fakes import (
    NOT_HOLDER,
    LEASE_EXPIRED,
    FakeClock,
    next_call,
    failed_call,
    join_callbacks,
    Parts,
    ack,
    hold_ended,
)


# ---------------------------------------------------------------- the stream's dispatch


async def test_dispatch_when_ack_matches_its_request_id() -> None:
    """An ack extends the lease from its own keepalive's send time; unknown or mismatched request ids are ignored."""
    parts = Parts(FakeClock(0.0))
    lease = parts.lease()
    parts.stream.outbox = asyncio.Queue()
    parts.clock.now = 4.0
    parts.stream.send_keepalives([lease])
    (request_id,) = parts.stream.pending
    parts.clock.now = 6.0
    parts.stream.dispatch(ack(request_id + 1))
    parts.stream.dispatch(ack(request_id, lease_id=78))  # another lease's answer under this id: dropped
    assert lease.deadline == pytest.approx(9.0)
    parts.stream.send_keepalives([lease])
    (request_id,) = parts.stream.pending
    parts.stream.dispatch(ack(request_id))
    assert lease.deadline == pytest.approx(15.0)
    assert parts.stream.pending == {} and not lease.lost


async def test_dispatch_when_ack_says_lease_is_gone() -> None:
    """An ack with ttl 0 loses the lease and its holds with LEASE_EXPIRED, exactly once."""
    parts = Parts()
    lease = parts.lease()
    handle = parts.hold(lease)
    calls: list[str | None] = []
    handle.on_lost(lambda h: calls.append(h.lost_reason))
    parts.stream.outbox = asyncio.Queue()
    parts.stream.send_keepalives([lease])
    parts.stream.send_keepalives([lease])
    first, second = parts.stream.pending
    parts.stream.dispatch(ack(first, ttl_seconds=0))
    parts.stream.dispatch(ack(second, ttl_seconds=0))
    join_callbacks()
    assert calls == [LEASE_EXPIRED]
    assert lease.lost_reason == LEASE_EXPIRED and parts.pool.get(77) is None


async def test_send_keepalives_when_no_stream_is_open() -> None:
    """Without a stream, a keepalive is dropped and nothing waits for an answer (the reconnect resends)."""
    parts = Parts()
    parts.stream.send_keepalives([parts.lease()])
    assert parts.stream.pending == {}


@pytest.mark.parametrize(
    ("ttls", "lost", "ceiling"),
    [
        ((), (), 2.0),  # no lease: the backoff's own cap
        ((60,), (), 2.0),  # long TTLs: the cap
        ((4,), (), 4 / 3 / 2),  # T = 4 s: half its keepalive period
        ((60, 4, 9), (), 4 / 3 / 2),  # the shortest live lease counts
        ((60, 4), (4,), 2.0),  # ... but not a lost one
        ((1,), (), 1 / 6),
    ],
)
async def test_reconnect_ceiling_when_leases_are_short(ttls: tuple[int, ...], lost: tuple[int, ...],
                                                       ceiling: float) -> None:
    """The stream retries within half the shortest live lease's keepalive period, at most every 2 s."""
    parts = Parts()
    for i, ttl in enumerate(ttls):
        lease = parts.lease(lease_id=100 + i, ttl=ttl)
        if ttl in lost:
            lease.mark_lost("LEASE_EXPIRED")
    assert parts.stream.reconnect_ceiling() == pytest.approx(ceiling)


async def test_resend_all_when_a_stream_opens() -> None:
    """A new stream gets one keepalive per live lease and one watch per live hold."""
    parts = Parts()
    lease = parts.lease()
    parts.hold(lease, "a", 5)
    parts.hold(lease, "b", 6)
    parts.stream.outbox = outbox = asyncio.Queue()
    parts.stream.resend_all()
    sent = [outbox.get_nowait() for _ in range(outbox.qsize())]
    assert [m.WhichOneof("request") for m in sent] == ["keepalive", "watch", "watch"]
    assert {(m.watch.name, m.watch.lease_id, m.watch.token) for m in sent[1:]} == {("a", 77, 5), ("b", 77, 6)}


async def test_dispatch_when_hold_ended_names_name_lease_and_token() -> None:
    """A HoldEnded loses only the hold with that (name, lease id, token); other grants are untouched."""
    parts = Parts()
    lease = parts.lease()
    a, b = parts.hold(lease, "a", 5), parts.hold(lease, "b", 6)
    parts.stream.dispatch(hold_ended("a", 4))  # an older grant of "a"
    parts.stream.dispatch(hold_ended("a", 5, lease_id=78))  # another lease
    parts.stream.dispatch(hold_ended("c", 5))  # a lock this lease does not hold
    assert not a.lost.is_set() and not b.lost.is_set()
    parts.stream.dispatch(hold_ended("a", 5))
    assert a.lost_reason == NOT_HOLDER and not b.lost.is_set() and not lease.lost
    assert parts.pool.holds() == [b]


async def test_dispatch_when_hold_ended_says_lease_expired() -> None:
    """A HoldEnded with LEASE_EXPIRED loses the whole lease, and every hold under it."""
    parts = Parts()
    lease = parts.lease()
    a, b = parts.hold(lease, "a", 5), parts.hold(lease, "b", 6)
    parts.stream.dispatch(hold_ended("a", 5, ErrorReason.LEASE_EXPIRED))
    assert (a.lost_reason, b.lost_reason, lease.lost_reason) == (LEASE_EXPIRED,) * 3


@pytest.mark.parametrize("reason", [ErrorReason.ERROR_REASON_UNSPECIFIED, 999])
async def test_dispatch_when_hold_ended_reason_is_unset_or_unknown(reason: int) -> None:
    """A HoldEnded without a reason, or with one newer than this client, ends the hold as NOT_HOLDER."""
    parts = Parts()
    handle = parts.hold(parts.lease())
    parts.stream.dispatch(hold_ended("a", 5, reason))
    assert handle.lost_reason == NOT_HOLDER


async def test_dispatch_when_every_loss_path_fires() -> None:
    """HoldEnded, a ttl 0 ack and the deadline all firing still lose each hold exactly once, with the first reason."""
    parts = Parts()
    lease = parts.lease()
    a, b = parts.hold(lease, "a", 5), parts.hold(lease, "b", 6)
    calls: list[tuple[str, str | None]] = []
    for h in (a, b):
        h.on_lost(lambda h: calls.append((h.name, h.lost_reason)))
    parts.stream.outbox = asyncio.Queue()
    parts.stream.send_keepalives([lease])
    (request_id,) = parts.stream.pending
    parts.stream.dispatch(hold_ended("a", 5))
    parts.stream.dispatch(ack(request_id, ttl_seconds=0))
    parts.pool.lose(lease, REASON_DEADLINE)
    parts.stream.dispatch(hold_ended("b", 6, ErrorReason.LEASE_EXPIRED))
    join_callbacks()
    assert sorted(calls) == [("a", NOT_HOLDER), ("b", LEASE_EXPIRED)]
    assert lease.lost_reason == LEASE_EXPIRED


# ---------------------------------------------------------------- release classification


async def test_release_when_server_confirms() -> None:
    """A confirmed Release marks the handle released, frees the slot for the next local acquire, and unwatches."""
    parts = Parts()
    handle = await parts.acquire("a", token=5)
    parts.stream.outbox = outbox = asyncio.Queue()
    releasing = asyncio.ensure_future(handle.release())
    request, reply = await next_call(parts.transport, "Release")
    assert (request.name, request.lease_id, request.token) == ("a", 77, 5)
    reply.set_result(pb.ReleaseResponse(revision=9))
    await releasing
    assert handle.released and not handle.lost.is_set() and parts.pool.holds() == []
    assert outbox.get_nowait().WhichOneof("request") == "unwatch"
    again = await parts.acquire("a", token=6, grant=False)
    assert again.token == 6


@pytest.mark.parametrize(
    ("refusal", "lease_lost"),
    [(ErrorReason.NOT_HOLDER, False), (ErrorReason.STALE_TOKEN, False), (ErrorReason.LEASE_EXPIRED, True)],
)
async def test_release_when_server_refuses(refusal: int, lease_lost: bool) -> None:
    """A refused Release raises, loses the hold with the server's reason, and loses the lease for LEASE_EXPIRED."""
    parts = Parts()
    handle = await parts.acquire("a")
    other = await parts.acquire("b", grant=False)
    releasing = asyncio.ensure_future(handle.release())
    _, reply = await next_call(parts.transport, "Release")
    reply.set_exception(from_rpc_error(failed_call(refusal), name="a", lease_id=77, token=5))
    with pytest.raises(fc.FencepostError) as info:
        await releasing
    assert info.value.reason == reason_name(refusal)
    assert handle.released and handle.lost_reason == reason_name(refusal)
    assert other.lost.is_set() is lease_lost


async def test_release_when_cancelled_in_flight() -> None:
    """A release cancelled before the server answered goes on: the hold stays until the answer, never lost."""
    parts = Parts()
    handle = await parts.acquire("a")
    releasing = asyncio.ensure_future(handle.release())
    _, reply = await next_call(parts.transport, "Release")
    releasing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await releasing
    assert not handle.released and not handle.lost.is_set() and parts.pool.holds() == [handle]
    again = asyncio.ensure_future(handle.release())  # waits for the same call: no second Release is sent
    await asyncio.sleep(0)
    reply.set_result(pb.ReleaseResponse())
    await again
    assert handle.released and not handle.lost.is_set()
    assert parts.transport.calls.empty()


async def test_release_when_hold_ended_arrives_while_in_flight() -> None:
    """A HoldEnded during the Release is left to it: if the answer is lost, the hold counts as released, not lost."""
    parts = Parts()
    handle = await parts.acquire("a")
    releasing = asyncio.ensure_future(handle.release())
    _, reply = await next_call(parts.transport, "Release")
    parts.stream.dispatch(hold_ended("a", 5))  # most likely this very Release
    assert not handle.lost.is_set() and not handle.released
    reply.set_exception(fc.Unavailable("connection closed during the call"))
    with pytest.raises(fc.Unavailable):
        await releasing
    assert handle.released and not handle.lost.is_set()


async def test_release_when_lease_expired_arrives_while_in_flight() -> None:
    """A LEASE_EXPIRED HoldEnded during a Release whose answer is lost loses the lease and its other holds."""
    parts = Parts()
    handle = await parts.acquire("a")
    other = await parts.acquire("b", grant=False)
    releasing = asyncio.ensure_future(handle.release())
    _, reply = await next_call(parts.transport, "Release")
    parts.stream.dispatch(hold_ended("a", 5, ErrorReason.LEASE_EXPIRED))
    reply.set_exception(fc.Unavailable("connection closed during the call"))
    with pytest.raises(fc.Unavailable):
        await releasing
    assert handle.lost_reason == LEASE_EXPIRED and other.lost_reason == LEASE_EXPIRED


async def test_release_when_hold_was_lost_to_the_deadline() -> None:
    """Releasing a hold lost to its local deadline raises LeaseLost at once and still sends a Release."""
    parts = Parts()
    handle = await parts.acquire("a")
    lease = parts.pool.get(handle.lease_id)
    assert lease is not None
    parts.pool.lose(lease, REASON_DEADLINE)
    with pytest.raises(fc.LeaseLost) as info:
        await handle.release()
    assert info.value.reason == REASON_DEADLINE and handle.released
    request, reply = await next_call(parts.transport, "Release")
    assert request.token == 5
    reply.set_exception(from_rpc_error(failed_call(ErrorReason.NOT_HOLDER)))
    await asyncio.gather(*parts.tasks)


async def test_release_when_already_released() -> None:
    """A second release raises NotHolder without a call."""
    parts = Parts()
    handle = await parts.acquire("a")
    releasing = asyncio.ensure_future(handle.release())
    _, reply = await next_call(parts.transport, "Release")
    reply.set_result(pb.ReleaseResponse())
    await releasing
    with pytest.raises(fc.NotHolder):
        await handle.release()
    assert parts.transport.calls.empty()
