"""Lock Txns batched into one etcd Txn (coordinator/etcd/batch.py), against the real etcd.

Requests started in one pass of the event loop reach the batcher in order:
the first finds nothing in flight and is sent alone at once, the others
queue behind it and go together when it returns. The tests count the etcd
Txns through the coordinator's own metrics.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import grpc
import pytest
from etcd3aio import Etcd3Client
from prometheus_client import CollectorRegistry

from fencepost.client.errors import LeaseLost, Unavailable
from fencepost.client.v1 import etcdops
from fencepost.client.v1.keys import Keys
from fencepost.coordinator.etcd import EtcdClient, Stubs, bounded
from fencepost.coordinator.etcd.batch import ops_needed
from fencepost.coordinator.process.embedded import EmbeddedEtcd
from fencepost.coordinator.recipes.lock import LockManager
from fencepost.coordinator.recipes.watch import DeleteWatcher
from fencepost.coordinator.telemetry.metrics import LockMetrics

from .fake_etcd import rpc_error


class LosingKV:
    """The real KV stub, except that the next batch Txn's answer is lost, after etcd applied it or before."""

    def __init__(self, kv: Any) -> None:
        self._kv = kv
        self.lose: str | None = None  # "applied" or "not applied": what happens to the next batch
        self.lost = 0

    def Range(self, request: Any, **kw: Any) -> Any:  # noqa: N802 (the stub's name)
        return self._kv.Range(request, **kw)

    async def Txn(self, request: Any, **kw: Any) -> Any:  # noqa: N802
        batch = len(request.success) > 1 and all(op.WhichOneof("request") == "request_txn" for op in request.success)
        if not batch or self.lose is None:
            return await self._kv.Txn(request, **kw)
        lose, self.lose = self.lose, None
        self.lost += 1
        if lose == "applied":
            await self._kv.Txn(request, **kw)
        raise rpc_error(grpc.StatusCode.UNAVAILABLE, "connection reset by peer")


@dataclasses.dataclass
class Locks:
    """A LockManager on the real etcd with its etcd layer and metrics."""

    etcd: EtcdClient
    locks: LockManager
    keys: Keys
    registry: CollectorRegistry
    kv: LosingKV | None

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    @property
    def etcd_txns(self) -> int:
        """Txns sent to etcd (every attempt, read-backs are Ranges)."""
        return int(self.metric("fencepost_etcd_request_seconds_count", operation="txn"))

    @property
    def batches(self) -> tuple[int, int]:
        """(etcd Txns sent for lock Txns, lock Txns they carried)."""
        return int(self.metric("fencepost_etcd_batch_size_count")), int(self.metric("fencepost_etcd_batch_size_sum"))

    async def leases(self, n: int) -> list[int]:
        return [(await self.etcd.lease_grant(30))[0] for _ in range(n)]


async def make_locks(endpoint: str, prefix: str, **options: Any) -> tuple[Locks, Any]:
    registry = CollectorRegistry()
    kvs: list[LosingKV] = []

    def stubs(channel: grpc.aio.Channel) -> Stubs:
        real = Stubs.on(channel)
        kvs.append(LosingKV(real.kv))
        return dataclasses.replace(real, kv=kvs[-1])

    etcd = EtcdClient([endpoint], metrics=LockMetrics(registry), stubs=stubs, **options)
    keys = Keys(prefix)
    watcher = DeleteWatcher(etcd, keys)
    watcher.start()
    locks = LockManager(etcd, keys, watcher)

    async def close() -> None:
        await locks.close()
        await watcher.close()
        await etcd.close()

    return Locks(etcd, locks, keys, registry, kvs[0]), close


@pytest.fixture
async def lm(etcd: EmbeddedEtcd, prefix: str) -> AsyncIterator[Locks]:
    made, close = await make_locks(etcd.endpoint, prefix)
    granted: list[int] = []
    made.leases = _tracking(made.leases, granted)  # type: ignore[method-assign]
    try:
        yield made
    finally:
        for lease in granted:
            await made.etcd.lease_revoke(lease)
        await close()


def _tracking(grant: Any, granted: list[int]) -> Any:
    async def leases(n: int) -> list[int]:
        ids = await grant(n)
        granted.extend(ids)
        return ids
    return leases


class Headers:
    """A HeaderWatch (what the token floor implements) that keeps every revision it is shown."""

    def __init__(self) -> None:
        self.revisions: set[int] = set()

    def mark(self) -> int:
        return 0

    def seen(self, mark: int, header: Any) -> None:
        self.revisions.add(int(header.revision))


async def create_revision(client: Etcd3Client, key: bytes) -> int:
    assert client.kv is not None
    resp = await client.kv.get(key, timeout=5)
    return int(resp.kvs[0].create_revision) if resp.kvs else 0


async def together(*steps: Awaitable[Any]) -> list[Any]:
    """Start every step in this pass of the event loop (so all but the first queue), wait for all."""
    return await asyncio.gather(*steps, return_exceptions=True)


