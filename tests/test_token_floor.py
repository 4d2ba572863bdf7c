"""Fencing tokens never go back, even after etcd is restored from an older snapshot (issue 9, item 5).

The restore tests run their own etcd (they stop it, restore a snapshot taken
with ``etcdctl snapshot save`` using ``etcdutl snapshot restore``, and start it
again on the same ports), a real coordinator and the real clients. The unit
tests drive :class:`~fencepost.coordinator.recipes.tokens.TokenFloor`'s detection
with response headers, and :func:`~fencepost.coordinator.recipes.tokens.recover` on
the shared etcd.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from etcd3aio import Etcd3Client  # type: ignore[import-untyped]

import fencepost.client as fc
from fencepost.client.errors import from_rpc_error
from fencepost.client.fencing import EtcdGuard
from fencepost.client.v1 import lock_pb2
from fencepost.client.v1.etcd import rpc_pb2
from fencepost.client.v1.keys import Keys
from fencepost.coordinator.etcd import EtcdClient
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.process.embedded import EmbeddedEtcd
from fencepost.coordinator.recipes.tokens import TokenFloor, TokenRecord, record_key, recover

from .conftest import list_keys, wait_for
from .etcd_restore import (NOT_SERVING, SERVING, assert_data_loss, cycles, health_is, own_etcd, recover_cli,
                           refused, restore, snapshot_save)
from .owned_stub import OwnedStub, adopt

__all__ = ["own_etcd"]  # the fixture, from tests/etcd_restore.py


@pytest.fixture
async def coord(own_etcd: EmbeddedEtcd, prefix: str) -> AsyncIterator[Coordinator]:
    """A coordinator on the test's own etcd."""
    coordinator = Coordinator([own_etcd.endpoint], listen="127.0.0.1:0", prefix=prefix)
    await asyncio.wait_for(coordinator.start(), 20)
    try:
        yield coordinator
    finally:
        await asyncio.wait_for(coordinator.stop(0), 20)


# ---------------------------------------------------------------- restore, end to end


