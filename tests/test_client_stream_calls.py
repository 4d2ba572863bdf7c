"""The clients send Acquire, Release and Withdraw as messages on their KeepAlive stream (issue 11).

Unit tests (a fake outbox, no server) check :class:`StreamCalls` and the
stream's dispatch: the message sent, the answer or failure returned as the
unary call's error, a stream that ends before the answer, a cancelled or
timed-out acquire (``cancel``), and the watch/unwatch messages a call on the
stream makes unnecessary. The rest run a real coordinator on a real etcd:
a lock cycle makes no unary Acquire or Release (the clients' stubs count
them), every failure maps to the exception class and reason the unary
call gives, a cancelled wait leaves no key, a stream cut in the middle of
an acquire ends in one grant and no leftover key, and ``stream_calls=False``
keeps the calls unary.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import grpc.aio
import pytest
from etcd3aio import Etcd3Client
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from fencepost.client import (
    AsyncLockClient,
    FencepostError,
    LockClient,
    LockHeld,
    LockTimeout,
    LeaseLost,
    NotHolder,
    NotLeaseOwner,
    StaleTokenError,
    Unavailable,
)
from fencepost.client._leases.calls import CALLS_METADATA, Outbox, StreamCalls
from fencepost.client._transport import transport as transport_module
from fencepost.client._leases.lease import Lease
from fencepost.client._recipes.lock import LockRecipe
from fencepost.client.errors import from_rpc_error
from fencepost.client.handle import AsyncLockHandle
from fencepost.client.v1 import details
from fencepost.client.v1 import lock_pb2 as pb
from fencepost.client.v1 import lock_pb2_grpc
from fencepost.client.v1.details import ErrorReason, reason_name
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.process.embedded import EmbeddedEtcd

from .client_fakes import Parts, failed_call
from .conftest import list_keys, wait_for

ANNOUNCED = ((CALLS_METADATA, "acquire,release,withdraw"),)


# ---------------------------------------------------------------- unit: StreamCalls over a fake outbox


def open_calls(enabled: bool = True) -> tuple[StreamCalls, Outbox]:
    """StreamCalls on a new stream (sending to the returned outbox) that announced the three calls."""
    calls = StreamCalls(enabled=enabled)
    outbox: Outbox = asyncio.Queue()
    calls.opened(outbox)
    calls.announced(outbox, ANNOUNCED)
    return calls, outbox


async def sent(outbox: Outbox) -> pb.KeepAliveRequest:
    message = await asyncio.wait_for(outbox.get(), 5)
    assert message is not None
    return message


async def test_serves_when_the_stream_announced_the_calls() -> None:
    """Only a stream that is up and announced the calls in its initial metadata serves them; False when disabled."""
    calls = StreamCalls()
    outbox: Outbox = asyncio.Queue()
    assert not calls.serves("Acquire")  # no stream
    calls.opened(outbox)
    assert not calls.serves("Acquire")  # no initial metadata yet (an older coordinator sends none)
    calls.announced(outbox, (("other", "x"),))
    assert not calls.serves("Acquire")
    calls.announced(outbox, ((CALLS_METADATA, "acquire, release"),))
    assert calls.serves("Acquire") and calls.serves("Release") and not calls.serves("Withdraw")
    calls.announced(asyncio.Queue(), ANNOUNCED)  # a stream that has ended since: ignored
    assert not calls.serves("Withdraw")
    calls.ended(outbox)
    assert not calls.serves("Acquire")
    disabled, _ = open_calls(enabled=False)
    assert not disabled.serves("Acquire")


async def test_call_when_answered() -> None:
    """An acquire goes as one message (request id, timeout_ms, lease secret, traceparent) and returns its answer."""
    calls, outbox = open_calls()
    request = pb.AcquireRequest(name="a", lease_id=77, wait_ms=1500)
    calling = asyncio.ensure_future(calls.call("Acquire", request, timeout=2.5, secret="s3", traceparent="00-tp"))
    message = await sent(outbox)
    assert message.WhichOneof("request") == "acquire" and message.acquire == request
    assert (message.timeout_ms, message.lease_secret, message.traceparent) == (2500, "s3", "00-tp")
    assert calls.running == 1
    assert calls.answer(pb.KeepAliveResponse(request_id=message.request_id + 1000)) is None  # unknown id
    assert calls.answer(pb.KeepAliveResponse(request_id=message.request_id, acquired=pb.AcquireResponse(
        acquired=True, token=9))) == ("Acquire", request)
    assert (await calling).token == 9
    assert calls.running == 0


@pytest.mark.parametrize(("reason", "expected"), [
    (ErrorReason.NOT_HOLDER, NotHolder), (ErrorReason.STALE_TOKEN, StaleTokenError),
    (ErrorReason.NOT_LEASE_OWNER, NotLeaseOwner), (ErrorReason.ACQUIRE_TIMEOUT, LockTimeout)])
async def test_call_when_failed_raises_what_the_unary_call_raises(reason: int, expected: type) -> None:
    """A ``failed`` answer raises an AioRpcError that maps to the unary call's exception, reason and metadata."""
    calls, outbox = open_calls()
    calling = asyncio.ensure_future(calls.call("Release", pb.ReleaseRequest(name="a", lease_id=77, token=5),
                                               timeout=None))
    message = await sent(outbox)
    assert message.timeout_ms == 0
    status = details.status_for(reason, "server said no", {"current_token": "8", "lease_id": "77"})
    (_, status_bytes), = status.trailing_metadata
    calls.answer(pb.KeepAliveResponse(request_id=message.request_id, failed=pb.CallFailed(
        code=status.code.value[0], message=status.details, status=status_bytes)))
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await calling
    mapped = from_rpc_error(raised.value, name="a", lease_id=77, token=5)
    unary = from_rpc_error(failed_call(reason, "server said no", current_token="8", lease_id="77"),
                           name="a", lease_id=77, token=5)
    assert type(mapped) is type(unary) is expected
    assert (mapped.reason, mapped.code, str(mapped)) == (unary.reason, unary.code, str(unary)) == (
        reason_name(reason), status.code, str(unary))
    assert getattr(mapped, "current_token", None) == getattr(unary, "current_token", None)


