"""Unit tests of the client's parts with fakes: no server, no network, injected time, no sleeps.

The parts are those of ``fencepost.client``: the error table
(:func:`~fencepost.client.errors.from_rpc_error`), the argument checks and
unit conversion (``_wire``), the lease state machine and pool (``_lease``),
the keepalive stream's dispatch and the deadline watcher (``_stream``), the
release classification (``_lock``) and the handles. Behaviour against a real
coordinator is tested elsewhere (test_locks.py, tests/faults/).
"""

from __future__ import annotations

import asyncio
import random
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import grpc
import grpc.aio
import pytest

import fencepost.client as fc
from fencepost.client import _wire
from fencepost.client._lease import Lease, LeasePool, margin_for
from fencepost.client._lock import Locker
from fencepost.client._stream import DeadlineWatcher, KeepAliveStream
from fencepost.client._transport import Transport
from fencepost.client.errors import REASON_DEADLINE, from_rpc_error
from fencepost.client.handle import AsyncLockHandle
from fencepost.client.v1 import details
from fencepost.client.v1 import lock_pb2 as pb
from fencepost.client.v1.details import ErrorReason, reason_name
from fencepost.client.v1.retry import CLIENT_BACKOFF

# An address nothing listens on (the tests below never connect to it).
UNUSED_ADDRESS = "127.0.0.1:9"

NOT_HOLDER = reason_name(ErrorReason.NOT_HOLDER)
STALE_TOKEN = reason_name(ErrorReason.STALE_TOKEN)
LEASE_EXPIRED = reason_name(ErrorReason.LEASE_EXPIRED)


class FakeClock:
    """A monotonic clock moved by hand."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeTransport:
    """A transport whose every call waits for the test to answer it (see :func:`next_call`)."""

    connect_timeout = 5.0

    def __init__(self) -> None:
        self.calls: asyncio.Queue[tuple[str, Any, asyncio.Future[Any]]] = asyncio.Queue()

    async def call(self, method: str, make: Callable[[float | None], tuple[Any, float | None]], *,
                   until: float | None, idempotent: bool, **_ids: object) -> Any:
        request, _timeout = make(None)
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        await self.calls.put((method, request, reply))
        return await reply


async def next_call(transport: FakeTransport, method: str) -> tuple[Any, asyncio.Future[Any]]:
    """The next call the code under test made: it must be ``method``; returns (request, reply future)."""
    got, request, reply = await asyncio.wait_for(transport.calls.get(), 5)
    assert got == method, (got, request)
    return request, reply


def failed_call(reason: int, message: str = "server said no", **metadata: str) -> grpc.aio.AioRpcError:
    """A failed call carrying the status the coordinator sends for ``reason`` (built by details.status_for)."""
    status = details.status_for(reason, message, metadata)
    return grpc.aio.AioRpcError(status.code, grpc.aio.Metadata(), grpc.aio.Metadata(*status.trailing_metadata),
                                details=status.details)


def join_callbacks() -> None:
    """Wait for every on_lost callback thread started so far (they are started synchronously)."""
    for thread in threading.enumerate():
        if thread.name == "fencepost-on-lost":
            thread.join(5)
            assert not thread.is_alive(), "an on_lost callback is still running"


class Parts:
    """A lease pool, a keepalive stream and a locker wired as the client wires them, over a FakeTransport."""

    def __init__(self, clock: FakeClock | None = None) -> None:
        self.clock = clock or FakeClock()
        self.transport = FakeTransport()
        self.pool = LeasePool(self.clock)
        self.tasks: list[asyncio.Task[Any]] = []
        self.stream = KeepAliveStream(self.transport, self.pool, fraction=1 / 3,  # type: ignore[arg-type]
                                      spawn=self.spawn)
        self.locker = Locker(self.transport, self.pool, self.stream, spawn=self.spawn,  # type: ignore[arg-type]
                             on_new_lease=lambda lease: None, state=lambda: "open")

    def spawn(self, coro: Awaitable[Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self.tasks.append(task)
        return task

    def lease(self, lease_id: int = 77, ttl: int = 10) -> Lease:
        """A live lease in the pool, as if granted now."""
        lease = Lease(lease_id, ttl, self.clock.now, clock=self.clock)
        self.pool.add(ttl, lease)
        return lease

    def hold(self, lease: Lease, name: str = "a", token: int = 5) -> AsyncLockHandle:
        """A live hold of ``name`` under ``lease``, as if just granted."""
        handle = AsyncLockHandle(name, lease, token, self.locker.release)
        lease.holds[name] = handle
        return handle

    async def acquire(self, name: str = "a", *, token: int = 5, grant: bool = True) -> AsyncLockHandle:
        """Acquire ``name`` through the locker, answering its calls (and the LeaseGrant when ``grant``)."""
        acquiring = asyncio.ensure_future(self.locker.acquire(name, 10, None, try_once=False))
        if grant:
            _, reply = await next_call(self.transport, "LeaseGrant")
            reply.set_result(pb.LeaseGrantResponse(lease_id=77, ttl_seconds=10))
        request, reply = await next_call(self.transport, "Acquire")
        assert request.name == name
        reply.set_result(pb.AcquireResponse(acquired=True, token=token))
        return await asyncio.wait_for(acquiring, 5)


def ack(request_id: int, ttl_seconds: int = 10, lease_id: int = 77) -> pb.KeepAliveResponse:
    return pb.KeepAliveResponse(keepalive=pb.LeaseKeepAliveAck(lease_id=lease_id, request_id=request_id,
                                                               ttl_seconds=ttl_seconds))


def hold_ended(name: str, token: int, reason: int = ErrorReason.NOT_HOLDER, lease_id: int = 77) -> pb.KeepAliveResponse:
    return pb.KeepAliveResponse(hold_ended=pb.HoldEnded(name=name, lease_id=lease_id, token=token, reason=reason))


@pytest.fixture
def no_connect(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Record every channel the client tries to open (none should be)."""
    opened: list[str] = []

    def refuse(target: str, *args: object, **kwargs: object) -> None:
        opened.append(target)
        raise AssertionError(f"the client opened a channel to {target}")

    monkeypatch.setattr(grpc.aio, "insecure_channel", refuse)
    yield opened
    assert opened == []


