"""Each failure class of a LockService call, over gRPC and over the HTTP/JSON API (issue 24): the same reason.

Every scenario runs twice, through :class:`~.http_callers.GrpcCaller` and
:class:`~.http_callers.HttpCaller`, against one real coordinator (real
etcd), each with its own leases and lock names. Both must fail with the same
status code, ErrorInfo reason, metadata keys and RetryInfo; the HTTP answer's
status is the code's (``HTTP_STATUS``: 400, 403, 429, 503, 504, ...) and it
carries ``Retry-After`` exactly when a RetryInfo applies. Reasons covered here:
INVALID_FIELD, NOT_HOLDER, STALE_TOKEN, LEASE_EXPIRED, ACQUIRE_TIMEOUT,
NOT_LEASE_OWNER, PERMITS_MISMATCH, REQUEST_ID_REUSED, LIMIT_EXCEEDED (a count
and a rate), TOO_MANY_WAITERS, DRAINING, OVERLOADED, ETCD_UNAVAILABLE, DATA_LOSS;
TOO_MANY_STREAMS and SHUTTING_DOWN (streams) are in tests/test_http_events.py,
ACCESS_DENIED in tests/test_http_tls.py.
"""

from __future__ import annotations

import asyncio
import math
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import grpc
import pytest

from fencepost.client.v1 import lock_pb2
from fencepost.coordinator.admission.capacity import Capacity
from fencepost.coordinator.admission.limits import Limits
from fencepost.coordinator.http import HTTP_STATUS
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.process.embedded import EmbeddedEtcd

from .conftest import wait_for
from .http_callers import Failure, GrpcCaller, HttpCaller
from .test_capacity import Saturation, past_capacity

Caller = Callable[..., Awaitable[Any]]
Scenario = Callable[[Caller, str], Awaitable[Failure]]


async def start(etcd: EmbeddedEtcd, prefix: str, **options: Any) -> Coordinator:
    """A coordinator on ``prefix`` serving gRPC and HTTP on 127.0.0.1 (free ports)."""
    coordinator = Coordinator([etcd.endpoint] if "etcd_endpoints" not in options else options.pop("etcd_endpoints"),
                              listen="127.0.0.1:0", prefix=prefix, http_listen="127.0.0.1:0", **options)
    await asyncio.wait_for(coordinator.start(), 20)
    return coordinator


async def twins(coordinator: Coordinator, scenario: Scenario) -> tuple[Failure, Failure]:
    """``scenario`` over gRPC, then over HTTP (sequentially: a coordinator's limits are shared)."""
    async with grpc.aio.insecure_channel(coordinator.address) as channel, aiohttp.ClientSession() as session:
        over_grpc = await scenario(GrpcCaller(channel), "grpc")
        over_http = await scenario(HttpCaller(session, f"http://{coordinator.http_address}"), "http")
    return over_grpc, over_http


#: The HTTP status of each gRPC code, as google/rpc/code.proto gives it (written out here, not read from the code).
GOOGLE_HTTP = {grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.FAILED_PRECONDITION: 400,
               grpc.StatusCode.OUT_OF_RANGE: 400, grpc.StatusCode.UNAUTHENTICATED: 401,
               grpc.StatusCode.PERMISSION_DENIED: 403, grpc.StatusCode.NOT_FOUND: 404, grpc.StatusCode.ABORTED: 409,
               grpc.StatusCode.ALREADY_EXISTS: 409, grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
               grpc.StatusCode.CANCELLED: 499, grpc.StatusCode.UNKNOWN: 500, grpc.StatusCode.INTERNAL: 500,
               grpc.StatusCode.DATA_LOSS: 500, grpc.StatusCode.UNIMPLEMENTED: 501, grpc.StatusCode.UNAVAILABLE: 503,
               grpc.StatusCode.DEADLINE_EXCEEDED: 504, grpc.StatusCode.OK: 200}


def test_http_status_of_every_code_is_googles() -> None:
    """HTTP_STATUS maps every gRPC code as google/rpc/code.proto (and grpc-gateway) do."""
    assert HTTP_STATUS == GOOGLE_HTTP


def assert_twins(over_grpc: Failure, over_http: Failure, code: grpc.StatusCode, reason: str) -> None:
    """Both failed with ``code`` / ``reason``, alike; the HTTP answer's status and Retry-After follow them."""
    assert isinstance(over_grpc, Failure) and isinstance(over_http, Failure), (over_grpc, over_http)
    for failure in (over_grpc, over_http):
        assert (failure.code, failure.reason) == (code, reason), failure
    assert set(over_grpc.metadata) == set(over_http.metadata), (over_grpc.metadata, over_http.metadata)
    assert (over_grpc.retry_delay is None) == (over_http.retry_delay is None)
    if over_grpc.retry_delay is not None and over_http.retry_delay is not None:  # a rate's delay runs down meanwhile
        assert over_grpc.retry_delay == pytest.approx(over_http.retry_delay, abs=1.0)
    assert over_http.http_status == GOOGLE_HTTP[code]
    expected = None if over_http.retry_delay is None else str(max(1, math.ceil(over_http.retry_delay)))
    assert over_http.retry_after == expected


