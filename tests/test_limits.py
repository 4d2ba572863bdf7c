"""Limits against one bad or buggy client (coordinator/admission/limits.py, issue 9).

Unit tests of the token bucket and the tracker run on an injected clock;
the others drive a real coordinator (small limits) through the generated
stub and the Python client: each limit is hit exactly at its value, with
RESOURCE_EXHAUSTED / LIMIT_EXCEEDED, ``limit`` and ``value``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

import fencepost.client as fc
from fencepost.client.v1 import details, lock_pb2, lock_pb2_grpc
from fencepost.coordinator.admission import limit_tracker
from fencepost.coordinator.admission.limit_tracker import LOG_INTERVAL_SECONDS, LimitTracker, TokenBucket
from fencepost.coordinator.admission.limits import Limits, add_limit_arguments, limits_from_args
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.telemetry.events import FIELDS_ATTR

from .owned_stub import OwnedStub

from .conftest import error_info, wait_for


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _limit_of(exc: fc.LimitExceeded) -> tuple[str | None, str | None]:
    return exc.limit, exc.value


# ---------------------------------------------------------------- unit: token bucket


def test_bucket_when_drained_refills_at_its_rate() -> None:
    """A full bucket gives ``burst`` tokens at once, then one per 1/rate seconds."""
    bucket = TokenBucket(3, now=0.0)
    assert [bucket.take(2.0, 3, 0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take(2.0, 3, 0.0) == pytest.approx(0.5)
    assert bucket.take(2.0, 3, 0.25) == pytest.approx(0.25)
    assert bucket.take(2.0, 3, 0.5) == 0.0
    assert not bucket.full(2.0, 3, 1.0)
    assert bucket.full(2.0, 3, 2.0)  # never above the burst
    assert [bucket.take(2.0, 3, 100.0) for _ in range(4)][-1] > 0


# ---------------------------------------------------------------- unit: leases


def test_lease_grant_when_caller_at_limit_is_refused_until_one_ends() -> None:
    """The (N+1)-th lease of a caller is refused; another caller is not; a lease that ends frees its slot."""
    clock = FakeClock()
    tracker = LimitTracker(Limits(max_leases_per_caller=2, lease_grant_rate=0), clock=clock)
    for lease_id in (1, 2):
        with tracker.lease_grant("a") as granted:
            granted(lease_id, 60)
    with pytest.raises(fc.LimitExceeded) as info, tracker.lease_grant("a"):
        pass
    assert _limit_of(info.value) == ("max-leases-per-caller", "2")
    assert "max-leases-per-caller" in info.value.message and "(2)" in info.value.message
    assert info.value.retry_delay is None
    with tracker.lease_grant("b") as granted:
        granted(3, 60)
    tracker.lease_ended(1)
    with tracker.lease_grant("a") as granted:
        granted(4, 60)
    assert tracker.leases_of("a") == 2 and tracker.leases_of("b") == 1


def test_lease_grant_when_the_grant_fails_does_not_count() -> None:
    """A LeaseGrant counts from its check, and no longer once it failed (concurrent calls cannot pass together)."""
    tracker = LimitTracker(Limits(max_leases_per_caller=1, lease_grant_rate=0), clock=FakeClock())
    with tracker.lease_grant("a"):
        with pytest.raises(fc.LimitExceeded), tracker.lease_grant("a"):
            pass  # the first is still being granted: it counts
    assert tracker.leases_of("a") == 0
    with pytest.raises(RuntimeError), tracker.lease_grant("a"):
        raise RuntimeError("etcd failed")
    assert tracker.leases_of("a") == 0 and tracker.lease_count == 0


def test_lease_when_ttl_passes_without_keepalive_here_stops_counting() -> None:
    """A lease counts until its TTL passes after its grant or its last keepalive here; one found gone stops at once."""
    clock = FakeClock()
    tracker = LimitTracker(Limits(max_leases_per_caller=5, lease_grant_rate=0), clock=clock)
    for lease_id in (1, 2, 3):
        with tracker.lease_grant("a") as granted:
            granted(lease_id, 10)
    clock.now += 8
    tracker.kept_alive(2, 10)  # renewed: now expires at +18
    tracker.kept_alive(3, 0)  # a keepalive found it gone
    assert tracker.leases_of("a") == 2
    clock.now += 2.5  # lease 1's TTL has passed
    assert tracker.leases_of("a") == 1
    clock.now += 8
    assert tracker.leases_of("a") == 0
    assert tracker.tracked["leases"] == 0 and tracker.tracked["callers"] == 0


def test_lease_grant_when_lease_limits_are_off_keeps_nothing() -> None:
    """With both lease limits at 0 no lease is remembered (the memory of a flood is etcd's alone)."""
    tracker = LimitTracker(Limits(max_leases=0, max_leases_per_caller=0, lease_grant_rate=0), clock=FakeClock())
    for lease_id in range(1, 101):
        with tracker.lease_grant(f"c{lease_id % 7}") as granted:
            granted(lease_id, 60)
    assert tracker.lease_count == 0 and tracker.tracked["leases"] == 0 and tracker.tracked["expiries"] == 0


def test_lease_grant_when_coordinator_total_reached_is_refused() -> None:
    """``max-leases`` bounds every caller together (callers are connections without mTLS)."""
    tracker = LimitTracker(Limits(max_leases=3, lease_grant_rate=0), clock=FakeClock())
    for lease_id, caller in enumerate(("a", "b", "c"), 1):
        with tracker.lease_grant(caller) as granted:
            granted(lease_id, 60)
    with pytest.raises(fc.LimitExceeded) as info, tracker.lease_grant("d"):
        pass
    assert _limit_of(info.value) == ("max-leases", "3")


def test_lease_grant_when_rate_exceeded_says_when_to_retry() -> None:
    """Past its burst a caller is refused with the seconds until its next token; the bucket refills at its rate."""
    clock = FakeClock()
    tracker = LimitTracker(Limits(lease_grant_rate=4, lease_grant_burst=2), clock=clock)
    for lease_id in (1, 2):
        with tracker.lease_grant("a") as granted:
            granted(lease_id, 60)
    with pytest.raises(fc.LimitExceeded) as info, tracker.lease_grant("a"):
        pass
    assert _limit_of(info.value) == ("max-lease-grant-rate", "4/s")
    assert info.value.retry_delay == pytest.approx(0.25)
    assert tracker.leases_of("a") == 2  # the refused call counts nothing
    with tracker.lease_grant("b") as granted:  # another caller has its own bucket
        granted(3, 60)
    clock.now += 0.25
    with tracker.lease_grant("a") as granted:
        granted(4, 60)


def test_rate_buckets_are_bounded_and_forgotten_when_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """Buckets that filled up are dropped, and at most MAX_TRACKED_CALLERS are kept whatever the callers do."""
    monkeypatch.setattr(limit_tracker, "MAX_TRACKED_CALLERS", 50)
    clock = FakeClock()
    tracker = LimitTracker(Limits(lease_grant_rate=1, lease_grant_burst=1, max_leases=10**6,
                                  max_leases_per_caller=0), clock=clock)
    for n in range(200):
        with tracker.lease_grant(f"c{n}") as granted:
            granted(n + 1, 1)
    assert tracker.tracked["lease_grant_buckets"] == 50
    clock.now += 2  # every bucket is full again, every lease past its TTL
    with tracker.lease_grant("new") as granted:
        granted(1000, 1)
    assert tracker.tracked["lease_grant_buckets"] == 1
    assert tracker.tracked["leases"] == 1 and tracker.tracked["callers"] == 1


# ---------------------------------------------------------------- unit: acquires, streams, log


def test_acquire_when_lease_at_holds_limit_is_refused_except_for_a_lock_it_holds() -> None:
    """Holds granted here plus Acquire calls in progress count; an Acquire of a lock already held is not refused."""
    held: set[tuple[str, int]] = {("a", 7)}
    tracker = LimitTracker(Limits(max_holds_per_lease=2, acquire_rate=0),
                           holds_of=lambda lease: sum(1 for _, lid in held if lid == lease),
                           holds=lambda name, lease: (name, lease) in held, clock=FakeClock())
    with tracker.acquiring("c", "b", 7):
        with pytest.raises(fc.LimitExceeded) as info, tracker.acquiring("c", "x", 7):
            pass
        with tracker.acquiring("c", "a", 7):  # held already: the same hold again
            pass
        with tracker.acquiring("c", "x", 8):  # another lease
            pass
    assert _limit_of(info.value) == ("max-holds-per-lease", "2")
    assert info.value.name == "x" and info.value.lease_id == 7
    with tracker.acquiring("c", "x", 7):  # the wait on "b" ended
        pass
    assert tracker.tracked["acquiring"] == 0


def test_acquire_when_rate_exceeded_is_refused_with_retry_delay() -> None:
    """Acquire calls of one caller past the burst are refused with a RetryInfo delay of 1/rate."""
    clock = FakeClock()
    tracker = LimitTracker(Limits(acquire_rate=10, acquire_burst=3), clock=clock)
    for _ in range(3):
        with tracker.acquiring("c", "n", 1):
            pass
    with pytest.raises(fc.LimitExceeded) as info, tracker.acquiring("c", "n", 1):
        pass
    assert _limit_of(info.value) == ("max-acquire-rate", "10/s")
    assert info.value.retry_delay == pytest.approx(0.1)
    clock.now += 0.1
    with tracker.acquiring("c", "n", 1):
        pass


def test_stream_when_caller_at_limit_is_refused_until_one_closes() -> None:
    """The (N+1)-th open KeepAlive stream of a caller is refused and not counted."""
    tracker = LimitTracker(Limits(max_streams_per_caller=2))
    tracker.stream_opened("a")
    tracker.stream_opened("a")
    with pytest.raises(fc.LimitExceeded) as info:
        tracker.stream_opened("a")
    assert _limit_of(info.value) == ("max-streams-per-caller", "2")
    tracker.stream_opened("b")
    tracker.stream_closed("a")
    tracker.stream_opened("a")
    for _ in range(3):
        tracker.stream_closed("a")
    tracker.stream_closed("b")
    assert tracker.tracked["streams"] == 0


def test_log_refusal_when_repeated_logs_once_per_interval_with_suppressed_count() -> None:
    """One line per caller and limit per LOG_INTERVAL_SECONDS; the next line says how many were left out."""
    clock = FakeClock()
    tracker = LimitTracker(Limits(), clock=clock)
    assert tracker.log_refusal("a", "max-leases") == 0
    assert [tracker.log_refusal("a", "max-leases") for _ in range(5)] == [None] * 5
    assert tracker.log_refusal("a", "max-streams-per-caller") == 0  # another limit
    assert tracker.log_refusal("b", "max-leases") == 0  # another caller
    clock.now += LOG_INTERVAL_SECONDS
    assert tracker.log_refusal("a", "max-leases") == 5


def test_limits_when_out_of_range_name_the_flag() -> None:
    """Bad values raise ValueError naming the flag; every flag parses from its text."""
    with pytest.raises(ValueError, match="--max-leases is -1"):
        Limits(max_leases=-1)
    with pytest.raises(ValueError, match="--max-acquire-burst is 0"):
        Limits(acquire_burst=0)
    with pytest.raises(ValueError, match="--max-message-bytes is 10"):
        Limits(max_message_bytes=10)
    parser = argparse.ArgumentParser()
    add_limit_arguments(parser, lambda flag, default: "7" if flag == "max-waiters" else default)
    parsed = limits_from_args(parser.parse_args(["--max-leases-per-caller", "5", "--max-acquire-rate", "2.5"]))
    assert (parsed.max_leases_per_caller, parsed.acquire_rate, parsed.max_waiters) == (5, 2.5, 7)
    assert parsed.max_leases == Limits().max_leases
    with pytest.raises(ValueError, match="--max-holds-per-lease is 'x'; must be a whole number"):
        limits_from_args(parser.parse_args(["--max-holds-per-lease", "x"]))


# ---------------------------------------------------------------- a real coordinator


@pytest.fixture
async def limited(etcd: Any, prefix: str, request: pytest.FixtureRequest) -> AsyncIterator[Coordinator]:
    """A coordinator with the test's limits (``@pytest.mark.parametrize`` is not needed: a marker-free kwarg)."""
    limits = getattr(request, "param", Limits(lease_grant_rate=0, acquire_rate=0))
    coord = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix, limits=limits)
    await asyncio.wait_for(coord.start(), 20)
    try:
        yield coord
    finally:
        await asyncio.wait_for(coord.stop(grace=0), 20)


