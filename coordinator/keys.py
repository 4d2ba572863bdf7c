"""Lock names, their validation and their etcd keys.

A lock named ``N`` is the key range ``<prefix><encoded N>/``; each contender
puts one key ``<prefix><encoded N>/<lease id as 16 hex digits>`` attached to
its lease. The name is percent-encoded with no safe characters, so ``/``
becomes ``%2F``: no lock's range can contain another lock's keys (``a`` and
``a/b`` are independent locks).
"""

from __future__ import annotations

from urllib.parse import quote, unquote

from .errors import InvalidField

MAX_NAME_BYTES = 256
MIN_TTL_SECONDS = 1
MAX_TTL_SECONDS = 86_400
MAX_WAIT_MS = 86_400_000
MAX_LEASE_ID = 2**63 - 1


def validate_name(name: str) -> str:
    """Check a lock name.

    Args:
        name: 1 to 256 bytes of UTF-8, no control characters.

    Returns:
        The name unchanged.

    Raises:
        InvalidField: field ``name``.
    """
    if not name:
        raise InvalidField("name", "must not be empty")
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_NAME_BYTES:
        raise InvalidField("name", f"is {size} bytes; at most {MAX_NAME_BYTES} bytes of UTF-8")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in name):
        raise InvalidField("name", "must not contain control characters (NUL, newline, ...)")
    return name


def validate_ttl(ttl_seconds: int) -> int:
    """Check a requested lease TTL in whole seconds (1 to 86400).

    Raises:
        InvalidField: field ``ttl_seconds``.
    """
    if not MIN_TTL_SECONDS <= ttl_seconds <= MAX_TTL_SECONDS:
        raise InvalidField(
            "ttl_seconds", f"is {ttl_seconds}; must be {MIN_TTL_SECONDS} to {MAX_TTL_SECONDS} seconds"
        )
    return ttl_seconds


def validate_lease_id(lease_id: int) -> int:
    """Check a lease id (> 0).

    Raises:
        InvalidField: field ``lease_id``.
    """
    if not 0 < lease_id <= MAX_LEASE_ID:
        raise InvalidField("lease_id", f"is {lease_id}; must be a lease id from LeaseGrant (> 0)")
    return lease_id


def validate_token(token: int) -> int:
    """Check a fencing token (> 0).

    Raises:
        InvalidField: field ``token``.
    """
    if token <= 0:
        raise InvalidField("token", f"is {token}; must be the fencing token of a grant (> 0)")
    return token


def wait_seconds(wait_ms: int, wait_forever: bool) -> float | None:
    """Turn an Acquire's wait fields into seconds.

    Returns:
        None to wait without limit, 0.0 to try once, else the wait in seconds.

    Raises:
        InvalidField: field ``wait_ms``.
    """
    if wait_ms < 0 or wait_ms > MAX_WAIT_MS:
        raise InvalidField("wait_ms", f"is {wait_ms}; must be 0 to {MAX_WAIT_MS} milliseconds")
    if wait_forever:
        if wait_ms:
            raise InvalidField("wait_ms", "must be 0 when wait_forever is set")
        return None
    return wait_ms / 1000.0


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

    def lock_prefix(self, name: str) -> bytes:
        """The key range of lock ``name`` (every contender's key starts with it)."""
        return self.prefix + quote(name, safe="").encode() + b"/"

    def contender(self, name: str, lease_id: int) -> bytes:
        """The key of ``lease_id``'s hold or place in the queue for ``name``."""
        return self.lock_prefix(name) + f"{lease_id:016x}".encode()

    def parse(self, key: bytes) -> tuple[str, int] | None:
        """Split a contender key into (lock name, lease id); None if it is not one."""
        if not key.startswith(self.prefix):
            return None
        encoded, sep, lease_hex = key[len(self.prefix):].rpartition(b"/")
        if not sep or not encoded:
            return None
        try:
            return unquote(encoded.decode()), int(lease_hex, 16)
        except ValueError:
            return None


def prefix_end(prefix: bytes) -> bytes:
    """The etcd range_end that covers every key starting with ``prefix``."""
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\0"