# ---------------------------------------------------------------- from_rpc_error's table


#: The class of each reason the coordinator can send (from_rpc_error's table, as the client sees it).
CLASS_BY_REASON: dict[int, type[fc.FencepostError]] = {
    ErrorReason.INVALID_FIELD: fc.InvalidArgument,
    ErrorReason.NOT_HOLDER: fc.NotHolder,
    ErrorReason.STALE_TOKEN: fc.StaleTokenError,
    ErrorReason.LEASE_EXPIRED: fc.LeaseLost,
    ErrorReason.ACQUIRE_TIMEOUT: fc.LockTimeout,
    ErrorReason.ETCD_UNAVAILABLE: fc.Unavailable,
    ErrorReason.TOO_MANY_WAITERS: fc.ResourceExhausted,
    ErrorReason.SHUTTING_DOWN: fc.Unavailable,
    ErrorReason.TOO_MANY_STREAMS: fc.ResourceExhausted,
}


@pytest.mark.parametrize(("reason", "expected"), CLASS_BY_REASON.items(), ids=[reason_name(r) for r in CLASS_BY_REASON])
def test_from_rpc_error_when_server_names_a_reason(reason: int, expected: type[fc.FencepostError]) -> None:
    """Each reason the coordinator sends maps to its class, keeping the reason name and the status code."""
    err = from_rpc_error(failed_call(reason))
    assert type(err) is expected
    assert err.reason == reason_name(reason)
    assert err.code is details.CODE_BY_REASON[reason]
    assert err.message == "server said no"


def test_from_rpc_error_when_table_covers_every_reason() -> None:
    """The table above names every reason the coordinator can send."""
    assert set(CLASS_BY_REASON) == set(details.CODE_BY_REASON)


def test_from_rpc_error_when_stale_token_carries_current_token() -> None:
    """A STALE_TOKEN refusal fills current_token from ErrorInfo; the offered token is the caller's."""
    err = from_rpc_error(failed_call(ErrorReason.STALE_TOKEN, current_token="12", name="inv:1", lease_id="7"),
                         token=9)
    assert isinstance(err, fc.StaleTokenError)
    assert (err.token, err.current_token, err.record) == (9, 12, None)
    assert (err.name, err.lease_id) == ("inv:1", 7)


