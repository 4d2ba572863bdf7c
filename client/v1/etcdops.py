"""Builders of the etcd compares and request ops that the lock algorithm and the etcd guard use.

Pure functions over the generated etcd stubs (:mod:`fencepost.client.v1.etcd`):
they build messages and send nothing. The coordinator's etcd layer and the
client's etcd fencing guard both build their Txns here, so that "this hold
is still the holder's" is spelled once.

The central compare is :func:`is_owner`, after ``Mutex.IsOwner()`` in etcd's
``client/v3/concurrency/mutex.go``: a contender key still exists with the
create revision it had when it was granted (its fencing token). A deleted
and re-created key has a new create revision, so it never passes for the
old grant.

etcd semantics these builders rely on (``api/etcdserverpb/rpc.proto``):

- a Compare with ``range_end`` holds only if it holds for every key in the
  range; a missing key has create revision 0, and a VALUE compare on a
  missing key is false;
- the compares of one Txn are ANDed; a ``request_txn`` op nests a Txn
  (etcd >= 3.3), which is how "A or B" is written.
"""

from __future__ import annotations

from collections.abc import Sequence

from .etcd import rpc_pb2
from .keys import prefix_end

__all__ = [
    "count",
    "delete",
    "get",
    "holder_of",
    "is_absent",
    "keys_under",
    "is_owner",
    "is_unchanged",
    "is_free",
    "is_first",
    "last_before",
    "put",
    "txn",
    "txn_op",
    "value_below",
    "value_differs",
]

Compare = rpc_pb2.Compare
RequestOp = rpc_pb2.RequestOp
RangeRequest = rpc_pb2.RangeRequest


def is_owner(key: bytes, create_revision: int) -> rpc_pb2.Compare:
    """The compare "``key`` exists and was created at ``create_revision``" (mutex.go's ``IsOwner``).

    Args:
        key: A contender key.
        create_revision: Its create revision when granted: the fencing token (> 0).

    Returns:
        ``CREATE(key) == create_revision``.
    """
    return Compare(result=Compare.EQUAL, target=Compare.CREATE, key=key, create_revision=create_revision)


def is_unchanged(key: bytes, mod_revision: int) -> rpc_pb2.Compare:
    """The compare "``key`` exists and was last written at ``mod_revision``".

    Args:
        key: A contender key.
        mod_revision: The revision of its last put (> 0).

    Returns:
        ``MOD(key) == mod_revision``.
    """
    return Compare(result=Compare.EQUAL, target=Compare.MOD, key=key, mod_revision=mod_revision)


def is_absent(key: bytes) -> rpc_pb2.Compare:
    """The compare "``key`` does not exist" (its create revision is 0)."""
    return Compare(result=Compare.EQUAL, target=Compare.CREATE, key=key, create_revision=0)


def is_free(lock: bytes) -> rpc_pb2.Compare:
    """The compare "no key starts with ``lock``": the whole range has create revision 0.

    Args:
        lock: A lock's key range prefix (:meth:`fencepost.client.v1.keys.Keys.lock_prefix`).
    """
    return Compare(result=Compare.EQUAL, target=Compare.CREATE, key=lock, range_end=prefix_end(lock),
                   create_revision=0)


def is_first(lock: bytes, create_revision: int) -> rpc_pb2.Compare:
    """The compare "no key of ``lock`` was created before ``create_revision``".

    With :func:`is_owner` of the same revision: that contender holds the lock
    (its key is the lowest of the range).

    Args:
        lock: A lock's key range prefix.
        create_revision: A contender key's create revision (> 0).

    Returns:
        ``CREATE(range) > create_revision - 1``, for every key of the range.
    """
    return Compare(result=Compare.GREATER, target=Compare.CREATE, key=lock, range_end=prefix_end(lock),
                   create_revision=create_revision - 1)


def value_below(key: bytes, value: bytes) -> rpc_pb2.Compare:
    """The compare "``key`` exists and its value sorts below ``value``" (bytewise; false when absent)."""
    return Compare(result=Compare.LESS, target=Compare.VALUE, key=key, value=value)


def value_is(key: bytes, value: bytes) -> rpc_pb2.Compare:
    """The compare "``key`` exists and its value is exactly ``value``" (false when absent)."""
    return Compare(result=Compare.EQUAL, target=Compare.VALUE, key=key, value=value)


