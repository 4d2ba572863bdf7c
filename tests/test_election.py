"""Leader election against a real etcd and in-process coordinators: campaign, proclaim, resign, leader, observe."""

from __future__ import annotations

import asyncio
import logging
import contextlib
import sys
from typing import Any

import grpc
import pytest
from etcd3aio import Etcd3Client, prefix_range_end

from fencepost.client import (
    AccessDenied,
    AsyncLockClient,
    InvalidArgument,
    LeaderInfo,
    LeaseLost,
    LockClient,
    LockTimeout,
    NotHolder,
)
from fencepost.client.v1 import kinds, lock_pb2, lock_pb2_grpc
from fencepost.client.v1.keys import MAX_VALUE_BYTES, Keys
from fencepost.coordinator.telemetry.events import FIELDS_ATTR

from .conftest import cli_env, error_info, wait_for
from .owned_stub import secret_metadata


async def _leader(stub: Any, election: str) -> lock_pb2.LeaderResponse:
    return await stub.Leader(lock_pb2.LeaderRequest(election=election), timeout=5)


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


async def candidates(etcd_client: Etcd3Client, prefix: str, election: str) -> int:
    """How many candidates (leader included) election ``election`` has in etcd."""
    assert etcd_client.kv is not None
    lock = Keys(prefix).lock_prefix(kinds.election_lock(election))
    resp = await etcd_client.kv.get(lock, prefix_range_end(lock), count_only=True, timeout=5)
    return int(resp.count)


async def test_fifo_handoff_with_larger_token(address: str, etcd_client: Etcd3Client, prefix: str) -> None:
    """Queued candidates lead in arrival order, each with a larger token, when the leader resigns."""
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(AsyncLockClient(address)) for _ in range(3)]
        first = await clients[0].campaign("fifo", "a", timeout=5)
        tasks = []
        for i in (1, 2):
            tasks.append(asyncio.create_task(clients[i].campaign("fifo", "bc"[i - 1], timeout=20)))
            await wait_for(lambda n=i: _has(etcd_client, prefix, "fifo", n + 1), 10, what=f"candidate {i} queued")
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


async def _has(etcd_client: Etcd3Client, prefix: str, election: str, n: int) -> bool:
    return await candidates(etcd_client, prefix, election) == n


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
        assert (await _leader(stub, "once")).leader.value == b"2"
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
            await wait_for(lambda: _has(etcd_client, prefix, "ref", 2), 10, what="the candidate queued")
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
            assert (await _leader(stub, "ref")).leader.value == b"v"
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
        assert not (await _leader(stub, "own")).HasField("leader")
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
        await wait_for(lambda: _has(etcd_client, prefix, "loss", 2), 10, what="the second candidate queued")
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


# ---------------------------------------------------------------- the command line

ELECT_CHILD = r"""
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (print("child got SIGTERM", flush=True), sys.exit(42)))
print(os.environ["FENCEPOST_TOKEN"], os.environ["FENCEPOST_LEASE_ID"], os.environ["FENCEPOST_LOCK"],
      os.environ["FENCEPOST_ELECTION_VALUE"], flush=True)
if sys.argv[1] == "wait":
    time.sleep(60)
"""


async def _fencepost(*args: str, timeout: float = 30.0) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fencepost.client.cli", *args, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=cli_env())
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_cli_elect_value_that_is_not_utf8_is_published_as_given(address: str) -> None:
    """elect --value with bytes that are not UTF-8 publishes those bytes (a traceback before)."""
    script = ("import asyncio, sys\n"
              "from fencepost.client import AsyncLockClient\n"
              "async def main():\n"
              "    async with AsyncLockClient(sys.argv[1]) as c:\n"
              "        print((await c.leader('raw')).value.hex())\n"
              "asyncio.run(main())\n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fencepost.client.cli", "elect", "raw", "--value", b"\xff\xfeok", "--try",
        "--address", address, "--", sys.executable, "-c", script, address, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=cli_env())
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    assert out.decode().split() == [b"\xff\xfeok".hex()], (out, err)  # the leader's value, read while it leads


