"""The client's defaults, argument checks, and unit conversion to the wire.

The Python API takes float seconds; this module is the one place that turns
them into the wire's whole ``ttl_seconds`` and ``wait_ms``. The limits come
from the wire contract (:mod:`fencepost.client.v1.keys`), the backoff policy
from :mod:`fencepost.client.v1.retry`.
"""

from __future__ import annotations

import ipaddress
import math
import re
import sys
import uuid
from collections.abc import Sequence

from ..errors import InvalidArgument
from ..v1.keys import MAX_LOCK_DELAY_SECONDS, MAX_NAME_BYTES, MAX_TTL_SECONDS, MAX_WAIT_MS, MIN_TTL_SECONDS
from ..v1.names import forbidden_problem

__all__ = [
    "ADDRESS_FORMS",
    "CHANNEL_OPTIONS",
    "DEFAULT_ADDRESS",
    "MAX_TTL_SECONDS",
    "MAX_UNIX_PATH_BYTES",
    "MAX_WAIT_SECONDS",
    "MIN_TTL_SECONDS",
    "address_problem",
    "check_addresses",
    "check_connect_timeout",
    "check_fraction",
    "check_idle_leases",
    "check_name",
    "check_prefix",
    "check_timeout",
    "host_port",
    "name_problem",
    "new_request_id",
    "ttl_to_wire",
    "unix_path",
    "wait_to_wire",
]

def new_request_id() -> str:
    """A fresh request id for one logical call (32 hex digits of a random UUID).

    Sent as the ``request_id`` of a call that changes state, the SAME on every
    retry of that call, so that a retry after a lost answer gets the first
    attempt's outcome (proto/fencepost/v1/lock.proto, "Retries").
    """
    return uuid.uuid4().hex


#: The coordinator address used when none is given.
DEFAULT_ADDRESS = "127.0.0.1:7420"
#: Longest wait of one acquire, in seconds (the wire's ``MAX_WAIT_MS``).
MAX_WAIT_SECONDS = MAX_WAIT_MS / 1000

# gRPC channel options: HTTP/2 pings every 20 s (10 s to answer) even without
# calls, so that a half-open connection is noticed.
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # Reconnect as our own backoff does (CLIENT_BACKOFF: 0.05 s growing to
    # 2 s), not after gRPC's default 1 s growing to 120 s: a coordinator
    # back from a restart is found within a fraction of the TTL, so that a
    # loss is told in time (field case F09). Each channel has its own
    # subchannels, so a channel opened by a rotation starts without the
    # failed one's backoff.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
    ("grpc.use_local_subchannel_pool", 1),
)


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


def lock_delay_to_wire(lock_delay: float) -> int:
    """Check a lock-delay and convert it to whole seconds, rounding up.

    Args:
        lock_delay: Seconds; finite, 0 to 3600 (``MAX_LOCK_DELAY_SECONDS``); 0 for none.

    Returns:
        The lock-delay in whole seconds (``AcquireRequest.lock_delay_seconds``), never shorter than asked.

    Raises:
        InvalidArgument: ``lock_delay`` is not a finite number in range (field "lock_delay").
    """
    if not _is_number(lock_delay) or not math.isfinite(lock_delay) or not 0 <= lock_delay <= MAX_LOCK_DELAY_SECONDS:
        raise InvalidArgument(
            f"lock_delay must be a finite number of seconds from 0 to {MAX_LOCK_DELAY_SECONDS}, got {lock_delay!r}",
            field="lock_delay",
        )
    return math.ceil(lock_delay)


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
    return min(wait_ms, MAX_WAIT_MS), False


def name_problem(name: object) -> str | None:
    """What is wrong with a lock name, if anything: the server's rules, checked client-side.

    A name is a str of 1 to :data:`~fencepost.client.v1.keys.MAX_NAME_BYTES`
    bytes of UTF-8 without a character of the Unicode categories Cc, Cf, Zl
    or Zp (controls, format characters such as U+200B, line and paragraph
    separators: :mod:`fencepost.client.v1.names`; the coordinator's own
    check, with the same wording). A str that cannot be encoded as UTF-8 (a lone
    surrogate, as ``sys.argv`` holds for a byte that is not UTF-8) is refused
    too: it could not be sent at all.

    Args:
        name: The lock name.

    Returns:
        None when the name is valid, else the problem, worded to follow
        ``"name "`` (``"must not be empty"``).
    """
    if not isinstance(name, str):
        return f"must be a str, got {name!r}"
    if not name:
        return "must not be empty"
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError as err:
        ch = name[err.start]
        if 0xDC80 <= ord(ch) <= 0xDCFF:  # how sys.argv and os.fsdecode carry a byte that is not UTF-8
            return f"must be valid UTF-8: character {err.start} is the byte 0x{ord(ch) - 0xDC00:02x}, not UTF-8"
        return f"must be valid UTF-8: character {err.start} is {ch!r}, a lone surrogate"
    if size > MAX_NAME_BYTES:
        return f"is {size} bytes; at most {MAX_NAME_BYTES} bytes of UTF-8"
    return forbidden_problem(name)