def _channel(coord: Coordinator) -> grpc.aio.Channel:
    """A channel with its own connection (gRPC shares one between channels to the same address otherwise)."""
    return grpc.aio.insecure_channel(coord.address, options=[("grpc.use_local_subchannel_pool", 1)])


def _assert_limit(err: grpc.aio.AioRpcError, limit: str, value: str) -> None:
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (err.code(), err.details())
    info = error_info(err)
    assert info is not None and info.domain == "fencepost.dev"
    assert info.reason == "LIMIT_EXCEEDED"
    assert info.metadata["limit"] == limit and info.metadata["value"] == value, dict(info.metadata)
    assert limit in (err.details() or "") and f"({value})" in (err.details() or "")


async def _revoke_all(stub: lock_pb2_grpc.LockServiceStub, lease_ids: list[int]) -> None:
    for lease_id in lease_ids:
        await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease_id), timeout=5)


@pytest.mark.parametrize("limited", [Limits(max_leases_per_caller=3, lease_grant_rate=0)], indirect=True)
async def test_lease_grant_at_caller_limit_is_refused_and_a_revoke_frees_a_slot(
        limited: Coordinator, caplog: pytest.LogCaptureFixture) -> None:
    """The 4th LeaseGrant of one connection gets LIMIT_EXCEEDED (logged once); another connection is another caller."""
    caplog.set_level(logging.INFO, logger="fencepost.coordinator")
    async with _channel(limited) as chan, _channel(limited) as other:
        stub, stub2 = OwnedStub(chan), OwnedStub(other)
        leases = [(await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=30), timeout=5)).lease_id
                  for _ in range(3)]
        try:
            for _ in range(4):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=30), timeout=5)
                _assert_limit(info.value, "max-leases-per-caller", "3")
            assert details.parse(info.value).retry_delay is None
            leases.append((await stub2.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=30), timeout=5)).lease_id)
            await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=leases.pop(0)), timeout=5)
            leases.append((await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=30), timeout=5)).lease_id)
        finally:
            await _revoke_all(stub, leases)
    lines = [r for r in caplog.records if getattr(r, FIELDS_ATTR, {}).get("limit") == "max-leases-per-caller"]
    assert len(lines) == 1, [r.getMessage() for r in lines]  # 4 refusals, one line
    assert lines[0].levelno == logging.WARNING and getattr(lines[0], FIELDS_ATTR)["suppressed"] == 0


