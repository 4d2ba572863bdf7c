"""Acquire, Release and Withdraw as messages on the KeepAlive stream (coordinator side, raw stub).

Real coordinator in-process on a real etcd. Each call on the stream must
answer as its unary twin does: the same outcome, the same status code and
ErrorInfo reason on failure; a grant on the stream is watched there, a
release on it drops the watch without a HoldEnded; ``cancel`` and the end of
the stream abandon a waiting acquire, whose key then goes.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from fencepost.client.v1 import lock_pb2, lock_pb2_grpc
from fencepost.coordinator.api.stream_calls import CALLS_METADATA

from .conftest import describe, wait_for
from .owned_stub import SECRETS, OwnedStub


def reason_of(failed: lock_pb2.CallFailed) -> str | None:
    """The ErrorInfo reason in a ``failed`` answer's status."""
    status = status_pb2.Status.FromString(failed.status)
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return info.reason
    return None


def unary_reason(err: grpc.aio.AioRpcError) -> str | None:
    for key, value in err.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            return reason_of(lock_pb2.CallFailed(status=value))
    return None


class Session:
    """A KeepAlive stream carrying calls: send one, await its answer by request id; other messages queued."""

    def __init__(self, stub: OwnedStub) -> None:
        self.call = stub.KeepAlive()
        self.answers: dict[int, asyncio.Future[lock_pb2.KeepAliveResponse]] = {}
        self.events: asyncio.Queue[lock_pb2.KeepAliveResponse] = asyncio.Queue()
        self.next_id = 0
        self.writing = asyncio.Lock()  # one write at a time on a grpc.aio stream
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for response in self.call:
            if response.WhichOneof("response") in ("acquired", "released", "withdrawn", "failed"):
                future = self.answers.pop(response.request_id, None)
                if future is not None and not future.done():
                    future.set_result(response)
                    continue
            await self.events.put(response)

    async def send(self, kind: str, message: Any, *, secret: str | None = None, timeout_ms: int = 0,
                   request_id: int | None = None) -> asyncio.Future[lock_pb2.KeepAliveResponse]:
        if request_id is None:
            self.next_id += 1
            request_id = self.next_id
        future: asyncio.Future[lock_pb2.KeepAliveResponse] = asyncio.get_running_loop().create_future()
        self.answers.setdefault(request_id, future)
        lease_secret = SECRETS.get(message.lease_id, "") if secret is None else secret
        async with self.writing:
            await self.call.write(lock_pb2.KeepAliveRequest(request_id=request_id, timeout_ms=timeout_ms,
                                                            lease_secret=lease_secret, **{kind: message}))
        return future

    async def ask(self, kind: str, message: Any, **kwargs: Any) -> lock_pb2.KeepAliveResponse:
        return await asyncio.wait_for(await self.send(kind, message, **kwargs), 10)

    async def close(self) -> None:
        self.call.cancel()
        self.reader.cancel()
        await asyncio.gather(self.reader, return_exceptions=True)


@pytest.fixture
async def session(stub: OwnedStub) -> Any:
    s = Session(stub)
    try:
        yield s
    finally:
        await s.close()


async def grant(stub: OwnedStub, ttl: int = 30) -> int:
    return (await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=ttl))).lease_id


async def test_the_stream_announces_its_calls(session: Session) -> None:
    metadata = await session.call.initial_metadata()
    assert (CALLS_METADATA[0], CALLS_METADATA[1]) in tuple(metadata)


async def test_a_cycle_on_the_stream(stub: OwnedStub, session: Session) -> None:
    lease = await grant(stub)
    answer = await session.ask("acquire", lock_pb2.AcquireRequest(name="cycle", lease_id=lease, wait_forever=True))
    assert answer.WhichOneof("response") == "acquired" and answer.acquired.acquired
    token = answer.acquired.token
    held = await describe(stub, "cycle")
    assert held.held and held.holder.lease_id == lease and held.holder.token == token
    # Idempotent per (lease, name), as the unary Acquire: the same token again.
    again = await session.ask("acquire", lock_pb2.AcquireRequest(name="cycle", lease_id=lease))
    assert again.acquired.acquired and again.acquired.token == token
    released = await session.ask("release", lock_pb2.ReleaseRequest(name="cycle", lease_id=lease, token=token))
    assert released.WhichOneof("response") == "released" and released.released.revision > token
    assert not (await describe(stub, "cycle")).held
    # A release on the stream drops the watch its grant started: no HoldEnded follows. A later grant's
    # watch does report (proves the stream still tells events): revoke the lease under a new hold.
    second = await session.ask("acquire", lock_pb2.AcquireRequest(name="other", lease_id=lease))
    await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease))
    event = await asyncio.wait_for(session.events.get(), 10)
    assert event.WhichOneof("response") == "hold_ended"
    assert (event.hold_ended.name, event.hold_ended.token) == ("other", second.acquired.token)
    assert session.events.empty()


