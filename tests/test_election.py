"""Leader election against a real etcd and in-process coordinators: campaign, proclaim, resign, leader
(observing: tests/test_election_observe.py; the command line: tests/test_election_cli.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import grpc
import pytest
from etcd3aio import Etcd3Client

from fencepost.client import (
    AccessDenied,
    AsyncLockClient,
    InvalidArgument,
    LeaderInfo,
    LeaderObserver,
    LeaseLost,
    LockClient,
    LockTimeout,
    NotHolder,
)
from fencepost.client.v1 import kinds, lock_pb2, lock_pb2_grpc
from fencepost.client.v1.keys import MAX_VALUE_BYTES
from fencepost.coordinator.telemetry.events import FIELDS_ATTR

from .conftest import error_info, wait_for
from .election_helpers import candidates, has_candidates, leader_of
from .owned_stub import secret_metadata


async def test_campaign_leader_proclaim_resign(address: str) -> None:
    """The first candidate leads with its value; proclaim changes the value, not the token; resign frees it."""
    async with AsyncLockClient(address) as client, AsyncLockClient(address) as other:
        assert await client.leader("sched") is None
        lead = await client.campaign("sched", "10.0.0.1:80", ttl=10, timeout=5)
        assert lead.token > 0 and lead.value == b"10.0.0.1:80" and lead.name == "sched"
        assert lead.kind == kinds.HoldKind.HOLD_KIND_ELECTION
        seen = await other.leader("sched")
        assert seen is not None
        assert (seen.value, seen.lease_id, seen.token) == (b"10.0.0.1:80", lead.lease_id, lead.token)
        await lead.proclaim(b"10.0.0.2:80")
        seen = await other.leader("sched")
        assert seen is not None and (seen.value, seen.token) == (b"10.0.0.2:80", lead.token)
        assert lead.value == b"10.0.0.2:80"
        # An election and a lock of the same name are independent.
        lock = await other.acquire("sched", ttl=10, timeout=5)
        await lock.release()
        await lead.resign()
        assert lead.released and not lead.lost.is_set()
        assert await other.leader("sched") is None


async def test_leader_value_given_as_str_comes_back_as_that_str(address: str) -> None:
    """A value given as the str 'me' is b'me' on the wire and in ``value`` (bytes, as before); ``text`` is 'me',
    for LeaderInfo, Leadership and the sync client's; a value given as bytes that are not UTF-8 has no text."""
    async with AsyncLockClient(address) as client:
        lead = await client.campaign("str-value", "me été", ttl=10, timeout=5)
        seen = await client.leader("str-value")
        assert seen is not None and seen.value == "me été".encode()
        assert seen.text == lead.text == "me été"
        await lead.proclaim(b"\xff")
        seen = await client.leader("str-value")
        assert seen is not None and seen.value == b"\xff"
        with pytest.raises(UnicodeDecodeError):
            seen.text  # noqa: B018
        await lead.resign()

    def sync() -> None:
        with LockClient(address) as client:
            lead = client.campaign("str-value", "me", ttl=10, timeout=5)
            info = client.leader("str-value")
            assert info is not None and info.value == b"me" and info.text == lead.text == "me"
            lead.resign()

    await asyncio.wait_for(asyncio.to_thread(sync), 60)


async def test_fifo_handoff_with_larger_token(address: str, etcd_client: Etcd3Client, prefix: str) -> None:
    """Queued candidates lead in arrival order, each with a larger token, when the leader resigns."""
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(AsyncLockClient(address)) for _ in range(3)]
        first = await clients[0].campaign("fifo", "a", timeout=5)
        tasks = []
        for i in (1, 2):
            tasks.append(asyncio.create_task(clients[i].campaign("fifo", "bc"[i - 1], timeout=20)))
            await wait_for(lambda n=i: has_candidates(etcd_client, prefix, "fifo", n + 1), 10,
                           what=f"candidate {i} queued")
        await first.resign()
        second = await asyncio.wait_for(tasks[0], 10)
        assert second.token > first.token and second.value == b"b"
        assert not tasks[1].done()
        info = await clients[0].leader("fifo")
        assert info is not None and info.token == second.token and info.value == b"b"
        await second.resign()
        third = await asyncio.wait_for(tasks[1], 10)
        assert third.token > second.token and third.value == b"c"
        await third.resign()