def value_differs(key: bytes, value: bytes) -> rpc_pb2.Compare:
    """The compare "``key`` exists and its value is not ``value``" (false when absent)."""
    return Compare(result=Compare.NOT_EQUAL, target=Compare.VALUE, key=key, value=value)


def put(key: bytes, value: bytes = b"", *, lease_id: int = 0) -> rpc_pb2.RequestOp:
    """A put op, attached to ``lease_id`` when it is not 0 (the key then dies with the lease)."""
    return RequestOp(request_put=rpc_pb2.PutRequest(key=key, value=value, lease=lease_id))


def delete(key: bytes) -> rpc_pb2.RequestOp:
    """A delete op of one key."""
    return RequestOp(request_delete_range=rpc_pb2.DeleteRangeRequest(key=key))


def get(key: bytes, *, keys_only: bool = False) -> rpc_pb2.RequestOp:
    """A read op of one key (its create revision, lease and, unless ``keys_only``, value)."""
    return RequestOp(request_range=RangeRequest(key=key, keys_only=keys_only))


def holder_of(lock: bytes, range_end: bytes | None = None, *, limit: int = 1,
              keys_only: bool = True) -> rpc_pb2.RequestOp:
    """A read op of the lock's contenders in grant order: the first is the holder.

    Args:
        lock: The lock's key range prefix.
        range_end: The end of the range read, when not the whole prefix (a read-write lock's writers).
        limit: How many contenders to return, lowest create revision first.
        keys_only: Leave the values out (False: an election's values too).
    """
    return RequestOp(request_range=RangeRequest(
        key=lock, range_end=range_end or prefix_end(lock), sort_order=RangeRequest.ASCEND,
        sort_target=RangeRequest.CREATE, limit=limit, keys_only=keys_only,
    ))


def last_before(lock: bytes, create_revision: int, *, limit: int = 1,
                range_end: bytes | None = None) -> rpc_pb2.RequestOp:
    """A read op of the contender queued just before the one created at ``create_revision``.

    Args:
        lock: The lock's key range prefix.
        create_revision: The create revision of the contender's key.
        limit: How many contenders before it to return, nearest first (a
            semaphore's queue member watches its ``permits`` nearest ones).
        range_end: The end of the range read, when not the whole prefix (a reader waits for writers only).

    Returns:
        The op whose response holds at most ``limit`` keys: the highest create
        revisions below ``create_revision`` in the lock's range, highest first
        (empty when that contender is first, i.e. holds the lock).
    """
    return RequestOp(request_range=RangeRequest(
        key=lock, range_end=range_end or prefix_end(lock), max_create_revision=create_revision - 1,
        sort_order=RangeRequest.DESCEND, sort_target=RangeRequest.CREATE, limit=limit, keys_only=True,
    ))


def count(prefix: bytes) -> rpc_pb2.RangeRequest:
    """A Range request counting the keys that start with ``prefix`` (returns no keys)."""
    return RangeRequest(key=prefix, range_end=prefix_end(prefix), count_only=True)


def keys_under(prefix: bytes, limit: int) -> rpc_pb2.RangeRequest:
    """A Range request of the first ``limit`` keys (no values) that start with ``prefix``, in key order.

    Its response's ``count`` is the number of all the keys under ``prefix``,
    ``more`` whether there are keys past the ``limit`` returned.
    """
    return RangeRequest(key=prefix, range_end=prefix_end(prefix), keys_only=True, limit=limit)


def txn(compare: Sequence[rpc_pb2.Compare], success: Sequence[rpc_pb2.RequestOp],
        failure: Sequence[rpc_pb2.RequestOp] = ()) -> rpc_pb2.TxnRequest:
    """A Txn request: if every compare holds, apply ``success``, else ``failure``, at one revision."""
    return rpc_pb2.TxnRequest(compare=list(compare), success=list(success), failure=list(failure))


def txn_op(compare: Sequence[rpc_pb2.Compare], success: Sequence[rpc_pb2.RequestOp],
           failure: Sequence[rpc_pb2.RequestOp] = ()) -> rpc_pb2.RequestOp:
    """A nested Txn, as an op of an outer Txn's branch."""
    return RequestOp(request_txn=txn(compare, success, failure))