async def test_restore_when_coordinator_saw_the_old_revisions(own_etcd: EmbeddedEtcd, coord: Coordinator, prefix: str,
                                                              tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """After a restore of an older snapshot, no grant carries a token at or below one issued before it.

    The coordinator that saw the old revisions refuses (UNAVAILABLE/DATA_LOSS,
    NOT_SERVING, one ERROR line) and publishes its highest token, so that a
    coordinator started after the restore refuses too; after
    ``fencepost admin recover-tokens --above T`` both grant tokens above T,
    strictly increasing, and a restarted coordinator keeps the floor.
    """
    caplog.set_level(logging.INFO, logger="fencepost.coordinator")
    before = await cycles(coord.address, "inv:1", 3)
    raw = grpc.aio.insecure_channel(coord.address)
    stub = OwnedStub(raw)
    lease = (await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=60), timeout=5)).lease_id
    kept = (await stub.Acquire(lock_pb2.AcquireRequest(name="snap", lease_id=lease), timeout=5)).token
    snapshot_save(own_etcd, tmp_path / "snap.db")  # with "snap" held by `lease`: both come back with the restore
    after = await cycles(coord.address, "inv:1", 4)
    await stub.Release(lock_pb2.ReleaseRequest(name="snap", lease_id=lease, token=kept), timeout=5)
    after += [(await stub.Acquire(lock_pb2.AcquireRequest(name="snap", lease_id=lease), timeout=5)).token]
    issued = before + after
    assert sorted(issued) == sorted(set(issued)) and kept < after[-1]
    top = max(issued)  # T: the highest token handed out, known here as an operator knows it from storage

    await asyncio.to_thread(restore, own_etcd, tmp_path / "snap.db")

    await wait_for(lambda: coord.tokens is not None and coord.tokens.refusing is not None, 20, 0.05,
                   "the coordinator to notice etcd went back")
    await wait_for(lambda: health_is(coord.address, NOT_SERVING), 10, 0.05, "health NOT_SERVING")
    for call, request in (("Acquire", lock_pb2.AcquireRequest(name="inv:1", lease_id=1)),
                          ("Release", lock_pb2.ReleaseRequest(name="inv:1", lease_id=1, token=top)),
                          ("Describe", lock_pb2.DescribeRequest(name="inv:1")),
                          ("ListLocks", lock_pb2.ListLocksRequest()),
                          ("LeaseGrant", lock_pb2.LeaseGrantRequest(ttl_seconds=5))):
        assert_data_loss(await refused(coord.address, call, request))
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "fencing tokens would go back" in errors[0] and "docs/deploy.md" in errors[0], errors
    assert f"at least {coord.tokens.high if coord.tokens else 0}" in errors[0], errors
    assert coord.tokens is not None and coord.tokens.high >= top

    # A coordinator started after the restore never saw the old revisions: the published mark stops it,
    # once the first coordinator has published it (its next record check after the detection, within ~1 s).
    await wait_for(lambda: any("published this coordinator's highest token" in r.getMessage() for r in caplog.records),
                   10, 0.05, "the first coordinator to publish its highest token in the token record")
    late = Coordinator([own_etcd.endpoint], listen="127.0.0.1:0", prefix=prefix)
    await asyncio.wait_for(late.start(), 20)
    try:
        assert_data_loss(await refused(late.address, "Acquire", lock_pb2.AcquireRequest(name="inv:1", lease_id=1)))

        out = recover_cli(own_etcd, prefix, top)
        assert out.startswith("tokens recovered at etcd revision"), out

        await wait_for(lambda: health_is(coord.address, SERVING), 10, 0.05, "health SERVING after the recovery")
        await wait_for(lambda: health_is(late.address, SERVING), 10, 0.05, "the late coordinator SERVING")
        granted = await cycles(coord.address, "inv:1", 3) + await cycles(late.address, "inv:1", 3)
        # The lease that held "snap" when the snapshot was taken asks again (Acquire is idempotent per
        # lease and name): its restored key was dropped by the recovery, so it gets a new, higher token.
        granted.append((await stub.Acquire(lock_pb2.AcquireRequest(name="snap", lease_id=lease), timeout=5)).token)
        assert min(granted) > top, (granted, top)
        assert granted == sorted(set(granted)), granted
        await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease), timeout=5)
        await raw.close()
        async with fc.AsyncLockClient(coord.address) as client:
            handle = await client.acquire("inv:2", ttl=10.0, timeout=5.0)
            described = await client.describe("inv:2")
            assert described.holder_token == handle.token > max(granted)
            listed = await client.list_locks()
            assert [lock.token for lock in listed] == [handle.token]
            # The etcd guard compares the holder key's create revision with token - floor: it learns the
            # floor from the token record and keeps accepting the holder's writes.
            async with grpc.aio.insecure_channel(f"dns:///{own_etcd.endpoint}") as etcd_channel:
                guard = EtcdGuard(etcd_channel, prefix=prefix)
                record = prefix.rstrip("/") + ".records/invoice"
                assert await guard.put(record, handle, b"v1") > 0
                assert await guard.get(record) == (b"v1", handle.token)
            adopt(handle)  # the raw Release below is the holder's own
            stale = await refused(coord.address, "Release", lock_pb2.ReleaseRequest(
                name="inv:2", lease_id=handle.lease_id, token=top))  # a token from before the restore
            assert isinstance(from_rpc_error(stale), fc.StaleTokenError)  # the lease holds it under a newer one
            await handle.release()
    finally:
        await asyncio.wait_for(late.stop(0), 20)

    # A restarted coordinator reads the floor from the token record.
    await coord.stop(0)
    again = Coordinator([own_etcd.endpoint], listen="127.0.0.1:0", prefix=prefix)
    await asyncio.wait_for(again.start(), 20)
    try:
        assert min(await cycles(again.address, "inv:1", 2)) > max(granted)
    finally:
        await asyncio.wait_for(again.stop(0), 20)


async def test_restore_when_cluster_id_changed_and_no_coordinator_saw_it(own_etcd: EmbeddedEtcd, prefix: str,
                                                                         tmp_path: Path) -> None:
    """A coordinator started after a restore under a new cluster token refuses at its first call (the record's
    cluster id differs); recover-tokens records the new cluster id and the coordinator serves without a restart."""
    first = Coordinator([own_etcd.endpoint], listen="127.0.0.1:0", prefix=prefix)
    await asyncio.wait_for(first.start(), 20)
    try:
        await cycles(first.address, "a", 2)
        snapshot_save(own_etcd, tmp_path / "snap.db")
        top = max(await cycles(first.address, "a", 3))
    finally:
        await asyncio.wait_for(first.stop(0), 20)

    await asyncio.to_thread(restore, own_etcd, tmp_path / "snap.db", cluster_token="restored-1")
    coordinator = Coordinator([own_etcd.endpoint], listen="127.0.0.1:0", prefix=prefix)
    await asyncio.wait_for(coordinator.start(), 20)
    try:
        err = await refused(coordinator.address, "Acquire", lock_pb2.AcquireRequest(name="a", lease_id=1))
        assert_data_loss(err)
        assert "cluster id" in (err.details() or "")
        await wait_for(lambda: health_is(coordinator.address, NOT_SERVING), 10, 0.05, "health NOT_SERVING")
        recover_cli(own_etcd, prefix, top)
        await wait_for(lambda: health_is(coordinator.address, SERVING), 10, 0.05, "health SERVING")
        granted = await cycles(coordinator.address, "a", 2)
        assert top < granted[0] < granted[1]
    finally:
        await asyncio.wait_for(coordinator.stop(0), 20)


