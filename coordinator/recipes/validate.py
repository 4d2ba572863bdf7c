"""Checks of request fields, raising InvalidArgument that names the field.

The limits are the wire contract's (:mod:`fencepost.client.v1.keys`).
"""

from __future__ import annotations

from fencepost.client.errors import InvalidArgument
from fencepost.client.v1 import kinds
from fencepost.client.v1.keys import MAX_LEASE_ID, MAX_NAME_BYTES, MAX_TOKEN, MAX_TTL_SECONDS, MAX_WAIT_MS, MIN_TTL_SECONDS
from fencepost.client.v1.names import forbidden_problem


def _invalid(field: str, problem: str) -> InvalidArgument:
    return InvalidArgument(f"{field} {problem}", field=field)


def validate_name(name: str) -> str:
    """Check a lock name.

    Args:
        name: 1 to 256 bytes of UTF-8, no character of the Unicode categories
            Cc, Cf, Zl or Zp (:mod:`fencepost.client.v1.names`).

    Returns:
        The name unchanged.

    Raises:
        InvalidArgument: field ``name``.
    """
    if not name:
        raise _invalid("name", "must not be empty")
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_NAME_BYTES:
        raise _invalid("name", f"is {size} bytes; at most {MAX_NAME_BYTES} bytes of UTF-8")
    problem = forbidden_problem(name)
    if problem is not None:
        raise _invalid("name", problem)
    return name


def validate_lock_name(name: str) -> str:
    """Check a lock name as the lock algorithm sees it: a caller's name, or an internal one.

    Internal names (:mod:`fencepost.client.v1.kinds`: an election's lock, a
    semaphore's queue or slot) are a tag followed by a caller's name; that
    name is checked like any lock name. The service checks callers' names
    with :func:`validate_name`, which refuses internal ones.

    Raises:
        InvalidArgument: field ``name``.
    """
    if not kinds.is_internal(name):
        return validate_name(name)
    public = kinds.public_hold(name).name if not name.startswith(kinds.INTERNAL + "p/") else name[3:]
    validate_name(public)
    return name


def validate_ttl(ttl_seconds: int) -> int:
    """Check a requested lease TTL in whole seconds (1 to 86400).

    Raises:
        InvalidArgument: field ``ttl_seconds``.
    """
    if not MIN_TTL_SECONDS <= ttl_seconds <= MAX_TTL_SECONDS:
        raise _invalid(
            "ttl_seconds", f"is {ttl_seconds}; must be {MIN_TTL_SECONDS} to {MAX_TTL_SECONDS} seconds"
        )
    return ttl_seconds


def validate_lease_id(lease_id: int) -> int:
    """Check a lease id (> 0).

    Raises:
        InvalidArgument: field ``lease_id``.
    """
    if not 0 < lease_id <= MAX_LEASE_ID:
        raise _invalid("lease_id", f"is {lease_id}; must be a lease id from LeaseGrant (> 0)")
    return lease_id


def validate_token(token: int) -> int:
    """Check a fencing token (> 0).

    Raises:
        InvalidArgument: field ``token``.
    """
    if not 0 < token <= MAX_TOKEN:
        raise _invalid("token", f"is {token}; must be the fencing token of a grant (> 0)")
    return token


def wait_seconds(wait_ms: int, wait_forever: bool) -> float | None:
    """Turn an Acquire's wait fields into seconds.

    Returns:
        None to wait without limit, 0.0 to try once, else the wait in seconds.

    Raises:
        InvalidArgument: field ``wait_ms``.
    """
    if wait_ms < 0 or wait_ms > MAX_WAIT_MS:
        raise _invalid("wait_ms", f"is {wait_ms}; must be 0 to {MAX_WAIT_MS} milliseconds")
    if wait_forever:
        if wait_ms:
            raise _invalid("wait_ms", "must be 0 when wait_forever is set")
        return None
    return wait_ms / 1000.0