async def test_try_once_on_a_held_lock_names_the_holder(stub: OwnedStub, session: Session) -> None:
    holder, other = await grant(stub), await grant(stub)
    first = await session.ask("acquire", lock_pb2.AcquireRequest(name="busy", lease_id=holder))
    busy = await session.ask("acquire", lock_pb2.AcquireRequest(name="busy", lease_id=other))
    assert not busy.acquired.acquired
    assert (busy.acquired.holder.lease_id, busy.acquired.holder.token) == (holder, first.acquired.token)


async def test_failures_carry_the_unary_calls_status(stub: OwnedStub, session: Session) -> None:
    lease = await grant(stub)
    token = (await session.ask("acquire", lock_pb2.AcquireRequest(name="f", lease_id=lease))).acquired.token
    cases: list[tuple[str, Any, str]] = [
        ("release", lock_pb2.ReleaseRequest(name="f", lease_id=lease, token=token - 1), "Release"),
        ("release", lock_pb2.ReleaseRequest(name="nothing", lease_id=lease, token=token), "Release"),
        ("acquire", lock_pb2.AcquireRequest(name="", lease_id=lease), "Acquire"),
        ("acquire", lock_pb2.AcquireRequest(name="g", lease_id=0), "Acquire"),
        ("withdraw", lock_pb2.WithdrawRequest(name="x" * 300, lease_id=lease), "Withdraw"),
    ]
    for kind, message, method in cases:
        answer = await session.ask(kind, message)
        assert answer.WhichOneof("response") == "failed", (kind, message)
        with pytest.raises(grpc.aio.AioRpcError) as unary:
            await getattr(stub, method)(message)
        assert answer.failed.code == unary.value.code().value[0], (kind, message)
        assert reason_of(answer.failed) == unary_reason(unary.value), (kind, message)
        assert answer.failed.message == unary.value.details()


async def test_a_foreign_lease_is_refused_per_call_and_the_stream_goes_on(stub: OwnedStub, session: Session) -> None:
    lease = await grant(stub)
    refused = await session.ask("acquire", lock_pb2.AcquireRequest(name="mine", lease_id=lease), secret="wrong")
    assert refused.failed.code == grpc.StatusCode.PERMISSION_DENIED.value[0]
    assert reason_of(refused.failed) == "NOT_LEASE_OWNER"
    granted = await session.ask("acquire", lock_pb2.AcquireRequest(name="mine", lease_id=lease))
    assert granted.acquired.acquired


async def test_bad_call_fields_are_answered_not_fatal(stub: OwnedStub, session: Session) -> None:
    lease = await grant(stub)
    negative = await session.ask("acquire", lock_pb2.AcquireRequest(name="t", lease_id=lease), timeout_ms=-1)
    assert negative.failed.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "timeout_ms" in negative.failed.message
    other = await grant(stub)
    holder = await session.ask("acquire", lock_pb2.AcquireRequest(name="t", lease_id=lease))
    waiting = await session.send("acquire", lock_pb2.AcquireRequest(name="t", lease_id=other, wait_forever=True),
                                 request_id=500)
    await wait_for(lambda: describe_waiters(stub, "t", 1), 10, what="the waiter queued")
    # A second call with the id of one still running is refused; the running one goes on.
    await session.call.write(lock_pb2.KeepAliveRequest(request_id=500, lease_secret=SECRETS[lease],
                                                       acquire=lock_pb2.AcquireRequest(name="u", lease_id=lease)))
    duplicate = await asyncio.wait_for(waiting, 10)
    assert duplicate.failed.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "request_id" in duplicate.failed.message
    granted: asyncio.Future[lock_pb2.KeepAliveResponse] = asyncio.get_running_loop().create_future()
    session.answers[500] = granted
    await session.ask("release", lock_pb2.ReleaseRequest(name="t", lease_id=lease, token=holder.acquired.token))
    assert (await asyncio.wait_for(granted, 10)).acquired.acquired


async def test_a_bounded_wait_times_out_as_the_unary_call(stub: OwnedStub, session: Session) -> None:
    holder, other = await grant(stub), await grant(stub)
    await session.ask("acquire", lock_pb2.AcquireRequest(name="slow", lease_id=holder))
    answer = await session.ask("acquire", lock_pb2.AcquireRequest(name="slow", lease_id=other, wait_ms=200),
                               timeout_ms=5000)
    with pytest.raises(grpc.aio.AioRpcError) as unary:
        await stub.Acquire(lock_pb2.AcquireRequest(name="slow", lease_id=other, wait_ms=200), timeout=5)
    assert answer.failed.code == unary.value.code().value[0]
    assert reason_of(answer.failed) == unary_reason(unary.value) == "ACQUIRE_TIMEOUT"
    assert (await describe(stub, "slow")).waiter_count == 0


