"""etcd guard: a put that lands only while the writer holds the lock, in one Txn.

Two checks, both inside one etcd Txn (etcd applies a Txn atomically at one
revision):

1. the writer still holds the lock: its contender key
   ``<prefix><encoded lock name>/<lease id as 16 hex digits>`` exists with
   create revision == its token (the coordinator's own holder check);
2. the record has accepted no higher token: the token stored beside the
   value is absent or <= the offered token.

Layout: the value at ``key``, the token at ``key + b"\\x00fencing_token"`` as
20 zero-padded decimal digits, so that byte order is number order. etcd's
compares are ANDed, so "absent OR <=" takes a nested Txn; one request::

    Txn(compare=[CREATE(holder) == token, VALUE(token_key) < pad(token + 1)],
        success=[Put(key, value), Put(token_key, pad(token))],
        failure=[Txn(compare=[CREATE(holder) == token, CREATE(token_key) == 0],
                     success=[Put(key, value), Put(token_key, pad(token))],
                     failure=[Range(holder), Range(token_key)])])

(a VALUE compare on a missing key is false in etcd, hence the second branch.)
A refusal raises :class:`~fencepost.client.StaleTokenError`: reason
``STALE_TOKEN`` when the record holds a higher token, ``NOT_HOLDER`` when the
writer no longer holds the lock (released, lease expired, key deleted); both
are counted by the hook. The value keys carry no lease: they outlive the lock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..v1.details import ErrorReason
from ._guard import FencingGuard, RejectHook, check_token

if TYPE_CHECKING:
    from etcd3aio import Etcd3Client

TOKEN_SUFFIX = b"\x00fencing_token"
DEFAULT_PREFIX = "/fencepost/locks/"
ETCD_CALL_TIMEOUT = 5.0


class Hold(Protocol):
    """What the guard needs of a grant: a LockHandle, AsyncLockHandle or :class:`Grant`."""

    @property
    def name(self) -> str: ...
    @property
    def lease_id(self) -> int: ...
    @property
    def token(self) -> int: ...


@dataclass(frozen=True)
class Grant:
    """A grant given by its parts (lock name, lease id, fencing token)."""

    name: str
    lease_id: int
    token: int


def _pad(token: int) -> bytes:
    return f"{token:020d}".encode()


def _bytes(data: str | bytes) -> bytes:
    return data.encode() if isinstance(data, str) else bytes(data)


class EtcdGuard(FencingGuard):
    """Fenced writes to etcd keys, tied to a live hold of a Fencepost lock.

    Args:
        etcd: A connected ``etcd3aio.Etcd3Client`` on the coordinator's etcd.
        prefix: The coordinator's lock key prefix (``--prefix``, default
            ``/fencepost/locks/``).
        on_reject: Hook called with each StaleTokenError (see FencingGuard).
    """

    def __init__(self, etcd: Etcd3Client, *, prefix: str = DEFAULT_PREFIX,
                 on_reject: RejectHook | None = None) -> None:
        from fencepost.client.v1.keys import Keys

        super().__init__(on_reject=on_reject)
        self.etcd = etcd
        self.keys = Keys(prefix)

    async def put(self, key: str | bytes, value: str | bytes, hold: Hold) -> int:
        """Write ``value`` at ``key`` if ``hold`` still holds its lock and its token is not stale.

        Args:
            key: The record's etcd key (outside the lock prefix).
            value: The new value.
            hold: The writer's grant: ``.name``, ``.lease_id``, ``.token``.

        Returns:
            The etcd revision of the write.

        Raises:
            StaleTokenError: refused, nothing written; reason ``STALE_TOKEN``
                (the record holds a higher token) or ``NOT_HOLDER`` (the
                lock is no longer held under this token).
            ValueError: a bad token.
            etcd3aio.EtcdError, grpc.aio.AioRpcError: etcd failed.
        """
        from etcd3aio._protobuf import Compare, PutRequest, RangeRequest, RequestOp, TxnRequest

        token = check_token(hold.token)
        record, key = key, _bytes(key)
        token_key = key + TOKEN_SUFFIX
        holder = self.keys.contender(hold.name, hold.lease_id)
        held = Compare(result=Compare.EQUAL, target=Compare.CREATE, key=holder, create_revision=token)
        not_higher = Compare(result=Compare.LESS, target=Compare.VALUE, key=token_key, value=_pad(token + 1))
        absent = Compare(result=Compare.EQUAL, target=Compare.CREATE, key=token_key, create_revision=0)
        puts = [RequestOp(request_put=PutRequest(key=key, value=_bytes(value))),
                RequestOp(request_put=PutRequest(key=token_key, value=_pad(token)))]
        reads = [RequestOp(request_range=RangeRequest(key=holder, keys_only=True)),
                 RequestOp(request_range=RangeRequest(key=token_key))]
        first = RequestOp(request_txn=TxnRequest(compare=[held, absent], success=puts, failure=reads))
        resp: Any = await self.etcd.kv.txn([held, not_higher], puts, [first], timeout=ETCD_CALL_TIMEOUT)
        if resp.succeeded:
            return int(resp.header.revision)
        inner = resp.responses[0].response_txn
        if inner.succeeded:
            return int(resp.header.revision)
        holder_kvs = inner.responses[0].response_range.kvs
        token_kvs = inner.responses[1].response_range.kvs
        current = int(token_kvs[0].value) if token_kvs else None
        if not holder_kvs or int(holder_kvs[0].create_revision) != token:
            raise self._reject(
                record, token, current, reason=ErrorReason.NOT_HOLDER, name=hold.name, lease_id=hold.lease_id,
                message=(f"write with fencing token {token} refused: lease {hold.lease_id:#x} no longer "
                         f"holds lock {hold.name!r} under that token"))
        raise self._reject(record, token, current, name=hold.name, lease_id=hold.lease_id)

    async def get(self, key: str | bytes) -> tuple[bytes | None, int | None]:
        """Read a record: (value, token), each None when absent (one Txn, one revision).

        Raises:
            etcd3aio.EtcdError, grpc.aio.AioRpcError: etcd failed.
        """
        from etcd3aio._protobuf import RangeRequest, RequestOp

        key = _bytes(key)
        ops = [RequestOp(request_range=RangeRequest(key=key)),
               RequestOp(request_range=RangeRequest(key=key + TOKEN_SUFFIX))]
        resp: Any = await self.etcd.kv.txn([], ops, [], timeout=ETCD_CALL_TIMEOUT)
        value_kvs = resp.responses[0].response_range.kvs
        token_kvs = resp.responses[1].response_range.kvs
        return (bytes(value_kvs[0].value) if value_kvs else None,
                int(token_kvs[0].value) if token_kvs else None)