async def grant(call: Caller, ttl: int = 30) -> lock_pb2.LeaseGrantResponse:
    answer = await call("LeaseGrant", lock_pb2.LeaseGrantRequest(ttl_seconds=ttl))
    assert isinstance(answer, lock_pb2.LeaseGrantResponse), answer
    return answer


async def acquire(call: Caller, lease: lock_pb2.LeaseGrantResponse, name: str, wait_ms: int = 0) -> Any:
    return await call("Acquire", lock_pb2.AcquireRequest(name=name, lease_id=lease.lease_id, wait_ms=wait_ms),
                      lease.lease_secret)


async def revoke(call: Caller, *leases: lock_pb2.LeaseGrantResponse) -> None:
    for lease in leases:
        await call("LeaseRevoke", lock_pb2.LeaseRevokeRequest(lease_id=lease.lease_id), lease.lease_secret)


@pytest.fixture
async def served(etcd: EmbeddedEtcd, prefix: str) -> AsyncIterator[Coordinator]:
    coordinator = await start(etcd, prefix)
    try:
        yield coordinator
    finally:
        await asyncio.wait_for(coordinator.stop(grace=0), 20)


# ---------------------------------------------------------------- scenarios on one coordinator


async def invalid_field(call: Caller, name: str) -> Failure:
    lease = await grant(call)
    failure = await call("Acquire", lock_pb2.AcquireRequest(name="", lease_id=lease.lease_id), lease.lease_secret)
    await revoke(call, lease)
    assert failure.metadata["field"] == "name"
    return failure  # type: ignore[no-any-return]


async def not_holder(call: Caller, name: str) -> Failure:
    lease = await grant(call)
    failure = await call("Release", lock_pb2.ReleaseRequest(name=name, lease_id=lease.lease_id, token=5),
                         lease.lease_secret)
    await revoke(call, lease)
    return failure  # type: ignore[no-any-return]


async def stale_token(call: Caller, name: str) -> Failure:
    lease = await grant(call)
    first = await acquire(call, lease, name)
    await call("Release", lock_pb2.ReleaseRequest(name=name, lease_id=lease.lease_id, token=first.token),
               lease.lease_secret)
    second = await acquire(call, lease, name)
    failure = await call("Release", lock_pb2.ReleaseRequest(name=name, lease_id=lease.lease_id, token=first.token),
                         lease.lease_secret)
    await revoke(call, lease)
    assert failure.metadata["current_token"] == str(second.token)
    return failure  # type: ignore[no-any-return]


async def lease_expired(call: Caller, name: str) -> Failure:
    lease = await grant(call)
    await revoke(call, lease)
    return await acquire(call, lease, name)  # type: ignore[no-any-return]


async def acquire_timeout(call: Caller, name: str) -> Failure:
    holder, waiter = await grant(call), await grant(call)
    assert (await acquire(call, holder, name)).acquired
    failure = await acquire(call, waiter, name, wait_ms=200)
    await revoke(call, holder, waiter)
    return failure  # type: ignore[no-any-return]


async def not_lease_owner(call: Caller, name: str) -> Failure:
    """Another caller (no secret, a wrong one) cannot release, renew, revoke or withdraw the lease; then Release."""
    lease = await grant(call)
    held = await acquire(call, lease, name)
    for secret in (None, "not-its-secret"):
        for rpc, request in (("LeaseKeepAlive", lock_pb2.LeaseKeepAliveRequest(lease_id=lease.lease_id)),
                             ("LeaseRevoke", lock_pb2.LeaseRevokeRequest(lease_id=lease.lease_id)),
                             ("Withdraw", lock_pb2.WithdrawRequest(name=name, lease_id=lease.lease_id))):
            refused = await call(rpc, request, secret)
            assert isinstance(refused, Failure) and refused.reason == "NOT_LEASE_OWNER", (rpc, refused)
    failure = await call("Release", lock_pb2.ReleaseRequest(name=name, lease_id=lease.lease_id, token=held.token))
    assert (await acquire(call, lease, name)).token == held.token  # still held, by the same grant
    await revoke(call, lease)
    return failure  # type: ignore[no-any-return]


