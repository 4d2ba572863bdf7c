"""Contender keys created only under the token floor this coordinator uses.

A fencing token is a key's create revision plus the token floor F
(:mod:`.tokens`), and ``fencepost admin recover-tokens`` raises F in the
same Txn that deletes every lock key. A coordinator learns the new F when
it next reads the token record (the health monitor's check, every second);
a key it created meanwhile would get a token computed with the old F, at or
below the T the recovery promised to stay above. So every Txn that may
create a contender key (a try-once acquire, the first write of a waiting
acquire or of a semaphore's queue key, an election's campaign through
both, a semaphore's slot claim) is sent here, nested in a Txn whose only
compare is "the token record's mod revision is still the one this
coordinator read its floor from" (``MOD(record) == m``, after the way
etcd's own ``concurrency.STM`` and Kubernetes' ``GuaranteedUpdate`` guard a
write with the mod revision read): a key is then created, or found, only
while the floor returned with it is the one in force. When the record
changed, nothing is applied; the coordinator reads the record again
(:meth:`~.tokens.TokenFloor.check`, which adopts the new floor, or refuses),
and sends the Txn once more under the new compare.

Why it holds for every token, not only at creation: the recovery deletes
every lock key in the Txn that changes the floor, so a key that exists at a
revision was created under the floor in force at that revision. The floor
returned with a Txn that created or found a key is the floor of every later
read that still finds that key (a wait's grant, a permit's own slot).

Costs: no etcd request on the hot path; each guarded Txn carries one more
compare and one more level of nesting (about 40 bytes with the default
prefix, one op of ``--max-txn-ops``); its read-back (after a lost answer)
reads the record too. After a change of the record, each Txn in flight
costs one Range of the record and one more Txn.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from fencepost.client.v1 import etcdops
from fencepost.client.v1.etcd import rpc_pb2

from ..etcd import EtcdClient, Op, TxnPlan, etcd_unavailable
from .tokens import Adopted, TokenFloor

__all__ = ["read_under_floor", "under_floor"]

T = TypeVar("T")


class _Changed:
    def __repr__(self) -> str:
        return "RECORD_CHANGED"


#: What a guarded Txn's answer is when the token record changed since this coordinator read it.
_CHANGED: Any = _Changed()
#: Sends of one Txn: the first, and one more after reading the changed record.
_SENDS = 2


def _guarded(plan: TxnPlan[T], key: bytes, adopted: Adopted) -> TxnPlan[T]:
    """``plan`` nested in a Txn that applies it only while the record at ``key`` has ``adopted``'s mod revision."""
    def decide(resp: rpc_pb2.TxnResponse) -> T:
        if not resp.succeeded:
            return _CHANGED  # type: ignore[no-any-return]
        inner = resp.responses[0].response_txn
        inner.header.CopyFrom(resp.header)  # a nested Txn's header is empty
        return plan.decide(inner)

    def resolve(resp: rpc_pb2.TxnResponse) -> T:
        record = resp.responses[-1].response_range.kvs
        if not record or int(record[0].mod_revision) != adopted.mod_revision:
            return _CHANGED  # type: ignore[no-any-return]
        del resp.responses[-1]
        return plan.resolve(resp)

    request = etcdops.txn([etcdops.is_unchanged(key, adopted.mod_revision)],
                          [rpc_pb2.RequestOp(request_txn=plan.request)])
    return TxnPlan(request, decide, [*plan.read_back, etcdops.get(key, keys_only=True)], resolve,
                   name=plan.name, lease_id=plan.lease_id)


async def under_floor(tokens: TokenFloor, send: Callable[[TxnPlan[Any]], Awaitable[Any]],
                      plan: TxnPlan[T]) -> tuple[T, int]:
    """Send ``plan`` (a Txn that may create a contender key) only while the token floor in use is in force.

    Args:
        tokens: This coordinator's token floor (one without etcd: ``plan`` is sent as it is, under floor 0).
        send: How the Txn goes to etcd (``EtcdClient.txn``, or a lock's ``lock_txn``).
        plan: The Txn and how to read its answer.

    Returns:
        (``plan``'s result, the floor its keys were created or found under:
        a token is their create revision plus that floor).

    Raises:
        DataLoss: tokens would go back (also when the changed record says so).
        Unavailable: etcd unreachable; or the record changed again before the second send.
        Whatever ``plan``'s ``decide`` or ``resolve`` raise.
    """
    if not tokens.recorded:
        return await send(plan), tokens.floor
    return await _in_force(tokens, lambda adopted: send(_guarded(plan, tokens.key, adopted)),
                           name=plan.name, lease_id=plan.lease_id)


async def read_under_floor(tokens: TokenFloor, etcd: EtcdClient, ops: Sequence[rpc_pb2.RequestOp], *,
                           name: str | None = None, lease_id: int | None = None) -> tuple[rpc_pb2.TxnResponse, int]:
    """Read ``ops`` (range ops) at one revision at which the token floor in use is in force (:meth:`EtcdClient.read`).

    Returns:
        (the read, the floor of every contender key it found).

    Raises:
        DataLoss, Unavailable: as :func:`under_floor`.
    """
    if not tokens.recorded:
        return await etcd.read(ops, name=name, lease_id=lease_id), tokens.floor

    async def read(adopted: Adopted) -> rpc_pb2.TxnResponse:
        resp = await etcd.read(ops, compare=[etcdops.is_unchanged(tokens.key, adopted.mod_revision)], name=name,
                               lease_id=lease_id)
        return resp if resp.succeeded else _CHANGED

    return await _in_force(tokens, read, name=name, lease_id=lease_id)


async def _in_force(tokens: TokenFloor, attempt: Callable[[Adopted], Awaitable[T]], *, name: str | None,
                    lease_id: int | None) -> tuple[T, int]:
    """``attempt`` under the record as last read; after a change, once more under the record read again."""
    failed: Adopted | None = None
    for _ in range(_SENDS):
        if failed is not None and tokens.adopted == failed:  # not read again meanwhile (by a call beside this one)
            await tokens.check(Op.RANGE)  # adopt the changed record (or refuse: ready() raises)
        await tokens.ready()
        adopted = tokens.adopted
        result = await attempt(adopted)
        if result is not _CHANGED:
            return result, adopted.floor
        failed = adopted
    raise etcd_unavailable(f"the token record {tokens.key.decode(errors='replace')} changed twice during one call "
                           f"(fencing tokens recovered meanwhile?); try again", name=name, lease_id=lease_id)
