"""AdminRevoke of an election's leader and of a semaphore's permit holder (kind, slot), on a real coordinator with
mTLS and an access policy: through the clients, the raw stub (bad kinds and slots) and `fencepost admin revoke`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from fencepost.client import AsyncLockClient, InvalidArgument, LockClient, Revoked
from fencepost.client.v1 import details, kinds, lock_pb2
from fencepost.coordinator.process.coordinator import Coordinator

from .cli_helpers import run_cli
from .conftest import assert_invalid_field, wait_for
from .owned_stub import OwnedStub
from .test_admin import Pki, pki, policed  # noqa: F401  (fixtures: a coordinator with mTLS and an access policy)
from .tls_helpers import open_channel

ELECTION = "jobs/leader"
SEMAPHORE = "jobs/pool"
LOCK, ELECT, SEM = (kinds.HoldKind.HOLD_KIND_LOCK, kinds.HoldKind.HOLD_KIND_ELECTION,
                    kinds.HoldKind.HOLD_KIND_SEMAPHORE)


async def _candidates_waiting(coordinator: Coordinator, election: str, n: int) -> bool:
    return (await coordinator.locks.describe(kinds.election_lock(election))).waiter_count == n


@contextlib.asynccontextmanager
async def _finally_cancelled(task: asyncio.Task[Any]) -> AsyncIterator[asyncio.Task[Any]]:
    """Yield ``task``; at the end cancel it if it is still running, and release what it got."""
    try:
        yield task
    finally:
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            got = await task
            await got.release()


async def test_admin_revoke_of_an_election_deposes_its_leader(policed: Coordinator, pki: Pki,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """kind ELECTION revokes the leader's lease: its Leadership reports lost (the client's log line names the
    election), the next candidate leads with a larger token; the answer names the leader's lease and token; an
    election without a leader revokes nothing."""
    caplog.set_level(logging.INFO, "fencepost.client")
    async with AsyncLockClient(policed.address, tls=pki.tls(pki.billing)) as a, \
            AsyncLockClient(policed.address, tls=pki.tls(pki.worker)) as b, \
            AsyncLockClient(policed.address, tls=pki.tls(pki.operator)) as operator:
        leader = await a.campaign(ELECTION, "a", ttl=30.0, timeout=10.0)
        async with _finally_cancelled(asyncio.create_task(b.campaign(ELECTION, "b", ttl=30.0, timeout=60.0))) as nxt:
            await wait_for(lambda: _candidates_waiting(policed, ELECTION, 1), 10, what="b campaigning")
            # a lock of the same name is not the election: nothing to revoke there
            assert await operator.admin_revoke(ELECTION) == Revoked(ELECTION, False, 0, 0)
            assert not leader.lost.is_set()

            revoked = await operator.admin_revoke(ELECTION, kind=ELECT)
            assert revoked == Revoked(ELECTION, True, leader.lease_id, leader.token, ELECT, 0)
            await asyncio.wait_for(leader.lost.wait(), 10)
            assert not leader.is_valid() and leader.lost_reason in ("NOT_HOLDER", "LEASE_EXPIRED"), leader.lost_reason
            successor = await asyncio.wait_for(nxt, 10)
            assert successor.token > leader.token
            assert f"fencepost: election {ELECTION!r} (lease {leader.lease_id}, token {leader.token}) lost" in \
                caplog.text, caplog.text
            now = await operator.leader(ELECTION)
            assert now is not None and (now.value, now.lease_id, now.token) == (b"b", successor.lease_id,
                                                                                 successor.token)
        assert await operator.admin_revoke(ELECTION, kind="election") == Revoked(ELECTION, False, 0, 0, ELECT, 0)


async def test_admin_revoke_of_a_semaphore_slot_deposes_that_permit_holder(policed: Coordinator, pki: Pki) -> None:
    """kind SEMAPHORE, slot k revokes the lease of the holder of permit k only: it reports lost, the other
    permit holder keeps its permit, and the waiter is granted slot k with a larger token."""
    tls = pki.tls(pki.worker)
    async with AsyncLockClient(policed.address, tls=pki.tls(pki.billing)) as a, \
            AsyncLockClient(policed.address, tls=tls) as b, AsyncLockClient(policed.address, tls=tls) as c, \
            AsyncLockClient(policed.address, tls=pki.tls(pki.operator)) as operator:
        first = await a.semaphore(SEMAPHORE, 2, ttl=30.0).acquire(timeout=10.0)
        second = await b.semaphore(SEMAPHORE, 2, ttl=30.0).acquire(timeout=10.0)
        assert {first.slot, second.slot} == {0, 1}
        watching = operator.semaphore(SEMAPHORE, 2)

        async def one_waiter() -> bool:
            return (await watching.describe()).waiter_count == 1

        waiting = asyncio.create_task(c.semaphore(SEMAPHORE, 2, ttl=30.0).acquire(timeout=60.0))
        async with _finally_cancelled(waiting):
            await wait_for(one_waiter, 10, what="c waiting")
            k = second.slot
            revoked = await operator.admin_revoke(SEMAPHORE, kind=SEM, slot=k)
            assert revoked == Revoked(SEMAPHORE, True, second.lease_id, second.token, SEM, k)
            await asyncio.wait_for(second.lost.wait(), 10)
            granted = await asyncio.wait_for(waiting, 10)
            assert (granted.slot, granted.token > second.token) == (k, True)
            assert not first.lost.is_set() and first.is_valid()
            seen = await watching.describe()
            assert {(h.slot, h.lease_id, h.token) for h in seen.holders} == {
                (first.slot, first.lease_id, first.token), (k, granted.lease_id, granted.token)}
            await first.release()

            with LockClient(policed.address, tls=pki.tls(pki.operator)) as sync_operator:
                free = await asyncio.to_thread(sync_operator.admin_revoke, SEMAPHORE, kind="semaphore", slot=1 - k)
            assert free == Revoked(SEMAPHORE, False, 0, 0, SEM, 1 - k)
            assert granted.is_valid()


async def test_admin_revoke_when_kind_or_slot_is_bad(policed: Coordinator, pki: Pki) -> None:
    """An unknown kind, a slot for a lock or an election, a negative slot, or a slot not below the semaphore's
    permits is INVALID_ARGUMENT naming the field, and revokes nothing; a semaphore never used has no holder;
    a request id reused for another kind is REQUEST_ID_REUSED. The client refuses bad kinds and slots first."""
    async with open_channel(policed.address, pki.operator.credentials) as oc, \
            AsyncLockClient(policed.address, tls=pki.tls(pki.billing)) as a, \
            AsyncLockClient(policed.address, tls=pki.tls(pki.operator)) as operator:
        stub = OwnedStub(oc)
        permit = await a.semaphore(SEMAPHORE, 2, ttl=30.0).acquire(timeout=10.0)
        for kind, slot, field in [(7, 0, "kind"), (LOCK, 1, "slot"), (ELECT, 1, "slot"), (SEM, -1, "slot"),
                                  (SEM, 2, "slot"), (SEM, 1000, "slot")]:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.AdminRevoke(lock_pb2.AdminRevokeRequest(name=SEMAPHORE, kind=kind, slot=slot), timeout=10)
            assert_invalid_field(info.value, field)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.AdminRevoke(lock_pb2.AdminRevokeRequest(name=SEMAPHORE, kind=SEM, slot=2), timeout=10)
        assert "has 2 permits" in info.value.details(), info.value.details()
        assert permit.is_valid() and await policed.locks.lease_alive(permit.lease_id)

        never = await stub.AdminRevoke(lock_pb2.AdminRevokeRequest(name="jobs/unused", kind=SEM, slot=5), timeout=10)
        assert (never.revoked, never.lease_id, never.token) == (False, 0, 0)

        first = await stub.AdminRevoke(lock_pb2.AdminRevokeRequest(name="jobs/free", request_id="r1"), timeout=10)
        assert not first.revoked
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.AdminRevoke(lock_pb2.AdminRevokeRequest(name="jobs/free", kind=ELECT, request_id="r1"),
                                   timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        reused = details.parse(info.value)
        assert reused.reason == "REQUEST_ID_REUSED" and reused.metadata.get(details.NAME) == "jobs/free"
        assert "used for AdminRevoke of 'jobs/free'" in reused.message, reused.message
        await stub.AdminRevoke(lock_pb2.AdminRevokeRequest(name="jobs/free", kind=SEM, slot=1, request_id="r2"),
                               timeout=10)
        with pytest.raises(grpc.aio.AioRpcError) as info:  # another slot: another call
            await stub.AdminRevoke(lock_pb2.AdminRevokeRequest(name="jobs/free", kind=SEM, slot=0, request_id="r2"),
                                   timeout=10)
        reused = details.parse(info.value)
        assert reused.reason == "REQUEST_ID_REUSED" and reused.metadata.get(details.NAME) == "jobs/free"
        assert "used for AdminRevoke of semaphore 'jobs/free' slot 1" in reused.message, reused.message
        assert "\x01" not in reused.message

        for kwargs, field in [({"kind": 7}, "kind"), ({"kind": True}, "kind"), ({"kind": SEM}, "slot"),
                              ({"kind": SEM, "slot": -1}, "slot"), ({"kind": SEM, "slot": "1"}, "slot"),
                              ({"kind": SEM, "slot": 2**31}, "slot"),
                              ({"kind": ELECT, "slot": 0}, "slot"), ({"slot": 0}, "slot")]:
            with pytest.raises(InvalidArgument) as caught:
                await operator.admin_revoke(SEMAPHORE, **kwargs)
            assert caught.value.field == field, kwargs
        with pytest.raises(InvalidArgument) as caught:
            await operator.admin_revoke(SEMAPHORE, kind=SEM, slot=3)  # the coordinator's check
        assert caught.value.field == "slot"
        assert permit.is_valid()
        await permit.release()


async def test_cli_admin_revoke_of_an_election_and_a_semaphore_slot(policed: Coordinator, pki: Pki) -> None:
    """`fencepost admin revoke NAME --election` deposes the leader, `--semaphore --slot N` the holder of permit
    N (one line, or --json with kind and slot); a bad flag combination or a slot out of range exits 2."""
    base = ["--address", policed.address, *pki.flags(pki.operator)]
    async with AsyncLockClient(policed.address, tls=pki.tls(pki.billing)) as a:
        leader = await a.campaign(ELECTION, "a", ttl=30.0, timeout=10.0)
        deposed = await run_cli("admin", "revoke", ELECTION, "--election", *base)
        assert deposed.rc == 0, deposed.err
        assert deposed.out.strip() == (f"revoked lease 0x{leader.lease_id:x} ({leader.lease_id}), the leader of "
                                       f"election {ELECTION} with token {leader.token}")
        await asyncio.wait_for(leader.lost.wait(), 10)
        none = await run_cli("admin", "revoke", ELECTION, "--election", *base)
        assert (none.rc, none.out.strip()) == (0, f"election {ELECTION} has no leader: nothing revoked"), none

    async with AsyncLockClient(policed.address, tls=pki.tls(pki.billing)) as a:
        permit = await a.semaphore(SEMAPHORE, 3, ttl=30.0).acquire(timeout=10.0)
        out_of_range = await run_cli("admin", "revoke", SEMAPHORE, "--semaphore", "--slot", "3", *base)
        assert out_of_range.rc == 2 and "invalid slot" in out_of_range.err, out_of_range
        slot = str(permit.slot)
        revoked = await run_cli("admin", "revoke", SEMAPHORE, "--semaphore", "--slot", slot, "--json", *base)
        assert revoked.rc == 0, revoked.err
        assert json.loads(revoked.out) == {"address": policed.address, "name": SEMAPHORE, "kind": "semaphore",
                                           "slot": permit.slot, "revoked": True, "lease_id": permit.lease_id,
                                           "token": permit.token}
        await asyncio.wait_for(permit.lost.wait(), 10)
        free = await run_cli("admin", "revoke", SEMAPHORE, "--semaphore", "--slot", slot, *base)
        assert free.out.strip() == f"semaphore {SEMAPHORE} permit {slot} is not held: nothing revoked", free

    for flags, text in [(["--semaphore"], "--semaphore needs --slot"), (["--slot", "1"], "--slot is for"),
                        (["--election", "--slot", "1"], "--slot is for"),
                        (["--election", "--semaphore"], "not allowed"),
                        (["--semaphore", "--slot", "-1"], "slot must be 0 or more"),
                        (["--semaphore", "--slot", str(2**31)], "at most 999")]:
        bad = await run_cli("admin", "revoke", SEMAPHORE, *flags, *base)
        assert bad.rc == 2 and text in bad.err and len(bad.err.splitlines()) == 1, (flags, bad)