def check_name(name: str) -> str:
    """Check a lock name client-side, by the server's rules (see :func:`name_problem`).

    Args:
        name: The lock name.

    Returns:
        ``name`` unchanged.

    Raises:
        InvalidArgument: ``name`` is not a str of 1 to 256 bytes of UTF-8
            without control, format or separator characters (Unicode Cc, Cf,
            Zl, Zp) (field "name").
    """
    problem = name_problem(name)
    if problem is not None:
        raise InvalidArgument(f"name {problem}", field="name")
    return name


def check_prefix(prefix: str) -> str:
    """Check a name prefix client-side (ListLocks), by the server's rules: a name's, except that it may be empty.

    Args:
        prefix: The name prefix; "" for every name.

    Returns:
        ``prefix`` unchanged.

    Raises:
        InvalidArgument: ``prefix`` is not a str of 0 to 256 bytes of UTF-8
            without control, format or separator characters (field "prefix").
    """
    problem = name_problem(prefix) if prefix != "" else None
    if problem is not None:
        raise InvalidArgument(f"prefix {problem}", field="prefix")
    return prefix


#: What an address may be, for error messages.
ADDRESS_FORMS = ("HOST:PORT (a host name, an IPv4 address or [IPv6]; port 1 to 65535), dns:///HOST:PORT, "
                 "unix:/ABSOLUTE/PATH or unix:///ABSOLUTE/PATH")

#: Longest unix socket path, in bytes (``sun_path`` holds 108 bytes on Linux, 104 elsewhere, with the NUL).
MAX_UNIX_PATH_BYTES = 107 if sys.platform.startswith("linux") else 103

_HOST_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_PORT = re.compile(r"[0-9]{1,5}")


def unix_path(address: str) -> str | None:
    """The socket path of a ``unix:`` address as :func:`check_addresses` returns it, None for the other forms.

    Args:
        address: A checked address (``unix:/run/f.sock`` or ``unix:///run/f.sock``).

    Returns:
        ``"/run/f.sock"`` for either form; None for ``HOST:PORT`` and ``dns:///HOST:PORT``.
    """
    if not address.startswith("unix:"):
        return None
    rest = address[len("unix:"):]
    return rest[2:] if rest.startswith("//") else rest


def host_port(address: str) -> tuple[str, int] | None:
    """The host and port of a checked TCP address, None for a ``unix:`` address.

    Args:
        address: ``HOST:PORT``, ``[IPv6]:PORT`` or ``dns:///HOST:PORT``, as :func:`check_addresses` returns it.

    Returns:
        ``(host, port)``; an IPv6 host without its brackets.
    """
    if address.startswith("unix:"):
        return None
    if address.startswith("dns:///"):
        address = address[len("dns:///"):]
    host, _, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def _unix_problem(rest: str) -> str | None:
    """What is wrong with the part of a ``unix:`` address after ``unix:``, if anything."""
    if not rest:
        return "has no socket path"
    if rest.startswith("//") and not rest.startswith("///"):
        return "names a host after unix:// (a unix socket has three slashes: unix:///ABSOLUTE/PATH)"
    path = rest[2:] if rest.startswith("//") else rest
    if not path.startswith("/"):
        return f"has the relative socket path {path!r}; a unix socket needs an absolute path"
    size = len(path.encode("utf-8"))
    if size > MAX_UNIX_PATH_BYTES:
        return f"has a socket path of {size} bytes; a unix socket path is at most {MAX_UNIX_PATH_BYTES} bytes"
    return None


def _host_port_problem(text: str) -> str | None:
    """What is wrong with ``HOST:PORT``, if anything (None when it is valid)."""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            return "has no ']' after its IPv6 address"
        host, rest = text[1:end], text[end + 1:]
        if not rest.startswith(":"):
            return "has no port"
        port = rest[1:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return f"has {host!r} in brackets, which is not an IPv6 address"
        if "%" in host:
            return "has an IPv6 zone index, which is not supported"
    else:
        host, sep, port = text.rpartition(":")
        if not sep:
            return "has no port"
        if not host:
            return "has no host"
        if ":" in host:
            return "has a ':' in its host (write an IPv6 address in brackets: [::1]:7420)"
        if re.fullmatch(r"[0-9.]+", host):
            try:
                ipaddress.IPv4Address(host)
            except ValueError:
                return f"has {host!r}, which is not an IPv4 address"
        else:
            name = host[:-1] if host.endswith(".") else host
            if len(name) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in name.split(".")):
                return f"has {host!r}, which is not a host name"
    if not _PORT.fullmatch(port) or not 0 < int(port) < 65536:
        return f"has port {port!r}, not 1 to 65535"
    return None