async def permits_mismatch(call: Caller, name: str) -> Failure:
    one, two = await grant(call), await grant(call)
    first = await call("AcquirePermit", lock_pb2.AcquirePermitRequest(name=name, lease_id=one.lease_id, permits=2),
                       one.lease_secret)
    assert first.acquired
    failure = await call("AcquirePermit", lock_pb2.AcquirePermitRequest(name=name, lease_id=two.lease_id, permits=3),
                         two.lease_secret)
    await revoke(call, one, two)
    assert failure.metadata["permits"] == "2"
    return failure  # type: ignore[no-any-return]


async def request_id_reused(call: Caller, name: str) -> Failure:
    lease = await grant(call)
    held = await acquire(call, lease, name)
    request_id = f"reused-{name}"
    released = await call("Release", lock_pb2.ReleaseRequest(name=name, lease_id=lease.lease_id, token=held.token,
                                                            request_id=request_id), lease.lease_secret)
    assert isinstance(released, lock_pb2.ReleaseResponse)
    failure = await call("Release", lock_pb2.ReleaseRequest(name=name + "-other", lease_id=lease.lease_id,
                                                           token=held.token, request_id=request_id),
                         lease.lease_secret)
    await revoke(call, lease)
    return failure  # type: ignore[no-any-return]


