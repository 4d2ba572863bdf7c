"""Unit tests of the client's pure logic: no server, no network, injected time."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable

import grpc
import grpc.aio
import pytest
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

import fencepost.client as fc
from fencepost.client import _wire
from fencepost.client._aio import AsyncLockClient
from fencepost.client.errors import from_rpc_error
from fencepost.client.handle import AsyncLockHandle, _LeaseState
from fencepost.client.v1 import lock_pb2 as pb

# An address nothing listens on: any RPC attempt would fail or hang.
UNUSED_ADDRESS = "127.0.0.1:9"


class FakeClock:
    """A monotonic clock moved by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeRpcError(grpc.RpcError):
    """A failed call as grpc exposes it: code(), details(), trailing_metadata()."""

    def __init__(self, code: grpc.StatusCode, details: str = "", metadata: object = ()) -> None:
        super().__init__(details)
        self._code = code
        self._details = details
        self._metadata = metadata

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> object:
        return self._metadata


def status_details(code: grpc.StatusCode, reason: str, **metadata: str) -> bytes:
    """Serialize a google.rpc.Status holding one ErrorInfo, as the coordinator sends it."""
    info = error_details_pb2.ErrorInfo(reason=reason, domain="fencepost.dev", metadata=metadata)
    detail = any_pb2.Any()
    detail.Pack(info)
    return status_pb2.Status(code=code.value[0], message="m", details=[detail]).SerializeToString()


def rpc_error(code: grpc.StatusCode, reason: str, **metadata: str) -> FakeRpcError:
    return FakeRpcError(code, "server said no", (("grpc-status-details-bin", status_details(code, reason, **metadata)),))


async def noop_release(handle: AsyncLockHandle) -> None:
    return None


def make_handle(
    name: str = "n", lease: _LeaseState | None = None, token: int = 7, release: Callable[..., object] = noop_release
) -> AsyncLockHandle:
    lease = lease or _LeaseState(42, 10, 0.0, clock=FakeClock(0.0))
    handle = AsyncLockHandle(name, lease, token, release)  # type: ignore[arg-type]
    lease.holds[name] = handle
    return handle


# ---------------------------------------------------------------- error mapping


@pytest.mark.parametrize(
    ("code", "reason", "expected"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD", fc.InvalidArgument),
        (grpc.StatusCode.DEADLINE_EXCEEDED, "ACQUIRE_TIMEOUT", fc.LockTimeout),
        (grpc.StatusCode.FAILED_PRECONDITION, "NOT_HOLDER", fc.NotHolder),
        (grpc.StatusCode.FAILED_PRECONDITION, "STALE_TOKEN", fc.StaleTokenError),
        (grpc.StatusCode.FAILED_PRECONDITION, "LEASE_EXPIRED", fc.LeaseLost),
        (grpc.StatusCode.UNAVAILABLE, "ETCD_UNAVAILABLE", fc.Unavailable),
        (grpc.StatusCode.UNAVAILABLE, "SHUTTING_DOWN", fc.Unavailable),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "TOO_MANY_WAITERS", fc.ResourceExhausted),
        (grpc.StatusCode.PERMISSION_DENIED, "", fc.FencepostError),
        (grpc.StatusCode.FAILED_PRECONDITION, "SOMETHING_NEW", fc.FencepostError),
    ],
)
def test_from_rpc_error_when_status_has_error_info(
    code: grpc.StatusCode, reason: str, expected: type[fc.FencepostError]
) -> None:
    """Each (status code, ErrorInfo reason) pair maps to the class of the table, keeping the reason and code."""
    err = from_rpc_error(rpc_error(code, reason))
    assert type(err) is expected
    assert err.code is code
    assert err.reason == (reason or None)