async def test_call_when_the_stream_ends_before_the_answer() -> None:
    """A call whose stream ends first fails UNAVAILABLE without a reason, as a unary call on a lost connection."""
    calls, outbox = open_calls()
    calling = asyncio.ensure_future(calls.call("Release", pb.ReleaseRequest(name="a", lease_id=77, token=5),
                                               timeout=5))
    await sent(outbox)
    calls.ended(outbox)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await calling
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    mapped = from_rpc_error(raised.value)
    assert type(mapped).__name__ == "Unavailable" and mapped.reason is None
    assert calls.running == 0 and not calls.serves("Release")
    assert outbox.empty()  # no cancel: the stream's end cancelled the call on the coordinator


async def test_acquire_when_its_caller_is_cancelled() -> None:
    """A cancelled waiting acquire is abandoned with a ``cancel`` of its request id; its late answer is dropped."""
    calls, outbox = open_calls()
    calling = asyncio.ensure_future(calls.call("Acquire", pb.AcquireRequest(name="a", lease_id=77,
                                                                            wait_forever=True), timeout=None))
    message = await sent(outbox)
    calling.cancel()
    with pytest.raises(asyncio.CancelledError):
        await calling
    cancel = await sent(outbox)
    assert cancel.WhichOneof("request") == "cancel" and cancel.cancel.request_id == message.request_id
    assert calls.answer(pb.KeepAliveResponse(request_id=message.request_id, failed=pb.CallFailed(
        code=grpc.StatusCode.CANCELLED.value[0]))) is None


async def test_calls_when_their_timeout_passes() -> None:
    """No answer within the timeout: DEADLINE_EXCEEDED as a unary deadline; an acquire is cancelled, a release not."""
    calls, outbox = open_calls()
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await calls.call("Acquire", pb.AcquireRequest(name="a", lease_id=77, wait_ms=10), timeout=0.05)
    assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert type(from_rpc_error(raised.value)) is LockTimeout
    acquire = await sent(outbox)
    assert (await sent(outbox)).cancel.request_id == acquire.request_id
    with pytest.raises(grpc.aio.AioRpcError):
        await calls.call("Release", pb.ReleaseRequest(name="a", lease_id=77, token=5), timeout=0.05)
    assert (await sent(outbox)).WhichOneof("request") == "release"
    assert outbox.empty() and calls.running == 0