@pytest.mark.parametrize(("scenario", "code", "reason"), [
    (invalid_field, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD"),
    (not_holder, grpc.StatusCode.FAILED_PRECONDITION, "NOT_HOLDER"),
    (stale_token, grpc.StatusCode.FAILED_PRECONDITION, "STALE_TOKEN"),
    (lease_expired, grpc.StatusCode.FAILED_PRECONDITION, "LEASE_EXPIRED"),
    (acquire_timeout, grpc.StatusCode.DEADLINE_EXCEEDED, "ACQUIRE_TIMEOUT"),
    (not_lease_owner, grpc.StatusCode.PERMISSION_DENIED, "NOT_LEASE_OWNER"),
    (permits_mismatch, grpc.StatusCode.FAILED_PRECONDITION, "PERMITS_MISMATCH"),
    (request_id_reused, grpc.StatusCode.INVALID_ARGUMENT, "REQUEST_ID_REUSED"),
], ids=lambda value: value if isinstance(value, str) else None)
async def test_failure_over_http_is_its_grpc_twin(served: Coordinator, scenario: Scenario, code: grpc.StatusCode,
                                                  reason: str) -> None:
    """The scenario fails alike over gRPC and HTTP: same code, reason, metadata keys; HTTP status of the code."""
    assert_twins(*await twins(served, scenario), code, reason)


# ---------------------------------------------------------------- scenarios that need a coordinator of their own


async def second_lease(call: Caller, name: str) -> Failure:
    lease = await grant(call)
    failure = await call("LeaseGrant", lock_pb2.LeaseGrantRequest(ttl_seconds=30))
    await revoke(call, lease)
    return failure  # type: ignore[no-any-return]


@pytest.mark.parametrize("limits", [Limits(max_leases_per_caller=1),
                                    Limits(lease_grant_rate=0.01, lease_grant_burst=1)], ids=["count", "rate"])
async def test_limit_exceeded_over_http_is_its_grpc_twin(etcd: EmbeddedEtcd, prefix: str, limits: Limits) -> None:
    """A second lease past a caller's limit: LIMIT_EXCEEDED (429) on both; a rate's refusal has Retry-After."""
    coordinator = await start(etcd, prefix, limits=limits)
    try:
        over_grpc, over_http = await twins(coordinator, second_lease)
    finally:
        await coordinator.stop(0)
    assert_twins(over_grpc, over_http, grpc.StatusCode.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED")
    assert (over_http.retry_after is not None) == (limits.lease_grant_rate < 1)


async def test_too_many_waiters_over_http_is_its_grpc_twin(etcd: EmbeddedEtcd, prefix: str) -> None:
    """With one waiter allowed on the coordinator, a second wait: TOO_MANY_WAITERS (429) on both."""
    coordinator = await start(etcd, prefix, limits=Limits(max_waiters=1))

    async def second_waiter(call: Caller, name: str) -> Failure:
        holder, waiter, third = await grant(call), await grant(call), await grant(call)
        assert (await acquire(call, holder, name)).acquired
        waiting = asyncio.ensure_future(acquire(call, waiter, name, wait_ms=60_000))
        await wait_for(lambda: coordinator.locks is not None and coordinator.locks.waiting == 1, 10,
                       what="one waiting Acquire")
        failure = await acquire(call, third, name, wait_ms=60_000)
        await revoke(call, holder)  # the waiter is granted
        await waiting
        await revoke(call, waiter, third)
        return failure  # type: ignore[no-any-return]

    try:
        over_grpc, over_http = await twins(coordinator, second_waiter)
    finally:
        await coordinator.stop(0)
    assert_twins(over_grpc, over_http, grpc.StatusCode.RESOURCE_EXHAUSTED, "TOO_MANY_WAITERS")


async def test_draining_over_http_is_its_grpc_twin(served: Coordinator) -> None:
    """While draining: a new lease is DRAINING (503, Retry-After 1) on both; a held lease's keepalive is served."""
    async def draining(call: Caller, name: str) -> Failure:
        return await call("LeaseGrant", lock_pb2.LeaseGrantRequest(ttl_seconds=30))  # type: ignore[no-any-return]

    async def held(call: Caller, name: str) -> Any:
        lease = await grant(call)
        leases[name] = lease
        return lease

    leases: dict[str, lock_pb2.LeaseGrantResponse] = {}
    await twins(served, held)
    assert await served.drain(30) == "no_streams"
    assert_twins(*await twins(served, draining), grpc.StatusCode.UNAVAILABLE, "DRAINING")

    async def renewed(call: Caller, name: str) -> Any:
        lease = leases[name]
        answer = await call("LeaseKeepAlive", lock_pb2.LeaseKeepAliveRequest(lease_id=lease.lease_id),
                            lease.lease_secret)
        assert isinstance(answer, lock_pb2.LeaseKeepAliveResponse) and answer.ttl_seconds == lease.ttl_seconds, answer
        await revoke(call, lease)
        return answer

    await twins(served, renewed)


async def test_overloaded_over_http_is_its_grpc_twin(etcd: EmbeddedEtcd, prefix: str) -> None:
    """Past its capacity, the coordinator refuses a new lease with OVERLOADED (429, Retry-After 1) on both."""
    saturation = Saturation()
    coordinator = await start(etcd, prefix, capacity=Capacity(cpu_clock=saturation.cpu, window=0.1))
    try:
        await past_capacity(coordinator, saturation)

        async def overloaded(call: Caller, name: str) -> Failure:
            return await call("LeaseGrant", lock_pb2.LeaseGrantRequest(ttl_seconds=30))  # type: ignore[no-any-return]

        over_grpc, over_http = await twins(coordinator, overloaded)
    finally:
        await coordinator.stop(0)
    assert_twins(over_grpc, over_http, grpc.StatusCode.RESOURCE_EXHAUSTED, "OVERLOADED")


async def test_etcd_unavailable_over_http_is_its_grpc_twin(prefix: str) -> None:
    """A coordinator whose etcd does not answer: ETCD_UNAVAILABLE (503, Retry-After) on both, within the call's
    timeout (the HTTP call's Fencepost-Timeout-Ms bounds its etcd work as a gRPC deadline does)."""
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        endpoint = f"127.0.0.1:{closed.getsockname()[1]}"
    coordinator = Coordinator([endpoint], listen="127.0.0.1:0", prefix=prefix, http_listen="127.0.0.1:0")
    await asyncio.wait_for(coordinator.start(), 20)

    async def unreachable(call: Caller, name: str) -> Failure:
        return await call("Describe", lock_pb2.DescribeRequest(name=name), timeout=2.0)  # type: ignore[no-any-return]

    try:
        over_grpc, over_http = await twins(coordinator, unreachable)
    finally:
        await coordinator.stop(0)
    assert_twins(over_grpc, over_http, grpc.StatusCode.UNAVAILABLE, "ETCD_UNAVAILABLE")


async def test_data_loss_over_http_is_its_grpc_twin(etcd: EmbeddedEtcd, prefix: str) -> None:
    """Once the coordinator sees etcd's revisions go back, a new lease is refused UNAVAILABLE / DATA_LOSS (503,
    Retry-After) on both; a held lease's keepalive and revoke are still served."""
    from fencepost.client.v1.etcd import rpc_pb2

    coordinator = await start(etcd, prefix)
    leases: dict[str, lock_pb2.LeaseGrantResponse] = {}

    async def held(call: Caller, name: str) -> Any:
        leases[name] = await grant(call)
        return leases[name]

    async def data_loss(call: Caller, name: str) -> Failure:
        failure = await call("LeaseGrant", lock_pb2.LeaseGrantRequest(ttl_seconds=30))
        lease = leases[name]
        renewed = await call("LeaseKeepAlive", lock_pb2.LeaseKeepAliveRequest(lease_id=lease.lease_id),
                             lease.lease_secret)
        assert isinstance(renewed, lock_pb2.LeaseKeepAliveResponse), renewed
        await revoke(call, lease)
        return failure  # type: ignore[no-any-return]

    try:
        await twins(coordinator, held)
        tokens = coordinator.tokens
        assert tokens is not None
        tokens.seen(tokens.mark() + 1000, rpc_pb2.ResponseHeader(revision=1))  # an answer from before the past
        over_grpc, over_http = await twins(coordinator, data_loss)
    finally:
        await coordinator.stop(0)
    assert_twins(over_grpc, over_http, grpc.StatusCode.UNAVAILABLE, "DATA_LOSS")
