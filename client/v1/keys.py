"""The etcd key layout of locks, and the limits of names, TTLs, waits, lease ids and tokens.

A lock named ``N`` is the key range ``<prefix><encoded N>/``; each contender
puts one key ``<prefix><encoded N>/<lease id as 16 hex digits>`` attached to
its lease. The name is percent-encoded with no safe characters, so ``/``
becomes ``%2F``: no lock's range can contain another lock's keys (``a`` and
``a/b`` are independent locks).

A reader of lock ``N`` (a read-write lock, ``kinds.read_lock(N)``) puts the
key ``<prefix><encoded N>/r<lease id as 16 hex digits>`` in the same range:
its contenders, readers and writers, queue in one order of create
revisions, and a plain holder is a writer. Writers' keys (16 hex digits)
all sort before ``r``, so they are the range :meth:`Keys.writers`.

One more key lives under the prefix: the coordinators' token record
``<prefix>.tokens`` (no ``/`` after the name part, so no lock's range holds
it), JSON with the token floor F: a fencing token is its key's create
revision + F (0 until an operator recovers from an etcd restore; see
``fencepost.coordinator.recipes.tokens``).

And one key per lease granted through a coordinator, its ownership record
``<prefix>.lease.<lease id as 16 hex digits>`` (no ``/`` either, so no lock
holds it and :meth:`Keys.parse` rejects it), attached to the lease so that it
ends with it: JSON with the owner's certificate identity and the SHA-256 of
the lease secret (see ``fencepost.coordinator.admission.ownership``).

And, for a lock whose holds ask for a lock-delay, up to two keys under
``<prefix>!delay!<encoded name>!`` (``!`` is percent-encoded in names, so no
lock's range holds them, and :meth:`Keys.parse` rejects them): the record of
the last such hold, and the wait of a delay that runs (see
``fencepost.coordinator.recipes.lock_delay``).

And one key per recent call that changed state and carried a request id,
its request record ``<prefix>.request.<request id>`` (no ``/``: no lock
holds it and :meth:`Keys.parse` rejects it; a request id is 1 to 64
characters of ``[A-Za-z0-9_-]``), attached to a lease of the coordinators'
own that is never kept alive, so that it ends 60 to 120 s after it was
written: JSON naming the call (see ``fencepost.coordinator.recipes.requests``).
Each such lease carries a marker key ``<prefix>.request.~<lease id as 16
hex digits>`` (``~`` is in no request id).
"""

from __future__ import annotations

import json
from typing import NamedTuple
import functools
from urllib.parse import quote, unquote

from .kinds import READ_TAG

#: Longest lock name, in bytes of UTF-8.
MAX_NAME_BYTES = 256
#: Shortest and longest lease TTL a caller may ask for, in seconds.
MIN_TTL_SECONDS = 1
MAX_TTL_SECONDS = 86_400
#: Longest wait of one Acquire, in milliseconds (one day).
MAX_WAIT_MS = 86_400_000
#: Most permits of one semaphore (AcquirePermitRequest.permits).
MAX_PERMITS = 1000
#: Most names of one multi-lock (AcquireAll): its Txns stay well under etcd's default --max-txn-ops (128).
MAX_MULTILOCK_NAMES = 32
#: Longest value of an election's leader (CampaignRequest.value, ProclaimRequest.value), in bytes: well
#: inside a coordinator's default --max-message-bytes (64 KiB) with the rest of the request.
MAX_VALUE_BYTES = 32_768
#: Longest lock-delay (AcquireRequest.lock_delay_seconds), in seconds.
MAX_LOCK_DELAY_SECONDS = 3600
#: Longest request id (the ``request_id`` fields), in characters of ``[A-Za-z0-9_-]``.
MAX_REQUEST_ID_CHARS = 64
#: Most entries of one batch of keepalives (KeepAliveRequest.keepalives): about 60 bytes each with its lease's
#: secret, so a full batch stays well inside a coordinator's default --max-message-bytes (64 KiB).
MAX_KEEPALIVES_PER_BATCH = 500
#: Most entries of one batch of calls (KeepAliveRequest.calls; a coordinator refuses more).
MAX_CALLS_PER_BATCH = 500
#: Largest batch of calls a client sends, in bytes of its entries: a call is up to about 450 bytes (a 256-byte
#: name, a lease secret, a traceparent), so a batch stays well inside a coordinator's --max-message-bytes
#: (64 KiB by default); more calls go in the next message.
MAX_CALLS_BATCH_BYTES = 16_384
#: Largest lease id and fencing token (etcd's int64).
MAX_LEASE_ID = 2**63 - 1
MAX_TOKEN = 2**63 - 1
#: The gRPC metadata key under which a unary call naming a lease presents the lease's secret
#: (LeaseGrantResponse.lease_secret; see proto/fencepost/v1/lock.proto, "Ownership").
LEASE_SECRET_METADATA = "fencepost-lease-secret"
#: The initial metadata key with which a coordinator says it accepted an Observe (its first etcd read
#: succeeded); a refused Observe has none.
OBSERVE_ACCEPTED_METADATA = "fencepost-observe-accepted"
#: Default etcd key prefix of all locks.
DEFAULT_PREFIX = "/fencepost/locks/"
#: The token record's key is the prefix followed by this.
TOKEN_RECORD_SUFFIX = b".tokens"
#: Each lease's ownership record's key is the prefix followed by this and the lease id in 16 hex digits.
LEASE_RECORD_INFIX = b".lease."
#: Each request record's key is the prefix followed by this and the request id.
REQUEST_RECORD_INFIX = b".request."
#: A records lease's marker key is the prefix, REQUEST_RECORD_INFIX, this and the lease id in 16 hex digits.
RECORDS_LEASE_MARK = b"~"
#: A reader's key is its lock's range, this, and its lease id in 16 hex digits (after every writer's key).
READER_MARK = b"r"