async def test_cancel_abandons_a_waiting_acquire(stub: OwnedStub, session: Session) -> None:
    holder, other = await grant(stub), await grant(stub)
    await session.ask("acquire", lock_pb2.AcquireRequest(name="c", lease_id=holder))
    waiting = await session.send("acquire", lock_pb2.AcquireRequest(name="c", lease_id=other, wait_forever=True))
    await wait_for(lambda: describe_waiters(stub, "c", 1), 10, what="the waiter queued")
    await session.call.write(lock_pb2.KeepAliveRequest(cancel=lock_pb2.CancelCall(request_id=session.next_id)))
    answer = await asyncio.wait_for(waiting, 10)
    assert answer.failed.code == grpc.StatusCode.CANCELLED.value[0]
    withdrawn = await session.ask("withdraw", lock_pb2.WithdrawRequest(name="c", lease_id=other))
    assert withdrawn.withdrawn.found and not withdrawn.withdrawn.held
    assert (await describe(stub, "c")).waiter_count == 0


async def test_the_end_of_the_stream_abandons_its_waiting_acquires(stub: OwnedStub, coordinator: Any) -> None:
    holder, other = await grant(stub), await grant(stub)
    session = Session(stub)
    try:
        await session.ask("acquire", lock_pb2.AcquireRequest(name="gone", lease_id=holder))
        await session.send("acquire", lock_pb2.AcquireRequest(name="gone", lease_id=other, wait_forever=True))
        await wait_for(lambda: describe_waiters(stub, "gone", 1), 10, what="the waiter queued")
    finally:
        await session.close()
    # As a cancelled unary Acquire: the waiter's key is kept for a moment for a retry, then deleted.
    await wait_for(lambda: describe_waiters(stub, "gone", 0), 15, what="the abandoned waiter's key deleted")
    assert (await describe(stub, "gone")).holder.lease_id == holder


async def test_many_calls_at_once_on_one_stream(stub: OwnedStub, session: Session) -> None:
    lease = await grant(stub)
    answers = await asyncio.gather(*(session.ask("acquire", lock_pb2.AcquireRequest(name=f"m{i}", lease_id=lease))
                                     for i in range(50)))
    tokens = [a.acquired.token for a in answers]
    assert all(a.acquired.acquired for a in answers) and all(t > 0 for t in tokens)
    # (Tokens of different names may be equal: concurrent grants share one etcd Txn.)
    for i, token in enumerate(tokens[:5]):
        held = await describe(stub, f"m{i}")
        assert (held.holder.lease_id, held.holder.token) == (lease, token)
    released = await asyncio.gather(*(session.ask("release", lock_pb2.ReleaseRequest(
        name=f"m{i}", lease_id=lease, token=t)) for i, t in enumerate(tokens)))
    assert all(r.WhichOneof("response") == "released" for r in released)
    assert session.events.empty()


async def describe_waiters(stub: lock_pb2_grpc.LockServiceStub, name: str, n: int) -> bool:
    return (await describe(stub, name)).waiter_count == n


async def test_calls_on_the_stream_are_traced_and_counted_as_unary_calls(etcd: Any, prefix: str) -> None:
    """Each call on the stream gets the SERVER span and the grpc_server_* counts of its unary twin: operators'
    dashboards and traces do not change when clients move their calls onto the stream."""
    from fencepost.coordinator.process.coordinator import Coordinator

    from .metrics_scrape import scrape
    from .trace_spans import LOCKS, PARENT_ID, TRACE_ID, TRACEPARENT, Spans, parent_of, trace_id

    spans = Spans()
    coord = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix, metrics_listen="127.0.0.1:0",
                        tracer_provider=spans.provider)
    await asyncio.wait_for(coord.start(), 20)
    try:
        async with grpc.aio.insecure_channel(coord.address) as channel:
            stub = OwnedStub(channel)
            lease = await grant(stub)
            session = Session(stub)
            try:
                future = await session.send("acquire", lock_pb2.AcquireRequest(name="traced", lease_id=lease))
                token = (await asyncio.wait_for(future, 10)).acquired.token
                session.next_id += 1
                future = asyncio.get_running_loop().create_future()
                session.answers[session.next_id] = future
                async with session.writing:
                    await session.call.write(lock_pb2.KeepAliveRequest(
                        request_id=session.next_id, lease_secret=SECRETS[lease], traceparent=TRACEPARENT,
                        release=lock_pb2.ReleaseRequest(name="traced", lease_id=lease, token=token - 1)))
                refused = await asyncio.wait_for(future, 10)
                assert reason_of(refused.failed) == "STALE_TOKEN"
            finally:
                await session.close()
        granted = await spans.one(f"{LOCKS}/Acquire", **{"fencepost.lock.name": "traced"})
        assert granted.attributes["fencepost.outcome"] == "granted"  # type: ignore[index]
        stale = await spans.one(f"{LOCKS}/Release", **{"rpc.grpc.status_code": 9})
        assert stale.attributes["fencepost.outcome"] == "STALE_TOKEN"  # type: ignore[index]
        assert format(trace_id(stale), "032x") == TRACE_ID and format(parent_of(stale) or 0, "016x") == PARENT_ID

        async def counted() -> bool:
            metrics = await scrape(coord.metrics_address)
            return (metrics.handled("Acquire").get("OK") == 1
                    and metrics.handled("Release").get("FailedPrecondition") == 1)

        await wait_for(counted, 10, 0.02, "the stream's calls counted under Acquire and Release")
    finally:
        await asyncio.wait_for(coord.stop(grace=0), 20)
        spans.shutdown()