def test_from_rpc_error_when_not_holder_carries_current_token() -> None:
    """A NOT_HOLDER refusal fills current_token (the holder's) and keeps the caller's token."""
    err = from_rpc_error(failed_call(ErrorReason.NOT_HOLDER, current_token="30"), name="n", lease_id=2, token=4)
    assert isinstance(err, fc.NotHolder)
    assert (err.token, err.current_token, err.name, err.lease_id) == (4, 30, "n", 2)


def test_from_rpc_error_when_not_holder_has_no_current_token() -> None:
    """Without current_token in ErrorInfo (the lock is free), current_token stays None."""
    err = from_rpc_error(failed_call(ErrorReason.NOT_HOLDER), token=4)
    assert isinstance(err, fc.NotHolder) and err.current_token is None


def test_from_rpc_error_when_metadata_names_field_lock_and_lease() -> None:
    """ErrorInfo field, name and lease_id land on the exception and win over the caller's values."""
    err = from_rpc_error(failed_call(ErrorReason.INVALID_FIELD, field="wait_ms", name="inv:1", lease_id="99"),
                         name="other", lease_id=1)
    assert isinstance(err, fc.InvalidArgument)
    assert (err.field, err.name, err.lease_id) == ("wait_ms", "inv:1", 99)


def test_from_rpc_error_when_unavailable_carries_retry_info() -> None:
    """An UNAVAILABLE refusal carries the server's RetryInfo delay in seconds."""
    err = from_rpc_error(failed_call(ErrorReason.ETCD_UNAVAILABLE))
    assert isinstance(err, fc.Unavailable)
    assert err.retry_delay == pytest.approx(details.RETRY_DELAY_BY_REASON[ErrorReason.ETCD_UNAVAILABLE])


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (grpc.StatusCode.UNAVAILABLE, fc.Unavailable),
        (grpc.StatusCode.DEADLINE_EXCEEDED, fc.LockTimeout),
        (grpc.StatusCode.FAILED_PRECONDITION, fc.FencepostError),
        (grpc.StatusCode.PERMISSION_DENIED, fc.FencepostError),
    ],
)
def test_from_rpc_error_when_call_never_reached_a_coordinator(
    code: grpc.StatusCode, expected: type[fc.FencepostError]
) -> None:
    """Without status details the class follows the code alone, reason is None and the caller's ids are kept."""
    err = from_rpc_error(grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details="x"),
                         name="a", lease_id=5)
    assert type(err) is expected
    assert (err.name, err.lease_id, err.reason, err.code) == ("a", 5, None, code)


def test_from_rpc_error_when_reason_is_unknown() -> None:
    """A FAILED_PRECONDITION with a reason this client does not know is the base class, reason kept."""
    info = details.status_for(ErrorReason.NOT_HOLDER, "m")
    trailing = [(k, v.replace(b"NOT_HOLDER", b"SOME_NEWER") if isinstance(v, bytes) else v)
                for k, v in info.trailing_metadata]
    err = from_rpc_error(grpc.aio.AioRpcError(info.code, grpc.aio.Metadata(), grpc.aio.Metadata(*trailing)))
    assert type(err) is fc.FencepostError
    assert err.reason == "SOME_NEWER"


def test_from_rpc_error_when_details_are_garbage() -> None:
    """Undecodable status details do not hide the error: the code still picks the class."""
    trailing = grpc.aio.Metadata((details.STATUS_DETAILS_KEY, b"\xff\x00"))
    err = from_rpc_error(grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), trailing))
    assert type(err) is fc.Unavailable and err.reason is None


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
    from fencepost.coordinator.validate import validate_name

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
    "list-with-None": ["a:1", None], "empty-list": [], "list-with-empty": ["a:1", ""],
}


