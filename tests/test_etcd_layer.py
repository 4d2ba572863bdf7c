"""Tests of the coordinator's etcd layer: the failure table, the retry table, re-authentication and
release classification with a fake etcd (tests/fake_etcd.py); the lock algorithm's read-back of a Txn
whose answer was lost, or that was not applied, on the real etcd with that one answer dropped
(tests/dropping_stubs.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from fencepost.client.errors import LeaseLost, NotHolder, StaleTokenError, Unavailable
from fencepost.client.v1 import etcdops
from fencepost.client.v1.etcd import kv_pb2, rpc_pb2
from fencepost.client.v1.keys import Keys, prefix_end
from fencepost.coordinator.process.embedded import EmbeddedEtcd
from fencepost.client.v1.keys import Hold
from fencepost.coordinator.etcd import RULES, EtcdAuth, EtcdClient, Failure, Op, classify, error_for, parse_endpoint
from fencepost.coordinator.recipes.lock import Holder, LockManager, release_refusal
from fencepost.coordinator.recipes.watch import DeleteWatcher

from .conftest import wait_for
from .dropping_stubs import DroppingStubs
from .fake_etcd import FakeEtcd, rpc_error

Code = grpc.StatusCode


@pytest.mark.parametrize(("code", "message", "failure"), [
    (Code.NOT_FOUND, "etcdserver: requested lease not found", Failure.LEASE_NOT_FOUND),
    (Code.UNAUTHENTICATED, "etcdserver: invalid auth token", Failure.AUTH_EXPIRED),
    (Code.INVALID_ARGUMENT, "etcdserver: revision of auth store is old", Failure.AUTH_EXPIRED),
    (Code.UNKNOWN, "auth: revision in header is old", Failure.AUTH_EXPIRED),
    (Code.UNKNOWN, "auth: invalid auth token", Failure.AUTH_EXPIRED),
    (Code.INVALID_ARGUMENT, "etcdserver: authentication failed, invalid user ID or password", Failure.AUTH_FAILED),
    (Code.FAILED_PRECONDITION, "etcdserver: authentication is not enabled", Failure.AUTH_FAILED),
    (Code.PERMISSION_DENIED, "etcdserver: permission denied", Failure.PERMISSION_DENIED),
    (Code.UNAVAILABLE, "etcdserver: no leader", Failure.NO_LEADER),
    (Code.UNAVAILABLE, "etcdserver: request timed out, possibly due to previous leader failure", Failure.NO_LEADER),
    (Code.UNAVAILABLE, "failed to connect to all addresses", Failure.UNREACHABLE),
    (Code.DEADLINE_EXCEEDED, "Deadline Exceeded", Failure.TIMEOUT),
    (Code.RESOURCE_EXHAUSTED, "etcdserver: too many requests", Failure.BUSY),
    (Code.OUT_OF_RANGE, "etcdserver: mvcc: required revision has been compacted", Failure.COMPACTED),
    (Code.INVALID_ARGUMENT, "etcdserver: request is too large", Failure.REJECTED),
])
def test_classify_when_etcd_fails(code: grpc.StatusCode, message: str, failure: Failure) -> None:
    """Each gRPC code and etcd message lands on its row of the failure table."""
    assert classify(rpc_error(code, message)) is failure


def test_rules_when_an_operation_may_have_applied() -> None:
    """Writes are never re-sent on an unknown outcome: Txn and LeaseRevoke read back, LeaseGrant gives up."""
    for op in (Op.TXN, Op.LEASE_REVOKE, Op.LEASE_GRANT):
        assert not RULES[op].resend & {Failure.UNREACHABLE, Failure.TIMEOUT, Failure.NO_LEADER}, op
    assert RULES[Op.TXN].read_back == RULES[Op.LEASE_REVOKE].read_back == {
        Failure.UNREACHABLE, Failure.TIMEOUT, Failure.NO_LEADER}
    assert not RULES[Op.LEASE_GRANT].read_back
    for op in (Op.RANGE, Op.LEASE_TTL, Op.KEEPALIVE):
        assert Failure.UNREACHABLE in RULES[op].resend, op
    assert (RULES[Op.KEEPALIVE].attempts, RULES[Op.KEEPALIVE].timeout) == (3, 0.5)


def test_error_for_when_etcd_refuses_the_coordinator() -> None:
    """A lost lease is LeaseLost; refused credentials are Unavailable naming the user, never the password."""
    lost = error_for(Failure.LEASE_NOT_FOUND, None, Op.TXN, name="n", lease_id=0x2A)
    assert isinstance(lost, LeaseLost) and lost.lease_id == 0x2A and "0x2a" in lost.message
    refused = error_for(Failure.AUTH_FAILED, rpc_error(Code.INVALID_ARGUMENT, "etcdserver: authentication failed"),
                        Op.AUTHENTICATE, user="locks")
    assert isinstance(refused, Unavailable) and refused.reason == "ETCD_UNAVAILABLE"
    assert "'locks'" in refused.message and "authentication failed" in refused.message


@pytest.mark.parametrize(("endpoint", "target", "tls"), [
    ("etcd1:2379", "dns:///etcd1:2379", None),
    ("https://10.0.0.5:2379/", "dns:///10.0.0.5:2379", True),
    ("http://[::1]:2379", "dns:///[::1]:2379", False),
    ("dns:///etcd-0.etcd.svc:2379", "dns:///etcd-0.etcd.svc:2379", None),
])
def test_parse_endpoint_when_valid(endpoint: str, target: str, tls: bool | None) -> None:
    """Host names, addresses and schemes become one dns:/// target each."""
    assert parse_endpoint(endpoint) == (target, tls)


