"""Unit tests of the client's argument checks and unit conversion (_wire): no server, no network.

Behaviour against a real coordinator is tested elsewhere (test_locks.py, tests/faults/).
"""

from __future__ import annotations

import random
import threading

import pytest

import fencepost.client as fc
from fencepost.client._transport import wire as _wire
from fencepost.client.v1.retry import CLIENT_BACKOFF

from .client_fakes import (
    UNUSED_ADDRESS,
)


# ---------------------------------------------------------------- argument checks and units


@pytest.mark.parametrize("ttl", [0, 0.5, -1, 86_401, float("nan"), float("inf"), True, "10", None])
async def test_acquire_when_ttl_is_out_of_range(ttl: object, no_connect: list[str]) -> None:
    """A bad ttl raises InvalidArgument(field="ttl") before the client opens a channel."""
    client = fc.AsyncLockClient(UNUSED_ADDRESS)
    with pytest.raises(fc.InvalidArgument) as info:
        await client.acquire("n", ttl=ttl)  # type: ignore[arg-type]
    assert info.value.field == "ttl"
    await client.close()


@pytest.mark.parametrize("timeout", [-0.001, float("nan"), float("inf"), 86_401, "1", True])
async def test_acquire_when_timeout_is_out_of_range(timeout: object, no_connect: list[str]) -> None:
    """A bad timeout raises InvalidArgument(field="timeout") before the client opens a channel."""
    client = fc.AsyncLockClient(UNUSED_ADDRESS)
    with pytest.raises(fc.InvalidArgument) as info:
        await client.acquire("n", ttl=5, timeout=timeout)  # type: ignore[arg-type]
    assert info.value.field == "timeout"


BAD_NAMES = {
    "empty": "", "None": None, "int": 5, "bytes": b"x", "lone-surrogate": "\ud800", "argv-byte-0xff": "a\udcff",
    "257-bytes": "n" * 257, "258-bytes-e-acute": "\u00e9" * 129, "nul": "a\x00b", "newline": "a\nb", "del": "\x7f",
}


@pytest.mark.parametrize("name", list(BAD_NAMES.values()), ids=list(BAD_NAMES))
async def test_try_acquire_when_name_is_not_a_non_empty_str(name: object, no_connect: list[str]) -> None:
    """A bad name raises InvalidArgument(field="name") before the client opens a channel."""
    client = fc.AsyncLockClient(UNUSED_ADDRESS)
    with pytest.raises(fc.InvalidArgument) as info:
        await client.try_acquire(name)  # type: ignore[arg-type]
    assert info.value.field == "name"
    with pytest.raises(fc.InvalidArgument) as info:
        await client.describe(name)  # type: ignore[arg-type]
    assert info.value.field == "name"


@pytest.mark.parametrize("name", ["\ud800", "lock-\udcff"], ids=["lone-surrogate", "argv-byte-0xff"])
def test_sync_calls_when_name_is_not_utf8(name: str, no_connect: list[str]) -> None:
    """A name with a lone surrogate (what sys.argv holds for a byte that is not UTF-8) is InvalidArgument.

    It was a bare UnicodeEncodeError from the request's serialization.
    """
    client = fc.LockClient(UNUSED_ADDRESS)
    for call in (lambda: client.try_acquire(name, ttl=5), lambda: client.acquire(name, ttl=5),
                 lambda: client.describe(name)):
        with pytest.raises(fc.InvalidArgument) as info:
            call()
        assert info.value.field == "name"
        assert "UTF-8" in info.value.message
    client.close()


NAMES_AT_THE_LIMITS = {
    "plain": "a", "colon": "inv:42", "slash": "a/b", "256-bytes-e-acute": "\u00e9" * 128,
    "257-bytes-e-acute": "\u00e9" * 128 + "x", "256-bytes": "n" * 256, "257-bytes": "n" * 257, "empty": "",
    "nul": "a\x00b", "newline": "a\nb", "tab": "tab\there", "del": "\x7f", "c1-control": "\x80ok",
    "256-bytes-emoji": "\U0001F512" * 64, "257-bytes-emoji": "\U0001F512" * 64 + "x", "space": " ",
}