@pytest.mark.parametrize("address", list(BAD_ADDRESSES.values()), ids=list(BAD_ADDRESSES))
def test_client_init_when_address_is_not_an_address(address: object, no_connect: list[str]) -> None:
    """Anything but HOST:PORT, dns:///HOST:PORT or unix:PATH is InvalidArgument(field="address") at construction.

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
    "unix-relative": "unix:fencepost.sock",
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
    from fencepost.client.cli import common

    try:
        client: list[str] | None = _wire.check_addresses(value)
    except fc.InvalidArgument:
        client = None
    for flag, env in (([value], None), (None, value)):
        if env is not None and not env:
            continue  # an empty FENCEPOST_ADDRESS is unset: the default
        try:
            cli = common.parse_addresses(flag, env)
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


# ---------------------------------------------------------------- the lease state machine


def test_lease_when_granted() -> None:
    """The first deadline is grant send time + granted TTL - margin (margin 10% of TTL, 0.1 s to 1 s)."""
    clock = FakeClock(100.0)
    assert Lease(1, 10, 100.0, clock=clock).deadline == pytest.approx(109.0)
    assert Lease(1, 2, 100.0, clock=clock).deadline == pytest.approx(101.8)
    assert Lease(1, 60, 100.0, clock=clock).deadline == pytest.approx(159.0)
    assert margin_for(0.5) == pytest.approx(0.1)


def test_on_ack_when_answers_arrive_out_of_order() -> None:
    """An ack moves the deadline to its keepalive's send time + TTL - margin, and never backwards."""
    clock = FakeClock(100.0)
    lease = Lease(1, 10, 100.0, clock=clock)
    assert lease.on_ack(105.0, 10)
    assert lease.deadline == pytest.approx(114.0)
    assert lease.on_ack(103.0, 10)  # a late answer to an older keepalive
    assert lease.deadline == pytest.approx(114.0)
    assert lease.on_ack(99.0, 10)  # an answer to a keepalive sent before the grant
    assert lease.deadline == pytest.approx(114.0)
    clock.now = 110.0
    assert lease.remaining() == pytest.approx(4.0)


@pytest.mark.parametrize("ttl_seconds", [0, -1])
def test_on_ack_when_ttl_is_not_positive(ttl_seconds: int) -> None:
    """An ack with ttl <= 0 reports the lease gone and does not extend the deadline."""
    lease = Lease(1, 10, 100.0, clock=FakeClock(100.0))
    assert not lease.on_ack(105.0, ttl_seconds)
    assert lease.deadline == pytest.approx(109.0)


def test_lease_when_deadline_passes() -> None:
    """Past the deadline remaining() is 0 and expired() is true, on the injected clock only."""
    clock = FakeClock(100.0)
    lease = Lease(1, 10, 100.0, clock=clock)
    clock.now = 108.99
    assert not lease.expired() and lease.remaining() == pytest.approx(0.01)
    clock.now = 109.0
    assert lease.expired() and lease.remaining() == 0.0


def test_mark_lost_when_called_twice() -> None:
    """mark_lost reports True once and keeps the first reason; a lost lease ignores acks."""
    lease = Lease(1, 10, 100.0, clock=FakeClock(100.0))
    assert lease.mark_lost(REASON_DEADLINE)
    assert not lease.mark_lost(LEASE_EXPIRED)
    assert lease.lost_reason == REASON_DEADLINE
    assert not lease.on_ack(200.0, 10)
    assert lease.remaining() == 0.0


async def test_pool_lose_when_lease_has_holds() -> None:
    """Losing a lease drops it from the pool, stops its keepalives and loses each hold once, with its reason."""
    parts = Parts()
    lease = parts.lease()
    a, b = parts.hold(lease, "a", 5), parts.hold(lease, "b", 6)
    lease.keepalive = keepalive = asyncio.ensure_future(asyncio.Event().wait())
    assert parts.pool.lose(lease, REASON_DEADLINE)
    assert not parts.pool.lose(lease, LEASE_EXPIRED)
    assert parts.pool.live(10) is None and parts.pool.get(77) is None and parts.pool.holds() == []
    assert (a.lost_reason, b.lost_reason) == (REASON_DEADLINE, REASON_DEADLINE)
    with pytest.raises(asyncio.CancelledError):
        await keepalive


def test_pool_expire_when_one_deadline_passed() -> None:
    """expire() loses the leases past their deadline (reason DEADLINE) and returns the time to the next one."""
    clock = FakeClock(0.0)
    pool = LeasePool(clock)
    short, long = Lease(1, 2, 0.0, clock=clock), Lease(2, 10, 0.0, clock=clock)
    pool.add(2, short)
    pool.add(10, long)
    assert pool.expire() == pytest.approx(1.8)
    assert not short.lost
    clock.now = 1.8
    assert pool.expire() == pytest.approx(9.0 - 1.8)
    assert short.lost_reason == REASON_DEADLINE and not long.lost
    assert pool.leases() == [long]


def test_pool_close_when_holds_are_live() -> None:
    """Closing the pool marks every hold released, without signalling a loss."""
    parts = Parts()
    handle = parts.hold(parts.lease())
    parts.pool.close()
    assert handle.released and not handle.lost.is_set()
    assert parts.pool.leases() == []