def test_from_rpc_error_when_metadata_names_field_lock_and_lease() -> None:
    """ErrorInfo metadata field, name and lease_id land on the exception and win over the caller's values."""
    err = from_rpc_error(
        rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD", field="wait_ms", name="inv:1", lease_id="99"),
        name="other",
        lease_id=1,
    )
    assert isinstance(err, fc.InvalidArgument)
    assert (err.field, err.name, err.lease_id) == ("wait_ms", "inv:1", 99)
    assert "server said no" in str(err)


def test_from_rpc_error_when_server_sent_no_details() -> None:
    """Without status details the class follows the code alone and the caller's name and lease id are kept."""
    err = from_rpc_error(FakeRpcError(grpc.StatusCode.UNAVAILABLE, "connect failed"), name="a", lease_id=5)
    assert type(err) is fc.Unavailable
    assert (err.name, err.lease_id, err.reason) == ("a", 5, None)


def test_from_rpc_error_when_failed_precondition_has_no_reason() -> None:
    """A FAILED_PRECONDITION without a known reason falls back to the base class."""
    err = from_rpc_error(FakeRpcError(grpc.StatusCode.FAILED_PRECONDITION))
    assert type(err) is fc.FencepostError


def test_from_rpc_error_when_details_are_garbage() -> None:
    """Undecodable status details do not hide the error: the code still picks the class."""
    err = from_rpc_error(FakeRpcError(grpc.StatusCode.UNAVAILABLE, "x", (("grpc-status-details-bin", b"\xff\x00"),)))
    assert type(err) is fc.Unavailable


def test_from_rpc_error_when_metadata_is_aio_metadata() -> None:
    """grpc.aio.Metadata trailing metadata (as AioRpcError returns) is read like a tuple of pairs."""
    details = status_details(grpc.StatusCode.FAILED_PRECONDITION, "STALE_TOKEN", name="x")
    metadata = grpc.aio.Metadata(("other-key", "v"), ("grpc-status-details-bin", details))
    err = from_rpc_error(FakeRpcError(grpc.StatusCode.FAILED_PRECONDITION, "", metadata), token=3)
    assert isinstance(err, fc.StaleTokenError)
    assert (err.name, err.token) == ("x", 3)


def test_from_rpc_error_when_given_a_real_aio_error() -> None:
    """A grpc.aio.AioRpcError built by hand maps like the fake one."""
    details = status_details(grpc.StatusCode.FAILED_PRECONDITION, "NOT_HOLDER")
    aio_err = grpc.aio.AioRpcError(
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(("grpc-status-details-bin", details)),
        details="not the holder",
    )
    err = from_rpc_error(aio_err, name="n", lease_id=2)
    assert isinstance(err, fc.NotHolder)
    assert (err.name, err.lease_id, err.reason) == ("n", 2, "NOT_HOLDER")


def test_errors_when_checking_the_tree() -> None:
    """Every public error derives from FencepostError."""
    for cls in (fc.InvalidArgument, fc.LockHeld, fc.LockTimeout, fc.LeaseLost, fc.NotHolder, fc.StaleTokenError,
                fc.Unavailable, fc.ResourceExhausted):
        assert issubclass(cls, fc.FencepostError)


# ---------------------------------------------------------------- argument checks


@pytest.mark.parametrize("ttl", [0, 0.5, -1, 86_401, float("nan"), float("inf"), True, "10", None])
async def test_acquire_when_ttl_is_out_of_range(ttl: object) -> None:
    """A bad ttl raises InvalidArgument(field="ttl") before the client even connects."""
    client = AsyncLockClient(UNUSED_ADDRESS)
    with pytest.raises(fc.InvalidArgument) as info:
        await client.acquire("n", ttl=ttl)  # type: ignore[arg-type]
    assert info.value.field == "ttl"
    assert client._channel is None
    await client.close()


