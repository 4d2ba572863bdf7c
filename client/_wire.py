"""Argument checks, unit conversion to the wire, channel options and backoff.

The Python API takes float seconds; this module is the one place that turns
them into the wire's whole ``ttl_seconds`` and ``wait_ms``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence

from .errors import InvalidArgument

MIN_TTL_SECONDS = 1
MAX_TTL_SECONDS = 86_400
MAX_WAIT_SECONDS = 86_400.0

# gRPC channel options: HTTP/2 pings every 20 s (10 s to answer) even without
# calls, so that a half-open connection is noticed.
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
)

BACKOFF_BASE_SECONDS = 0.05
BACKOFF_CAP_SECONDS = 2.0


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def ttl_to_wire(ttl: float) -> int:
    """Check a TTL and convert it to whole seconds, rounding up.

    Args:
        ttl: Requested lease TTL in seconds; finite, 1 to 86400.

    Returns:
        The TTL in whole seconds, never shorter than ``ttl``.

    Raises:
        InvalidArgument: ``ttl`` is not a finite number in range (field "ttl").
    """
    if not _is_number(ttl) or not math.isfinite(ttl) or not MIN_TTL_SECONDS <= ttl <= MAX_TTL_SECONDS:
        raise InvalidArgument(
            f"ttl must be a finite number of seconds from {MIN_TTL_SECONDS} to {MAX_TTL_SECONDS}, got {ttl!r}",
            field="ttl",
        )
    return math.ceil(ttl)


def check_timeout(timeout: float | None) -> float | None:
    """Check an acquire timeout.

    Args:
        timeout: Seconds to wait, None to wait forever; finite, 0 to 86400.

    Returns:
        ``timeout`` as a float, or None.

    Raises:
        InvalidArgument: ``timeout`` is not None nor a finite number in range
            (field "timeout").
    """
    if timeout is None:
        return None
    if not _is_number(timeout) or not math.isfinite(timeout) or not 0 <= timeout <= MAX_WAIT_SECONDS:
        raise InvalidArgument(
            f"timeout must be None or a finite number of seconds from 0 to {MAX_WAIT_SECONDS:g}, got {timeout!r}",
            field="timeout",
        )
    return float(timeout)


def wait_to_wire(remaining: float | None) -> tuple[int, bool]:
    """Convert the time left to wait into ``(wait_ms, wait_forever)``.

    Args:
        remaining: Seconds left to wait (clamped at 0), or None for forever.

    Returns:
        ``(wait_ms, wait_forever)`` for an AcquireRequest.
    """
    if remaining is None:
        return 0, True
    wait_ms = round(max(0.0, remaining) * 1000)
    return min(wait_ms, int(MAX_WAIT_SECONDS * 1000)), False


def check_name(name: str) -> str:
    """Check a lock name client-side (the server checks length and characters).

    Args:
        name: The lock name.

    Returns:
        ``name`` unchanged.

    Raises:
        InvalidArgument: ``name`` is not a non-empty str (field "name").
    """
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"name must be a non-empty str, got {name!r}", field="name")
    return name


def check_addresses(address: str | Sequence[str]) -> list[str]:
    """Normalise the client's address argument into a non-empty list.

    Args:
        address: ``"host:port"`` or a sequence of them (a comma-separated
            string is split too).

    Returns:
        The addresses, in order.

    Raises:
        InvalidArgument: no address given (field "address").
    """
    items = address.split(",") if isinstance(address, str) else list(address)
    addresses = [a.strip() for a in items if isinstance(a, str) and a.strip()]
    if not addresses or len(addresses) != len(items):
        raise InvalidArgument(f"address must be 'host:port' or a list of them, got {address!r}", field="address")
    return addresses


def check_fraction(keepalive_fraction: float) -> float:
    """Check the keepalive period as a fraction of the TTL (0 < f <= 0.5).

    Raises:
        InvalidArgument: out of range (field "keepalive_fraction").
    """
    if not _is_number(keepalive_fraction) or not 0 < keepalive_fraction <= 0.5:
        raise InvalidArgument(
            f"keepalive_fraction must be in (0, 0.5], got {keepalive_fraction!r}", field="keepalive_fraction"
        )
    return float(keepalive_fraction)


def margin_for(ttl: float) -> float:
    """Safety margin in seconds taken off the local lease deadline.

    Args:
        ttl: Granted TTL in seconds.

    Returns:
        ``min(1.0, max(0.1, 0.1 * ttl))``.
    """
    return min(1.0, max(0.1, 0.1 * ttl))


def backoff_delays(
    base: float = BACKOFF_BASE_SECONDS,
    cap: float = BACKOFF_CAP_SECONDS,
    rng: random.Random | None = None,
) -> Iterator[float]:
    """Exponential backoff with full jitter: uniform(0, min(cap, base * 2**n)).

    Args:
        base: First ceiling in seconds.
        cap: Largest ceiling in seconds.
        rng: Random source (for tests); the module's by default.

    Yields:
        Delays in seconds, forever.
    """
    uniform = (rng or random).uniform
    ceiling = base
    while True:
        yield uniform(0.0, ceiling)
        ceiling = min(cap, ceiling * 2)