@pytest.mark.parametrize("limited", [Limits(max_holds_per_lease=2, acquire_rate=0)], indirect=True)
async def test_acquire_at_holds_per_lease_limit_raises_limit_exceeded_in_the_client(limited: Coordinator) -> None:
    """A client whose lease holds the limit gets LimitExceeded at once (not retried); a release frees a slot."""
    async with fc.AsyncLockClient(limited.address, connect_timeout=5) as client:
        a = await client.acquire("a", ttl=10)
        b = await client.try_acquire("b", ttl=10)
        started = time.monotonic()
        with pytest.raises(fc.LimitExceeded) as info:
            await client.acquire("c", ttl=10, timeout=3)
        assert time.monotonic() - started < 1.0  # refused at once, not retried until the timeout
        assert (info.value.limit, info.value.value, info.value.name) == ("max-holds-per-lease", "2", "c")
        assert isinstance(info.value, fc.ResourceExhausted) and info.value.lease_id == a.lease_id
        await b.release()
        c = await client.try_acquire("c", ttl=10)
        assert c.lease_id == a.lease_id
        await c.release()
        await a.release()


@pytest.mark.parametrize("limited", [Limits(acquire_rate=5, acquire_burst=1)], indirect=True)
async def test_acquire_past_rate_is_refused_with_retry_info_and_the_client_waits(limited: Coordinator) -> None:
    """A second Acquire at once gets LIMIT_EXCEEDED with a RetryInfo; the client waits that long and succeeds."""
    async with _channel(limited) as chan:
        stub = OwnedStub(chan)
        lease = (await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=30), timeout=5)).lease_id
        try:
            await stub.Acquire(lock_pb2.AcquireRequest(name="r", lease_id=lease), timeout=5)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Acquire(lock_pb2.AcquireRequest(name="r", lease_id=lease), timeout=5)
            _assert_limit(info.value, "max-acquire-rate", "5/s")
            delay = details.parse(info.value).retry_delay
            assert delay is not None and 0 < delay <= 0.2
        finally:
            await _revoke_all(stub, [lease])
    async with fc.AsyncLockClient(limited.address, connect_timeout=5) as client:
        started = time.monotonic()
        handles = [await client.try_acquire(f"r{n}", ttl=10) for n in range(3)]
        assert time.monotonic() - started >= 0.3  # 3 Acquires at 5/s after a burst of 1: waited as told
        for handle in handles:
            await handle.release()