@pytest.mark.parametrize("timeout", [-0.001, float("nan"), float("inf"), 86_401, "1", True])
async def test_acquire_when_timeout_is_out_of_range(timeout: object) -> None:
    """A bad timeout raises InvalidArgument(field="timeout") before the client even connects."""
    client = AsyncLockClient(UNUSED_ADDRESS)
    with pytest.raises(fc.InvalidArgument) as info:
        await client.acquire("n", ttl=5, timeout=timeout)  # type: ignore[arg-type]
    assert info.value.field == "timeout"
    assert client._channel is None


@pytest.mark.parametrize("name", ["", None, 5, b"x"])
async def test_try_acquire_when_name_is_not_a_non_empty_str(name: object) -> None:
    """A bad name raises InvalidArgument(field="name") before the client even connects."""
    client = AsyncLockClient(UNUSED_ADDRESS)
    with pytest.raises(fc.InvalidArgument) as info:
        await client.try_acquire(name)  # type: ignore[arg-type]
    assert info.value.field == "name"
    assert client._channel is None


def test_sync_acquire_when_arguments_are_out_of_range() -> None:
    """The sync client checks arguments on the caller's thread, before starting its loop thread or connecting."""
    client = fc.LockClient(UNUSED_ADDRESS)
    for call, field in (
        (lambda: client.acquire("n", ttl=0), "ttl"),
        (lambda: client.acquire("n", ttl=5, timeout=-1), "timeout"),
        (lambda: client.try_acquire("", ttl=5), "name"),
    ):
        with pytest.raises(fc.InvalidArgument) as info:
            call()
        assert info.value.field == field
    assert client._loop is None and client._thread is None
    client.close()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"address": []}, "address"),
        ({"address": ""}, "address"),
        ({"keepalive_fraction": 0}, "keepalive_fraction"),
        ({"keepalive_fraction": 0.9}, "keepalive_fraction"),
        ({"connect_timeout": 0}, "connect_timeout"),
        ({"connect_timeout": float("inf")}, "connect_timeout"),
    ],
)
def test_client_init_when_argument_is_out_of_range(kwargs: dict[str, object], field: str) -> None:
    """The constructor rejects bad arguments with the field named."""
    kwargs.setdefault("address", UNUSED_ADDRESS)
    with pytest.raises(fc.InvalidArgument) as info:
        AsyncLockClient(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


@pytest.mark.parametrize(("ttl", "wire"), [(1, 1), (1.0, 1), (1.2, 2), (9.999, 10), (10, 10), (86_400, 86_400)])
def test_ttl_to_wire_when_ttl_is_fractional(ttl: float, wire: int) -> None:
    """A TTL is rounded up to whole seconds, never shortened."""
    assert _wire.ttl_to_wire(ttl) == wire


@pytest.mark.parametrize(
    ("remaining", "wire"),
    [(None, (0, True)), (0.0, (0, False)), (-1.0, (0, False)), (1.2345, (1234, False)), (1e9, (86_400_000, False))],
)
def test_wait_to_wire_when_converting_seconds(remaining: float | None, wire: tuple[int, bool]) -> None:
    """The time left becomes wait_ms (rounded, clamped to the wire's range) or wait_forever."""
    assert _wire.wait_to_wire(remaining) == wire


def test_check_addresses_when_given_a_comma_separated_string() -> None:
    """A comma-separated address string is split into the list of addresses, in order."""
    assert _wire.check_addresses("a:1, b:2") == ["a:1", "b:2"]
    assert AsyncLockClient(["a:1", "b:2"]).addresses == ("a:1", "b:2")


def test_backoff_delays_when_iterated() -> None:
    """Delays are full-jitter draws under a ceiling doubling from 0.05 s to a 2 s cap."""
    rng = random.Random(1)
    delays = _wire.backoff_delays(rng=rng)
    ceilings = [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    for ceiling in ceilings:
        assert 0.0 <= next(delays) <= ceiling


# ---------------------------------------------------------------- lease deadline


def test_lease_state_when_granted() -> None:
    """The first deadline is grant send time + granted TTL - margin (margin 10% of TTL, 0.1 s to 1 s)."""
    clock = FakeClock(100.0)
    assert _LeaseState(1, 10, 100.0, clock=clock).deadline == pytest.approx(109.0)
    assert _LeaseState(1, 2, 100.0, clock=clock).deadline == pytest.approx(101.8)
    assert _LeaseState(1, 60, 100.0, clock=clock).deadline == pytest.approx(159.0)
    assert _wire.margin_for(0.5) == pytest.approx(0.1)


def test_lease_state_when_ack_arrives() -> None:
    """An ack moves the deadline to its keepalive's send time + TTL - margin, never backwards."""
    clock = FakeClock(100.0)
    lease = _LeaseState(1, 10, 100.0, clock=clock)
    assert lease.on_ack(105.0, 10)
    assert lease.deadline == pytest.approx(114.0)
    assert lease.on_ack(103.0, 10)  # a late answer to an older keepalive
    assert lease.deadline == pytest.approx(114.0)
    clock.now = 110.0
    assert lease.remaining() == pytest.approx(4.0)


def test_lease_state_when_ack_says_lease_is_gone() -> None:
    """An ack with ttl <= 0 does not extend the deadline and reports the lease gone."""
    lease = _LeaseState(1, 10, 100.0, clock=FakeClock(100.0))
    assert not lease.on_ack(105.0, 0)
    assert not lease.on_ack(105.0, -1)
    assert lease.deadline == pytest.approx(109.0)


def test_lease_state_when_deadline_passes() -> None:
    """Past the deadline remaining() is 0 and expired() is true, on the injected clock only."""
    clock = FakeClock(100.0)
    lease = _LeaseState(1, 10, 100.0, clock=clock)
    clock.now = 108.99
    assert not lease.expired()
    clock.now = 109.0
    assert lease.expired()
    assert lease.remaining() == 0.0


def test_lease_state_when_marked_lost_twice() -> None:
    """mark_lost reports True once, keeps the first reason, and a lost lease ignores acks."""
    lease = _LeaseState(1, 10, 100.0, clock=FakeClock(100.0))
    assert lease.mark_lost("DEADLINE")
    assert not lease.mark_lost("LEASE_EXPIRED")
    assert lease.lost_reason == "DEADLINE"
    assert not lease.on_ack(200.0, 10)
    assert lease.remaining() == 0.0


# ---------------------------------------------------------------- handles


async def test_handle_when_lost_by_several_paths() -> None:
    """The loss is signalled once: one reason, one callback call, one hook call."""
    handle = make_handle()
    calls: list[str | None] = []
    done = threading.Event()

    def callback(h: AsyncLockHandle) -> None:
        calls.append(h.lost_reason)
        done.set()

    handle.on_lost(callback)
    assert handle._mark_lost("DEADLINE")
    assert not handle._mark_lost("LEASE_EXPIRED")
    assert not handle._mark_lost("NOT_HOLDER")
    assert done.wait(5)
    await asyncio.sleep(0.05)
    assert calls == ["DEADLINE"]
    assert handle.lost.is_set() and handle.lost_reason == "DEADLINE"
    assert handle.valid_for() == 0.0 and not handle.is_valid()
    with pytest.raises(fc.LeaseLost) as info:
        handle.check()
    assert (info.value.reason, info.value.name, info.value.lease_id) == ("DEADLINE", "n", 42)


async def test_on_lost_when_callback_blocks() -> None:
    """A callback that blocks runs in its own thread and does not block the loop or other callbacks."""
    handle = make_handle()
    release_blocker = threading.Event()
    second = threading.Event()
    handle.on_lost(lambda h: release_blocker.wait(10))
    handle.on_lost(lambda h: second.set())
    handle._mark_lost("DEADLINE")
    await asyncio.sleep(0)  # the loop is not blocked
    assert await asyncio.to_thread(second.wait, 5)
    release_blocker.set()


async def test_on_lost_when_registered_after_the_loss() -> None:
    """A callback registered after the loss is called at once."""
    handle = make_handle()
    handle._mark_lost("LEASE_EXPIRED")
    called = threading.Event()
    handle.on_lost(lambda h: called.set())
    assert await asyncio.to_thread(called.wait, 5)


async def test_handle_when_released_before_loss() -> None:
    """A released handle never signals a loss and check() raises NotHolder."""
    handle = make_handle()
    called = threading.Event()
    handle.on_lost(lambda h: called.set())
    handle._mark_released()
    assert not handle._mark_lost("DEADLINE")
    assert not handle.lost.is_set()
    assert handle.valid_for() == 0.0
    with pytest.raises(fc.NotHolder):
        handle.check()
    await asyncio.sleep(0.05)
    assert not called.is_set()


async def test_cancel_on_lost_when_hold_is_lost() -> None:
    """cancel_on_lost cancels the registered task when the hold is lost."""
    handle = make_handle()
    task = asyncio.create_task(asyncio.sleep(10))
    handle.cancel_on_lost(task)
    handle._mark_lost("DEADLINE")
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_check_when_local_deadline_passed_before_watcher_ran() -> None:
    """check() raises LeaseLost(reason DEADLINE) as soon as the clock passes the deadline."""
    clock = FakeClock(0.0)
    handle = make_handle(lease=_LeaseState(1, 10, 0.0, clock=clock))
    handle.check()
    assert handle.valid_for() == pytest.approx(9.0)
    clock.now = 9.5
    with pytest.raises(fc.LeaseLost) as info:
        handle.check()
    assert info.value.reason == "DEADLINE"


# ---------------------------------------------------------------- client bookkeeping (no RPC)


def client_with_lease(clock: FakeClock, ttl: int = 10) -> tuple[AsyncLockClient, _LeaseState]:
    """A never-connected client holding one lease as if granted at clock.now (messages are dropped)."""
    client = AsyncLockClient(UNUSED_ADDRESS)
    client._clock = clock
    lease = _LeaseState(77, ttl, clock.now, clock=clock)
    client._sessions[ttl] = lease
    client._leases[lease.lease_id] = lease
    return client, lease


async def test_client_when_every_loss_path_fires() -> None:
    """HoldEnded, a ttl<=0 ack and the deadline all firing still lose each hold exactly once."""
    clock = FakeClock(0.0)
    client, lease = client_with_lease(clock)
    a = make_handle("a", lease, token=5)
    b = make_handle("b", lease, token=6)
    calls: list[tuple[str, str | None]] = []
    for h in (a, b):
        h.on_lost(lambda h: calls.append((h.name, h.lost_reason)))
    client._on_response(pb.KeepAliveResponse(hold_ended=pb.HoldEnded(name="a", lease_id=77, token=5,
                                                                      reason="NOT_HOLDER")))
    client._pending[1] = (lease, 1.0)
    client._on_response(pb.KeepAliveResponse(keepalive=pb.LeaseKeepAliveAck(lease_id=77, request_id=1,
                                                                             ttl_seconds=0)))
    client._lose_lease(lease, "DEADLINE")
    client._on_response(pb.KeepAliveResponse(hold_ended=pb.HoldEnded(name="b", lease_id=77, token=6,
                                                                      reason="LEASE_EXPIRED")))
    await asyncio.sleep(0.2)
    assert sorted(calls) == [("a", "NOT_HOLDER"), ("b", "LEASE_EXPIRED")]
    assert lease.lost_reason == "LEASE_EXPIRED"
    assert 10 not in client._sessions and 77 not in client._leases


async def test_client_when_ack_answers_a_keepalive() -> None:
    """An ack extends the lease from its own keepalive's send time; unknown request ids are ignored."""
    clock = FakeClock(0.0)
    client, lease = client_with_lease(clock)
    client._pending[3] = (lease, 4.0)
    client._on_response(pb.KeepAliveResponse(keepalive=pb.LeaseKeepAliveAck(lease_id=77, request_id=99,
                                                                             ttl_seconds=10)))
    assert lease.deadline == pytest.approx(9.0)
    client._on_response(pb.KeepAliveResponse(keepalive=pb.LeaseKeepAliveAck(lease_id=77, request_id=3,
                                                                             ttl_seconds=10)))
    assert lease.deadline == pytest.approx(13.0)
    assert not lease.lost


async def test_client_when_hold_ended_arrives_during_release() -> None:
    """A HoldEnded for a handle being released is ignored, and one for an older token too."""
    clock = FakeClock(0.0)
    client, lease = client_with_lease(clock)
    handle = make_handle("a", lease, token=5)
    handle._releasing = True
    client._on_response(pb.KeepAliveResponse(hold_ended=pb.HoldEnded(name="a", lease_id=77, token=5,
                                                                      reason="NOT_HOLDER")))
    handle._releasing = False
    client._on_response(pb.KeepAliveResponse(hold_ended=pb.HoldEnded(name="a", lease_id=77, token=4,
                                                                      reason="NOT_HOLDER")))
    assert not handle.lost.is_set()
    assert handle._ended_during_release == "NOT_HOLDER"


async def test_deadline_loop_when_deadline_passes() -> None:
    """The deadline watcher loses a lease whose deadline has passed on the injected clock."""
    clock = FakeClock(0.0)
    client, lease = client_with_lease(clock, ttl=2)
    handle = make_handle("a", lease)
    client._state = "open"
    client._wakeup = asyncio.Event()
    watcher = asyncio.create_task(client._deadline_loop())
    await asyncio.sleep(0.05)
    assert not handle.lost.is_set()
    clock.now = 1.8
    client._wakeup.set()
    await asyncio.wait_for(handle.lost.wait(), 5)
    assert handle.lost_reason == "DEADLINE"
    watcher.cancel()
    with pytest.raises(asyncio.CancelledError):
        await watcher


async def test_lock_when_cancel_on_lost_fires() -> None:
    """Inside lock(), a cancellation by cancel_on_lost surfaces as LeaseLost and the task is not left cancelling."""
    client = AsyncLockClient(UNUSED_ADDRESS)
    handle = make_handle("a")

    async def fake_acquire(name: str, ttl: float = 10.0, timeout: float | None = None) -> AsyncLockHandle:
        return handle

    client.acquire = fake_acquire  # type: ignore[method-assign]
    with pytest.raises(fc.LeaseLost):
        async with client.lock("a") as h:
            h.cancel_on_lost()
            asyncio.get_running_loop().call_soon(h._mark_lost, "DEADLINE")
            await asyncio.sleep(10)
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


def test_all_when_listing_public_names() -> None:
    """__all__ lists exactly the public names of the package."""
    expected = {
        "DEFAULT_ADDRESS", "AsyncLockClient", "AsyncLockHandle", "FencepostError", "InvalidArgument", "LeaseLost",
        "LockClient", "LockHandle", "LockHeld", "LockInfo", "LockTimeout", "NotHolder", "ResourceExhausted",
        "StaleTokenError", "Unavailable",
    }
    assert set(fc.__all__) == expected
    assert fc.DEFAULT_ADDRESS == "127.0.0.1:7420"
    for name in fc.__all__:
        assert getattr(fc, name) is not None


async def test_connect_when_no_coordinator_listens() -> None:
    """connect() raises Unavailable after connect_timeout, leaves no task behind, and the client is closed."""
    client = AsyncLockClient(UNUSED_ADDRESS, connect_timeout=0.3)
    with pytest.raises(fc.Unavailable):
        await client.connect()
    assert not client._tasks
    with pytest.raises(fc.FencepostError):
        await client.acquire("n")