def address_problem(address: object) -> str | None:
    """What is wrong with one coordinator address, if anything.

    An address is ``HOST:PORT`` (a host name, an IPv4 address, or an IPv6
    address in brackets; port 1 to 65535), or one of two gRPC targets:
    ``dns:///HOST:PORT`` and a unix socket, ``unix:/ABSOLUTE/PATH`` or
    ``unix:///ABSOLUTE/PATH`` (a relative path is refused: it would depend on
    the working directory of each process that uses the address, such as a
    ``fencepost run`` child; a path longer than
    :data:`MAX_UNIX_PATH_BYTES` is refused too). Nothing else is accepted,
    so that a typo (no port, a URL scheme) fails at once instead of after
    the connect timeout.

    Returns:
        None when the address is valid, else the problem, worded to follow
        the quoted address.
    """
    if not isinstance(address, str):
        return "is not a str"
    if not address:
        return "is empty"
    if address != address.strip() or any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in address):
        return "contains white space or control characters"
    try:
        address.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    if address.startswith("unix:"):
        return _unix_problem(address[len("unix:"):])
    if address.startswith("dns:"):
        if not address.startswith("dns:///"):
            return "is not dns:///HOST:PORT (a DNS server authority is not supported)"
        problem = _host_port_problem(address[len("dns:///"):])
        return None if problem is None else f"{problem} after dns:///"
    if "://" in address:
        return f"is a URL; give HOST:PORT without the {address.split('://', 1)[0]}:// scheme"
    return _host_port_problem(address)


def check_addresses(address: str | Sequence[str]) -> list[str]:
    """Parse the coordinator address argument: the one address parser of the client and the CLI.

    Args:
        address: An address, a comma-separated string of them, or a
            sequence of such strings. Each address is ``HOST:PORT`` (a host
            name, an IPv4 address or ``[IPv6]``; port 1 to 65535),
            ``dns:///HOST:PORT``, ``unix:/ABSOLUTE/PATH`` or
            ``unix:///ABSOLUTE/PATH`` (see :func:`address_problem`).
            Spaces around commas are ignored; an empty entry is an error.

    Returns:
        The addresses, in order, without duplicates (at least one).

    Raises:
        InvalidArgument: no address, an empty entry, or an address that is
            none of the forms above (field "address").
    """
    if isinstance(address, str):
        items = [address]
    elif isinstance(address, Sequence) and not isinstance(address, (bytes, bytearray)):
        items = list(address)
    else:
        raise InvalidArgument(f"address must be a str or a list of str, got {address!r}", field="address")
    out: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise InvalidArgument(f"address must be a str or a list of str, got {item!r} in {address!r}",
                                  field="address")
        for part in item.split(","):
            addr = part.strip()
            if not addr:
                problem = "is empty" if not item.strip() else "has an empty entry"
                raise InvalidArgument(f"address {item!r} {problem}; an address is {ADDRESS_FORMS}", field="address")
            problem = address_problem(addr)
            if problem is not None:
                raise InvalidArgument(f"address {addr!r} {problem}; an address is {ADDRESS_FORMS}", field="address")
            if addr not in out:
                out.append(addr)
    if not out:
        raise InvalidArgument(f"address must name at least one coordinator, got {address!r}", field="address")
    return out


def check_fraction(keepalive_fraction: float) -> float:
    """Check the keepalive period as a fraction of the TTL.

    Args:
        keepalive_fraction: The fraction, 0 < f <= 0.5.

    Returns:
        ``keepalive_fraction`` as a float.

    Raises:
        InvalidArgument: out of range (field "keepalive_fraction").
    """
    if not _is_number(keepalive_fraction) or not 0 < keepalive_fraction <= 0.5:
        raise InvalidArgument(
            f"keepalive_fraction must be in (0, 0.5], got {keepalive_fraction!r}", field="keepalive_fraction"
        )
    return float(keepalive_fraction)


def check_idle_leases(idle_lease_timeout: float, max_idle_leases: int) -> tuple[float, int]:
    """Check the bounds of the client's idle leases.

    Args:
        idle_lease_timeout: Seconds a lease with no hold and no acquire may
            stay idle before it is revoked; finite, > 0, at most 86400.
        max_idle_leases: Most idle leases kept at once; 0 to 1000.

    Returns:
        The two values, as a float and an int.

    Raises:
        InvalidArgument: out of range (field "idle_lease_timeout" or "max_idle_leases").
    """
    if not _is_number(idle_lease_timeout) or not 0 < idle_lease_timeout <= 86400:
        raise InvalidArgument(f"idle_lease_timeout must be > 0 and at most 86400 seconds, got {idle_lease_timeout!r}",
                              field="idle_lease_timeout")
    if isinstance(max_idle_leases, bool) or not isinstance(max_idle_leases, int) or not 0 <= max_idle_leases <= 1000:
        raise InvalidArgument(f"max_idle_leases must be an int from 0 to 1000, got {max_idle_leases!r}",
                              field="max_idle_leases")
    return float(idle_lease_timeout), max_idle_leases


def check_connect_timeout(connect_timeout: float) -> float:
    """Check how long the client keeps trying to reach a coordinator.

    Args:
        connect_timeout: Seconds; finite and > 0.

    Returns:
        ``connect_timeout`` as a float.

    Raises:
        InvalidArgument: out of range (field "connect_timeout").
    """
    if not _is_number(connect_timeout) or not math.isfinite(connect_timeout) or connect_timeout <= 0:
        raise InvalidArgument(
            f"connect_timeout must be a finite number of seconds > 0, got {connect_timeout!r}",
            field="connect_timeout",
        )
    return float(connect_timeout)
