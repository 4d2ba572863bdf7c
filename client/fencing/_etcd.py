"""etcd guard: a put that lands only while the writer holds the lock, in one Txn.

Two checks, both inside one etcd Txn (etcd applies a Txn atomically at one
revision):

1. the writer still holds the lock: its contender key
   ``<prefix><encoded lock name>/<lease id as 16 hex digits>`` exists with
   create revision == its token - F (the coordinator's own holder check; F is
   the token floor in the coordinators' token record ``<prefix>.tokens``, 0
   until an operator recovered from an etcd restore; the guard starts from 0,
   and a refusal's read of the record tells it the floor, once, then it sends
   again);
2. the record has accepted no higher token: the token stored beside the
   value is absent or <= the offered token.

Layout: the value at ``key``, the token at ``key + b"\\x00fencing_token"`` as
exactly 20 zero-padded decimal digits, so that byte order is number order.
etcd's compares are ANDed and cannot test that a value is 20 digits, so a
put is up to two kinds of round. The first (a holder's own writes, a new
record) passes only on no token or exactly the writer's::

    Txn(compare=[CREATE(holder) == token - F, VALUE(token_key) == pad(token)],
        success=[Put(key, value), Put(token_key, pad(token))],
        failure=[Txn(compare=[CREATE(holder) == token - F, CREATE(token_key) == 0],
                     success=[Put(key, value), Put(token_key, pad(token))],
                     failure=[Range(holder), Range(token_key), Range(token record)])])

(a VALUE compare on a missing key is false in etcd, hence the second branch.)
A refusal returns the stored token: when it is a valid token s < t, the next
round replaces ``VALUE(token_key) == pad(token)`` with ``MOD(token_key) ==``
the mod revision it returned (exactly that version), again after another
write came in between, up to :data:`MAX_ATTEMPTS` rounds
(:class:`~fencepost.client.ResourceExhausted`). A stored token that is not 20
ASCII digits raises :class:`~fencepost.client.fencing.MalformedTokenError`
(counted), nothing written.
A refusal raises :class:`~fencepost.client.StaleTokenError`: reason
``NOT_HOLDER`` when the writer no longer holds the lock (released, lease
expired, key deleted); when the record holds a higher token although the same
Txn saw the writer's key, a
:class:`~fencepost.client.fencing.StoredTokenAheadError` (reason
``TOKEN_AHEAD``: the stored token is ahead of the lock service, see
:mod:`._ahead`; also counted in ``ahead``); both are counted by the hook.
The value keys carry no lease: they outlive the lock.
Record keys live outside the lock prefix: a key inside it (where the
coordinator's lock keys are) is refused with
:class:`~fencepost.client.InvalidArgument` before any call, as are an empty
key and a hold that is not a valid grant.
The compares and ops come from :mod:`fencepost.client.v1.etcdops`, the
builders the coordinator's own Txns use.

The guard talks to etcd through a ``grpc.aio.Channel`` you make, to the
same etcd cluster (and with the same ``--prefix``) as the coordinator::

    channel = grpc.aio.insecure_channel("dns:///etcd1:2379")
    # TLS (mTLS: with your client certificate and key, for --client-cert-auth):
    creds = grpc.ssl_channel_credentials(root_certificates=open("ca.pem", "rb").read(),
                                         private_key=open("client-key.pem", "rb").read(),
                                         certificate_chain=open("client.pem", "rb").read())
    channel = grpc.aio.secure_channel("dns:///etcd1:2379", creds)
    guard = EtcdGuard(channel, prefix="/fencepost/locks/")

With etcd authentication on, pass ``metadata=(("token", token),)`` with a
token from etcd's ``Auth.Authenticate`` (the user needs read on the lock
prefix and readwrite on the record keys).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import grpc

from .._transport.wire import name_problem
from ..errors import InvalidArgument, ResourceExhausted, Unavailable
from ..v1 import etcdops
from ..v1.details import ErrorReason
from ..v1.etcd import rpc_pb2_grpc
from ..v1.keys import DEFAULT_PREFIX, MAX_LEASE_ID, Keys, token_floor
from ._guard import FencingGuard, MalformedTokenError, RejectHook, check_token

TOKEN_SUFFIX = b"\x00fencing_token"
#: Per-call deadline of the guard's etcd calls, in seconds.
ETCD_CALL_TIMEOUT = 5.0
#: Txn rounds of one put before a contended write gives up (each lost to another write, or to a new floor).
MAX_ATTEMPTS = 16


class HoldLike(Protocol):
    """What the guard needs of a hold: a :class:`~fencepost.client.v1.keys.Hold`, or a lock handle."""

    @property
    def name(self) -> str: ...
    @property
    def lease_id(self) -> int: ...
    @property
    def token(self) -> int: ...


def _pad(token: int) -> bytes:
    return f"{token:020d}".encode()


def _stored(stored: bytes | None) -> int | None:
    """A stored token key's value as a token: exactly 20 ASCII digits (the guard's own form); else None."""
    if stored is None or len(stored) != 20 or not stored.isdigit():
        return None
    return int(stored)


def _bytes(data: str | bytes, field: str) -> bytes:
    """``data`` as bytes (a str as UTF-8); InvalidArgument naming ``field`` for anything else."""
    if isinstance(data, str):
        try:
            return data.encode("utf-8")
        except UnicodeEncodeError as err:
            raise InvalidArgument(f"{field} must be valid UTF-8: character {err.start} is "
                                  f"{data[err.start]!r}, a lone surrogate", field=field) from None
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise InvalidArgument(f"{field} must be str or bytes, got {data!r}", field=field)


def _check_hold(hold: object) -> tuple[str, int, int]:
    """The (name, lease id, token) of a hold, checked; InvalidArgument before anything is sent.

    Raises:
        InvalidArgument: not a hold, or its name or lease id is bad (field
            ``hold``); its token is bad (field ``token``).
    """
    try:
        name, lease_id, token = hold.name, hold.lease_id, hold.token  # type: ignore[attr-defined]
    except AttributeError:
        raise InvalidArgument(f"hold must be a lock handle or a Hold(name, lease_id, token), got {hold!r}",
                              field="hold") from None
    check_token(token)
    problem = name_problem(name)
    if problem is not None:
        raise InvalidArgument(f"hold's lock name {problem}", field="hold")
    if isinstance(lease_id, bool) or not isinstance(lease_id, int) or not 0 < lease_id <= MAX_LEASE_ID:
        raise InvalidArgument(f"hold's lease_id must be a lease id (1 to 2**63-1), got {lease_id!r}", field="hold")
    return name, lease_id, token


class EtcdGuard(FencingGuard):
    """Fenced writes to etcd keys, tied to a live hold of a Fencepost lock.

    Args:
        channel: A ``grpc.aio.Channel`` to the coordinator's etcd (see the
            module docstring for TLS); the guard does not close it.
        prefix: The coordinator's lock key prefix (``--prefix``, default
            ``/fencepost/locks/``).
        metadata: Call metadata sent with every call, e.g. ``(("token", token),)``
            when etcd has authentication on.
        timeout: Per-call deadline, seconds.
        on_reject: Hook called with each StaleTokenError (see FencingGuard).
        metrics: A ``prometheus_client.CollectorRegistry`` to count writes in
            (see FencingGuard); ``storage`` is ``etcd``.

    Raises:
        InvalidArgument: ``channel`` is not a ``grpc.aio.Channel``, ``prefix``
            is not a non-empty str, or ``timeout`` is not a finite number > 0.
    """

    storage = "etcd"

    def __init__(self, channel: grpc.aio.Channel, *, prefix: str = DEFAULT_PREFIX,
                 metadata: Sequence[tuple[str, str]] | None = None, timeout: float = ETCD_CALL_TIMEOUT,
                 on_reject: RejectHook | None = None,
                 metrics: Any = None) -> None:
        super().__init__(on_reject=on_reject, metrics=metrics)
        if not isinstance(channel, grpc.aio.Channel):
            raise InvalidArgument(f"channel must be a grpc.aio.Channel to etcd, got {channel!r}", field="channel")
        if not isinstance(prefix, str) or not prefix:
            raise InvalidArgument(f"prefix must be the coordinator's lock key prefix, got {prefix!r}", field="prefix")
        _bytes(prefix, "prefix")
        if (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout)
                or timeout <= 0):
            raise InvalidArgument(f"timeout must be a finite number of seconds > 0, got {timeout!r}", field="timeout")
        self.channel = channel
        self.keys = Keys(prefix)
        self._kv = rpc_pb2_grpc.KVStub(channel)
        self._metadata = tuple(metadata) if metadata else None
        self._timeout = timeout
        self._floor = 0  # the coordinators' token floor, as last read from their token record

    async def put(self, key: str | bytes, hold: HoldLike, value: str | bytes) -> int:
        """Write ``value`` at ``key`` if ``hold`` still holds its lock and its token is not stale: one Txn.

        Args:
            key: The record's etcd key (str or bytes, not empty, outside the
                lock prefix: a guarded write must not touch lock keys).
            hold: The writer's grant: ``.name``, ``.lease_id``, ``.token``.
            value: The new value (str or bytes).

        Returns:
            The etcd revision of the write.

        Raises:
            StaleTokenError: refused, nothing written; reason ``NOT_HOLDER``
                (the lock is no longer held under this token).
            StoredTokenAheadError: (a StaleTokenError) refused, nothing
                written: the record holds a higher token although the Txn saw
                the writer still holding the lock (reason ``TOKEN_AHEAD``).
            InvalidArgument: a bad key (field ``key``), hold (``hold``),
                token (``token``) or value (``value``); nothing was sent.
            Unavailable: the etcd call failed (after a timeout or a broken
                connection the write may or may not have been applied: read
                the record back with :meth:`get`).
        """
        name, lease_id, token = _check_hold(hold)
        record, key = key, self._key(key)
        data = _bytes(value, "value")
        token_key = key + TOKEN_SUFFIX
        holder = self.keys.contender(name, lease_id)
        puts = [etcdops.put(key, data), etcdops.put(token_key, _pad(token))]
        reads = [etcdops.get(holder, keys_only=True), etcdops.get(token_key), etcdops.get(self.keys.token_record)]
        seen = 0  # the mod revision of a lower token the last refusal showed (0: none: compare with our own)
        for _ in range(MAX_ATTEMPTS):
            floor = self._floor
            created = token - floor if token > floor else -1  # -1: no key has it (0 would match a missing key)
            held = etcdops.is_owner(holder, created)
            stored_ok = (etcdops.is_unchanged(token_key, seen) if seen
                         else etcdops.value_is(token_key, _pad(token)))
            first = etcdops.txn_op([held, etcdops.is_absent(token_key)], puts, reads)
            resp = await self._txn(etcdops.txn([held, stored_ok], puts, [first]))
            inner = resp.responses[0].response_txn if not resp.succeeded else None
            if inner is None or inner.succeeded:
                self._accepted()
                return int(resp.header.revision)
            record_kvs = inner.responses[2].response_range.kvs
            try:
                self._floor = token_floor(bytes(record_kvs[0].value) if record_kvs else None)
            except ValueError:
                self._floor = floor
            if self._floor != floor:
                continue  # another token floor: send again
            holder_kvs = inner.responses[0].response_range.kvs
            token_kvs = inner.responses[1].response_range.kvs
            stored = bytes(token_kvs[0].value) if token_kvs else None
            current = _stored(stored)
            if not holder_kvs or int(holder_kvs[0].create_revision) != created:
                raise self._reject(
                    record, token, current, reason=ErrorReason.NOT_HOLDER, name=name, lease_id=lease_id,
                    message=(f"write with fencing token {token} refused: lease {lease_id:#x} no longer "
                             f"holds lock {name!r} under that token"))
            if stored is not None and current is None:
                raise self._malformed(record, token, stored, what="token key value", name=name, lease_id=lease_id)
            if current is not None and current > token:
                raise self._reject(record, token, current, name=name, lease_id=lease_id, held=True)
            # No token now, or a lower one: write over exactly that one (its mod revision) next round.
            seen = int(token_kvs[0].mod_revision) if token_kvs else 0
        raise ResourceExhausted(f"etcd: {MAX_ATTEMPTS} fenced writes with fencing token {token} to {record!r} each "
                                f"lost to another write; nothing written, retry later")

    async def get(self, key: str | bytes) -> tuple[bytes | None, int | None]:
        """Read a record: (value, token), each None when absent (one Txn, one revision).

        Raises:
            InvalidArgument: a bad key (as for :meth:`put`).
            Unavailable: the etcd call failed.
        """
        key = self._key(key)
        resp = await self._txn(etcdops.txn([], [etcdops.get(key), etcdops.get(key + TOKEN_SUFFIX)]))
        value_kvs = resp.responses[0].response_range.kvs
        token_kvs = resp.responses[1].response_range.kvs
        stored = bytes(token_kvs[0].value) if token_kvs else None
        token = _stored(stored)
        if stored is not None and token is None:
            raise MalformedTokenError(f"{key!r}: the stored token is {stored!r}, not a fencing token",
                                      record=key, stored=stored)
        return (bytes(value_kvs[0].value) if value_kvs else None), token

    def _key(self, key: str | bytes) -> bytes:
        """A record key as bytes: not empty, and neither it nor its token key inside the lock prefix."""
        data = _bytes(key, "key")
        if not data:
            raise InvalidArgument("key must not be empty", field="key")
        prefix = self.keys.prefix
        if data.startswith(prefix) or (data + TOKEN_SUFFIX).startswith(prefix):
            raise InvalidArgument(f"key {key!r} is inside the lock prefix {prefix.decode(errors='replace')!r}: a "
                                  f"guarded write there could overwrite lock keys; keep records outside it",
                                  field="key")
        return data

    async def _txn(self, request: Any) -> Any:
        try:
            return await self._kv.Txn(request, timeout=self._timeout, metadata=self._metadata)
        except grpc.aio.AioRpcError as exc:
            raise Unavailable(f"etcd: Txn failed: {exc.code().name}: {exc.details()}") from exc