async def test_try_once_answers_the_leader(address: str, stub: Any) -> None:
    """A try-once Campaign against a led election is not elected, leaves nothing queued and names the leader."""
    async with AsyncLockClient(address) as client, AsyncLockClient(address) as other:
        lead = await client.campaign("once", b"me", timeout=5)
        with pytest.raises(LockTimeout, match="led by lease"):
            await other.campaign("once", b"you", timeout=0)
        grant = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10), timeout=5)
        resp = await stub.Campaign(lock_pb2.CampaignRequest(election="once", lease_id=grant.lease_id, value=b"x"),
                                   timeout=5, metadata=secret_metadata(grant.lease_id))
        assert not resp.elected and resp.token == 0
        assert (resp.leader.lease_id, resp.leader.token, resp.leader.value) == (lead.lease_id, lead.token, b"me")
        # Nothing was queued: once the leader resigns, the election is free.
        await lead.resign()
        assert await other.leader("once") is None
        # The same lease campaigning again while it leads gets the same token, with the new value.
        first = await stub.Campaign(lock_pb2.CampaignRequest(election="once", lease_id=grant.lease_id, value=b"1"),
                                    timeout=5, metadata=secret_metadata(grant.lease_id))
        again = await stub.Campaign(lock_pb2.CampaignRequest(election="once", lease_id=grant.lease_id, value=b"2"),
                                    timeout=5, metadata=secret_metadata(grant.lease_id))
        assert first.elected and again.elected and again.token == first.token
        assert (await leader_of(stub, "once")).leader.value == b"2"
        await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=grant.lease_id), timeout=5)


@pytest.mark.parametrize(("call", "message", "field"), [
    ("Campaign", lock_pb2.CampaignRequest(election="", lease_id=1), "election"),
    ("Campaign", lock_pb2.CampaignRequest(election="a\nb", lease_id=1), "election"),
    ("Campaign", lock_pb2.CampaignRequest(election="e", lease_id=0), "lease_id"),
    ("Campaign", lock_pb2.CampaignRequest(election="e", lease_id=1, wait_ms=-1), "wait_ms"),
    ("Campaign", lock_pb2.CampaignRequest(election="e", lease_id=1, request_id="no spaces"), "request_id"),
    ("Campaign", lock_pb2.CampaignRequest(election="e", lease_id=1, request_id="r" * 65), "request_id"),
    ("Proclaim", lock_pb2.ProclaimRequest(election="e", lease_id=1, token=0), "token"),
    ("Proclaim", lock_pb2.ProclaimRequest(election="\x01e/x", lease_id=1, token=1), "election"),
    ("Resign", lock_pb2.ResignRequest(election="e", lease_id=1, token=-1), "token"),
    ("Resign", lock_pb2.ResignRequest(election="e", lease_id=-5), "lease_id"),
    ("Leader", lock_pb2.LeaderRequest(election=""), "election"),
])
async def test_bad_input_names_the_field(stub: Any, call: str, message: Any, field: str) -> None:
    """A malformed election request is INVALID_ARGUMENT naming its field, before any other check."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await getattr(stub, call)(message, timeout=5)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    info = error_info(caught.value)
    assert info is not None and info.metadata["field"] == field


async def test_value_of_the_longest_size_goes_through_and_longer_is_refused(stub: Any) -> None:
    """A value of MAX_VALUE_BYTES reaches a default coordinator (its --max-message-bytes leaves room) and is
    the leader's value; one byte more is INVALID_ARGUMENT naming "value"."""
    grant = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10), timeout=5)
    metadata = (("fencepost-lease-secret", grant.lease_secret),)
    longest = b"v" * MAX_VALUE_BYTES
    won = await stub.Campaign(lock_pb2.CampaignRequest(election="longest", lease_id=grant.lease_id, value=longest),
                              metadata=metadata, timeout=5)
    assert won.elected
    assert (await stub.Leader(lock_pb2.LeaderRequest(election="longest"), timeout=5)).leader.value == longest
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Proclaim(lock_pb2.ProclaimRequest(election="longest", lease_id=grant.lease_id, token=won.token,
                                                     value=longest + b"v"), metadata=metadata, timeout=5)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    info = error_info(caught.value)
    assert info is not None and info.metadata["field"] == "value"
    await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=grant.lease_id), metadata=metadata, timeout=5)


async def test_client_checks_input_before_any_call(address: str) -> None:
    """The client refuses a bad election or value with InvalidArgument naming the field."""
    async with AsyncLockClient(address) as client:
        for kwargs, field in (({"election": "", "value": b""}, "election"),
                              ({"election": "e", "value": b"v" * (MAX_VALUE_BYTES + 1)}, "value"),
                              ({"election": "e", "value": 3}, "value"),
                              ({"election": "e", "value": "\udcff"}, "value")):  # a lone surrogate: not UTF-8
            with pytest.raises(InvalidArgument) as caught:
                await client.campaign(**kwargs)  # type: ignore[arg-type]
            assert caught.value.field == field


