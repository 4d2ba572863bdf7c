"""Holding a lock over HTTP stays safe (issue 24): the hold's end told by Server-Sent Events, waits withdrawn when
the caller goes away, and the stream-shaped failures over HTTP twinned with gRPC. Real etcd, real coordinator."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import grpc
import pytest

from fencepost.client.v1 import details, lock_pb2
from fencepost.coordinator.admission.limits import Limits
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.process.embedded import EmbeddedEtcd

from .conftest import wait_for
from .http_callers import Failure, GrpcCaller, HttpCaller, events, next_event
from .owned_stub import OwnedStub
from .test_http_twins import acquire, grant, revoke, start


class Api:
    """One coordinator's HTTP API, for these tests: its calls (an :class:`HttpCaller`), its base URL, a session."""

    def __init__(self, coordinator: Coordinator, session: aiohttp.ClientSession) -> None:
        self.coordinator = coordinator
        self.session = session
        self.base = f"http://{coordinator.http_address}"
        self.call = HttpCaller(session, self.base)

    def watch(self, lease: lock_pb2.LeaseGrantResponse, name: str, token: int, secret: str | None = "",
              kind: str = "locks") -> Any:
        """``GET /v1/{kind}/{name}:watch`` for the hold (with the lease's secret unless ``secret`` is given)."""
        secret = lease.lease_secret if secret == "" else secret
        return self.session.get(f"{self.base}/v1/{kind}/{name}:watch", params={"leaseId": str(lease.lease_id),
                                "token": str(token)}, headers={"Fencepost-Lease-Secret": secret} if secret else {})

    def streams(self) -> int:
        return self.coordinator.state_sizes()["streams"]


@pytest.fixture
async def api(etcd: EmbeddedEtcd, prefix: str) -> AsyncIterator[Api]:
    coordinator = await start(etcd, prefix)
    try:
        async with aiohttp.ClientSession() as session:
            yield Api(coordinator, session)
    finally:
        await asyncio.wait_for(coordinator.stop(grace=0), 20)


async def test_watch_tells_the_end_of_a_hold_once_and_leaves_no_stream(api: Api) -> None:
    """A watched hold revoked by another route: ``watching``, then one ``hold_ended`` (NOT_HOLDER), then the end;
    the KeepAlive stream behind it is gone after."""
    lease = await grant(api.call)
    held = await acquire(api.call, lease, "board")
    async with api.watch(lease, "board", held.token) as answer:
        assert answer.status == 200 and answer.content_type == "text/event-stream"
        stream = events(answer)
        assert await next_event(stream) == ("watching", {"name": "board", "leaseId": str(lease.lease_id),
                                                         "token": str(held.token), "kind": "HOLD_KIND_LOCK",
                                                         "slot": 0})
        assert api.streams() == 1
        await revoke(api.call, lease)
        name, ended = await next_event(stream)
        assert (name, ended["reason"], ended["token"]) == ("hold_ended", "NOT_HOLDER", str(held.token))
        assert [event async for event in stream] == []
    await wait_for(lambda: api.streams() == 0, 10, what="no stream left")


async def test_watch_of_a_hold_that_already_ended_tells_it_at_once(api: Api) -> None:
    """A watch begun after the hold's release hears ``hold_ended`` at once."""
    lease = await grant(api.call)
    held = await acquire(api.call, lease, "gone")
    await api.call("Release", lock_pb2.ReleaseRequest(name="gone", lease_id=lease.lease_id, token=held.token),
                   lease.lease_secret)
    async with api.watch(lease, "gone", held.token) as answer:
        stream = events(answer)
        assert (await next_event(stream))[0] == "watching"
        assert (await next_event(stream))[0] == "hold_ended"
    await revoke(api.call, lease)


async def test_watch_never_renews_the_lease(api: Api) -> None:
    """The coordinator does not keep a watched hold's lease alive: unrenewed, it expires and the watch says so."""
    lease = await grant(api.call, ttl=2)
    held = await acquire(api.call, lease, "unrenewed")
    async with api.watch(lease, "unrenewed", held.token) as answer:
        stream = events(answer)
        assert (await next_event(stream))[0] == "watching"
        name, ended = await next_event(stream, timeout=15)
        assert (name, ended["reason"]) == ("hold_ended", "NOT_HOLDER")
    renewed = await api.call("LeaseKeepAlive", lock_pb2.LeaseKeepAliveRequest(lease_id=lease.lease_id),
                             lease.lease_secret)
    assert isinstance(renewed, Failure) and renewed.reason == "LEASE_EXPIRED" and renewed.http_status == 400


