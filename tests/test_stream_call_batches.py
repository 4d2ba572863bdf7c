"""Batched calls on the KeepAlive stream (issue 23): ``calls`` in, ``answers`` out.

Coordinator side, raw stubs on a real coordinator and etcd: each entry of a
``calls`` message is served as its single call would be (grants, a
``failed`` entry with the unary call's status, a ``cancel`` in the same
batch, an entry with no call), more than MAX_CALLS_PER_BATCH entries refuse
the stream (INVALID_ARGUMENT naming ``calls``), and answers ready together
go as one ``answers`` message only on a stream that sent a batch. Client
side: the calls queued together go as one ``calls`` message (:func:`drain`,
unit), batched answers are delivered to their calls, a coordinator that does
not announce ``calls`` gets one message per call, and 64 concurrent
acquires of an AsyncLockClient reach the coordinator in fewer than 64
messages (its ``fencepost_stream_call_batch_size``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from fencepost.client import AsyncLockClient
from fencepost.client._leases.calls import CALLS_METADATA, CallEntry, Outbox, StreamCalls, drain
from fencepost.client.v1 import lock_pb2 as pb
from fencepost.client.v1 import lock_pb2_grpc
from fencepost.client.v1.keys import MAX_CALLS_BATCH_BYTES, MAX_CALLS_PER_BATCH
from fencepost.coordinator.api import keepalive as coordinator_keepalive
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.process.embedded import EmbeddedEtcd

from .conftest import assert_invalid_field, describe, describe_waiters_is, wait_for
from .metrics_scrape import scrape
from .owned_stub import SECRETS, OwnedStub
from .test_keepalive_batches import read_by_request_id
from .test_stream_calls import reason_of, unary_reason

WITH_BATCHES = ((CALLS_METADATA, "acquire,release,withdraw,keepalives,calls"),)
WITHOUT_BATCHES = ((CALLS_METADATA, "acquire,release,withdraw,keepalives"),)
ANSWERS = ("acquired", "released", "withdrawn", "failed")


async def grant(stub: OwnedStub, ttl: int = 30) -> int:
    return (await stub.LeaseGrant(pb.LeaseGrantRequest(ttl_seconds=ttl), timeout=5)).lease_id


def entry(request_id: int, kind: str, message: Any, **fields: Any) -> pb.StreamCall:
    """A StreamCall carrying ``message`` as ``kind``, with its lease's secret (unless given)."""
    fields.setdefault("lease_secret", SECRETS.get(getattr(message, "lease_id", 0), ""))
    return pb.StreamCall(request_id=request_id, **{kind: message}, **fields)


def batch(*entries: pb.StreamCall) -> pb.KeepAliveRequest:
    return pb.KeepAliveRequest(calls=pb.StreamCalls(calls=entries))


def answers_of(response: pb.KeepAliveResponse) -> list[Any]:
    """The answers one response carries (itself for a single answer, its entries for ``answers``)."""
    kind = response.WhichOneof("response")
    assert kind in (*ANSWERS, "answers"), response
    return list(response.answers.answers) if kind == "answers" else [response]


async def read_answers(stream: Any, count: int) -> tuple[dict[int, Any], list[str]]:
    """Read responses until ``count`` answers came: (request id -> answer, the kind of each response)."""
    return await read_by_request_id(stream, count, answers_of)


# ---------------------------------------------------------------- the coordinator


async def test_the_stream_announces_call_batches(stub: OwnedStub) -> None:
    """The initial metadata lists ``calls`` beside the calls and ``keepalives``."""
    stream = stub.KeepAlive()
    metadata = dict(await asyncio.wait_for(stream.initial_metadata(), 10))
    assert "calls" in metadata["fencepost-stream-calls"].split(",")
    stream.cancel()