async def test_proclaim_and_resign_refused_unless_leader(address: str, stub: Any, etcd_client: Etcd3Client,
                                                        prefix: str) -> None:
    """Proclaim and Resign by a candidate that does not lead, or with another token, are refused as Release is."""
    async with AsyncLockClient(address) as client:
        lead = await client.campaign("ref", b"v", timeout=5)
        grant = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10), timeout=5)
        waiting = asyncio.ensure_future(stub.Campaign(
            lock_pb2.CampaignRequest(election="ref", lease_id=grant.lease_id, value=b"w", wait_ms=20_000),
            timeout=25, metadata=secret_metadata(grant.lease_id)))
        try:
            await wait_for(lambda: has_candidates(etcd_client, prefix, "ref", 2), 10, what="the candidate queued")
            # The waiting candidate's own key has a revision above the leader's: it does not lead under it.
            for token in (lead.token, lead.token + 1):
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stub.Proclaim(lock_pb2.ProclaimRequest(election="ref", lease_id=grant.lease_id,
                                                                 token=token, value=b"x"),
                                        timeout=5, metadata=secret_metadata(grant.lease_id))
                assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                info = error_info(caught.value)
                assert info is not None and info.reason in ("NOT_HOLDER", "STALE_TOKEN")
                assert "\x01" not in (caught.value.details() or "")  # the public name only
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.Resign(lock_pb2.ResignRequest(election="ref", lease_id=grant.lease_id, token=lead.token),
                                  timeout=5, metadata=secret_metadata(grant.lease_id))
            assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            # The leader's value did not change.
            assert (await leader_of(stub, "ref")).leader.value == b"v"
            # Resign with token 0 withdraws the waiting candidacy (found), and again finds nothing.
            first = await stub.Resign(lock_pb2.ResignRequest(election="ref", lease_id=grant.lease_id),
                                      timeout=5, metadata=secret_metadata(grant.lease_id))
            again = await stub.Resign(lock_pb2.ResignRequest(election="ref", lease_id=grant.lease_id),
                                      timeout=5, metadata=secret_metadata(grant.lease_id))
            assert first.found and not again.found
        finally:
            waiting.cancel()
            with contextlib.suppress(BaseException):
                await waiting
            await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=grant.lease_id), timeout=5)
        await lead.resign()
        with pytest.raises(NotHolder):
            await lead.proclaim(b"late")


async def test_ownership_refused_without_the_lease_secret(address: str, stub: Any, channel: Any) -> None:
    """Campaign, Proclaim and Resign on a lease the caller did not grant are PERMISSION_DENIED / NOT_LEASE_OWNER."""
    grant = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10), timeout=5)
    stranger = lock_pb2_grpc.LockServiceStub(channel)  # presents no secret
    try:
        for call, request in (
                ("Campaign", lock_pb2.CampaignRequest(election="own", lease_id=grant.lease_id)),
                ("Proclaim", lock_pb2.ProclaimRequest(election="own", lease_id=grant.lease_id, token=1)),
                ("Resign", lock_pb2.ResignRequest(election="own", lease_id=grant.lease_id))):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await getattr(stranger, call)(request, timeout=5)
            assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED, call
            info = error_info(caught.value)
            assert info is not None and info.reason == "NOT_LEASE_OWNER", call
        assert not (await leader_of(stub, "own")).HasField("leader")
    finally:
        await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=grant.lease_id), timeout=5)


POLICY = """
[[allow]]
anonymous = true
actions = ["acquire", "release", "describe"]
names = ["open*"]

[[allow]]
anonymous = true
actions = ["describe"]
names = ["seen"]
"""


async def test_policy_checks_elections_by_name(etcd: Any, prefix: str) -> None:
    """The access policy applies the lock actions to elections by their public name."""
    from fencepost.coordinator.admission.access import Policy
    from fencepost.coordinator.process.coordinator import Coordinator

    coord = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix, policy=Policy.from_text(POLICY))
    await asyncio.wait_for(coord.start(), 20)
    try:
        async with AsyncLockClient(f"127.0.0.1:{coord.port}") as client:
            lead = await client.campaign("open-1", b"v", timeout=5)
            await lead.proclaim(b"w")
            assert (await client.leader("open-1")) is not None
            await lead.resign()
            assert await client.leader("seen") is None  # describe only
            with pytest.raises(AccessDenied) as caught:
                await client.campaign("seen", b"v", timeout=5)
            assert caught.value.action == "acquire"
            with pytest.raises(AccessDenied):
                await client.leader("closed")
            with pytest.raises(AccessDenied):
                async for _ in client.observe("closed"):
                    pass
    finally:
        await asyncio.wait_for(coord.stop(grace=0), 20)


