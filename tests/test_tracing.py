"""OpenTelemetry traces: client spans, the coordinator's SERVER spans and its etcd spans (serve's OTLP
export: tests/test_tracing_export.py).

Spans are read with the SDK's in-memory exporter, from tracer providers made
per test and passed in explicitly (the global provider can be set once per
process; it stays the API's default here). Where the client and the
coordinator share a trace, each has its own provider, so that only the W3C
context in the call metadata can join them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind, StatusCode

from fencepost.client import AsyncLockClient, LockClient, LockHeld, LockTimeout
from fencepost.client.tracing import Tracing
from fencepost.client.v1 import etcdops, lock_pb2
from fencepost.coordinator.etcd import NOT_APPLIED, EtcdClient, TxnPlan
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.process.embedded import EmbeddedEtcd

from .conftest import wait_for
from .fake_etcd import FakeEtcd
from .metrics_scrape import scrape
from .owned_stub import OwnedStub
from .trace_spans import LOCKS, PARENT_ID, TRACE_ID, TRACEPARENT, Spans, parent_of, span_id, trace_id


@pytest.fixture
def server_spans() -> Iterator[Spans]:
    """The coordinator's spans."""
    spans = Spans()
    yield spans
    spans.shutdown()


@pytest.fixture
def client_spans() -> Iterator[Spans]:
    """The client's spans."""
    spans = Spans()
    yield spans
    spans.shutdown()


@pytest.fixture
async def traced(etcd: EmbeddedEtcd, prefix: str, server_spans: Spans) -> AsyncIterator[Coordinator]:
    """A coordinator tracing into ``server_spans``, with metrics on too (both interceptors installed)."""
    coord = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix, metrics_listen="127.0.0.1:0",
                        tracer_provider=server_spans.provider)
    await asyncio.wait_for(coord.start(), 20)
    try:
        yield coord
    finally:
        await asyncio.wait_for(coord.stop(grace=0), 20)


async def test_one_trace_from_a_client_acquire_through_the_coordinator_to_its_etcd_txn(
        traced: Coordinator, server_spans: Spans, client_spans: Spans) -> None:
    """An acquire is one trace: fencepost.acquire -> the client's Acquire -> the coordinator's Acquire -> its
    etcd Txn; the lease grant and the release likewise, each span with its attributes."""
    async with AsyncLockClient(traced.address, tracer_provider=client_spans.provider) as client:
        handle = await client.acquire("inv:42", ttl=10.0, timeout=5.0)
        await handle.release()
    lease, token = handle.lease_id, handle.token

    acquire = await client_spans.one("fencepost.acquire")
    assert acquire.parent is None and acquire.kind == SpanKind.INTERNAL
    assert dict(acquire.attributes or {}) == {
        "fencepost.lock.name": "inv:42", "fencepost.ttl_seconds": 10, "fencepost.try_once": False,
        "fencepost.read": False, "fencepost.timeout_seconds": 5.0, "fencepost.lease_id": lease, "fencepost.token": token,
        "fencepost.outcome": "granted"}
    client_acquire = await client_spans.one(f"{LOCKS}/Acquire")
    assert client_acquire.kind == SpanKind.CLIENT and parent_of(client_acquire) == span_id(acquire)
    client_attributes = dict(client_acquire.attributes or {})
    request_id = client_attributes.pop("fencepost.request_id")  # one per call, the same on each attempt
    assert isinstance(request_id, str) and len(request_id) == 32
    assert client_attributes == {
        "rpc.system": "grpc", "rpc.service": LOCKS, "rpc.method": "Acquire", "rpc.grpc.status_code": 0,
        "fencepost.lock.name": "inv:42", "fencepost.lease_id": lease, "fencepost.token": token,
        "fencepost.outcome": "granted"}
    assert client_acquire.status.status_code == StatusCode.UNSET

    server_acquire = await server_spans.one(f"{LOCKS}/Acquire")
    assert server_acquire.kind == SpanKind.SERVER
    assert server_acquire.parent is not None and server_acquire.parent.is_remote
    assert parent_of(server_acquire) == span_id(client_acquire)
    assert trace_id(server_acquire) == trace_id(acquire)
    assert dict(server_acquire.attributes or {}) == {
        "rpc.system": "grpc", "rpc.service": LOCKS, "rpc.method": "Acquire", "rpc.grpc.status_code": 0,
        "fencepost.lock.name": "inv:42", "fencepost.lease_id": lease, "fencepost.token": token,
        "fencepost.request_id": request_id, "fencepost.outcome": "granted"}

    etcd_spans = server_spans.under(server_acquire)
    txns = [s for s in etcd_spans if s.name == "etcdserverpb.KV/Txn"]
    assert txns, [s.name for s in etcd_spans]
    assert {trace_id(s) for s in etcd_spans} == {trace_id(acquire)}
    granted = [s for s in txns if s.attributes.get("fencepost.etcd.op") == "txn"]  # type: ignore[union-attr]
    assert len(granted) == 1, [dict(s.attributes or {}) for s in txns]
    assert granted[0].kind == SpanKind.CLIENT
    assert dict(granted[0].attributes or {}) == {
        "rpc.system": "grpc", "rpc.service": "etcdserverpb.KV", "rpc.method": "Txn", "db.system": "etcd",
        "db.operation": "Txn", "fencepost.etcd.op": "txn", "rpc.grpc.status_code": 0,
        "fencepost.etcd.succeeded": True}

    # The lease grant is part of the acquire; the etcd LeaseGrant under the coordinator's.
    client_grant = await client_spans.one(f"{LOCKS}/LeaseGrant")
    assert parent_of(client_grant) == span_id(acquire)
    assert client_grant.attributes["fencepost.lease_id"] == lease  # type: ignore[index]
    server_grant = await server_spans.one(f"{LOCKS}/LeaseGrant")
    assert parent_of(server_grant) == span_id(client_grant)
    # The etcd LeaseGrant, then the Txn writing the lease's ownership record.
    assert [s.name for s in server_spans.under(server_grant)] == ["etcdserverpb.Lease/LeaseGrant",
                                                                  "etcdserverpb.KV/Txn"]

    release = await client_spans.one("fencepost.release")
    assert release.parent is None and trace_id(release) != trace_id(acquire)
    assert dict(release.attributes or {}) == {"fencepost.lock.name": "inv:42", "fencepost.lease_id": lease,
                                              "fencepost.token": token, "fencepost.outcome": "released"}
    client_release = await client_spans.one(f"{LOCKS}/Release", **{"fencepost.outcome": "released"})
    assert parent_of(client_release) == span_id(release)
    server_release = await server_spans.one(f"{LOCKS}/Release", **{"fencepost.lease_id": lease})
    assert parent_of(server_release) == span_id(client_release)
    assert server_release.attributes["fencepost.outcome"] == "released"  # type: ignore[index]
    assert any(s.name == "etcdserverpb.KV/Txn" for s in server_spans.under(server_release))