@pytest.mark.parametrize("limited", [Limits(max_streams_per_caller=1)], indirect=True)
async def test_observe_streams_count_toward_the_callers_stream_limit(limited: Coordinator) -> None:
    """An Observe stream holds an etcd watch: with one stream per caller allowed, a second Observe (or a
    KeepAlive stream beside an Observe) is refused with LIMIT_EXCEEDED; once the first ends, another opens."""
    async with _channel(limited) as chan:
        stub = OwnedStub(chan)
        first = stub.Observe(lock_pb2.ObserveRequest(election="limited"))
        assert not (await first.read()).HasField("leader")  # open and counted: no leader yet
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Observe(lock_pb2.ObserveRequest(election="other")).read()
        _assert_limit(info.value, "max-streams-per-caller", "1")
        first.cancel()

        async def opens() -> bool:
            again = stub.Observe(lock_pb2.ObserveRequest(election="limited"))
            try:
                return not (await again.read()).HasField("leader")
            except grpc.aio.AioRpcError:
                return False
            finally:
                again.cancel()

        await wait_for(opens, 10, what="an Observe to open once the first ended")


@pytest.mark.parametrize("limited", [Limits(max_streams_per_caller=1)], indirect=True)
async def test_keepalive_stream_past_caller_limit_is_refused(limited: Coordinator) -> None:
    """A second KeepAlive stream on one connection gets LIMIT_EXCEEDED; once the first ends, another opens."""
    async with _channel(limited) as chan:
        stub = OwnedStub(chan)
        lease = (await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=30), timeout=5)).lease_id
        keepalive = lock_pb2.KeepAliveRequest(keepalive=lock_pb2.LeaseKeepAlive(lease_id=lease, request_id=1))
        try:
            first = stub.KeepAlive()
            await first.write(keepalive)
            assert (await first.read()).keepalive.lease_id == lease  # open and counted
            second = stub.KeepAlive()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await second.write(keepalive)
                await second.read()
            _assert_limit(info.value, "max-streams-per-caller", "1")
            first.cancel()

            async def opens() -> bool:
                third = stub.KeepAlive()
                try:
                    await third.write(keepalive)
                    return (await third.read()).keepalive.lease_id == lease
                except grpc.aio.AioRpcError:
                    return False
                finally:
                    third.cancel()

            await wait_for(opens, 10, what="a stream to open once the first ended")
        finally:
            await _revoke_all(stub, [lease])


async def test_request_over_message_size_is_refused_by_grpc_without_harm(limited: Coordinator) -> None:
    """A request larger than max-message-bytes gets RESOURCE_EXHAUSTED from gRPC; the connection serves on."""
    async with _channel(limited) as chan:
        stub = OwnedStub(chan)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Acquire(lock_pb2.AcquireRequest(name="x" * (Limits().max_message_bytes + 1), lease_id=1),
                               timeout=5)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value.details()
        lease = (await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=30), timeout=5)).lease_id
        await _revoke_all(stub, [lease])