async def test_leadership_loss_is_signalled(address: str, etcd_client: Etcd3Client, prefix: str,
                                           caplog: pytest.LogCaptureFixture) -> None:
    """When the leader's lease is revoked, its handle is lost as a lock's is, and the next candidate leads; the
    coordinator's hold_ended line names the election as such (never its internal lock name)."""
    caplog.set_level(logging.INFO, logger="fencepost.coordinator")
    async with AsyncLockClient(address) as client, AsyncLockClient(address) as other:
        lead = await client.campaign("loss", b"a", ttl=10, timeout=5)
        called = asyncio.Event()
        loop = asyncio.get_running_loop()
        lead.on_lost(lambda _h: loop.call_soon_threadsafe(called.set))
        nxt = asyncio.create_task(other.campaign("loss", b"b", ttl=10, timeout=20))
        await wait_for(lambda: has_candidates(etcd_client, prefix, "loss", 2), 10, what="the second candidate queued")
        assert etcd_client.lease is not None
        await etcd_client.lease.revoke(lead.lease_id, timeout=5)  # as an operator would, behind the client's back
        await asyncio.wait_for(lead.lost.wait(), 10)
        await asyncio.wait_for(called.wait(), 10)
        assert lead.lost_reason in ("LEASE_EXPIRED", "NOT_HOLDER")
        second = await asyncio.wait_for(nxt, 10)
        assert second.token > lead.token and second.value == b"b"
        with pytest.raises(LeaseLost):
            lead.check()
        await second.resign()
    ended = [r for r in caplog.records if getattr(r, "event", None) == "hold_ended"]
    assert ended, [r.getMessage() for r in caplog.records]
    for record in ended:
        assert "\x01" not in record.getMessage() and "\x01" not in repr(record.__dict__), record.getMessage()
        fields = getattr(record, FIELDS_ATTR)
        assert (fields["name"], fields["kind"]) == ("loss", "election"), fields
        assert "election 'loss'" in record.getMessage(), record.getMessage()


async def test_cancelled_campaign_withdraws_its_candidacy(address: str, etcd_client: Etcd3Client,
                                                          prefix: str) -> None:
    """A waiting campaign that is cancelled (or times out) leaves no candidacy behind: the leader's key alone."""
    async with AsyncLockClient(address) as client, AsyncLockClient(address) as other:
        lead = await client.campaign("gone", b"a", timeout=5)
        waiting = asyncio.create_task(other.campaign("gone", b"b"))
        await wait_for(lambda: has_candidates(etcd_client, prefix, "gone", 2), 10, what="the candidate queued")
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await wait_for(lambda: has_candidates(etcd_client, prefix, "gone", 1), 10, what="the candidacy withdrawn")
        with pytest.raises(LockTimeout) as caught:
            await other.campaign("gone", b"c", timeout=0.3)
        assert caught.value.name == "gone"
        assert await candidates(etcd_client, prefix, "gone") == 1
        info = await other.leader("gone")
        assert info is not None and info.token == lead.token
        await lead.resign()


async def test_sync_client_campaign_observe_and_on_leader(address: str) -> None:
    """The sync client campaigns, proclaims, resigns, and observes by iterator and by callback."""
    await asyncio.wait_for(asyncio.to_thread(_sync_election, address), 60)  # the coordinator runs on this loop


def _sync_election(address: str) -> None:
    import queue as q

    with LockClient(address) as client, LockClient(address) as other:
        changes: q.Queue[LeaderInfo | None] = q.Queue()
        observer = other.on_leader("sync", changes.put)
        assert changes.get(timeout=10) is None
        lead = client.campaign("sync", "v1", ttl=5, timeout=5)
        assert lead.value == b"v1" and lead.token > 0
        got = changes.get(timeout=10)
        assert got is not None and (got.token, got.value, got.lease_id) == (lead.token, b"v1", lead.lease_id)
        lead.proclaim("v2")
        got = changes.get(timeout=10)
        assert got is not None and got.value == b"v2"
        info = other.leader("sync")
        assert info is not None and info.value == b"v2"
        iterator = other.observe("sync")
        current = next(iterator)
        assert current is not None and current.value == b"v2"
        lead.resign()
        assert changes.get(timeout=10) is None
        assert next(iterator) is None
        iterator.close()
        observer.stop()
        assert observer.error is None
        assert other.leader("sync") is None


async def test_leader_observer_made_directly_follows_and_leaves_the_client_open(address: str) -> None:
    """``LeaderObserver(client, election, callback)``, the exported class made by hand as before the client's
    regrouping: it follows the election, and stopping it leaves the caller's client open."""
    await asyncio.wait_for(asyncio.to_thread(_observer_made_directly, address), 60)


def _observer_made_directly(address: str) -> None:
    import queue as q

    with LockClient(address) as client:
        changes: q.Queue[LeaderInfo | None] = q.Queue()
        observer = LeaderObserver(client, "direct", changes.put)
        assert changes.get(timeout=10) is None
        lead = client.campaign("direct", "me", ttl=5, timeout=5)
        got = changes.get(timeout=10)
        assert got is not None and got.value == b"me"
        lead.resign()
        assert changes.get(timeout=10) is None
        observer.stop()
        assert observer.error is None
        assert client.leader("direct") is None  # the client is still open