def grant_on_stream(parts: Parts, outbox: Outbox) -> None:
    """Answer the acquire waiting in ``outbox`` (as the coordinator would, on the stream)."""
    message = outbox.get_nowait()
    assert message is not None and message.WhichOneof("request") == "acquire"
    parts.stream.dispatch(pb.KeepAliveResponse(request_id=message.request_id, acquired=pb.AcquireResponse(
        acquired=True, token=5)))


async def test_watch_when_granted_on_the_current_stream() -> None:
    """A hold granted on the stream is not watched again there; on the next stream it is (resend_all)."""
    parts = Parts()
    lease = parts.lease()
    outbox: Outbox = asyncio.Queue()
    parts.stream.outbox = outbox
    parts.stream.calls.opened(outbox)
    parts.stream.calls.announced(outbox, ANNOUNCED)
    calling = asyncio.ensure_future(parts.stream.calls.call("Acquire", pb.AcquireRequest(name="a", lease_id=77),
                                                            timeout=5))
    await asyncio.sleep(0)
    grant_on_stream(parts, outbox)
    await calling
    handle = parts.hold(lease, "a", 5)
    parts.stream.watch(handle)
    assert outbox.empty()
    parts.stream.watch(handle)  # a second watch on the same stream (none is made, but it must not be lost)
    assert outbox.get_nowait().WhichOneof("request") == "watch"


async def test_unwatch_when_released_on_the_current_stream() -> None:
    """A release answered on the stream dropped the watch there: no unwatch; a unary release still unwatches."""
    parts = Parts()
    lease = parts.lease()
    handle = parts.hold(lease, "a", 5)
    outbox: Outbox = asyncio.Queue()
    parts.stream.outbox = outbox
    parts.stream.calls.opened(outbox)
    parts.stream.calls.announced(outbox, ANNOUNCED)
    releasing = asyncio.ensure_future(parts.stream.calls.call("Release", pb.ReleaseRequest(
        name="a", lease_id=77, token=5), timeout=5))
    message = await sent(outbox)
    parts.stream.dispatch(pb.KeepAliveResponse(request_id=message.request_id, released=pb.ReleaseResponse()))
    await releasing
    parts.stream.unwatch(handle)
    assert outbox.empty()
    other = parts.hold(lease, "b", 6)
    parts.stream.unwatch(other)
    assert outbox.get_nowait().unwatch.name == "b"


# ---------------------------------------------------------------- a real coordinator and etcd


UnaryCounts = dict[str, int]


@pytest.fixture
def unary_calls(monkeypatch: pytest.MonkeyPatch) -> UnaryCounts:
    """How many unary Acquire, Release and Withdraw calls the clients made during the test (their stub counts)."""
    counts: UnaryCounts = {"Acquire": 0, "Release": 0, "Withdraw": 0}

    class CountingStub(lock_pb2_grpc.LockServiceStub):
        def __init__(self, channel: grpc.aio.Channel) -> None:
            super().__init__(channel)
            for method in counts:
                setattr(self, method, self._counted(method, getattr(self, method)))

        @staticmethod
        def _counted(method: str, inner: Any) -> Any:
            def call(*args: Any, **kwargs: Any) -> Any:
                counts[method] += 1
                return inner(*args, **kwargs)
            return call

    monkeypatch.setattr(transport_module.pb_grpc, "LockServiceStub", CountingStub)
    return counts


async def stream_ready(client: AsyncLockClient) -> None:
    """Wait until the client's stream has announced the calls (its initial metadata arrived)."""
    await wait_for(lambda: client._stream.calls.serves("Acquire"), 5, what="stream calls announced")