# ---------------------------------------------------------------- the stream's dispatch


async def test_dispatch_when_ack_matches_its_request_id() -> None:
    """An ack extends the lease from its own keepalive's send time; unknown or mismatched request ids are ignored."""
    parts = Parts(FakeClock(0.0))
    lease = parts.lease()
    parts.stream.outbox = asyncio.Queue()
    parts.clock.now = 4.0
    parts.stream.send_keepalive(lease)
    (request_id,) = parts.stream.pending
    parts.clock.now = 6.0
    parts.stream.dispatch(ack(request_id + 1))
    parts.stream.dispatch(ack(request_id, lease_id=78))  # another lease's answer under this id: dropped
    assert lease.deadline == pytest.approx(9.0)
    parts.stream.send_keepalive(lease)
    (request_id,) = parts.stream.pending
    parts.stream.dispatch(ack(request_id))
    assert lease.deadline == pytest.approx(15.0)
    assert parts.stream.pending == {} and not lease.lost


async def test_dispatch_when_ack_says_lease_is_gone() -> None:
    """An ack with ttl 0 loses the lease and its holds with LEASE_EXPIRED, exactly once."""
    parts = Parts()
    lease = parts.lease()
    handle = parts.hold(lease)
    calls: list[str | None] = []
    handle.on_lost(lambda h: calls.append(h.lost_reason))
    parts.stream.outbox = asyncio.Queue()
    parts.stream.send_keepalive(lease)
    parts.stream.send_keepalive(lease)
    first, second = parts.stream.pending
    parts.stream.dispatch(ack(first, ttl_seconds=0))
    parts.stream.dispatch(ack(second, ttl_seconds=0))
    join_callbacks()
    assert calls == [LEASE_EXPIRED]
    assert lease.lost_reason == LEASE_EXPIRED and parts.pool.get(77) is None


async def test_send_keepalive_when_no_stream_is_open() -> None:
    """Without a stream, a keepalive is dropped and nothing waits for an answer (the reconnect resends)."""
    parts = Parts()
    parts.stream.send_keepalive(parts.lease())
    assert parts.stream.pending == {}


async def test_resend_all_when_a_stream_opens() -> None:
    """A new stream gets one keepalive per live lease and one watch per live hold."""
    parts = Parts()
    lease = parts.lease()
    parts.hold(lease, "a", 5)
    parts.hold(lease, "b", 6)
    parts.stream.outbox = outbox = asyncio.Queue()
    parts.stream.resend_all()
    sent = [outbox.get_nowait() for _ in range(outbox.qsize())]
    assert [m.WhichOneof("request") for m in sent] == ["keepalive", "watch", "watch"]
    assert {(m.watch.name, m.watch.lease_id, m.watch.token) for m in sent[1:]} == {("a", 77, 5), ("b", 77, 6)}


async def test_dispatch_when_hold_ended_names_name_lease_and_token() -> None:
    """A HoldEnded loses only the hold with that (name, lease id, token); other grants are untouched."""
    parts = Parts()
    lease = parts.lease()
    a, b = parts.hold(lease, "a", 5), parts.hold(lease, "b", 6)
    parts.stream.dispatch(hold_ended("a", 4))  # an older grant of "a"
    parts.stream.dispatch(hold_ended("a", 5, lease_id=78))  # another lease
    parts.stream.dispatch(hold_ended("c", 5))  # a lock this lease does not hold
    assert not a.lost.is_set() and not b.lost.is_set()
    parts.stream.dispatch(hold_ended("a", 5))
    assert a.lost_reason == NOT_HOLDER and not b.lost.is_set() and not lease.lost
    assert parts.pool.holds() == [b]


async def test_dispatch_when_hold_ended_says_lease_expired() -> None:
    """A HoldEnded with LEASE_EXPIRED loses the whole lease, and every hold under it."""
    parts = Parts()
    lease = parts.lease()
    a, b = parts.hold(lease, "a", 5), parts.hold(lease, "b", 6)
    parts.stream.dispatch(hold_ended("a", 5, ErrorReason.LEASE_EXPIRED))
    assert (a.lost_reason, b.lost_reason, lease.lost_reason) == (LEASE_EXPIRED,) * 3


