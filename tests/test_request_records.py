"""Retries safe to repeat (issue 13, item 4), the request record store
(:mod:`fencepost.coordinator.recipes.requests`) against a real etcd: request ids, records on a records
lease, an id reused by another call, and retries through the service and on the KeepAlive stream (lost
answers end to end: tests/test_retries.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import grpc
import pytest
from etcd3aio import Etcd3Client

from fencepost.client.errors import InvalidArgument, NotHolder, from_rpc_error
from fencepost.client.v1 import details, etcdops, lock_pb2
from fencepost.client.v1.details import ErrorReason
from fencepost.client.v1.keys import Keys
from fencepost.coordinator.etcd import EtcdClient
from fencepost.coordinator.recipes.lock import LockManager
from fencepost.coordinator.recipes.requests import Call, RequestIdReused, RequestRecords, validate_request_id
from fencepost.coordinator.recipes.watch import DeleteWatcher

from .conftest import assert_invalid_field, error_info, lease_ids, list_keys, records_leases, wait_for
from .owned_stub import OwnedStub


@pytest.fixture
async def etcd_layer(etcd: Any) -> AsyncIterator[EtcdClient]:
    client = EtcdClient([etcd.endpoint])
    await client.connect()
    try:
        yield client
    finally:
        await client.close()


@pytest.mark.parametrize("request_id", ["", "a", "A-z_09", "f" * 64, "0123456789abcdef0123456789abcdef"])
def test_validate_request_id_when_good(request_id: str) -> None:
    """Empty (no record), or 1 to 64 characters of [A-Za-z0-9_-], is accepted as it is."""
    assert validate_request_id(request_id) == request_id


@pytest.mark.parametrize("request_id", ["f" * 65, "a b", "a/b", "a.b", "é", "id\n", "*"])
def test_validate_request_id_when_bad(request_id: str) -> None:
    """Anything else is InvalidArgument naming the field ``request_id``."""
    with pytest.raises(InvalidArgument) as info:
        validate_request_id(request_id)
    assert info.value.field == "request_id"


def test_request_record_key_when_parsed_is_no_lock_key() -> None:
    """A request record's key lies in no lock's key range and does not parse as a contender key."""
    keys = Keys("/p/")
    key = keys.request_record("abc-DEF_1")
    assert key == b"/p/.request.abc-DEF_1"
    assert keys.parse(key) is None and keys.is_record(key)
    for name in (".request.abc-DEF_1", ".request", ".request.abc-DEF_1/x", ""):
        if name:
            assert not key.startswith(keys.lock_prefix(name))


async def test_records_when_written_live_on_a_records_lease_that_is_not_kept_alive(
        etcd_layer: EtcdClient, prefix: str, etcd_client: Etcd3Client) -> None:
    """A record is attached to the records lease; a new lease is granted once the current one is
    ``rotate`` old (in the background) and used after ``use``; a record ends with its lease."""
    now = [1000.0]
    records = RequestRecords(etcd_layer, Keys(prefix), ttl_seconds=2, rotate_seconds=0.5, use_seconds=1.0,
                             clock=lambda: now[0])
    call = Call("Release", "x", 7, 9)
    try:
        assert await records.ops_for("", call) == []
        ops = await records.ops_for("r1", call)
        first = records.lease_id
        assert first and ops[0].request_put.lease == first
        await etcd_layer.txn(_put_plan(ops))
        kv = (await etcd_client.kv.get(Keys(prefix).request_record("r1"), timeout=5)).kvs[0]
        assert kv.lease == first
        assert first in await records_leases(etcd_client)  # marked as a records lease (not a caller's)
        assert first not in await lease_ids(etcd_client)
        assert (await records.outcome("r1", call)) is not None
        now[0] += 0.6  # past rotate: still the same lease, a new one is granted in the background
        assert (await records.ops_for("r2", call))[0].request_put.lease == first
        now[0] += 0.6  # past use: a new lease (waited for if the background grant is not done)
        second = (await records.ops_for("r3", call))[0].request_put.lease
        assert second and second != first
        # Never kept alive: the record ends with its lease, 2 s after its grant.
        await wait_for(lambda: _absent(etcd_client, Keys(prefix).request_record("r1")), 10,
                       what="the record to expire with its records lease")
        assert await records.outcome("r1", call) is None
    finally:
        await records.close()


async def _absent(client: Etcd3Client, key: bytes) -> bool:
    return not (await client.kv.get(key, timeout=5)).kvs


def _put_plan(ops: list[Any]) -> Any:
    from fencepost.coordinator.etcd import TxnPlan

    return TxnPlan(etcdops.txn([], ops), lambda resp: True, [], lambda resp: True)


async def test_records_when_an_id_is_reused_by_another_call(etcd_layer: EtcdClient, prefix: str) -> None:
    """The record answers only the call that wrote it; another call with the id is RequestIdReused."""
    records = RequestRecords(etcd_layer, Keys(prefix))
    written = Call("Release", "x", 7, 9)
    try:
        await etcd_layer.txn(_put_plan(await records.ops_for("id-1", written)))
        record = await records.outcome("id-1", written)
        assert record is not None and record.call == written and record.revision > 0
        for other in (Call("Release", "x", 7, 10), Call("Release", "y", 7, 9), Call("Resign", "x", 7, 9)):
            with pytest.raises(RequestIdReused) as info:
                await records.outcome("id-1", other)
            assert info.value.field == "request_id" and info.value.request_id == "id-1"
        assert await records.outcome("id-2", written) is None
    finally:
        await records.close()


async def test_release_retry_when_the_id_is_the_same_or_reused(coordinator: Any, stub: OwnedStub) -> None:
    """Through the service: a Release sent again with its request id answers OK with the first revision;
    with that id and another token, REQUEST_ID_REUSED naming the id; without an id, NOT_HOLDER."""
    lease = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10), timeout=5)
    grant = await stub.Acquire(lock_pb2.AcquireRequest(name="r", lease_id=lease.lease_id), timeout=5)
    release = lock_pb2.ReleaseRequest(name="r", lease_id=lease.lease_id, token=grant.token, request_id="rel-1")
    first = await stub.Release(release, timeout=5)
    again = await stub.Release(release, timeout=5)
    assert again.revision == first.revision > 0
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Release(lock_pb2.ReleaseRequest(name="r", lease_id=lease.lease_id, token=grant.token + 1,
                                                   request_id="rel-1"), timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    reused = error_info(info.value)
    assert reused is not None and reused.reason == "REQUEST_ID_REUSED"
    assert reused.metadata[details.REQUEST_ID] == "rel-1" and reused.metadata[details.FIELD] == "request_id"
    err = from_rpc_error(info.value)
    assert isinstance(err, InvalidArgument) and err.field == "request_id"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Release(lock_pb2.ReleaseRequest(name="r", lease_id=lease.lease_id, token=grant.token), timeout=5)
    assert isinstance(from_rpc_error(info.value), NotHolder)
    await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease.lease_id), timeout=5)


@pytest.mark.parametrize("method", ["Acquire", "Release", "Withdraw", "AdminRevoke"])
async def test_request_id_when_malformed_is_invalid_argument(coordinator: Any, stub: OwnedStub, method: str) -> None:
    """Every call that takes a request id refuses a malformed one with INVALID_ARGUMENT naming ``request_id``."""
    request = {
        "Acquire": lock_pb2.AcquireRequest(name="m", lease_id=1, request_id="no spaces"),
        "Release": lock_pb2.ReleaseRequest(name="m", lease_id=1, token=1, request_id="no spaces"),
        "Withdraw": lock_pb2.WithdrawRequest(name="m", lease_id=1, request_id="no spaces"),
        "AdminRevoke": lock_pb2.AdminRevokeRequest(name="m", request_id="x" * 65),
    }[method]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await getattr(stub, method)(request, timeout=5)
    assert_invalid_field(info.value, "request_id")


def test_request_id_reused_maps_to_its_reason() -> None:
    """REQUEST_ID_REUSED is INVALID_ARGUMENT in the one table both sides use."""
    assert details.CODE_BY_REASON[ErrorReason.REQUEST_ID_REUSED] == grpc.StatusCode.INVALID_ARGUMENT


async def test_release_on_the_stream_when_sent_again_with_its_request_id(coordinator: Any, stub: OwnedStub) -> None:
    """The request id rides in the ReleaseRequest sent on the KeepAlive stream: a Release sent again
    there with its id (a retry after a stream broke) answers ``released`` with the first revision."""
    from .test_stream_calls import Session

    session = Session(stub)
    try:
        lease = (await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10), timeout=5)).lease_id
        token = (await session.ask("acquire", lock_pb2.AcquireRequest(name="s", lease_id=lease))).acquired.token
        release = lock_pb2.ReleaseRequest(name="s", lease_id=lease, token=token, request_id="stream-1")
        first = await session.ask("release", release)
        again = await session.ask("release", release)
        assert first.WhichOneof("response") == again.WhichOneof("response") == "released"
        assert again.released.revision == first.released.revision > token
        bare = await session.ask("release", lock_pb2.ReleaseRequest(name="s", lease_id=lease, token=token))
        assert bare.WhichOneof("response") == "failed"  # without the id: NOT_HOLDER, as before
        await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease), timeout=5)
    finally:
        await session.close()


async def test_records_when_one_id_is_reused_by_two_releases_of_one_batch(
        etcd_layer: EtcdClient, prefix: str, etcd_client: Etcd3Client, caplog: pytest.LogCaptureFixture) -> None:
    """Two Releases of different locks with one request id in one batch of lock Txns: etcd refuses the
    batch (two puts of one key), the batcher sends each alone, and both locks are released."""
    keys = Keys(prefix)
    watcher = DeleteWatcher(etcd_layer, keys)
    watcher.start()
    locks = LockManager(etcd_layer, keys, watcher)
    records = RequestRecords(etcd_layer, keys)
    lease_id, _ = await etcd_layer.lease_grant(10)
    try:
        tokens = {name: (await locks.acquire(name, lease_id, 0.0)).token for name in ("x", "y", "z")}

        def release(name: str, request_id: str) -> Awaitable[int]:
            call = Call("Release", name, lease_id, tokens[name])
            return records.run(request_id, call, lambda also: locks.release(name, lease_id, tokens[name], also=also))

        await records.ops_for("warm-up", Call("Release", "-", 0))  # the records lease first: the three go at once
        # x goes alone (nothing in flight); y and z queue behind it and go as one batch.
        with caplog.at_level(logging.INFO, logger="fencepost.coordinator.etcd.batch"):
            revisions = await asyncio.gather(release("x", "id-x"), release("y", "dup"), release("z", "dup"))
        assert all(revisions) and await list_keys(etcd_client, prefix) == []
        assert any("duplicate key" in r.getMessage() for r in caplog.records)  # the batch was refused, then alone
    finally:
        await records.close()
        await locks.close()
        await watcher.close()
        await etcd_layer.lease_revoke(lease_id)