async def test_a_batch_is_answered_per_entry_as_its_single_calls(stub: OwnedStub) -> None:
    """Two grants, a release with a stale token, an acquire with no name, an entry with no call: each entry is
    answered by its request id, the failures with the status their unary calls end with; the grants hold."""
    lease = await grant(stub)
    stream = stub.KeepAlive()
    await stream.write(batch(entry(1, "acquire", pb.AcquireRequest(name="b1", lease_id=lease)),
                             entry(2, "acquire", pb.AcquireRequest(name="b2", lease_id=lease), timeout_ms=5000)))
    answers, _ = await read_answers(stream, 2)
    assert answers[1].acquired.acquired and answers[2].acquired.acquired
    token = answers[1].acquired.token
    stale = pb.ReleaseRequest(name="b1", lease_id=lease, token=token - 1)
    nameless = pb.AcquireRequest(name="", lease_id=lease)
    await stream.write(batch(entry(3, "release", stale), entry(4, "acquire", nameless), pb.StreamCall(request_id=5),
                             entry(6, "release", pb.ReleaseRequest(name="b2", lease_id=lease,
                                                                   token=answers[2].acquired.token))))
    answers, _ = await read_answers(stream, 4)
    for request_id, method, message in ((3, "Release", stale), (4, "Acquire", nameless)):
        assert answers[request_id].WhichOneof("response") == "failed"
        with pytest.raises(grpc.aio.AioRpcError) as unary:
            await getattr(stub, method)(message, timeout=5)
        failed = answers[request_id].failed
        assert (failed.code, failed.message, reason_of(failed)) == (
            unary.value.code().value[0], unary.value.details(), unary_reason(unary.value))
    assert answers[5].failed.code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and "call" in answers[5].failed.message
    assert answers[6].WhichOneof("response") == "released"
    held = await describe(stub, "b1")
    assert (held.holder.lease_id, held.holder.token) == (lease, token)
    assert not (await describe(stub, "b2")).held
    stream.cancel()


async def test_a_cancel_in_the_batch_of_its_acquire(stub: OwnedStub) -> None:
    """An acquire that would wait and its ``cancel`` in one batch: the acquire is answered CANCELLED (though
    it never started), and nothing of it waits; a cancel of an acquire of an earlier batch works as well."""
    holder, other = await grant(stub), await grant(stub)
    stream = stub.KeepAlive()
    await stream.write(batch(entry(1, "acquire", pb.AcquireRequest(name="c", lease_id=holder))))
    await read_answers(stream, 1)
    waiting = pb.AcquireRequest(name="c", lease_id=other, wait_forever=True)
    await stream.write(batch(entry(2, "acquire", waiting), entry(0, "cancel", pb.CancelCall(request_id=2))))
    answers, _ = await read_answers(stream, 1)
    assert answers[2].failed.code == grpc.StatusCode.CANCELLED.value[0]
    await stream.write(batch(entry(3, "acquire", waiting)))
    await wait_for(lambda: describe_waiters_is(stub, "c", 1), 10, what="the waiter queued")
    await stream.write(batch(entry(0, "cancel", pb.CancelCall(request_id=3)),
                             entry(4, "withdraw", pb.WithdrawRequest(name="c", lease_id=other))))
    answers, _ = await read_answers(stream, 2)
    assert answers[3].failed.code == grpc.StatusCode.CANCELLED.value[0]
    assert answers[4].WhichOneof("response") == "withdrawn"
    await wait_for(lambda: describe_waiters_is(stub, "c", 0), 10, what="no waiter left")
    stream.cancel()


async def test_a_batch_over_the_limit_refuses_the_stream(stub: OwnedStub) -> None:
    """A full batch (MAX_CALLS_PER_BATCH cancels, unanswered) is served and the stream goes on; one entry more
    ends the stream with INVALID_ARGUMENT naming ``calls``."""
    lease = await grant(stub)
    stream = stub.KeepAlive()
    cancels = [entry(0, "cancel", pb.CancelCall(request_id=i + 1)) for i in range(MAX_CALLS_PER_BATCH)]
    await stream.write(batch(*cancels))
    await stream.write(batch(entry(1, "acquire", pb.AcquireRequest(name="full", lease_id=lease))))
    answers, _ = await read_answers(stream, 1)
    assert answers[1].acquired.acquired
    await stream.write(batch(*cancels, entry(0, "cancel", pb.CancelCall(request_id=9))))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await asyncio.wait_for(stream.read(), 10)
    assert_invalid_field(info.value, "calls")


async def test_answers_are_merged_only_on_a_stream_that_sent_a_batch(stub: OwnedStub) -> None:
    """64 acquires in one batch are answered in fewer than 64 messages (answers ready together merged); the
    same 64 as single messages on another stream (an older client) get 64 single answers."""
    lease = await grant(stub)
    n = 64
    batched = stub.KeepAlive()
    await batched.write(batch(*(entry(i + 1, "acquire", pb.AcquireRequest(name=f"m{i}", lease_id=lease))
                                for i in range(n))))
    answers, kinds = await read_answers(batched, n)
    assert all(a.acquired.acquired for a in answers.values())
    assert "answers" in kinds and len(kinds) < n, f"{len(kinds)} messages for {n} answers"
    batched.cancel()

    single = stub.KeepAlive()
    for i in range(n):
        await single.write(pb.KeepAliveRequest(request_id=i + 1, lease_secret=SECRETS[lease], release=pb.ReleaseRequest(
            name=f"m{i}", lease_id=lease, token=answers[i + 1].acquired.token)))
    released, kinds = await read_answers(single, n)
    assert set(kinds) == {"released"} and len(kinds) == n
    single.cancel()