def test_ops_needed_when_nested() -> None:
    """A Txn needs its widest level plus what its nested Txns need (etcd's checkTxnRequest budget)."""
    inner = etcdops.txn([etcdops.is_absent(b"k")], [etcdops.put(b"k")], [etcdops.get(b"k"), etcdops.get(b"j")])
    assert ops_needed(inner) == 2
    outer = etcdops.txn([], [etcdops.RequestOp(request_txn=inner) for _ in range(5)])
    assert ops_needed(outer) == 5 + 2


async def test_lock_txns_when_concurrent_on_distinct_names_go_in_batches(lm: Locks, etcd_client: Etcd3Client) -> None:
    """40 clients acquire and release 40 names three times at once: every answer right, far fewer etcd Txns."""
    headers = lm.etcd.headers = Headers()
    n = 40
    names = [f"n{i}" for i in range(n)]
    leases = await lm.leases(n)
    tokens: dict[str, list[int]] = {name: [] for name in names}
    txns, (sent, carried) = lm.etcd_txns, lm.batches
    for _ in range(3):
        granted = await together(*(lm.locks.acquire(name, lease, 0) for name, lease in zip(names, leases)))
        for name, lease, result in zip(names, leases, granted):
            assert not isinstance(result, BaseException), result
            assert result.acquired and result.token == await create_revision(
                etcd_client, lm.keys.contender(name, lease))
            tokens[name].append(result.token)
        released = await together(*(lm.locks.release(name, lease, tokens[name][-1])
                                    for name, lease in zip(names, leases)))
        for name, revision in zip(names, released):
            assert isinstance(revision, int) and revision > tokens[name][-1], revision
    for name in names:
        assert tokens[name] == sorted(set(tokens[name])), tokens[name]  # strictly increasing per name
    # The token floor saw the header of each batch: every token handed out is a revision it saw.
    assert {t for ts in tokens.values() for t in ts} <= headers.revisions
    sent, carried = lm.batches[0] - sent, lm.batches[1] - carried
    assert carried == 6 * n
    assert lm.etcd_txns - txns == sent < carried / 4, (sent, carried)  # one etcd Txn per batch
    assert lm.metric("fencepost_etcd_batch_size_bucket", le="1.0") < sent  # most were real batches


async def test_lock_txns_when_on_the_same_name_never_share_a_batch(lm: Locks, etcd_client: Etcd3Client) -> None:
    """Waiting acquires of one name and of another interleaved: per name one at a time, in arrival order."""
    n = 6
    leases = await lm.leases(2 * n)
    order: dict[str, list[int]] = {"a": [], "b": []}
    before = lm.batches

    async def take(name: str, index: int, lease: int) -> int:
        result = await lm.locks.acquire(name, lease, None)
        order[name].append(index)  # granted: it is the only holder of name until it releases
        await lm.locks.release(name, lease, result.token)
        return result.token

    steps = [take(name, i, leases[2 * i + (name == "b")]) for i in range(n) for name in ("a", "b")]
    tokens = await together(*steps)
    assert not [t for t in tokens if isinstance(t, BaseException)], tokens
    assert order == {"a": list(range(n)), "b": list(range(n))}  # first come, first served per name
    for name in ("a", "b"):
        mine = tokens[name == "b"::2]
        assert mine == sorted(set(mine)), mine  # distinct create revisions: never two in one batch
    # a1 alone, then [b1, a2], [b2, a3], ...: the other name's request rides along, never the same name's.
    sent, carried = (after - was for after, was in zip(lm.batches, before))
    assert sent < carried


async def test_lock_txn_when_alone_is_sent_at_once(lm: Locks) -> None:
    """With nothing in flight a request goes alone at once: one etcd Txn, a batch of 1, nothing waited for."""
    (lease,) = await lm.leases(1)
    txns = lm.etcd_txns
    result = await asyncio.wait_for(lm.locks.acquire("solo", lease, 0), 5)
    assert result.acquired
    assert lm.batches == (1, 1) and lm.etcd_txns == txns + 1
    await lm.locks.release("solo", lease, result.token)
    assert lm.batches == (2, 2) and lm.etcd_txns == txns + 2


async def test_lock_txns_when_etcd_refuses_the_batch_are_sent_alone(lm: Locks) -> None:
    """One request on a revoked lease makes etcd refuse the batch: the others are granted, it gets LeaseLost."""
    n = 8
    leases = await lm.leases(n)
    await lm.etcd.lease_revoke(leases[4])
    txns = lm.etcd_txns
    results = await together(*(lm.locks.acquire(f"r{i}", lease, 0) for i, lease in enumerate(leases)))
    assert isinstance(results[4], LeaseLost) and results[4].lease_id == leases[4]
    assert all(r.acquired for i, r in enumerate(results) if i != 4), results
    assert lm.metric("fencepost_etcd_errors_total", operation="txn", code="NotFound") == 2  # the batch, then alone
    assert lm.etcd_txns - txns == 1 + 1 + (n - 1)  # alone, the refused batch, each again alone
    for i, (lease, result) in enumerate(zip(leases, results)):
        if i != 4:
            await lm.locks.release(f"r{i}", lease, result.token)