async def test_watch_when_not_the_owner_or_bad_is_refused_before_any_event(api: Api) -> None:
    """Without the secret (or with a wrong one): 403 NOT_LEASE_OWNER; a bad token or slot: 400 naming it."""
    lease = await grant(api.call)
    held = await acquire(api.call, lease, "mine")
    for secret in (None, "not-its-secret"):
        async with api.watch(lease, "mine", held.token, secret=secret) as answer:
            body = await answer.json()
            assert answer.status == 403 and body["details"][0]["reason"] == "NOT_LEASE_OWNER", body
    async with api.watch(lease, "mine", 0) as answer:
        assert answer.status == 400 and (await answer.json())["details"][0]["metadata"]["field"] == "token"
    async with api.session.get(f"{api.base}/v1/semaphores/s:watch", params={
            "leaseId": str(lease.lease_id), "token": "5", "slot": "5000"},
            headers={"Fencepost-Lease-Secret": lease.lease_secret}) as answer:
        assert answer.status == 400 and (await answer.json())["details"][0]["metadata"]["field"] == "slot"
    await wait_for(lambda: api.streams() == 0, 10, what="no stream left")
    await revoke(api.call, lease)


async def test_watch_when_the_caller_leaves_ends_its_stream(api: Api) -> None:
    """A watch whose client disconnects is cancelled: its KeepAlive stream ends."""
    lease = await grant(api.call)
    held = await acquire(api.call, lease, "left")
    async with api.watch(lease, "left", held.token) as answer:
        assert (await next_event(events(answer)))[0] == "watching"
        assert api.streams() == 1
    await wait_for(lambda: api.streams() == 0, 10, what="the stream of the departed watcher to end")
    await revoke(api.call, lease)


async def test_waiting_acquire_when_the_caller_leaves_is_withdrawn_at_once(api: Api) -> None:
    """An HTTP Acquire waiting behind a holder, whose client disconnects, leaves the queue at once (Withdraw), not
    after the reattach grace of a gRPC call: the next holder is the one after it."""
    holder, leaver, next_one = await grant(api.call), await grant(api.call), await grant(api.call)
    assert (await acquire(api.call, holder, "queue")).acquired
    waiting = asyncio.ensure_future(acquire(api.call, leaver, "queue", wait_ms=60_000))

    async def waiters() -> int:
        described = await api.call("Describe", lock_pb2.DescribeRequest(name="queue"))
        return int(described.waiter_count)

    await wait_for(lambda: _equals(waiters(), 1), 10, what="the HTTP waiter queued")
    waiting.cancel()  # the client closes its connection
    reattach = api.coordinator.locks.reattach_seconds if api.coordinator.locks is not None else 2.0
    await wait_for(lambda: _equals(waiters(), 0), reattach / 2, what="the departed waiter withdrawn")
    queued = asyncio.ensure_future(acquire(api.call, next_one, "queue", wait_ms=60_000))
    await wait_for(lambda: _equals(waiters(), 1), 10, what="the next waiter queued")
    await revoke(api.call, holder)
    granted = await queued
    assert granted.acquired
    described = await api.call("Describe", lock_pb2.DescribeRequest(name="queue"))
    assert described.holder.lease_id == next_one.lease_id
    await revoke(api.call, leaver, next_one)


async def _equals(count: Any, expected: int) -> bool:
    return bool(await count == expected)