@pytest.mark.parametrize("name", list(NAMES_AT_THE_LIMITS.values()), ids=list(NAMES_AT_THE_LIMITS))
def test_check_name_agrees_with_the_coordinator(name: str) -> None:
    """The client accepts exactly the names the coordinator accepts, and words a refusal the same way."""
    from fencepost.coordinator.recipes.validate import validate_name

    try:
        validate_name(name)
    except fc.InvalidArgument as err:
        server: str | None = err.message
    else:
        server = None
    problem = _wire.name_problem(name)
    assert (None if problem is None else f"name {problem}") == server


def test_sync_acquire_when_arguments_are_out_of_range(no_connect: list[str]) -> None:
    """The sync client checks arguments on the caller's thread, before it starts its loop thread."""
    before = sum(t.name == "fencepost-client" for t in threading.enumerate())
    client = fc.LockClient(UNUSED_ADDRESS)
    for call, field in (
        (lambda: client.acquire("n", ttl=0), "ttl"),
        (lambda: client.acquire("n", ttl=5, timeout=-1), "timeout"),
        (lambda: client.try_acquire("", ttl=5), "name"),
    ):
        with pytest.raises(fc.InvalidArgument) as info:
            call()
        assert info.value.field == field
    assert sum(t.name == "fencepost-client" for t in threading.enumerate()) == before
    client.close()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"address": []}, "address"),
        ({"address": ""}, "address"),
        ({"address": ["a:1", ""]}, "address"),
        ({"keepalive_fraction": 0}, "keepalive_fraction"),
        ({"keepalive_fraction": 0.9}, "keepalive_fraction"),
        ({"connect_timeout": 0}, "connect_timeout"),
        ({"connect_timeout": float("inf")}, "connect_timeout"),
        ({"connect_timeout": True}, "connect_timeout"),
    ],
)
def test_client_init_when_argument_is_out_of_range(kwargs: dict[str, object], field: str) -> None:
    """The constructor rejects bad arguments with the field named."""
    kwargs.setdefault("address", UNUSED_ADDRESS)
    with pytest.raises(fc.InvalidArgument) as info:
        fc.AsyncLockClient(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


def test_client_init_when_given_a_comma_separated_string() -> None:
    """A comma-separated address string is split into the addresses, in order."""
    assert fc.AsyncLockClient("a:1, b:2").addresses == ("a:1", "b:2")
    assert fc.LockClient(["a:1", "b:2"]).addresses == ("a:1", "b:2")
    assert fc.LockClient(["a:1,b:2", "c:3", "a:1"]).addresses == ("a:1", "b:2", "c:3")


BAD_ADDRESSES = {
    "None": None, "int": 42, "bytes": b"127.0.0.1:1", "no-port": "127.0.0.1", "host-no-port": "nohost",
    "port-too-big": "127.0.0.1:99999", "port-0": "127.0.0.1:0", "port-sign": "a:+80", "port-empty": "a:",
    "http-url": "http://127.0.0.1:1", "https-url": "https://coord:7420", "empty": "", "comma": ",",
    "trailing-comma": "a:1,", "blank": "  ", "ipv6-bare": "::1:7420", "ipv6-no-port": "[::1]",
    "not-ipv6": "[nohost]:1", "not-ipv4": "999.1.1.1:1", "short-ipv4": "1.2.3:1", "bad-host": "-x:1",
    "space-in-host": "a b:1", "dns-authority": "dns://8.8.8.8/coord:7420", "dns-no-port": "dns:///coord",
    "unix-empty": "unix:", "unix-authority": "unix://host/tmp/s", "ipv4-scheme": "ipv4:127.0.0.1:1",
    "unix-relative": "unix:fencepost.sock", "unix-relative-dir": "unix:run/fencepost.sock",
    "unix-too-long": "unix:/" + "s" * _wire.MAX_UNIX_PATH_BYTES,
    "list-with-None": ["a:1", None], "empty-list": [], "list-with-empty": ["a:1", ""],
}


@pytest.mark.parametrize("address", list(BAD_ADDRESSES.values()), ids=list(BAD_ADDRESSES))
def test_client_init_when_address_is_not_an_address(address: object, no_connect: list[str]) -> None:
    """Anything but HOST:PORT, dns:///HOST:PORT or unix:/ABSOLUTE/PATH is InvalidArgument(field="address") at once.

    "127.0.0.1", "127.0.0.1:99999" and "http://127.0.0.1:1" used to be
    accepted and fail with Unavailable after the 10 s connect timeout; None
    and 42 raised TypeError.
    """
    for cls in (fc.AsyncLockClient, fc.LockClient):
        with pytest.raises(fc.InvalidArgument) as info:
            cls(address)  # type: ignore[arg-type]
        assert info.value.field == "address"


GOOD_ADDRESSES = {
    "ipv4": "127.0.0.1:7420", "host": "localhost:1", "fqdn": "coord-1.example.com:65535",
    "fqdn-dot": "coord.example.com.:7420", "underscore": "my_coord:7420", "ipv6": "[::1]:7420",
    "ipv6-mapped": "[::ffff:127.0.0.1]:7420", "dns": "dns:///coord.example.com:7420",
    "dns-ipv6": "dns:///[::1]:7420", "unix": "unix:/run/fencepost.sock", "unix-abs": "unix:///run/fencepost.sock",
    "unix-longest": "unix:/" + "s" * (_wire.MAX_UNIX_PATH_BYTES - 1),
}


@pytest.mark.parametrize("address", list(GOOD_ADDRESSES.values()), ids=list(GOOD_ADDRESSES))
def test_client_init_when_address_is_valid(address: str) -> None:
    """Each accepted form comes back unchanged, alone or in a list."""
    assert fc.AsyncLockClient(address).addresses == (address,)
    assert fc.LockClient(f" {address} ,127.0.0.1:1").addresses == (address, "127.0.0.1:1")


@pytest.mark.parametrize(
    "value", [*GOOD_ADDRESSES.values(), *(v for v in BAD_ADDRESSES.values() if isinstance(v, str))],
    ids=[*GOOD_ADDRESSES, *(k for k, v in BAD_ADDRESSES.items() if isinstance(v, str))],
)
def test_cli_and_client_parse_addresses_alike(value: str) -> None:
    """The CLI's --address and FENCEPOST_ADDRESS go through the client's one parser: same result or both refuse."""
    from fencepost.client.cli import common, flags

    try:
        client: list[str] | None = _wire.check_addresses(value)
    except fc.InvalidArgument:
        client = None
    for flag, env in (([value], None), (None, value)):
        if env is not None and not env:
            continue  # an empty FENCEPOST_ADDRESS is unset: the default
        try:
            cli = flags.parse_addresses(flag, env)
        except common.CliError as err:
            assert client is None and err.exit_code == common.EXIT_USAGE
            assert "address" in str(err)
        else:
            assert cli == client


@pytest.mark.parametrize(("ttl", "wire"), [(1, 1), (1.0, 1), (1.2, 2), (9.999, 10), (10, 10), (86_400, 86_400)])
def test_ttl_to_wire_when_ttl_is_fractional(ttl: float, wire: int) -> None:
    """A TTL is rounded up to whole seconds, never shortened."""
    assert _wire.ttl_to_wire(ttl) == wire


@pytest.mark.parametrize(
    ("remaining", "wire"),
    [(None, (0, True)), (0.0, (0, False)), (-1.0, (0, False)), (1.2345, (1234, False)), (1e9, (86_400_000, False))],
)
def test_wait_to_wire_when_converting_seconds(remaining: float | None, wire: tuple[int, bool]) -> None:
    """The time left becomes wait_ms (rounded, clamped to the wire's MAX_WAIT_MS) or wait_forever."""
    assert _wire.wait_to_wire(remaining) == wire


def test_client_backoff_when_iterated() -> None:
    """The client's reconnect delays are full-jitter draws under a ceiling doubling from 0.05 s to a 2 s cap."""
    delays = CLIENT_BACKOFF.delays(random.Random(1))
    for ceiling in [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]:
        assert 0.0 <= next(delays) <= ceiling