@pytest.mark.parametrize("endpoint", ["etcd1", "etcd1:0", "etcd1:99999", "a b:1", "ftp://x:1", ""])
def test_parse_endpoint_when_invalid(endpoint: str) -> None:
    """Anything but host:port (with a port 1..65535) is refused with the endpoint in the message."""
    with pytest.raises(ValueError, match="etcd endpoint"):
        parse_endpoint(endpoint)


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeEtcd, EtcdClient]]:
    """A fake etcd behind an EtcdClient with two members."""
    etcd = FakeEtcd()
    client = EtcdClient(["127.0.0.1:1", "127.0.0.1:2"], stubs=etcd.stubs())
    try:
        yield etcd, client
    finally:
        await client.close()


async def test_range_when_member_unreachable_is_resent_on_the_next(fake: tuple[FakeEtcd, EtcdClient]) -> None:
    """A read that fails UNAVAILABLE is sent again, to the next member."""
    etcd, client = fake
    etcd.inject("Range", Code.UNAVAILABLE)
    await client.range(etcdops.count(b"/t/"))
    assert [(member, method) for member, method, _ in etcd.calls] == [(0, "Range"), (1, "Range")]


async def test_range_when_every_attempt_fails_raises_unavailable(fake: tuple[FakeEtcd, EtcdClient]) -> None:
    """A read gives up after its rule's attempts with ETCD_UNAVAILABLE."""
    etcd, client = fake
    for _ in range(RULES[Op.RANGE].attempts):
        etcd.inject("Range", Code.DEADLINE_EXCEEDED)
    with pytest.raises(Unavailable) as info:
        await client.range(etcdops.count(b"/t/"))
    assert info.value.reason == "ETCD_UNAVAILABLE" and "timed out" in info.value.message
    assert len(etcd.calls) == RULES[Op.RANGE].attempts


async def test_lease_grant_when_answer_lost_is_not_resent(fake: tuple[FakeEtcd, EtcdClient]) -> None:
    """A LeaseGrant whose answer is lost is not sent again (a second lease would be kept by nobody)."""
    etcd, client = fake
    etcd.inject("LeaseGrant", Code.UNAVAILABLE, applied=True)
    with pytest.raises(Unavailable):
        await client.lease_grant(5)
    assert [method for _, method, _ in etcd.calls] == ["LeaseGrant"]


@pytest.fixture
async def real(etcd: EmbeddedEtcd, prefix: str) -> AsyncIterator[tuple[DroppingStubs, EtcdClient, LockManager]]:
    """The real etcd behind an EtcdClient with two members (two channels to it) on stubs that drop
    planned answers, and a LockManager over the test's prefix; the test's leases are revoked after it."""
    stubs = DroppingStubs()
    client = EtcdClient([etcd.endpoint, etcd.endpoint], stubs=stubs.factory())
    keys = Keys(prefix)
    try:
        yield stubs, client, LockManager(client, keys, DeleteWatcher(client, keys))
    finally:
        for call in stubs.calls:
            if call.method == "LeaseGrant" and call.response is not None:
                await client.lease_revoke(call.response.ID)
        await client.close()