# ---------------------------------------------------------------- the client, unit


def open_calls(metadata: Any = WITH_BATCHES) -> tuple[StreamCalls, Outbox]:
    calls = StreamCalls()
    outbox: Outbox = asyncio.Queue()
    calls.opened(outbox)
    calls.announced(outbox, metadata)
    return calls, outbox


async def test_calls_queued_together_go_as_one_message() -> None:
    """Five calls started in one turn go as one ``calls`` message with their fields; a keepalive queued after
    them goes next, alone; answers in one ``answers`` message reach each call, a failure as the unary error."""
    calls, outbox = open_calls()
    requests = [pb.AcquireRequest(name=f"n{i}", lease_id=77) for i in range(4)]
    running = [asyncio.ensure_future(calls.call("Acquire", r, timeout=2.0, secret="s", traceparent="00-tp"))
               for r in requests]
    running.append(asyncio.ensure_future(calls.call("Release", pb.ReleaseRequest(name="x", lease_id=77, token=3),
                                                    timeout=None)))
    messages = drain(outbox)
    first = await asyncio.wait_for(anext(messages), 5)  # the drain wakes up after the five have queued
    outbox.put_nowait(pb.KeepAliveRequest(keepalive=pb.LeaseKeepAlive(lease_id=77)))
    second = await asyncio.wait_for(anext(messages), 5)
    assert first.WhichOneof("request") == "calls" and second.WhichOneof("request") == "keepalive"
    entries = list(first.calls.calls)
    assert [e.acquire for e in entries[:4]] == requests and entries[4].release.token == 3
    assert {(e.timeout_ms, e.lease_secret, e.traceparent) for e in entries[:4]} == {(2000, "s", "00-tp")}
    assert len({e.request_id for e in entries}) == 5 and calls.running == 5
    failed = pb.CallFailed(code=grpc.StatusCode.FAILED_PRECONDITION.value[0], message="not the holder")
    answers = pb.KeepAliveResponse(answers=pb.StreamAnswers(answers=[
        *(pb.StreamAnswer(request_id=e.request_id, acquired=pb.AcquireResponse(acquired=True, token=10 + i))
          for i, e in enumerate(entries[:4])),
        pb.StreamAnswer(request_id=entries[4].request_id, failed=failed)]))
    for answer in answers.answers.answers:
        assert calls.answer(answer) is not None
    assert [(await r).token for r in running[:4]] == [10, 11, 12, 13]
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await running[4]
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION and raised.value.details() == "not the holder"
    assert calls.running == 0


async def test_calls_when_the_coordinator_does_not_serve_batches() -> None:
    """Without ``calls`` in the announcement each call is a message of its own, as before."""
    calls, outbox = open_calls(WITHOUT_BATCHES)
    running = [asyncio.ensure_future(calls.call("Acquire", pb.AcquireRequest(name=f"o{i}", lease_id=7), timeout=None))
               for i in range(3)]
    messages = drain(outbox)
    sent = [await asyncio.wait_for(anext(messages), 5) for _ in range(3)]
    assert [m.WhichOneof("request") for m in sent] == ["acquire"] * 3
    calls.ended(outbox)
    for r in running:
        with pytest.raises(grpc.aio.AioRpcError):
            await r


async def test_a_cancelled_acquire_is_cancelled_by_an_entry() -> None:
    """A batched acquire whose caller is cancelled queues a ``cancel`` entry naming it."""
    calls, outbox = open_calls()
    acquiring = asyncio.ensure_future(calls.call("Acquire", pb.AcquireRequest(name="w", lease_id=7), timeout=None))
    sent = await asyncio.wait_for(outbox.get(), 5)
    assert isinstance(sent, CallEntry)
    acquiring.cancel()
    with pytest.raises(asyncio.CancelledError):
        await acquiring
    cancel = await asyncio.wait_for(outbox.get(), 5)
    assert isinstance(cancel, CallEntry) and cancel.fields["cancel"].request_id == sent.fields["request_id"]