async def test_spans_when_calls_are_refused(traced: Coordinator, server_spans: Spans, client_spans: Spans) -> None:
    """A refused call's spans carry the status the caller received and the refusal's reason, never OK: an
    acquire that ran out of time (client and server), a Release with a stale token (server; counted by the
    metrics interceptor too), a try_acquire of a held lock (``held``, not an error)."""
    async with AsyncLockClient(traced.address, tracer_provider=client_spans.provider) as holder_client, \
            AsyncLockClient(traced.address, tracer_provider=client_spans.provider) as other:
        held = await holder_client.acquire("busy", ttl=10.0)
        with pytest.raises(LockTimeout):
            await other.acquire("busy", ttl=10.0, timeout=0.3)
        with pytest.raises(LockHeld):
            await other.try_acquire("busy", ttl=10.0)
        await held.release()

        timed_out = await client_spans.one("fencepost.acquire", **{"fencepost.outcome": "ACQUIRE_TIMEOUT"})
        assert timed_out.status.status_code == StatusCode.ERROR
        call = await client_spans.one(f"{LOCKS}/Acquire", **{"fencepost.outcome": "ACQUIRE_TIMEOUT"})
        assert parent_of(call) == span_id(timed_out)
        assert call.attributes["rpc.grpc.status_code"] == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]  # type: ignore[index]
        assert call.status.status_code == StatusCode.ERROR
        server_call = await server_spans.one(f"{LOCKS}/Acquire", **{"fencepost.outcome": "ACQUIRE_TIMEOUT"})
        assert parent_of(server_call) == span_id(call)
        assert server_call.attributes["rpc.grpc.status_code"] == 4  # type: ignore[index]

        tried = await client_spans.one("fencepost.acquire", **{"fencepost.outcome": "held"})
        assert tried.status.status_code == StatusCode.UNSET
        assert (await client_spans.one(f"{LOCKS}/Acquire", **{"fencepost.outcome": "held"})).attributes[
            "rpc.grpc.status_code"] == 0  # type: ignore[index]

    async with grpc.aio.insecure_channel(traced.address) as channel:
        stub = OwnedStub(channel)
        lease = (await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10))).lease_id
        old = (await stub.Acquire(lock_pb2.AcquireRequest(name="stale", lease_id=lease))).token
        await stub.Release(lock_pb2.ReleaseRequest(name="stale", lease_id=lease, token=old))
        new = (await stub.Acquire(lock_pb2.AcquireRequest(name="stale", lease_id=lease))).token
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Release(lock_pb2.ReleaseRequest(name="stale", lease_id=lease, token=old),
                               metadata=(("traceparent", TRACEPARENT),))
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease))
    stale = await server_spans.one(f"{LOCKS}/Release", **{"fencepost.token": old, "rpc.grpc.status_code": 9})
    assert stale.attributes["fencepost.outcome"] == "STALE_TOKEN"  # type: ignore[index]
    assert format(trace_id(stale), "032x") == TRACE_ID and format(parent_of(stale) or 0, "016x") == PARENT_ID
    assert stale.status.status_code == StatusCode.UNSET  # the caller's error, not the server's
    assert new > old

    async def counted() -> bool:
        return (await scrape(traced.metrics_address)).handled("Release").get("FailedPrecondition") == 1

    await wait_for(counted, 10, 0.02, "the metrics interceptor counting the refused Release")