@pytest.mark.parametrize("reason", [ErrorReason.ERROR_REASON_UNSPECIFIED, 999])
async def test_dispatch_when_hold_ended_reason_is_unset_or_unknown(reason: int) -> None:
    """A HoldEnded without a reason, or with one newer than this client, ends the hold as NOT_HOLDER."""
    parts = Parts()
    handle = parts.hold(parts.lease())
    parts.stream.dispatch(hold_ended("a", 5, reason))
    assert handle.lost_reason == NOT_HOLDER


async def test_dispatch_when_every_loss_path_fires() -> None:
    """HoldEnded, a ttl 0 ack and the deadline all firing still lose each hold exactly once, with the first reason."""
    parts = Parts()
    lease = parts.lease()
    a, b = parts.hold(lease, "a", 5), parts.hold(lease, "b", 6)
    calls: list[tuple[str, str | None]] = []
    for h in (a, b):
        h.on_lost(lambda h: calls.append((h.name, h.lost_reason)))
    parts.stream.outbox = asyncio.Queue()
    parts.stream.send_keepalive(lease)
    (request_id,) = parts.stream.pending
    parts.stream.dispatch(hold_ended("a", 5))
    parts.stream.dispatch(ack(request_id, ttl_seconds=0))
    parts.pool.lose(lease, REASON_DEADLINE)
    parts.stream.dispatch(hold_ended("b", 6, ErrorReason.LEASE_EXPIRED))
    join_callbacks()
    assert sorted(calls) == [("a", NOT_HOLDER), ("b", LEASE_EXPIRED)]
    assert lease.lost_reason == LEASE_EXPIRED


# ---------------------------------------------------------------- the deadline watcher


async def test_deadline_watcher_when_woken_past_a_deadline() -> None:
    """The watcher loses a lease whose deadline has passed on the injected clock once it looks again."""
    parts = Parts(FakeClock(0.0))
    lease = parts.lease(ttl=2)
    handle = parts.hold(lease)
    watcher = DeadlineWatcher(parts.pool)
    running = asyncio.ensure_future(watcher.run())
    try:
        parts.clock.now = 1.8
        watcher.wake()
        await asyncio.wait_for(handle.lost.wait(), 5)
        assert (handle.lost_reason, lease.lost_reason) == (REASON_DEADLINE, REASON_DEADLINE)
    finally:
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running


# ---------------------------------------------------------------- release classification


async def test_release_when_server_confirms() -> None:
    """A confirmed Release marks the handle released, frees the slot for the next local acquire, and unwatches."""
    parts = Parts()
    handle = await parts.acquire("a", token=5)
    parts.stream.outbox = outbox = asyncio.Queue()
    releasing = asyncio.ensure_future(handle.release())
    request, reply = await next_call(parts.transport, "Release")
    assert (request.name, request.lease_id, request.token) == ("a", 77, 5)
    reply.set_result(pb.ReleaseResponse(revision=9))
    await releasing
    assert handle.released and not handle.lost.is_set() and parts.pool.holds() == []
    assert outbox.get_nowait().WhichOneof("request") == "unwatch"
    again = await parts.acquire("a", token=6, grant=False)
    assert again.token == 6


@pytest.mark.parametrize(
    ("refusal", "lease_lost"),
    [(ErrorReason.NOT_HOLDER, False), (ErrorReason.STALE_TOKEN, False), (ErrorReason.LEASE_EXPIRED, True)],
)
async def test_release_when_server_refuses(refusal: int, lease_lost: bool) -> None:
    """A refused Release raises, loses the hold with the server's reason, and loses the lease for LEASE_EXPIRED."""
    parts = Parts()
    handle = await parts.acquire("a")
    other = await parts.acquire("b", grant=False)
    releasing = asyncio.ensure_future(handle.release())
    _, reply = await next_call(parts.transport, "Release")
    reply.set_exception(from_rpc_error(failed_call(refusal), name="a", lease_id=77, token=5))
    with pytest.raises(fc.FencepostError) as info:
        await releasing
    assert info.value.reason == reason_name(refusal)
    assert handle.released and handle.lost_reason == reason_name(refusal)
    assert other.lost.is_set() is lease_lost


async def test_release_when_cancelled_in_flight() -> None:
    """A release cancelled before the server answered keeps the hold, and can be retried."""
    parts = Parts()
    handle = await parts.acquire("a")
    releasing = asyncio.ensure_future(handle.release())
    await next_call(parts.transport, "Release")
    releasing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await releasing
    assert not handle.released and not handle.lost.is_set() and parts.pool.holds() == [handle]
    retry = asyncio.ensure_future(handle.release())
    _, reply = await next_call(parts.transport, "Release")
    reply.set_result(pb.ReleaseResponse())
    await retry
    assert handle.released