async def test_lock_txns_when_a_batch_has_too_many_ops_are_sent_alone_and_batches_shrink(
        etcd: EmbeddedEtcd, prefix: str) -> None:
    """A batch over etcd's --max-txn-ops (128) is refused: each request goes alone, later batches are halved."""
    made, close = await make_locks(etcd.endpoint, prefix, batch_max=200, max_txn_ops=1000)
    try:
        n = 131  # the first alone, then 130 nested Txns needing 130 + 1 ops
        leases = await made.leases(n)
        results = await together(*(made.locks.acquire(f"m{i}", lease, 0) for i, lease in enumerate(leases)))
        assert all(not isinstance(r, BaseException) and r.acquired for r in results), results
        refused = made.metric("fencepost_etcd_errors_total", operation="txn", code="InvalidArgument")
        assert refused == 1
        assert made.etcd._batcher.max_requests == 65
        released = await together(*(made.locks.release(f"m{i}", lease, r.token)
                                    for i, (lease, r) in enumerate(zip(leases, results))))
        assert all(isinstance(r, int) for r in released), released
        assert made.metric("fencepost_etcd_errors_total", operation="txn", code="InvalidArgument") == refused
        for lease in leases:
            await made.etcd.lease_revoke(lease)
    finally:
        await close()


@pytest.mark.parametrize("lose", ["applied", "not applied"])
async def test_lock_txns_when_the_batch_answer_is_lost_are_each_read_back(
        lm: Locks, etcd_client: Etcd3Client, lose: str) -> None:
    """A batch of acquires and releases whose answer is lost: each resolved by its own read-back, none twice."""
    n = 5
    leases = await lm.leases(2 * n + 1)
    held = [await lm.locks.acquire(f"h{i}", lease, 0) for i, lease in enumerate(leases[n:2 * n])]
    first = lm.locks.acquire("first", leases[-1], 0)  # alone: the batch forms behind it
    assert lm.kv is not None
    lm.kv.lose = lose
    results = await together(first, *(lm.locks.acquire(f"a{i}", lease, 0) for i, lease in enumerate(leases[:n])),
                             *(lm.locks.release(f"h{i}", lease, h.token)
                               for i, (lease, h) in enumerate(zip(leases[n:2 * n], held))))
    assert lm.kv.lost == 1
    assert not [r for r in results if isinstance(r, BaseException)], results
    acquired, released = results[1:n + 1], results[n + 1:]
    created = [await create_revision(etcd_client, lm.keys.contender(f"a{i}", lease))
               for i, lease in enumerate(leases[:n])]
    assert [r.token for r in acquired] == created and all(r.acquired for r in acquired)
    if lose == "applied":  # applied once, by the batch: one revision for all, no Txn sent again
        assert len(set(created)) == 1
    else:  # not applied: each sent again alone
        assert len(set(created)) == n
    for i, revision in enumerate(released):
        assert revision > held[i].token
        assert not await create_revision(etcd_client, lm.keys.contender(f"h{i}", leases[n + i]))


async def test_lock_txn_when_its_caller_is_cancelled_or_times_out_while_queued_is_not_sent(
        lm: Locks, etcd_client: Etcd3Client) -> None:
    """A queued release whose caller is cancelled, or whose deadline passes, is dropped; the others go on."""
    n = 6
    leases = await lm.leases(n)
    held = [await lm.locks.acquire(f"c{i}", lease, 0) for i, lease in enumerate(leases)]

    async def release(i: int, seconds: float | None = None) -> int:
        with bounded(seconds):
            return await lm.locks.release(f"c{i}", leases[i], held[i].token)

    tasks = [asyncio.ensure_future(release(i, 0.0 if i == 3 else None)) for i in range(n)]
    await asyncio.sleep(0)  # one pass: the first is in flight alone, the others queued
    assert len(lm.etcd._batcher._queue) == n - 1
    tasks[2].cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[2], asyncio.CancelledError)
    assert isinstance(results[3], Unavailable) and "timed out" in results[3].message
    for i in (2, 3):  # never sent: still held
        assert await create_revision(etcd_client, lm.keys.contender(f"c{i}", leases[i])) == held[i].token
    for i in (0, 1, 4, 5):
        assert isinstance(results[i], int) and results[i] > held[i].token


@pytest.mark.parametrize(("value", "parsed"), [("0", 0), ("64", 64), ("1024", 1024), ("-1", None), ("x", None),
                                               ("1025", None)])
def test_serve_etcd_batch_max_when_given(value: str, parsed: int | None, capsys: pytest.CaptureFixture[str]) -> None:
    """`serve --etcd-batch-max` takes 0 (no batching) to 1024; anything else exits 2 naming the flag."""
    from fencepost.coordinator.process.flags import build_parser

    if parsed is not None:
        assert build_parser().parse_args(["--etcd-batch-max", value]).etcd_batch_max == parsed
        return
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["--etcd-batch-max", value])
    assert info.value.code == 2 and "--etcd-batch-max" in capsys.readouterr().err