async def test_sync_client_spans_are_children_of_the_calling_threads_span(
        traced: Coordinator, server_spans: Spans, client_spans: Spans) -> None:
    """The sync client's calls run on its own loop thread, in the caller's context: a span current in the
    calling thread is the parent of fencepost.acquire, and the coordinator's span is in its trace."""
    tracer = client_spans.provider.get_tracer("test")

    def job() -> tuple[int, int]:
        with LockClient(traced.address, tracer_provider=client_spans.provider) as client:
            with tracer.start_as_current_span("job") as span:
                with client.lock("sync-job", ttl=5.0, timeout=5.0) as handle:
                    token = handle.token
            return span.get_span_context().span_id, token

    job_span_id, token = await asyncio.to_thread(job)
    acquire = await client_spans.one("fencepost.acquire")
    assert parent_of(acquire) == job_span_id
    release = await client_spans.one("fencepost.release")
    assert parent_of(release) == job_span_id and release.attributes["fencepost.token"] == token  # type: ignore[index]
    server_acquire = await server_spans.one(f"{LOCKS}/Acquire")
    assert trace_id(server_acquire) == trace_id(acquire)
    assert server_acquire.attributes["fencepost.token"] == token  # type: ignore[index]


async def test_the_clients_own_tasks_are_in_no_callers_trace(traced: Coordinator, client_spans: Spans) -> None:
    """A client connected under an application span does not put its background work in that trace: the
    revocation of a lease left idle is a trace of its own, not a late child of the span that connected."""
    tracer = client_spans.provider.get_tracer("test")
    with tracer.start_as_current_span("app") as app:
        async with AsyncLockClient(traced.address, tracer_provider=client_spans.provider,
                                   max_idle_leases=0) as client:
            async with client.lock("idle-soon", ttl=5.0, timeout=5.0) as handle:
                pass
            revoke = await client_spans.one(f"{LOCKS}/LeaseRevoke", **{"fencepost.lease_id": handle.lease_id})
    assert revoke.parent is None and revoke.attributes["fencepost.outcome"] == "revoked"  # type: ignore[index]
    acquire = await client_spans.one("fencepost.acquire")
    assert parent_of(acquire) == app.get_span_context().span_id


async def test_spans_when_lock_names_are_not_traced(etcd: EmbeddedEtcd, prefix: str, server_spans: Spans,
                                                    client_spans: Spans) -> None:
    """trace_lock_names=False on the coordinator and the client: no span carries a lock name; ids and tokens
    still do."""
    coord = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix,
                        tracer_provider=server_spans.provider, trace_lock_names=False)
    await asyncio.wait_for(coord.start(), 20)
    try:
        async with AsyncLockClient(coord.address, tracer_provider=client_spans.provider,
                                   trace_lock_names=False) as client:
            async with client.lock("customer-1234", ttl=5.0, timeout=5.0) as handle:
                pass
        server_release = await server_spans.one(f"{LOCKS}/Release")
    finally:
        await asyncio.wait_for(coord.stop(grace=0), 20)
    spans = client_spans.finished() + server_spans.finished()
    assert {s.name for s in spans} >= {"fencepost.acquire", "fencepost.release", f"{LOCKS}/Acquire"}
    assert not [s for s in spans if "fencepost.lock.name" in (s.attributes or {})]
    assert not [s for s in spans if "customer-1234" in str(dict(s.attributes or {}))]
    assert server_release.attributes["fencepost.token"] == handle.token  # type: ignore[index]


async def test_no_spans_and_no_metadata_when_the_client_does_not_trace(
        traced: Coordinator, server_spans: Spans, caplog: pytest.LogCaptureFixture) -> None:
    """A client without a tracer provider (the API's default global one) makes no span and sends no
    traceparent: the coordinator's span begins a trace, and the log events of the call carry its trace id."""
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)  # nobody set a global provider
    assert Tracing().tracer() is None
    caplog.set_level(logging.DEBUG, logger="fencepost.coordinator")
    async with AsyncLockClient(traced.address) as client:
        handle = await client.acquire("untraced", ttl=5.0, timeout=5.0)
        await handle.release()
    server_acquire = await server_spans.one(f"{LOCKS}/Acquire")
    assert server_acquire.parent is None
    grants = [r for r in caplog.records if getattr(r, "event", None) == "grant"]
    assert len(grants) == 1
    assert grants[0].event_fields["trace_id"] == format(trace_id(server_acquire), "032x")  # type: ignore[attr-defined]