async def test_release_when_hold_ended_arrives_while_in_flight() -> None:
    """A HoldEnded during the Release is left to it: if the answer is lost, the hold counts as released, not lost."""
    parts = Parts()
    handle = await parts.acquire("a")
    releasing = asyncio.ensure_future(handle.release())
    _, reply = await next_call(parts.transport, "Release")
    parts.stream.dispatch(hold_ended("a", 5))  # most likely this very Release
    assert not handle.lost.is_set() and not handle.released
    reply.set_exception(fc.Unavailable("connection closed during the call"))
    with pytest.raises(fc.Unavailable):
        await releasing
    assert handle.released and not handle.lost.is_set()


async def test_release_when_lease_expired_arrives_while_in_flight() -> None:
    """A LEASE_EXPIRED HoldEnded during a Release whose answer is lost loses the lease and its other holds."""
    parts = Parts()
    handle = await parts.acquire("a")
    other = await parts.acquire("b", grant=False)
    releasing = asyncio.ensure_future(handle.release())
    _, reply = await next_call(parts.transport, "Release")
    parts.stream.dispatch(hold_ended("a", 5, ErrorReason.LEASE_EXPIRED))
    reply.set_exception(fc.Unavailable("connection closed during the call"))
    with pytest.raises(fc.Unavailable):
        await releasing
    assert handle.lost_reason == LEASE_EXPIRED and other.lost_reason == LEASE_EXPIRED


async def test_release_when_hold_was_lost_to_the_deadline() -> None:
    """Releasing a hold lost to its local deadline raises LeaseLost at once and still sends a Release."""
    parts = Parts()
    handle = await parts.acquire("a")
    lease = parts.pool.get(handle.lease_id)
    assert lease is not None
    parts.pool.lose(lease, REASON_DEADLINE)
    with pytest.raises(fc.LeaseLost) as info:
        await handle.release()
    assert info.value.reason == REASON_DEADLINE and handle.released
    request, reply = await next_call(parts.transport, "Release")
    assert request.token == 5
    reply.set_exception(from_rpc_error(failed_call(ErrorReason.NOT_HOLDER)))
    await asyncio.gather(*parts.tasks)


async def test_release_when_already_released() -> None:
    """A second release raises NotHolder without a call."""
    parts = Parts()
    handle = await parts.acquire("a")
    releasing = asyncio.ensure_future(handle.release())
    _, reply = await next_call(parts.transport, "Release")
    reply.set_result(pb.ReleaseResponse())
    await releasing
    with pytest.raises(fc.NotHolder):
        await handle.release()
    assert parts.transport.calls.empty()


# ---------------------------------------------------------------- handles


async def test_on_lost_when_lost_by_several_paths() -> None:
    """The loss is signalled once: one reason, one callback call."""
    parts = Parts()
    lease = parts.lease()
    handle = parts.hold(lease)
    calls: list[str | None] = []
    handle.on_lost(lambda h: calls.append(h.lost_reason))
    parts.pool.lose_hold(handle, REASON_DEADLINE)
    parts.pool.lose_hold(handle, LEASE_EXPIRED)
    parts.pool.lose(lease, NOT_HOLDER)
    join_callbacks()
    assert calls == [REASON_DEADLINE]
    assert handle.lost.is_set() and handle.lost_reason == REASON_DEADLINE
    assert handle.valid_for() == 0.0 and not handle.is_valid()
    with pytest.raises(fc.LeaseLost) as info:
        handle.check()
    assert (info.value.reason, info.value.name, info.value.lease_id) == (REASON_DEADLINE, "a", 77)


async def test_on_lost_when_callback_blocks() -> None:
    """A callback that blocks runs in its own thread and does not block the loop or other callbacks."""
    parts = Parts()
    handle = parts.hold(parts.lease())
    unblock = threading.Event()
    second = threading.Event()
    handle.on_lost(lambda h: unblock.wait(10))
    handle.on_lost(lambda h: second.set())
    parts.pool.lose_hold(handle, REASON_DEADLINE)
    assert await asyncio.to_thread(second.wait, 5)
    unblock.set()
    join_callbacks()