async def test_drain_splits_at_the_limits() -> None:
    """At most MAX_CALLS_PER_BATCH entries, and about MAX_CALLS_BATCH_BYTES, in one message; the rest next."""
    outbox: Outbox = asyncio.Queue()
    for i in range(MAX_CALLS_PER_BATCH + 2):
        outbox.put_nowait(CallEntry({"request_id": i + 1, "cancel": pb.CancelCall(request_id=i + 1)}))
    long_name = "x" * 250
    big = [CallEntry({"request_id": i, "lease_secret": "s" * 43, "acquire": pb.AcquireRequest(name=long_name)})
           for i in range(100)]
    for item in (*big, None):
        outbox.put_nowait(item)
    sizes = [(len(m.calls.calls), m.ByteSize()) async for m in drain(outbox)]
    assert sizes[0][0] == MAX_CALLS_PER_BATCH and sum(n for n, _ in sizes[1:]) == 2 + 100
    assert len(sizes) >= 3 and all(size <= MAX_CALLS_BATCH_BYTES for _, size in sizes)  # 100 * ~310 bytes: split


# ---------------------------------------------------------------- the client, against a real coordinator


async def call_messages(coord: Coordinator) -> tuple[float, float]:
    """The coordinator's ``fencepost_stream_call_batch_size``: (messages of calls, calls they carried)."""
    metrics = await scrape(coord.metrics_address)
    return (metrics.value("fencepost_stream_call_batch_size_count") or 0.0,
            metrics.value("fencepost_stream_call_batch_size_sum") or 0.0)


async def concurrent_cycles(etcd: EmbeddedEtcd, prefix: str, n: int) -> tuple[float, float]:
    """``n`` concurrent acquires, then their releases, through one AsyncLockClient on a coordinator of its own:
    the messages of calls and the calls the coordinator received for them."""
    coord = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix, metrics_listen="127.0.0.1:0")
    await asyncio.wait_for(coord.start(), 20)
    try:
        return await _cycles(coord, n)
    finally:
        await asyncio.wait_for(coord.stop(grace=0), 20)


async def _cycles(coord: Coordinator, n: int) -> tuple[float, float]:
    async with AsyncLockClient(coord.address) as client:
        async with client.lock("warm-up", ttl=10, timeout=5):
            pass
        await wait_for(lambda: client._stream.calls.serves("Acquire"), 5, what="stream calls announced")
        before = await call_messages(coord)
        handles = await asyncio.gather(*(client.acquire(f"u{i}", ttl=10, timeout=10) for i in range(n)))
        await asyncio.gather(*(h.release() for h in handles))
        after = await call_messages(coord)
        assert len({h.token for h in handles}) >= 1 and not any(h.is_valid() for h in handles)
    return after[0] - before[0], after[1] - before[1]


async def test_concurrent_acquires_go_in_fewer_messages(etcd: EmbeddedEtcd, prefix: str) -> None:
    """64 concurrent acquires and their 64 releases reach the coordinator in fewer than 64 messages."""
    messages, carried = await concurrent_cycles(etcd, prefix, 64)
    assert carried >= 128 and messages < 64, (messages, carried)


async def test_concurrent_acquires_without_the_announcement_go_one_per_message(
        etcd: EmbeddedEtcd, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A coordinator that does not announce ``calls`` (as one before batches) gets one message per call."""
    monkeypatch.setattr(coordinator_keepalive, "CALLS_METADATA", WITHOUT_BATCHES[0])
    messages, carried = await concurrent_cycles(etcd, prefix, 16)
    assert messages == carried >= 32, (messages, carried)


async def test_a_plain_stub_stream_gets_no_batched_answers(channel: grpc.aio.Channel, stub: OwnedStub) -> None:
    """A stream that never sent ``calls`` (the TypeScript client, an older Python one) is answered one message
    per call even when many answers are ready at once."""
    lease = await grant(stub)
    stream = lock_pb2_grpc.LockServiceStub(channel).KeepAlive()
    for i in range(32):
        await stream.write(pb.KeepAliveRequest(request_id=i + 1, lease_secret=SECRETS[lease],
                                               acquire=pb.AcquireRequest(name=f"p{i}", lease_id=lease)))
    answers, kinds = await read_answers(stream, 32)
    assert set(kinds) == {"acquired"} and all(a.acquired.acquired for a in answers.values())
    stream.cancel()