def token_floor(record: bytes | None) -> int:
    """The token floor F in a token record's value (``token = create revision + F``); 0 without a record.

    Raises:
        ValueError: the value is not a token record.
    """
    if record is None:
        return 0
    try:
        floor = int(json.loads(record)["floor"])
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"not a token record: {record[:100]!r}") from exc
    if floor < 0:
        raise ValueError(f"token record with a negative floor: {record[:100]!r}")
    return floor


class Hold(NamedTuple):
    """A hold: one grant of lock ``name`` to lease ``lease_id`` with fencing token ``token``.

    In etcd it is the key ``Keys.contender(name, lease_id)`` whose create
    revision is ``token``; it lasts until released, until its lease ends, or
    until that key is deleted.
    """

    name: str
    lease_id: int
    token: int


class Keys:
    """Builds and parses the etcd keys under one prefix.

    Args:
        prefix: key prefix, e.g. ``/fencepost/locks/`` (a trailing ``/`` is added).
    """

    def __init__(self, prefix: str) -> None:
        if not prefix.endswith("/"):
            prefix += "/"
        self.prefix = prefix.encode()
        self.range_end = prefix_end(self.prefix)
        #: The coordinators' token record (its token floor): ``<prefix>.tokens``.
        self.token_record = self.prefix + TOKEN_RECORD_SUFFIX
        #: Every lease's ownership record starts with this: ``<prefix>.lease.``.
        self.lease_records = self.prefix + LEASE_RECORD_INFIX
        #: Every request record starts with this: ``<prefix>.request.``.
        self.request_records = self.prefix + REQUEST_RECORD_INFIX

    def lock_prefix(self, name: str) -> bytes:
        """The key range of lock ``name`` (every contender's key starts with it; a read hold's is its lock's)."""
        if name.startswith(READ_TAG):
            name = name[len(READ_TAG):]
        return self.prefix + _encoded(name) + b"/"

    def ahead(self, name: str) -> tuple[bytes, bytes]:
        """The key range [start, end) whose keys before a contender's of ``name`` hold it back: the writers' for
        a read hold's name (:func:`.kinds.read_lock`), the whole lock's range otherwise."""
        if name.startswith(READ_TAG):
            return self.writers(name)
        lock = self.lock_prefix(name)
        return lock, prefix_end(lock)

    def writers(self, name: str) -> tuple[bytes, bytes]:
        """The key range [start, end) of the writers' keys of lock ``name`` (its range without its readers)."""
        lock = self.lock_prefix(name)
        return lock, lock + READER_MARK

    def name_prefix(self, prefix: str) -> bytes:
        """The key range of every lock whose name starts with ``prefix`` ("" for every lock).

        Names are encoded byte by byte and ``%`` itself is encoded, so a name
        starts with ``prefix`` exactly when its key starts with this.
        """
        return self.prefix + quote(prefix, safe="").encode()

    def contender(self, name: str, lease_id: int) -> bytes:
        """The key of ``lease_id``'s hold or place in the queue for ``name`` (a reader's for a read hold's name)."""
        mark = READER_MARK if name.startswith(READ_TAG) else b""
        return self.lock_prefix(name) + mark + f"{lease_id:016x}".encode()

    def lease_record(self, lease_id: int) -> bytes:
        """The key of lease ``lease_id``'s ownership record (not a lock key: :meth:`parse` returns None for it)."""
        return self.lease_records + f"{lease_id:016x}".encode()

    def request_record(self, request_id: str) -> bytes:
        """The key of the record of the call with ``request_id`` (a checked id: ``[A-Za-z0-9_-]``, 1 to 64).

        Not a lock key: :meth:`parse` returns None for it, and no lock's range holds it.
        """
        return self.request_records + request_id.encode("ascii")

    def records_lease_marker(self, lease_id: int) -> bytes:
        """The key that marks lease ``lease_id`` as a records lease: ``<prefix>.request.~<16 hex>``.

        ``~`` is in no request id, so no request record has this key.
        """
        return self.request_records + RECORDS_LEASE_MARK + f"{lease_id:016x}".encode()

    @staticmethod
    def is_reader(key: bytes) -> bool:
        """Whether contender key ``key`` is a reader's (``.../r<16 hex>``)."""
        return key[key.rfind(b"/") + 1:].startswith(READER_MARK)

    def is_record(self, key: bytes) -> bool:
        """Whether ``key`` is a lease's ownership record or a request record (not a lock key)."""
        return key.startswith(self.lease_records) or key.startswith(self.request_records)

    def parse(self, key: bytes) -> tuple[str, int] | None:
        """Split a contender key into (lock name, lease id); None if it is not one.

        A reader's key gives its lock's name: it is a contender of that lock (:meth:`is_reader` tells).
        """
        if not key.startswith(self.prefix):
            return None
        encoded, sep, lease_hex = key[len(self.prefix):].rpartition(b"/")
        if not sep or not encoded:
            return None
        try:
            return unquote(encoded.decode()), int(lease_hex.removeprefix(READER_MARK), 16)
        except ValueError:
            return None


@functools.lru_cache(maxsize=65_536)
def _encoded(name: str) -> bytes:
    """``name`` as it appears in its keys: percent-encoded byte by byte (cached: names repeat on the hot path)."""
    return quote(name, safe="").encode()


def prefix_end(prefix: bytes) -> bytes:
    """The etcd range_end that covers every key starting with ``prefix``."""
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\0"