async def _keys_under(client: EtcdClient, prefix: str) -> list[kv_pb2.KeyValue]:
    """Every key under ``prefix`` in etcd (read on the client's stubs: recorded, never dropped)."""
    resp = await client.range(rpc_pb2.RangeRequest(key=prefix.encode(), range_end=prefix_end(prefix.encode())))
    return list(resp.kvs)


async def test_release_when_answer_lost_after_commit_is_read_back(
    real: tuple[DroppingStubs, EtcdClient, LockManager], prefix: str,
) -> None:
    """A release Txn that committed but timed out is resolved by reading our key back, not re-sent."""
    stubs, client, locks = real
    lease, _ = await client.lease_grant(10)
    granted = await locks.acquire("inv", lease, 0)
    stubs.calls.clear()
    stubs.drop("Txn", Code.DEADLINE_EXCEEDED, applied=True)
    revision = await locks.release("inv", lease, granted.token)
    assert stubs.methods() == ["Txn", "Txn"]  # the release, then the read-back
    (deleted,) = stubs.lost
    read_back = stubs.calls[1].response
    assert revision == read_back.header.revision >= deleted.header.revision  # the revision of the read-back
    assert not await _keys_under(client, prefix)


async def test_release_when_not_applied_is_sent_again(
    real: tuple[DroppingStubs, EtcdClient, LockManager], prefix: str,
) -> None:
    """A release Txn lost before it applied is sent again once the read-back shows our key still there."""
    stubs, client, locks = real
    lease, _ = await client.lease_grant(10)
    granted = await locks.acquire("inv", lease, 0)
    stubs.calls.clear()
    stubs.drop("Txn", Code.UNAVAILABLE, applied=False)
    await locks.release("inv", lease, granted.token)
    assert [(c.member, c.method) for c in stubs.calls] == [(0, "Txn"), (1, "Txn"), (1, "Txn")]
    assert not await _keys_under(client, prefix)


async def test_try_acquire_when_answer_lost_after_commit_returns_the_token(
    real: tuple[DroppingStubs, EtcdClient, LockManager], prefix: str,
) -> None:
    """An uncontended acquire whose answer was lost reads the holder back and returns our token."""
    stubs, client, locks = real
    lease, _ = await client.lease_grant(10)
    stubs.drop("Txn", Code.DEADLINE_EXCEEDED, applied=True)
    result = await locks.acquire("inv", lease, 0)
    (kv,) = await _keys_under(client, prefix)
    (written,) = stubs.lost
    assert result.acquired and result.token == kv.create_revision == written.header.revision


async def test_acquire_when_lease_unknown_raises_lease_lost(
    real: tuple[DroppingStubs, EtcdClient, LockManager],
) -> None:
    """A put on a lease etcd does not know is LeaseLost, sent once."""
    stubs, _, locks = real
    with pytest.raises(LeaseLost):
        await locks.acquire("inv", 0x99, 0)
    assert stubs.methods() == ["Txn"]


async def test_call_when_auth_token_rejected_authenticates_again() -> None:
    """A call whose token etcd rejects authenticates again and is sent again with the new token."""
    etcd = FakeEtcd(tokens=["t1", "t2"])
    client = EtcdClient(["127.0.0.1:1"], auth=EtcdAuth("locks", "right"), stubs=etcd.stubs())
    try:
        await client.connect()
        etcd.valid_tokens = {"a token issued after t1 expired"}
        await client.range(etcdops.count(b"/t/"))
        sent = [(method, dict(md or ()).get("token")) for _, method, md in etcd.calls]
        assert sent == [("Authenticate", None), ("Range", "t1"), ("Authenticate", None), ("Range", "t2")]
    finally:
        await client.close()


async def test_connect_when_password_wrong_names_the_user() -> None:
    """A wrong password fails connect() with Unavailable naming the user, never the password."""
    etcd = FakeEtcd(tokens=["t1"])
    client = EtcdClient(["127.0.0.1:1"], auth=EtcdAuth("locks", "wrong"), stubs=etcd.stubs())
    try:
        with pytest.raises(Unavailable) as info:
            await client.connect()
        assert "'locks'" in info.value.message and "wrong" not in info.value.message
        assert client.refusal == Failure.AUTH_FAILED.value
    finally:
        await client.close()