async def test_cli_elect_and_leader(address: str, etcd_client: Etcd3Client) -> None:
    """``fencepost elect`` runs the command as leader with its token and value; ``fencepost leader`` shows the
    leader, exits 6 without one (1 is "unreachable"), and ``--watch`` prints each change; losing the leadership
    stops the command."""
    rc, out, err = await _fencepost("leader", "cli", "--address", address)
    assert rc == 6 and "no leader" in err, (rc, out, err)
    rc, out, err = await _fencepost("elect", "cli", "--value", "node-1", "--address", address, "--",
                                    sys.executable, "-c", ELECT_CHILD, "exit")
    assert rc == 0, (rc, out, err)
    token, lease, name, value = out.split()
    assert int(token) > 0 and int(lease) > 0 and name == "cli" and value == "node-1"
    assert "Traceback" not in err
    watch = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fencepost.client.cli", "leader", "cli", "--watch", "--address", address,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=cli_env())
    elect: asyncio.subprocess.Process | None = None
    try:
        assert watch.stdout is not None
        assert (await asyncio.wait_for(watch.stdout.readline(), 20)).decode().strip() == "cli: no leader"
        elect = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "fencepost.client.cli", "elect", "cli", "--value", "node-2", "--ttl", "5",
            "--address", address, "--", sys.executable, "-c", ELECT_CHILD, "wait",
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=cli_env())
        assert elect.stdout is not None
        token2, lease2, _, value2 = (await asyncio.wait_for(elect.stdout.readline(), 20)).decode().split()
        assert int(token2) > int(token) and value2 == "node-2"
        shown = (await asyncio.wait_for(watch.stdout.readline(), 20)).decode()
        assert "'node-2'" in shown and f"token {token2}" in shown, shown
        rc, out, err = await _fencepost("leader", "cli", "--address", address)
        assert rc == 0 and "'node-2'" in out and f"token {token2}" in out, (rc, out, err)
        rc, out, err = await _fencepost("elect", "cli", "--value", "node-3", "--try", "--address", address, "--",
                                        sys.executable, "-c", ELECT_CHILD, "exit")
        assert rc == 5 and not out and "command not run" in err, (rc, out, err)
        assert etcd_client.lease is not None
        await etcd_client.lease.revoke(int(lease2), timeout=5)  # the leadership is lost: the command is stopped
        out2, err2 = await asyncio.wait_for(elect.communicate(), 20)
        assert elect.returncode == 3, (elect.returncode, out2, err2)
        assert "child got SIGTERM" in out2.decode() and "lost" in err2.decode()
        assert (await asyncio.wait_for(watch.stdout.readline(), 20)).decode().strip() == "cli: no leader"
        watch.send_signal(2)
        await asyncio.wait_for(watch.wait(), 20)
        assert watch.returncode == 0
    finally:
        for proc in (watch, elect):
            if proc is None:
                continue
            if proc.returncode is None:
                proc.kill()
            await proc.communicate()


async def test_cancelled_campaign_withdraws_its_candidacy(address: str, etcd_client: Etcd3Client,
                                                          prefix: str) -> None:
    """A waiting campaign that is cancelled (or times out) leaves no candidacy behind: the leader's key alone."""
    async with AsyncLockClient(address) as client, AsyncLockClient(address) as other:
        lead = await client.campaign("gone", b"a", timeout=5)
        waiting = asyncio.create_task(other.campaign("gone", b"b"))
        await wait_for(lambda: _has(etcd_client, prefix, "gone", 2), 10, what="the candidate queued")
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await wait_for(lambda: _has(etcd_client, prefix, "gone", 1), 10, what="the candidacy withdrawn")
        with pytest.raises(LockTimeout) as caught:
            await other.campaign("gone", b"c", timeout=0.3)
        assert caught.value.name == "gone"
        assert await candidates(etcd_client, prefix, "gone") == 1
        info = await other.leader("gone")
        assert info is not None and info.token == lead.token
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


async def test_cli_elect_interrupted_while_waiting_exits_130_and_withdraws(address: str, etcd_client: Etcd3Client,
                                                                           prefix: str) -> None:
    """SIGINT while fencepost elect waits behind a leader: exit 130, the command not run, its candidacy gone."""
    import signal

    async with AsyncLockClient(address) as client:
        lead = await client.campaign("intr", b"first", timeout=5)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "fencepost.client.cli", "elect", "intr", "--value", "second", "--address", address,
            "--", sys.executable, "-c", "print('ran')", stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=cli_env())
        try:
            await wait_for(lambda: _has(etcd_client, prefix, "intr", 2), 20, what="the CLI candidate queued")
            proc.send_signal(signal.SIGINT)
            out, err = await asyncio.wait_for(proc.communicate(), 20)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert proc.returncode == 130, err.decode()
        assert b"ran" not in out
        assert await _has(etcd_client, prefix, "intr", 1)  # only the leader's key is left
        await lead.resign()