async def test_cycle_when_the_coordinator_serves_calls_on_the_stream(
        coordinator: Coordinator, unary_calls: UnaryCounts, etcd_client: Etcd3Client, prefix: str) -> None:
    """Acquire and release over the stream: no unary Acquire or Release, tokens grow, no watch left, no key left."""
    async with AsyncLockClient(coordinator.address) as client:
        await stream_ready(client)
        tokens = []
        for _ in range(3):
            async with client.lock("cycle", ttl=5, timeout=5) as handle:
                tokens.append(handle.token)
                assert handle.is_valid()
        assert tokens == sorted(set(tokens))
        assert await list_keys(etcd_client, prefix) == []
        assert (await client.server_info()).watched_holds == 0  # granted and released on the stream: no watch left
    assert unary_calls == {"Acquire": 0, "Release": 0, "Withdraw": 0}


async def test_cycle_when_stream_calls_are_off(coordinator: Coordinator, unary_calls: UnaryCounts) -> None:
    """``stream_calls=False``: every Acquire and Release is a unary call, as before."""
    async with AsyncLockClient(coordinator.address, stream_calls=False) as client:
        await wait_for(lambda: client._stream.outbox is not None, 5, what="the stream")
        for _ in range(2):
            async with client.lock("unary", ttl=5, timeout=5):
                pass
        assert not client._stream.calls.serves("Acquire")
    assert unary_calls == {"Acquire": 2, "Release": 2, "Withdraw": 0}


async def test_sync_client_cycle_on_the_stream(coordinator: Coordinator, unary_calls: UnaryCounts) -> None:
    """The sync LockClient runs the same machinery: its cycle goes on the stream too."""
    def job() -> int:
        with LockClient(coordinator.address) as client:
            wait = client._loop.run(stream_ready(client._aio))
            assert wait is None
            with client.lock("sync", ttl=5, timeout=5) as handle:
                return handle.token

    assert await asyncio.to_thread(job) > 0
    assert unary_calls == {"Acquire": 0, "Release": 0, "Withdraw": 0}


Outcome = tuple[type, str | None, Any]


async def outcome(attempt: Callable[[], Awaitable[Any]]) -> Outcome:
    """(exception class, reason, code) of what ``attempt`` raised."""
    try:
        await attempt()
    except FencepostError as exc:
        return type(exc), exc.reason, exc.code
    raise AssertionError("did not fail")


async def test_errors_on_the_stream_when_compared_with_unary(coordinator: Coordinator,
                                                             unary_calls: UnaryCounts) -> None:
    """Each refusal raises the same class, reason and code on the stream as by unary call."""
    address = coordinator.address
    async with AsyncLockClient(address) as holder, AsyncLockClient(address) as streamed, \
            AsyncLockClient(address, stream_calls=False) as unary:
        await stream_ready(holder)
        await stream_ready(streamed)
        held = await holder.acquire("busy", ttl=5)
        found: dict[str, list[Outcome]] = {}
        for client in (streamed, unary):
            mine = await client.acquire(f"mine-{id(client)}", ttl=5)
            lease = mine._lease
            foreign = Lease(held.lease_id, 5, 0.0, clock=lambda: 0.0, secret="not-the-secret")
            until = asyncio.get_running_loop().time() + 5
            busy, elsewhere = LockRecipe(client._holds, "busy"), LockRecipe(client._holds, "elsewhere")
            found.setdefault("held", []).append(await outcome(lambda: client.try_acquire("busy", ttl=5)))
            found.setdefault("timeout", []).append(await outcome(lambda: client.acquire("busy", ttl=5, timeout=0.2)))
            found.setdefault("not holder", []).append(await outcome(lambda: busy.release_call(
                AsyncLockHandle("busy", lease, held.token, busy.release), until)))
            found.setdefault("stale", []).append(await outcome(lambda: busy.release_call(
                AsyncLockHandle(mine.name, lease, mine.token - 1, busy.release), until)))
            found.setdefault("foreign", []).append(await outcome(lambda: elsewhere.acquire_call(
                foreign, until, True)))
            await mine.release()
        await held.release()
        assert streamed._stream.calls.serves("Acquire")  # the stream stayed up through every refusal
    for what, (on_stream, by_unary) in found.items():
        assert on_stream == by_unary, what
    assert [found[k][0][:2] for k in ("held", "timeout", "not holder", "stale", "foreign")] == [
        (LockHeld, "LOCK_HELD"), (LockTimeout, "ACQUIRE_TIMEOUT"), (NotHolder, "NOT_HOLDER"),
        (StaleTokenError, "STALE_TOKEN"), (NotLeaseOwner, "NOT_LEASE_OWNER")]
    # The unary client's calls only: 3 acquires of its own (mine, the try, the timed-out wait), the foreign one,
    # and its 3 releases (two refused).
    assert unary_calls == {"Acquire": 4, "Release": 3, "Withdraw": 0}