async def test_on_lost_when_registered_after_the_loss() -> None:
    """A callback registered after the loss is called at once."""
    parts = Parts()
    handle = parts.hold(parts.lease())
    parts.pool.lose_hold(handle, LEASE_EXPIRED)
    called = threading.Event()
    handle.on_lost(lambda h: called.set())
    assert await asyncio.to_thread(called.wait, 5)


async def test_on_lost_when_released_before_the_loss() -> None:
    """A released handle never signals a loss, and check() raises NotHolder."""
    parts = Parts()
    lease = parts.lease()
    handle = parts.hold(lease)
    called = threading.Event()
    handle.on_lost(lambda h: called.set())
    parts.pool.finish_release(handle)
    parts.pool.lose_hold(handle, REASON_DEADLINE)
    join_callbacks()
    assert not called.is_set() and not handle.lost.is_set()
    assert handle.valid_for() == 0.0
    with pytest.raises(fc.NotHolder) as info:
        handle.check()
    assert info.value.reason == NOT_HOLDER


async def test_cancel_on_lost_when_hold_is_lost() -> None:
    """cancel_on_lost cancels the registered task when the hold is lost."""
    parts = Parts()
    handle = parts.hold(parts.lease())
    task = asyncio.ensure_future(asyncio.Event().wait())
    handle.cancel_on_lost(task)
    parts.pool.lose_hold(handle, REASON_DEADLINE)
    with pytest.raises(asyncio.CancelledError):
        await task


def test_check_when_local_deadline_passed_before_the_watcher_ran() -> None:
    """check() raises LeaseLost(reason DEADLINE) as soon as the clock passes the deadline."""
    parts = Parts(FakeClock(0.0))
    handle = parts.hold(parts.lease())
    handle.check()
    assert handle.valid_for() == pytest.approx(9.0)
    parts.clock.now = 9.5
    with pytest.raises(fc.LeaseLost) as info:
        handle.check()
    assert info.value.reason == REASON_DEADLINE


# ---------------------------------------------------------------- the transport


def refused_address() -> str:
    """A 127.0.0.1 address that refuses connections (a port bound, never listened on)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


async def test_call_when_fail_fast_and_every_address_refuses() -> None:
    """A fail-fast transport tries each address once and gives up well before its connect_timeout."""
    transport = Transport([refused_address(), refused_address()], connect_timeout=30.0, fail_fast=True)
    transport.open()
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        with pytest.raises(fc.Unavailable) as info:
            await transport.call("Describe", lambda _left: (pb.DescribeRequest(name="n"), 1.0), until=None,
                                 idempotent=True, name="n")
    finally:
        await transport.close()
    assert loop.time() - started < 15.0
    assert (info.value.name, info.value.reason, info.value.code) == ("n", None, None)
    with pytest.raises(fc.FencepostError, match="closed"):
        await transport.call("Describe", lambda _left: (pb.DescribeRequest(name="n"), 1.0), until=None,
                             idempotent=True)


# ---------------------------------------------------------------- the client


async def test_lock_when_cancel_on_lost_fires(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside lock(), a cancellation by cancel_on_lost surfaces as LeaseLost and the task is not left cancelling."""
    parts = Parts()
    handle = parts.hold(parts.lease())
    client = fc.AsyncLockClient(UNUSED_ADDRESS)

    async def fake_acquire(name: str, ttl: float = 10.0, timeout: float | None = None) -> AsyncLockHandle:
        return handle

    monkeypatch.setattr(client, "acquire", fake_acquire)
    with pytest.raises(fc.LeaseLost) as info:
        async with client.lock("a") as h:
            h.cancel_on_lost()
            asyncio.get_running_loop().call_soon(parts.pool.lose_hold, h, NOT_HOLDER)
            await asyncio.Event().wait()
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    assert info.value.reason == NOT_HOLDER and handle.released
    assert parts.transport.calls.empty()  # the server ended the hold: no Release is sent for it


async def test_connect_when_no_coordinator_listens() -> None:
    """connect() raises Unavailable after connect_timeout, leaves no task behind, and the client is closed."""
    client = fc.AsyncLockClient(UNUSED_ADDRESS, connect_timeout=0.3)
    with pytest.raises(fc.Unavailable):
        await client.connect()
    assert [t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("fencepost")] == []
    with pytest.raises(fc.FencepostError):
        await client.acquire("n")