def test_tracing_when_the_sdk_is_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    """A provider makes a tracer; an SDK provider disabled by OTEL_SDK_DISABLED counts as off."""
    assert Tracing(TracerProvider()).tracer() is not None
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert Tracing(TracerProvider()).tracer() is None


async def test_health_watch_streams_with_tracing_on(traced: Coordinator, server_spans: Spans) -> None:
    """With the tracing interceptor, the health Watch streams each change (SERVING, then NOT_SERVING at
    shutdown), its span stays open while it does, and a cancelled Watch's span says CANCELLED. A health call
    without trace context (a probe) makes no span."""
    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    traced_call = (("traceparent", TRACEPARENT),)
    async with grpc.aio.insecure_channel(traced.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        assert (await health.Check(health_pb2.HealthCheckRequest(service="liveness"), timeout=5)).status == serving
        assert (await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5,
                                   metadata=traced_call)).status in (serving, not_serving)
        cancelled = health.Watch(health_pb2.HealthCheckRequest(service="liveness"), metadata=traced_call)
        assert (await asyncio.wait_for(cancelled.read(), 10)).status == serving
        cancelled.cancel()
        span = await server_spans.one("grpc.health.v1.Health/Watch")
        assert span.attributes["rpc.grpc.status_code"] == grpc.StatusCode.CANCELLED.value[0]  # type: ignore[index]
        assert span.kind == SpanKind.SERVER

        watch = health.Watch(health_pb2.HealthCheckRequest(service=""), metadata=traced_call)
        seen = [(await asyncio.wait_for(watch.read(), 10)).status]
        if seen[-1] != serving:
            seen.append((await asyncio.wait_for(watch.read(), 10)).status)
        assert seen[-1] == serving
        assert len(server_spans.named("grpc.health.v1.Health/Watch")) == 1  # the open one has no span ended yet
        stopping = asyncio.ensure_future(traced.stop(grace=1.0))
        assert (await asyncio.wait_for(watch.read(), 10)).status == not_serving
        await stopping
        check = server_spans.named("grpc.health.v1.Health/Check")
        assert len(check) == 1 and check[0].attributes["rpc.grpc.status_code"] == 0  # type: ignore[index]
        assert format(parent_of(check[0]) or 0, "016x") == PARENT_ID


async def test_etcd_requests_carry_the_trace_context() -> None:
    """Inside a traced call each etcd request is a CLIENT span whose W3C context goes in the request's metadata
    (beside the auth token); a Txn whose answer was lost and its read-back are spans of their own; outside
    a traced call there is neither span nor traceparent."""
    spans = Spans()
    fake = FakeEtcd()
    client = EtcdClient(["127.0.0.1:1"], stubs=fake.stubs(), tracer=spans.provider.get_tracer("test"))
    tracer = spans.provider.get_tracer("test")
    try:
        await client.range(etcdops.count(b"/k/"))
        assert spans.finished() == [] and "traceparent" not in dict(fake.calls[-1][2] or ())
        with tracer.start_as_current_span("call") as call:
            await client.range(etcdops.count(b"/k/"))
            sent = dict(fake.calls[-1][2] or ())
            fake.inject("Txn", grpc.StatusCode.UNAVAILABLE, applied=True)
            put = etcdops.txn([], [etcdops.put(b"/k/a", b"v")])
            result = await client.txn(TxnPlan(put, decide=lambda r: "sent", read_back=[etcdops.get(b"/k/a")],
                                              resolve=lambda r: "read back" if r.responses[0].response_range.kvs
                                              else NOT_APPLIED))
        assert result == "read back"
        ranged, lost, read_back = spans.finished()[:3]
        assert ranged.name == "etcdserverpb.KV/Range" and parent_of(ranged) == call.get_span_context().span_id
        assert sent["traceparent"].startswith(f"00-{trace_id(ranged):032x}-{span_id(ranged):016x}-")
        assert lost.name == read_back.name == "etcdserverpb.KV/Txn"
        assert lost.attributes["rpc.grpc.status_code"] == 14 and lost.status.status_code == StatusCode.ERROR  # type: ignore[index]
        assert lost.attributes["fencepost.etcd.op"] == "txn" and read_back.attributes["fencepost.etcd.op"] == "range"  # type: ignore[index]
        assert read_back.attributes["rpc.grpc.status_code"] == 0  # type: ignore[index]
    finally:
        await client.close()
        spans.shutdown()