async def test_acquire_on_the_stream_when_cancelled_while_waiting(coordinator: Coordinator,
                                                                 etcd_client: Etcd3Client, prefix: str) -> None:
    """A waiting acquire cancelled by its caller leaves no key in etcd once its cancellation completes."""
    async with AsyncLockClient(coordinator.address) as holder, AsyncLockClient(coordinator.address) as waiter:
        await stream_ready(waiter)
        held = await holder.acquire("wait", ttl=5)
        waiting = asyncio.ensure_future(waiter.acquire("wait", ttl=5, timeout=30))
        await wait_for(lambda: waiter._stream.calls.running == 1, 5, what="the acquire sent on the stream")
        await wait_for(lambda: _keys_is(etcd_client, prefix, 2), 5, what="the waiter's key")
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert len(await list_keys(etcd_client, prefix)) == 1  # the holder's only: the wait was withdrawn
        assert waiter._stream.calls.serves("Acquire")
        await held.release()
        again = await waiter.acquire("wait", ttl=5, timeout=5)  # the slot was freed
        assert again.token > held.token
        await again.release()


async def _keys_is(etcd_client: Etcd3Client, prefix: str, n: int) -> bool:
    return len(await list_keys(etcd_client, prefix)) == n


async def test_acquire_on_the_stream_when_its_coordinator_stops(etcd: EmbeddedEtcd, prefix: str,
                                                               etcd_client: Etcd3Client) -> None:
    """The stream breaks in the middle of a waiting acquire (its coordinator stops): the client retries on the
    other one, keeps its place in the queue, is granted once, and no key is left behind."""
    first = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix)
    second = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix)
    await asyncio.wait_for(first.start(), 20)
    await asyncio.wait_for(second.start(), 20)
    try:
        async with AsyncLockClient(second.address) as holder, \
                AsyncLockClient([first.address, second.address]) as waiter:
            await stream_ready(waiter)
            assert waiter.address == first.address
            held = await holder.acquire("cut", ttl=5)
            waiting = asyncio.ensure_future(waiter.acquire("cut", ttl=5, timeout=20))
            await wait_for(lambda: waiter._stream.calls.running == 1, 5, what="the acquire sent on the stream")
            await wait_for(lambda: _waiters_is(holder, "cut", 1), 5, what="the waiter queued")
            (queued,) = (await holder.describe("cut")).waiters
            await asyncio.wait_for(first.stop(grace=0), 20)
            await wait_for(lambda: waiter.address == second.address, 10, what="the client on the second coordinator")
            await stream_ready(waiter)
            assert not waiting.done()
            await held.release()
            handle = await asyncio.wait_for(waiting, 10)
            assert (handle.lease_id, handle.token) == queued  # its place, kept through the cut
            assert handle.is_valid()
            assert len(await list_keys(etcd_client, prefix)) == 1
            await handle.release()
            assert await list_keys(etcd_client, prefix) == []
    finally:
        await asyncio.wait_for(first.stop(grace=0), 20)
        await asyncio.wait_for(second.stop(grace=0), 20)


async def _waiters_is(client: AsyncLockClient, name: str, n: int) -> bool:
    return (await client.describe(name)).waiter_count == n