def _kv(create_revision: int) -> kv_pb2.KeyValue:
    return kv_pb2.KeyValue(key=b"k", create_revision=create_revision)


def test_release_refusal_when_lease_holds_a_newer_token() -> None:
    """STALE_TOKEN carries the lease's newer token as current_token."""
    err = release_refusal(Hold("n", 7, 10), _kv(12), Holder(7, 12), True)
    assert isinstance(err, StaleTokenError) and (err.token, err.current_token) == (10, 12)


def test_release_refusal_when_another_lease_holds() -> None:
    """NOT_HOLDER carries the current holder's token when the lock is held."""
    err = release_refusal(Hold("n", 7, 10), None, Holder(8, 15), True)
    assert type(err) is NotHolder and (err.token, err.current_token) == (10, 15)
    free = release_refusal(Hold("n", 7, 10), None, None, True)
    assert type(free) is NotHolder and free.current_token is None


def test_release_refusal_when_token_older_than_the_lease_key() -> None:
    """A token the lease was never granted (older than its key) is NOT_HOLDER, not STALE_TOKEN."""
    err = release_refusal(Hold("n", 7, 10), _kv(5), Holder(7, 5), True)
    assert type(err) is NotHolder and err.current_token == 5


def test_release_refusal_when_lease_gone() -> None:
    """No key and no lease: LEASE_EXPIRED."""
    assert isinstance(release_refusal(Hold("n", 7, 10), None, None, False), LeaseLost)


class _Deletions:
    """A fake etcd for DeleteWatcher: a revision and a queue of deletion batches (None: compaction)."""

    def __init__(self, revision: int) -> None:
        self.revision = revision
        self.batches: asyncio.Queue[list[tuple[bytes, int]] | None] = asyncio.Queue()
        self.watches: list[int] = []

    async def range(self, request: Any) -> Any:
        return rpc_pb2.RangeResponse(header=rpc_pb2.ResponseHeader(revision=self.revision))

    async def watch_deletes(self, key: bytes, range_end: bytes, start: int) -> AsyncIterator[list[tuple[bytes, int]]]:
        self.watches.append(start)
        while (batch := await self.batches.get()) is not None:
            yield batch


async def _delivered(watcher: DeleteWatcher, source: _Deletions, batch: list[tuple[bytes, int]]) -> None:
    """Feed one batch and wait until the watcher has dispatched its last deletion."""
    seen = asyncio.Event()
    unsubscribe = watcher.subscribe(batch[-1][0], lambda rev: seen.set())
    source.batches.put_nowait(batch)
    await asyncio.wait_for(seen.wait(), 5)
    unsubscribe()


async def test_deleted_after_when_window_overflows() -> None:
    """The watcher answers from its window and says "unknown" (None) past it."""
    source = _Deletions(10)
    watcher = DeleteWatcher(source, Keys("/p/"), window=2)
    assert watcher.deleted_after(b"k1", 5) is None  # not started: unknown
    watcher.start()
    try:
        await watcher.wait_ready()
        assert source.watches == [11]
        await _delivered(watcher, source, [(b"k1", 12)])
        assert watcher.deleted_after(b"k1", 11) is True
        assert watcher.deleted_after(b"k1", 12) is False
        assert watcher.deleted_after(b"k2", 11) is False
        await _delivered(watcher, source, [(b"k2", 13), (b"k3", 14)])  # evicts k1's deletion at 12
        assert watcher.deleted_after(b"k1", 11) is None
        assert watcher.deleted_after(b"k3", 13) is True
    finally:
        await watcher.close()


async def test_subscribe_when_deleted_compacted_then_unsubscribed() -> None:
    """Callbacks see deletions of their key only, None when the watch restarts, and nothing once unsubscribed."""
    source = _Deletions(1)
    watcher = DeleteWatcher(source, Keys("/p/"))
    watcher.start()
    try:
        await watcher.wait_ready()
        seen: list[int | None] = []
        unsubscribe = watcher.subscribe(b"k", seen.append)
        await _delivered(watcher, source, [(b"other", 2), (b"k", 3)])
        source.revision = 5
        source.batches.put_nowait(None)  # compacted: the watch restarts from a new revision
        await wait_for(lambda: source.watches == [2, 6], 5, what="the watch to restart after compaction")
        unsubscribe()
        await _delivered(watcher, source, [(b"k", 7)])
        assert seen == [3, None]
    finally:
        await watcher.close()