async def test_too_many_streams_over_http_is_its_grpc_twin(etcd: EmbeddedEtcd, prefix: str) -> None:
    """With one stream allowed: a second KeepAlive stream (gRPC) and a second watch (HTTP) are refused alike,
    TOO_MANY_STREAMS; over HTTP as a 429 with the Status body, before any event."""
    coordinator = await start(etcd, prefix, limits=Limits(max_streams=1))
    try:
        async with grpc.aio.insecure_channel(coordinator.address) as channel, aiohttp.ClientSession() as session:
            api = Api(coordinator, session)
            stub = OwnedStub(channel)
            lease = await grant(api.call)
            held = await acquire(api.call, lease, "streams")
            async with api.watch(lease, "streams", held.token) as first:
                assert (await next_event(events(first)))[0] == "watching"
                async with api.watch(lease, "streams", held.token) as second:
                    body = await second.json()
                    assert second.status == 429 and body["details"][0]["reason"] == "TOO_MANY_STREAMS", body
                call = stub.KeepAlive()
                # The refusal may end the stream before this write is taken: grpc.aio then fails the write
                # itself (seen once as INTERNAL); the stream's own status is what the read raises.
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await call.write(lock_pb2.KeepAliveRequest(watch=lock_pb2.WatchHold(
                        name="streams", lease_id=lease.lease_id, token=held.token)))
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await call.read()
                status = details.parse(refused.value)
                assert (status.code, status.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "TOO_MANY_STREAMS")
            await revoke(api.call, lease)
    finally:
        await coordinator.stop(0)


async def test_shutting_down_over_http_is_its_grpc_twin(etcd: EmbeddedEtcd, prefix: str) -> None:
    """The coordinator stops under an open watch: the HTTP watch gets an ``error`` event (UNAVAILABLE /
    SHUTTING_DOWN with its RetryInfo), as the gRPC KeepAlive stream ends with that status."""
    coordinator = await start(etcd, prefix)
    try:
        async with grpc.aio.insecure_channel(coordinator.address) as channel, aiohttp.ClientSession() as session:
            api = Api(coordinator, session)
            grpc_call = GrpcCaller(channel)
            lease = await grant(grpc_call)
            held = await acquire(grpc_call, lease, "stopping")
            stream_call = OwnedStub(channel).KeepAlive()
            await stream_call.write(lock_pb2.KeepAliveRequest(
                watch=lock_pb2.WatchHold(name="stopping", lease_id=lease.lease_id, token=held.token),
                lease_secret=lease.lease_secret))
            async with api.watch(lease, "stopping", held.token) as answer:
                stream = events(answer)
                assert (await next_event(stream))[0] == "watching"
                stopping = asyncio.ensure_future(coordinator.stop(5))
                name, body = await next_event(stream)
                assert name == "error"
                reasons = {d["reason"] for d in body["details"] if "reason" in d}
                assert body["code"] == grpc.StatusCode.UNAVAILABLE.value[0] and reasons == {"SHUTTING_DOWN"}
                assert any(d["@type"].endswith("RetryInfo") for d in body["details"])
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                await stream_call.read()
            status = details.parse(ended.value)
            assert (status.code, status.reason) == (grpc.StatusCode.UNAVAILABLE, "SHUTTING_DOWN")
            await stopping
    finally:
        await coordinator.stop(0)


async def test_observe_streams_leaders_and_resumes_after_last_event_id(api: Api) -> None:
    """Observe over HTTP: a ``leader`` event per change with the revision as its id; a reconnect with
    Last-Event-ID hears only what came after."""
    lease = await grant(api.call)
    url = f"{api.base}/v1/elections/chair:observe"
    async with api.session.get(url) as answer:
        stream = events(answer)
        name, first = await next_event(stream)
        assert name == "leader" and "leader" not in first
        campaign = await api.call("Campaign", lock_pb2.CampaignRequest(election="chair", lease_id=lease.lease_id,
                                                                      value=b"one"), lease.lease_secret)
        assert campaign.elected
        name, elected = await next_event(stream)
        assert elected["leader"]["token"] == str(campaign.token) and elected["leader"]["value"] == "b25l"
    await api.call("Proclaim", lock_pb2.ProclaimRequest(election="chair", lease_id=lease.lease_id,
                                                         token=campaign.token, value=b"two"), lease.lease_secret)
    async with api.session.get(url, headers={"Last-Event-ID": elected["revision"]}) as answer:
        name, resumed = await next_event(events(answer))
        assert resumed["leader"]["value"] == "dHdv" and int(resumed["revision"]) > int(elected["revision"])
    await revoke(api.call, lease)
