"""Ownership of leases: only the caller that granted a lease may renew, revoke, acquire with or release on it.

A lease belongs to the caller of its LeaseGrant (issue 9). Two credentials
prove it, either one enough:

- the caller's certificate identity (:func:`.identity.caller_of`), when the
  LeaseGrant came with a verified client certificate (mTLS): any later call
  with a certificate of the same identity owns the lease (a second process
  of the same service, ``fencepost release`` from a script);
- the lease secret: 32 random bytes (``secrets``) in base64url, returned once
  by LeaseGrant, presented as the metadata entry ``fencepost-lease-secret``
  on unary calls and in ``KeepAliveRequest.lease_secret`` on the stream.

The coordinator keeps neither in memory for long nor in clear: each lease
has an ownership record in etcd, ``<prefix>.lease.<lease id hex>``
(:meth:`~fencepost.client.v1.keys.Keys.lease_record`), attached to the lease
(it ends with it), holding the owner identity and the SHA-256 of the secret,
never the secret: whoever reads etcd cannot act as the owner. The record is
written before LeaseGrant answers (a lease whose record cannot be written is
revoked and the call fails), so every replica can check any lease after a
failover. Digests are compared with :func:`hmac.compare_digest`.

Each coordinator caches records (lease id -> record, bounded LRU), filled at
grant and on a miss by one etcd Range; a record never changes while its lease
lives, so a cached one is never stale for a live lease. A lease without a
record is refused while it lives (granted straight in etcd, around the
coordinators); one that is gone is let through, so that the call reports it
as before (LEASE_EXPIRED, NOT_HOLDER, ``found = false``): "expired" never
turns into "denied". A refusal is :class:`~fencepost.client.errors.PermissionDenied`
with reason NOT_LEASE_OWNER and the lease id; nothing was changed.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import secrets
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from fencepost.client.errors import NotLeaseOwner, PermissionDenied
from fencepost.client.v1 import etcdops
from fencepost.client.v1.details import ErrorReason, reason_name
from fencepost.client.v1.keys import LEASE_SECRET_METADATA, MAX_LEASE_ID, Keys

from ..etcd import NOT_APPLIED, EtcdClient, TxnPlan
from .identity import Caller, caller_of

__all__ = ["SECRET_METADATA", "OwnerRecord", "Ownership", "new_secret", "secret_of"]

_log = logging.getLogger(__name__)

#: The gRPC metadata key of the lease secret on unary calls.
SECRET_METADATA = LEASE_SECRET_METADATA
#: The format version of ownership records.
RECORD_VERSION = 1
#: Most records a coordinator caches.
CACHE_SIZE = 100_000


def new_secret() -> str:
    """A new lease secret: 32 random bytes from :mod:`secrets`, base64url without padding (43 characters).

    Never one that starts with ``-`` (1 in 64 would): passed as a command-line
    argument (``fencepost release --lease-secret SECRET``), it would read as an option.
    """
    while True:
        secret = base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()
        if not secret.startswith("-"):
            return secret


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).digest()


def secret_of(context: Any) -> str | None:
    """The lease secret a unary call presented (its ``fencepost-lease-secret`` metadata), or None."""
    for key, value in context.invocation_metadata() or ():
        if key == SECRET_METADATA:
            return value if isinstance(value, str) else bytes(value).decode("utf-8", "replace")
    return None


@dataclass(frozen=True, slots=True)
class OwnerRecord:
    """A lease's ownership record.

    Attributes:
        owner: the certificate identity of the caller that granted the lease; None without mTLS.
        secret_sha256: the SHA-256 of the lease secret (32 bytes).
    """

    owner: str | None
    secret_sha256: bytes

    @classmethod
    def for_secret(cls, owner: str | None, secret: str) -> OwnerRecord:
        """The record of a lease granted to ``owner`` with ``secret``."""
        return cls(owner, _digest(secret))

    def encode(self) -> bytes:
        """The record as stored in etcd (JSON)."""
        return json.dumps({"version": RECORD_VERSION, "owner": self.owner,
                           "secret_sha256": self.secret_sha256.hex()}, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, value: bytes) -> OwnerRecord:
        """Parse a stored record.

        Raises:
            ValueError: not an ownership record of a known version.
        """
        try:
            data = json.loads(value)
            if data["version"] != RECORD_VERSION:
                raise ValueError(f"unknown ownership record version {data['version']!r}")
            owner, digest = data["owner"], bytes.fromhex(data["secret_sha256"])
        except (TypeError, KeyError, AttributeError) as exc:
            raise ValueError("not an ownership record") from exc
        if (owner is not None and not isinstance(owner, str)) or len(digest) != 32:
            raise ValueError("not an ownership record")
        return cls(owner, digest)

    def allows(self, identity: str | None, secret: str | None) -> bool:
        """Whether a caller with certificate ``identity`` presenting ``secret`` owns the lease (constant time)."""
        by_identity = (self.owner is not None and identity is not None
                       and hmac.compare_digest(self.owner.encode(), identity.encode()))
        by_secret = secret is not None and hmac.compare_digest(_digest(secret), self.secret_sha256)
        return by_identity or by_secret

    def __repr__(self) -> str:
        return f"OwnerRecord(owner={self.owner!r})"


class Ownership:
    """Writes, caches and checks the ownership records of leases.

    Args:
        etcd: the coordinator's etcd layer.
        keys: the key layout (the records live at :meth:`Keys.lease_record`).
        cache_size: most records kept in memory.
    """

    def __init__(self, etcd: EtcdClient, keys: Keys, *, cache_size: int = CACHE_SIZE) -> None:
        self._etcd = etcd
        self._keys = keys
        self._cache: OrderedDict[int, OwnerRecord] = OrderedDict()
        self._cache_size = cache_size

    async def record(self, lease_id: int, record: OwnerRecord) -> None:
        """Write ``lease_id``'s ownership record, attached to the lease (one Txn: put if absent).

        Raises:
            LeaseLost: the lease is already gone.
            PermissionDenied: the lease already has another record (it cannot: lease ids are new).
            Unavailable: etcd unreachable.
        """
        key = self._keys.lease_record(lease_id)
        value = record.encode()

        def decide(resp: Any) -> bool:
            if resp.succeeded:
                return True
            kvs = resp.responses[0].response_range.kvs
            return bool(kvs) and bytes(kvs[0].value) == value

        def resolve(resp: Any) -> bool:
            kvs = resp.responses[0].response_range.kvs
            if not kvs:
                return NOT_APPLIED  # type: ignore[no-any-return]  # not written: send it again
            return bytes(kvs[0].value) == value

        written = await self._etcd.txn(TxnPlan(
            etcdops.txn([etcdops.is_absent(key)], [etcdops.put(key, value, lease_id=lease_id)], [etcdops.get(key)]),
            decide, [etcdops.get(key)], resolve, lease_id=lease_id))
        if not written:
            raise self._denied(lease_id, "LeaseGrant", "it already has an ownership record")
        self._remember(lease_id, record)

    def ended(self, lease_id: int) -> None:
        """Forget ``lease_id``'s record (the lease was revoked, or a keepalive found it gone)."""
        self._cache.pop(lease_id, None)

    async def check_call(self, context: Any, lease_id: int, call: str) -> None:
        """Refuse a unary call on ``lease_id`` whose caller does not own it (see :meth:`check`).

        Args:
            context: the call's ``grpc.aio.ServicerContext`` (its certificate and metadata).
            lease_id: the lease the request names.
            call: the RPC's name, for the error.
        """
        await self.check(lease_id, caller_of(context), secret_of(context), call)

    async def check(self, lease_id: int, who: Caller, secret: str | None, call: str) -> None:
        """Return when ``who`` (presenting ``secret``) owns ``lease_id``, or when the lease is gone or not valid.

        A lease id out of range is let through for the call to refuse as
        INVALID_ARGUMENT; so is a lease that is gone, for the call to report.

        Raises:
            PermissionDenied: NOT_LEASE_OWNER: the lease lives and is not the caller's
                (or has no ownership record).
            Unavailable: etcd unreachable (on a cache miss).
        """
        if not 0 < lease_id <= MAX_LEASE_ID:
            return
        record = self._cache.get(lease_id)
        if record is not None:
            self._cache.move_to_end(lease_id)
            if record.allows(who.identity, secret):
                return
            self._cache.pop(lease_id, None)  # refused from memory: read etcd again (the lease may be gone)
        record = await self._read(lease_id)
        if record is None:
            if await self._alive(lease_id):
                raise self._denied(lease_id, call, "it has no ownership record (was it granted straight in etcd?)")
            return  # gone: the call itself reports it
        self._remember(lease_id, record)
        if not record.allows(who.identity, secret):
            why = ("no lease secret was presented" if secret is None else "the lease secret presented is not its")
            if record.owner is not None:
                why += f", and it belongs to another identity than {who.identity!r}" if who.identity else (
                    ", and the call has no client certificate")
            raise self._denied(lease_id, call, why)

    async def _read(self, lease_id: int) -> OwnerRecord | None:
        resp = await self._etcd.range(etcdops.get(self._keys.lease_record(lease_id)).request_range, lease_id=lease_id)
        if not resp.kvs:
            return None
        try:
            return OwnerRecord.decode(bytes(resp.kvs[0].value))
        except ValueError as exc:
            _log.warning("lease %#x has an ownership record that cannot be read (%s): every call on it is refused",
                         lease_id, exc)
            return OwnerRecord(None, b"")  # allows nobody

    async def _alive(self, lease_id: int) -> bool:
        ttl, _ = await self._etcd.lease_ttl(lease_id)
        return ttl > 0

    def _remember(self, lease_id: int, record: OwnerRecord) -> None:
        self._cache[lease_id] = record
        self._cache.move_to_end(lease_id)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    @staticmethod
    def _denied(lease_id: int, call: str, why: str) -> NotLeaseOwner:
        return NotLeaseOwner(f"{call} refused: lease {lease_id:#x} is not the caller's: {why}", lease_id=lease_id,
                             reason=reason_name(ErrorReason.NOT_LEASE_OWNER))
