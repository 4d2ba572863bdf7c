"""Fencing guards: storage that refuses writes carrying a stale fencing token.

A TTL lock is not mutual exclusion: a holder that stalls past its TTL (GC
pause, SIGSTOP, partition) can wake up and write after the next holder did.
Every Fencepost grant carries a fencing token (an etcd revision, strictly
increasing per lock name); a guard makes the storage check it.

The contract, the same for every adapter:

- A guarded record keeps the highest token it has accepted.
- A write with token ``t`` is accepted when the record has no token yet or
  ``t >= stored`` (one holder may write many times with its token), and
  rejected when ``t < stored``.
- The check and the write are ONE atomic statement (a conditional UPDATE or
  upsert, a Lua script, an etcd Txn, a DynamoDB ConditionExpression), never
  a read followed by a write. A read, if any, only comes after the
  statement, to fill the error (or, in MySQL, to tell what an inconclusive
  affected-rows count meant, under the statement's row lock). S3 is the
  exception the storage imposes: a read of the ETag, then a PUT conditional
  on that ETag (a compare-and-swap of the object), retried on 412. DynamoDB
  and etcd cannot test "an integer" in a condition: their first conditional
  write passes only on no token or exactly the writer's token, and when the
  refusal returns a valid lower token, the next one is conditional on
  exactly that stored value (a compare-and-swap), retried if it changed.
- Every write method takes the record's key, then the token (the etcd
  guard: the hold that carries it), then the values.
- A stored token that is not a canonical non-negative integer of the
  store's type (``"1e3"``, ``"007"``, ``7.5``, ``"abc"``, ``{"S": "7"}``,
  ``-5``; docs/fencing.md, "What a stored token must be") refuses the write
  inside the same atomic step; the guard raises :class:`MalformedTokenError`
  (a StaleTokenError), counted as a rejection, the record unchanged.
- A rejection raises :class:`fencepost.client.StaleTokenError` with
  ``.record`` (the record's key), ``.token`` (offered) and
  ``.current_token`` (stored), and leaves the record unchanged.
- Every write method takes a lock handle in place of the token too (any
  :class:`TokenHold`: ``.token`` and ``.is_valid()``). A refusal over a higher
  stored token while that hold is still live (the etcd guard: while its Txn
  sees the writer's lock key) raises :class:`StoredTokenAheadError` (a
  StaleTokenError): the stored token is ahead of the lock service, most
  likely because etcd was restored from an older snapshot without ``fencepost
  admin recover-tokens``; counted in ``guard.ahead`` and
  ``fencepost_guard_token_ahead_total`` besides ``rejected`` (see :mod:`._ahead`).
- Every other error a guard raises is a :class:`fencepost.client.FencepostError`
  too: :class:`~fencepost.client.InvalidArgument` for a bad argument (a
  token, identifier, key, hold or value; values naming the guard's own key
  or token column), raised before anything is sent;
  :class:`MissingRecordError` for an update of a missing record;
  :class:`~fencepost.client.ResourceExhausted` when the S3 guard's
  conditional writes kept losing to other writes; the storage driver's own
  errors (a lost connection) pass through unchanged.
- The guard owns the token and the record's key: a write cannot set the
  token column (attribute) or the key column through its values, and the
  etcd guard's keys lie outside the lock prefix.
- Every guard counts its rejections (``guard.rejected``) and calls its
  optional ``on_reject(err)`` hook before raising, so that operators can see
  stale writers (a metric, a log line).

One record is guarded by one lock name: take the lock, then write with
``handle.token``. Not guaranteed: writes that bypass the guard are not
checked, and a guard does not order two writes that carry the SAME token
(one holder's own writes are ordered by that holder).

Adapters (each module's docstring shows its exact statement):

- :class:`SqlGuard` (SQLite ``sqlite3``, PostgreSQL psycopg 3):
  ``UPDATE ... WHERE key = ? AND (fencing_token IS NULL OR fencing_token <= ?)``
  and ``INSERT ... ON CONFLICT (key) DO UPDATE ... WHERE t.fencing_token IS
  NULL OR t.fencing_token <= excluded.fencing_token``; :func:`add_token_column`.
- :class:`RedisGuard` (redis-py): one Lua compare-and-set script on a hash.
- :class:`EtcdGuard` (a grpc.aio channel to etcd, asyncio): one Txn that also requires the
  writer's lock key to still have the token as its create revision.
- :class:`DynamoDBGuard` (boto3): ``attribute_not_exists(fencing_token) OR
  fencing_token = :t`` as the write's ConditionExpression, then, over a lower
  integer token s, ``fencing_token = :s``; :func:`condition_kwargs`.
- :class:`MySqlGuard` (MySQL, MariaDB; PyMySQL): ``UPDATE `t` SET ...,
  `fencing_token` = %s WHERE `id` = %s AND (`fencing_token` IS NULL OR
  `fencing_token` <= %s)`` and ``INSERT ... ON DUPLICATE KEY UPDATE `c` =
  IF(`fencing_token` IS NULL OR `fencing_token` <= %s, %s, `c`), ...,
  `fencing_token` = IF(..., %s, `fencing_token`)`` (token column last:
  MySQL assigns left to right); correct with or without
  ``CLIENT.FOUND_ROWS``; :func:`mysql_update_statement`,
  :func:`mysql_upsert_statement`.
- :class:`S3Guard` (boto3 >= 1.35.69): ``head_object`` for the ETag and the
  token (user metadata ``fencing-token``), refuse if stored > t, else
  ``put_object(..., IfMatch=etag)`` (``IfNoneMatch="*"`` for a new object),
  reading again after a 412; a read plus a conditional write per round.

Example (a worked timeline, SQLite)::

    guard = SqlGuard(conn, "invoices", "id", commit=True)
    guard.upsert("inv:42", 7, {"status": "draft"})    # worker A, token 7
    guard.upsert("inv:42", 9, {"status": "paid"})     # worker B, token 9
    guard.upsert("inv:42", 7, {"status": "void"})     # A wakes up: StaleTokenError
                                                      # record='inv:42' token=7 current_token=9
"""

from ._dynamodb import CONDITION as DYNAMODB_CONDITION
from ._dynamodb import DynamoDBGuard, condition_kwargs
from ._etcd import EtcdGuard, HoldLike
from ._mysql import MySqlGuard, mysql_update_statement, mysql_upsert_statement
from ..v1.keys import Hold
from ._ahead import StoredTokenAheadError, TokenHold
from ._guard import FencingGuard, MalformedTokenError, RejectHook, check_identifier, check_token
from ._redis import SCRIPT as REDIS_SCRIPT
from ._redis import RedisGuard
from ._s3 import TOKEN_METADATA as S3_TOKEN_METADATA
from ._s3 import S3Guard
from ._sql import SqlGuard, add_token_column, update_statement, upsert_statement
from ..errors import MissingRecordError

__all__ = [
    "DYNAMODB_CONDITION",
    "REDIS_SCRIPT",
    "DynamoDBGuard",
    "EtcdGuard",
    "FencingGuard",
    "Hold",
    "HoldLike",
    "MalformedTokenError",
    "MissingRecordError",
    "MySqlGuard",
    "RejectHook",
    "RedisGuard",
    "S3Guard",
    "S3_TOKEN_METADATA",
    "SqlGuard",
    "StoredTokenAheadError",
    "TokenHold",
    "add_token_column",
    "check_identifier",
    "check_token",
    "condition_kwargs",
    "mysql_update_statement",
    "mysql_upsert_statement",
    "update_statement",
    "upsert_statement",
]