async def test_acquire_on_the_stream_when_the_channel_is_closed(coordinator: Coordinator,
                                                               etcd_client: Etcd3Client, prefix: str) -> None:
    """The client's channel closed under a waiting acquire (the stream breaks): one grant, one key, none after."""
    async with AsyncLockClient(coordinator.address) as holder, AsyncLockClient(coordinator.address) as waiter:
        await stream_ready(waiter)
        held = await holder.acquire("reopen", ttl=5)
        waiting = asyncio.ensure_future(waiter.acquire("reopen", ttl=5, timeout=20))
        await wait_for(lambda: waiter._stream.calls.running == 1, 5, what="the acquire sent on the stream")
        await wait_for(lambda: _waiters_is(holder, "reopen", 1), 5, what="the waiter queued")
        channel = waiter._transport.channel
        waiter._transport.rotate(channel, force=True)  # a new channel; the old one (and its stream) closes
        # The acquire is sent again, on the next stream or (before that stream announced its calls) by a
        # unary call: either way it is waiting again once the next stream is up.
        await wait_for(lambda: waiter._stream.calls.serves("Acquire"), 10, what="the next stream up")
        assert not waiting.done()
        await held.release()
        handle = await asyncio.wait_for(waiting, 10)
        assert handle.token > held.token and handle.is_valid()
        assert len(await list_keys(etcd_client, prefix)) == 1
        await handle.release()
        assert await list_keys(etcd_client, prefix) == []


async def test_release_on_the_stream_when_the_channel_is_closed(coordinator: Coordinator,
                                                               etcd_client: Etcd3Client, prefix: str) -> None:
    """A release sent as the channel closes has an unknown outcome (Unavailable, as by unary call); releasing
    again settles it: the hold ends released or lost (NOT_HOLDER: that release had committed), never kept."""
    async with AsyncLockClient(coordinator.address) as client:
        await stream_ready(client)
        handle = await client.acquire("release-cut", ttl=5, timeout=5)
        channel = client._transport.channel
        client._transport.rotate(channel, force=True)
        outcomes = []
        for _ in range(10):
            try:
                await handle.release()
                outcomes.append("released")
                break
            except Unavailable as err:
                assert err.reason is None
                outcomes.append("unknown")
                await stream_ready(client)
            except (LeaseLost, NotHolder) as err:
                assert err.reason == "NOT_HOLDER" or handle.lost_reason == "NOT_HOLDER", err
                outcomes.append("lost")
                break
        assert outcomes[-1] in ("released", "lost"), outcomes
        assert await list_keys(etcd_client, prefix) == []
        assert client._leases.holds() == []


async def test_client_spans_of_calls_on_the_stream(coordinator: Coordinator,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """A traced acquire on the stream has its CLIENT span per attempt, as by unary call, and its trace context
    reaches the coordinator (the grant's log event carries its trace id)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    caplog.set_level(logging.DEBUG, logger="fencepost.coordinator")
    try:
        async with AsyncLockClient(coordinator.address, tracer_provider=provider) as client:
            await stream_ready(client)
            handle = await client.acquire("traced", ttl=5, timeout=5)
            await handle.release()
        spans = {s.name: s for s in exporter.get_finished_spans()}
        acquire, call = spans["fencepost.acquire"], spans["fencepost.v1.LockService/Acquire"]
        assert call.kind == SpanKind.CLIENT and call.parent is not None
        assert call.parent.span_id == acquire.context.span_id  # type: ignore[union-attr]
        assert dict(call.attributes or {}) == {
            "rpc.system": "grpc", "rpc.service": "fencepost.v1.LockService", "rpc.method": "Acquire",
            "rpc.grpc.status_code": 0, "fencepost.lock.name": "traced", "fencepost.lease_id": handle.lease_id,
            "fencepost.token": handle.token, "fencepost.outcome": "granted",
            "fencepost.request_id": call.attributes["fencepost.request_id"]}  # type: ignore[index]
        assert len(call.attributes["fencepost.request_id"]) == 32  # type: ignore[index,arg-type]  # a uuid4's hex
        release = spans["fencepost.v1.LockService/Release"]
        assert release.attributes["fencepost.outcome"] == "released"  # type: ignore[index]
        grants = [r for r in caplog.records if getattr(r, "event", None) == "grant"]
        assert len(grants) == 1
        assert grants[0].event_fields["trace_id"] == format(acquire.context.trace_id, "032x")  # type: ignore[attr-defined,union-attr]
    finally:
        provider.shutdown()