# ---------------------------------------------------------------- unit: detection


def header(revision: int, cluster_id: int = 7) -> rpc_pb2.ResponseHeader:
    return rpc_pb2.ResponseHeader(revision=revision, cluster_id=cluster_id)


def test_seen_when_revisions_grow_then_tokens_are_revisions() -> None:
    """Growing revisions leave the floor at 0: a token is the create revision."""
    floor = TokenFloor(None, Keys("/p/"))
    for revision in (5, 9, 12):
        floor.seen(floor.mark(), header(revision))
    assert floor.refusing is None and floor.high == 12
    assert floor.token(12) == 12 and floor.revision(12) == 12


def test_seen_when_a_later_answer_is_lower_than_the_mark_then_refuses() -> None:
    """An answer whose revision is below what was seen before its request was sent means etcd went back."""
    floor = TokenFloor(None, Keys("/p/"))
    floor.seen(floor.mark(), header(50))
    floor.seen(floor.mark(), header(20))
    assert floor.refusing is not None and "revision 20" in floor.refusing and "50" in floor.refusing
    with pytest.raises(fc.DataLoss):
        floor.token(21)
    with pytest.raises(fc.DataLoss):
        floor.check_serving()
    assert floor.revision(30) == 30  # an unchecked conversion still works (only ends holds)


def test_seen_when_answers_arrive_out_of_order_then_no_refusal() -> None:
    """Concurrent requests answered out of order are not a regression: each is compared with its own mark."""
    floor = TokenFloor(None, Keys("/p/"))
    floor.seen(floor.mark(), header(10))
    early = floor.mark()  # request A sent now
    late = floor.mark()   # request B sent now too
    floor.seen(late, header(15))  # B answered first, at a later revision
    floor.seen(early, header(12))  # A's answer, read before B's write: still >= A's mark
    assert floor.refusing is None and floor.high == 15


def test_token_record_when_round_tripped_or_garbled() -> None:
    """The record survives encoding; anything else is refused as not a record."""
    record = TokenRecord(0xCDF818194E3A8C32, 120, 140)
    assert TokenRecord.decode(record.encode()) == record
    for garbled in (b"", b"{}", b"not json", b'{"cluster_id": 1, "floor": -1}'):
        with pytest.raises(ValueError):
            TokenRecord.decode(garbled)


# ---------------------------------------------------------------- unit: recover() on the shared etcd


async def test_recover_when_locks_are_held_then_deletes_them_and_raises_the_floor(
        etcd: EmbeddedEtcd, prefix: str, etcd_client: Etcd3Client) -> None:
    """recover() drops every lock key under the prefix (not the keys beside it) and sets a floor above T."""
    keys = Keys(prefix)
    layer = EtcdClient([etcd.endpoint])
    try:
        beside = prefix.rstrip("/") + "-beside/x"
        await etcd_client.kv.put(beside.encode(), b"kept", timeout=5)
        await etcd_client.kv.put(keys.contender("held", 1), b"", timeout=5)
        await etcd_client.kv.put(keys.contender("held", 2), b"", timeout=5)
        above = 10**9
        done = await recover(layer, keys, above)
        assert done.deleted == 2 and done.previous is None
        assert await list_keys(etcd_client, prefix) == []
        assert (await etcd_client.kv.get(beside.encode(), timeout=5)).kvs[0].value == b"kept"
        stored = (await etcd_client.kv.get(record_key(keys), timeout=5)).kvs[0]
        assert TokenRecord.decode(stored.value) == done.record and done.record.high == above
        assert done.lowest_token > above and done.lowest_token == done.revision + 1 + done.record.floor
        # Run again with a lower T: the floor never goes down.
        again = await recover(layer, keys, 5)
        assert again.record.floor >= done.record.floor and again.previous == done.record
        await etcd_client.kv.delete(beside.encode(), timeout=5)
    finally:
        await layer.close()


async def test_recover_when_above_is_negative_then_value_error(etcd: EmbeddedEtcd, prefix: str) -> None:
    """A negative T is refused before anything is written."""
    layer = EtcdClient([etcd.endpoint])
    try:
        with pytest.raises(ValueError):
            await recover(layer, Keys(prefix), -1)
    finally:
        await layer.close()
