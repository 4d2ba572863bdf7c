"""The coordinator's /metrics: a real etcd, a real coordinator, a real HTTP scrape (the endpoint itself and
``fencepost serve --metrics-listen``: tests/test_metrics_endpoint.py).

Each scrape goes through ``urllib`` and ``prometheus_client.parser``; the
workloads are small enough that every count is known exactly. A call's end
is recorded once grpc.aio has sent its status (an abort sends it, then
raises), so the tests wait for the recorded total before comparing.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from etcd3aio import Etcd3Client

from fencepost.client.v1 import lock_pb2
from fencepost.client.v1.keys import Keys
from fencepost.coordinator.process import main as serve
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.process.embedded import EmbeddedEtcd
from fencepost.coordinator.telemetry.interceptor import GO_CODE_NAMES
from fencepost.coordinator.telemetry.metrics import REFUSAL_REASONS

from .conftest import wait_for
from .metrics_scrape import HEALTH, LOCKS, scrape
from .owned_stub import OwnedStub, with_secret


@pytest.fixture
async def metered(etcd: EmbeddedEtcd, prefix: str) -> AsyncIterator[Coordinator]:
    """A coordinator with ``metrics_listen="127.0.0.1:0"`` over the test's prefix."""
    coord = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix, metrics_listen="127.0.0.1:0")
    await asyncio.wait_for(coord.start(), 20)
    try:
        yield coord
    finally:
        await asyncio.wait_for(coord.stop(grace=0), 20)


class Workload:
    """Calls through the generated stub, tallying what each should be counted as."""

    def __init__(self, coordinator: Coordinator, channel: grpc.aio.Channel) -> None:
        self.coordinator = coordinator
        self.stub = OwnedStub(channel)
        self.channel = channel
        self.handled: collections.Counter[tuple[str, str]] = collections.Counter()  # (method, grpc_code)

    async def call(self, method: str, request: Any, code: grpc.StatusCode = grpc.StatusCode.OK,
                   **kwargs: Any) -> Any:
        """Make a unary call that must end with ``code``; return its response (None when it failed)."""
        self.handled[method, GO_CODE_NAMES[code]] += 1
        try:
            response = await getattr(self.stub, method)(request, **kwargs)
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == code, (method, exc.code(), exc.details())
            return None
        assert code == grpc.StatusCode.OK, (method, "succeeded, expected", code)
        return response

    async def counted(self, method: str, code: str, n: int) -> None:
        """Wait until the coordinator has counted ``n`` calls of ``method`` ended with ``code``."""
        async def done() -> bool:
            return (await scrape(self.coordinator.metrics_address)).handled(method).get(code, 0) == n

        await wait_for(done, 10, 0.02, f"{n} {method} calls counted {code}")

    async def waiting_acquires(self, n: int) -> None:
        """Wait until the coordinator counts ``n`` Acquire calls waiting."""
        async def done() -> bool:
            return (await scrape(self.coordinator.metrics_address)).value("fencepost_waiting_acquires") == n

        await wait_for(done, 10, 0.02, f"{n} waiting acquires")


async def test_metrics_of_a_known_workload(metered: Coordinator, etcd_client: Etcd3Client, prefix: str) -> None:
    """Grants, releases, every refusal, a waited grant, a client deadline, a cancelled call, an aborted
    KeepAlive stream and an etcd error, each counted exactly, gRPC and fencepost metrics alike; holds
    ended by release, expiry, revoke and key deletion, their hold times and hand-offs, the leases kept."""
    async with grpc.aio.insecure_channel(metered.address) as channel:
        w = Workload(metered, channel)
        a = (await w.call("LeaseGrant", lock_pb2.LeaseGrantRequest(ttl_seconds=30))).lease_id
        b = (await w.call("LeaseGrant", lock_pb2.LeaseGrantRequest(ttl_seconds=30))).lease_id
        # etcd Txns the workload makes (a read of several keys is a Txn too, but counted as "range"):
        # each LeaseGrant writes its ownership record in one.
        txns = 2

        for _ in range(3):  # immediate grants
            got = await w.call("Acquire", lock_pb2.AcquireRequest(name="n", lease_id=a, wait_ms=0))
            assert got.acquired
            await w.call("Release", lock_pb2.ReleaseRequest(name="n", lease_id=a, token=got.token))
            txns += 2

        held = await w.call("Acquire", lock_pb2.AcquireRequest(name="h", lease_id=b, wait_ms=0))
        refused = await w.call("Acquire", lock_pb2.AcquireRequest(name="h", lease_id=a, wait_ms=0))
        assert held.acquired and not refused.acquired  # LOCK_HELD
        await w.call("Acquire", lock_pb2.AcquireRequest(name="h", lease_id=a, wait_ms=100),
                     grpc.StatusCode.DEADLINE_EXCEEDED)  # ACQUIRE_TIMEOUT: queued, then withdrawn
        txns += 2 + 2

        waited = asyncio.ensure_future(w.call("Acquire", lock_pb2.AcquireRequest(name="h", lease_id=a,
                                                                                 wait_forever=True)))
        await w.waiting_acquires(1)
        await w.call("Release", lock_pb2.ReleaseRequest(name="h", lease_id=b, token=held.token))
        assert (await waited).acquired
        txns += 1 + 1

        # The client's own deadline: the coordinator's handler is cancelled; the waiter key is withdrawn
        # REATTACH_SECONDS later unless an Acquire of the same lease writes it again (as the next one does).
        await w.call("Acquire", lock_pb2.AcquireRequest(name="h", lease_id=b, wait_forever=True),
                     grpc.StatusCode.DEADLINE_EXCEEDED, timeout=0.5)
        await w.counted("Acquire", "DeadlineExceeded", 2)
        await w.waiting_acquires(0)
        # A call the client cancels while it waits.
        w.handled["Acquire", "Canceled"] += 1
        cancelled = w.stub.Acquire(lock_pb2.AcquireRequest(name="h", lease_id=b, wait_forever=True))
        await w.waiting_acquires(1)
        cancelled.cancel()
        await w.counted("Acquire", "Canceled", 1)
        await w.call("Release", lock_pb2.ReleaseRequest(name="h", lease_id=a, token=(await waited).token))
        txns += 2 + 2 + 1

        counted: list[float | None] = []

        async def txns_counted(n: int) -> bool:
            counted.append((await scrape(metered.metrics_address)).value("fencepost_etcd_request_seconds_count",
                                                                         operation="txn"))
            return counted[-1] == n

        # Both deferred withdrawals ran: the first found the key written again and left it, the second deleted it.
        try:
            await wait_for(lambda: txns_counted(txns), 10, 0.05, "the deferred withdrawals")
        except pytest.fail.Exception:
            pytest.fail(f"the deferred withdrawals: {txns} etcd Txns expected, the last counts seen {counted[-3:]}")

        first = await w.call("Acquire", lock_pb2.AcquireRequest(name="s", lease_id=a, wait_ms=0))
        await w.call("Release", lock_pb2.ReleaseRequest(name="s", lease_id=a, token=first.token))
        second = await w.call("Acquire", lock_pb2.AcquireRequest(name="s", lease_id=a, wait_ms=0))
        await w.call("Release", lock_pb2.ReleaseRequest(name="s", lease_id=a, token=first.token),
                     grpc.StatusCode.FAILED_PRECONDITION)  # STALE_TOKEN
        await w.call("Release", lock_pb2.ReleaseRequest(name="s", lease_id=a, token=second.token))
        await w.call("Release", lock_pb2.ReleaseRequest(name="never", lease_id=a, token=second.token),
                     grpc.StatusCode.FAILED_PRECONDITION)  # NOT_HOLDER
        await w.call("Acquire", lock_pb2.AcquireRequest(name="", lease_id=a, wait_ms=0),
                     grpc.StatusCode.INVALID_ARGUMENT)  # INVALID_FIELD, before etcd
        txns += 6

        # A KeepAlive stream: a keepalive and a watch, then a message that is not a KeepAliveRequest.
        kept = await w.call("Acquire", lock_pb2.AcquireRequest(name="k", lease_id=a, wait_ms=0))
        stream = channel.stream_stream(f"/{LOCKS}/KeepAlive",
                                       response_deserializer=lock_pb2.KeepAliveResponse.FromString)()
        await stream.write(with_secret(lock_pb2.KeepAliveRequest(
            keepalive=lock_pb2.LeaseKeepAlive(lease_id=a, request_id=7))).SerializeToString())
        await stream.write(lock_pb2.KeepAliveRequest(
            watch=lock_pb2.WatchHold(name="k", lease_id=a, token=kept.token)).SerializeToString())
        ack = await stream.read()
        assert ack.keepalive.request_id == 7 and ack.keepalive.ttl_seconds > 0

        async def watched(n: int) -> bool:
            return (await scrape(metered.metrics_address)).value("fencepost_watched_holds") == n

        async def gauges(**want: float) -> bool:
            s = await scrape(metered.metrics_address)
            return all(s.value(f"fencepost_{name}") == value for name, value in want.items())

        await wait_for(lambda: watched(1), 10, 0.02, "one watched hold")
        await wait_for(lambda: gauges(leases=1, holds=1), 10, 0.02, "one lease kept alive, one hold")
        await stream.write(b"\xff\xff")  # wire type 7: protobuf cannot parse it
        assert await stream.code() == grpc.StatusCode.INVALID_ARGUMENT
        await wait_for(lambda: watched(0), 10, 0.02, "no watched hold once the stream ended")
        await wait_for(lambda: gauges(leases=0, holds=1), 10, 0.02, "no lease kept once the stream ended")
        await w.call("Release", lock_pb2.ReleaseRequest(name="k", lease_id=a, token=kept.token))
        txns += 2

        # Holds granted here that end without a Release: the lease of one is never kept alive (etcd's
        # shortest TTL), the lease of another is revoked here, the key of a third is deleted under a live
        # lease; the next grant of that name is a hand-off from that end.
        async def ended(reason: str, n: int) -> bool:
            return (await scrape(metered.metrics_address)).value("fencepost_losses_total", reason=reason) == n

        short = (await w.call("LeaseGrant", lock_pb2.LeaseGrantRequest(ttl_seconds=1))).lease_id
        assert (await w.call("Acquire", lock_pb2.AcquireRequest(name="x", lease_id=short, wait_ms=0))).acquired
        assert await gauges(holds=1)
        await wait_for(lambda: ended("expired", 1), 20, 0.05, "the hold of a lease left to expire ends: expired")
        assert await gauges(holds=0)
        r = (await w.call("LeaseGrant", lock_pb2.LeaseGrantRequest(ttl_seconds=30))).lease_id
        assert (await w.call("Acquire", lock_pb2.AcquireRequest(name="r", lease_id=r, wait_ms=0))).acquired
        await w.call("LeaseRevoke", lock_pb2.LeaseRevokeRequest(lease_id=r))
        await wait_for(lambda: ended("revoked", 1), 10, 0.02, "the hold of a revoked lease ends: revoked")
        assert (await w.call("Acquire", lock_pb2.AcquireRequest(name="d", lease_id=a, wait_ms=0))).acquired
        assert etcd_client.kv is not None
        await etcd_client.kv.delete(Keys(prefix).contender("d", a), timeout=5)
        await wait_for(lambda: ended("key_deleted", 1), 10, 0.02, "a hold whose key was deleted ends: key_deleted")
        then = await w.call("Acquire", lock_pb2.AcquireRequest(name="d", lease_id=b, wait_ms=0))
        await w.call("Release", lock_pb2.ReleaseRequest(name="d", lease_id=b, token=then.token))
        txns += 1 + 1 + 1 + 1 + 1 + 2  # + 2: the ownership records of short and r

        unknown = await w.call("LeaseRevoke", lock_pb2.LeaseRevokeRequest(lease_id=0x7E57_0000_0000_0001))
        assert not unknown.found  # etcd answered NOT_FOUND: an etcd error, not a refusal
        await w.call("LeaseRevoke", lock_pb2.LeaseRevokeRequest(lease_id=a))
        await w.call("LeaseRevoke", lock_pb2.LeaseRevokeRequest(lease_id=b))

    async def all_counted() -> bool:
        s = await scrape(metered.metrics_address)
        return sum(value for (name, labels), value in s.samples.items() if name == "grpc_server_handled_total"
                   and ("grpc_service", LOCKS) in labels) == sum(w.handled.values()) + 1  # + the KeepAlive stream

    await wait_for(all_counted, 10, 0.02, "every call counted")
    s = await scrape(metered.metrics_address)

    # gRPC server metrics, method by method.
    for method in ("LeaseGrant", "LeaseRevoke", "Acquire", "Release", "Describe"):
        want = {code: float(n) for (m, code), n in w.handled.items() if m == method}
        calls = sum(want.values())
        assert s.handled(method) == want, method
        assert s.call("grpc_server_started_total", method) == calls, method
        assert s.call("grpc_server_msg_received_total", method) == calls, method
        assert s.call("grpc_server_msg_sent_total", method) == want.get("OK", 0), method
        assert s.call("grpc_server_handling_seconds_count", method) == calls, method
    assert s.handled("Acquire") == {"OK": 13, "DeadlineExceeded": 2, "Canceled": 1, "InvalidArgument": 1}
    assert s.handled("KeepAlive", "bidi_stream") == {"InvalidArgument": 1}
    assert [s.call(f"grpc_server_{m}", "KeepAlive", "bidi_stream")
            for m in ("started_total", "msg_received_total", "msg_sent_total")] == [1, 3, 1]  # the bad bytes too
    assert s.value("grpc_server_handled_total", grpc_type="unary", grpc_service=HEALTH, grpc_method="Check",
                   grpc_code="DataLoss") == 0  # every series of every method exists from the start

    # fencepost metrics: 12 grants, 9 ended by a Release here, 3 otherwise.
    assert s.value("fencepost_grants_total", prefix="") == 12
    assert s.value("fencepost_acquire_wait_seconds_count", prefix="") == 12
    assert s.value("fencepost_acquire_wait_seconds_bucket", prefix="", le="+Inf") == 12
    assert s.value("fencepost_releases_total") == 9
    assert s.by("fencepost_losses_total", "reason") == {"released": 9, "expired": 1, "revoked": 1, "key_deleted": 1}
    assert s.value("fencepost_hold_seconds_count", prefix="") == 12
    assert s.value("fencepost_holds") == 0
    assert s.value("fencepost_leases") == 0
    # Hand-offs: to the waiter of h (queued); n twice, s, d after its key was deleted (asked once it was free);
    # never the first grant of a name.
    assert s.by("fencepost_handoff_seconds_count", "queued") == {"true": 1, "false": 4}
    assert s.value("fencepost_handoff_seconds_bucket", queued="true", le="1.0") == 1
    assert s.by("fencepost_refusals_total", "reason") == {
        "LOCK_HELD": 1, "ACQUIRE_TIMEOUT": 1, "STALE_TOKEN": 1, "NOT_HOLDER": 1,
        "INVALID_FIELD": 2}  # an Acquire with an empty name, and the KeepAlive message that is no protobuf
    assert {r for (name, labels) in s.samples if name == "fencepost_refusals_total"
            for k, r in labels} == set(REFUSAL_REASONS)
    assert s.value("fencepost_waiting_acquires") == 0
    assert s.value("fencepost_watched_holds") == 0
    assert s.value("fencepost_keepalives_total") == 1
    assert s.value("fencepost_etcd_request_seconds_count", operation="txn") == txns + 1  # + 1: the token record's create-only Txn at the first start
    assert s.value("fencepost_etcd_request_seconds_count", operation="lease_grant") == 4
    assert s.value("fencepost_etcd_request_seconds_count", operation="lease_revoke") == 4
    # Why the expired and key_deleted holds ended: one LeaseTimeToLive each (the revoke was served here);
    # the NOT_HOLDER refusal's, which asks whether the lease lives; and the revoke of an unknown lease, whose
    # ownership check finds no record and asks whether the lease lives (it does not: the revoke goes on).
    assert s.value("fencepost_etcd_request_seconds_count", operation="lease_ttl") == 4
    assert s.value("fencepost_etcd_request_seconds_count", operation="keepalive") == 1
    assert s.by("fencepost_etcd_errors_total", "code") == {"NotFound": 1}
    assert s.value("fencepost_etcd_errors_total", operation="lease_revoke", code="NotFound") == 1
    assert s.value("fencepost_watch_restarts_total") == 0


async def test_metrics_name_prefixes_label_grants_waits_and_holds(etcd: EmbeddedEtcd, prefix: str) -> None:
    """With name prefixes, a grant, its wait and its hold are labelled with the longest prefix its name starts
    with, every other name with ""; every label value exists from the start."""
    coord = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix, metrics_listen="127.0.0.1:0",
                        metrics_name_prefixes=["orders/", "orders/eu/", "orders/"])
    await asyncio.wait_for(coord.start(), 20)
    try:
        s = await scrape(coord.metrics_address)
        labels = {"": 0.0, "orders/": 0.0, "orders/eu/": 0.0}
        assert {p: s.value("fencepost_grants_total", prefix=p) for p in labels} == labels
        async with grpc.aio.insecure_channel(coord.address) as channel:
            w = Workload(coord, channel)
            lease = (await w.call("LeaseGrant", lock_pb2.LeaseGrantRequest(ttl_seconds=30))).lease_id
            for name in ("orders/eu/1", "orders/2", "orders/eu/3", "ordersx", "misc"):
                got = await w.call("Acquire", lock_pb2.AcquireRequest(name=name, lease_id=lease, wait_ms=0))
                await w.call("Release", lock_pb2.ReleaseRequest(name=name, lease_id=lease, token=got.token))
            await w.call("LeaseRevoke", lock_pb2.LeaseRevokeRequest(lease_id=lease))
        s = await scrape(coord.metrics_address)
        want = {"orders/eu/": 2, "orders/": 1, "": 2}
        assert s.by("fencepost_grants_total", "prefix") == want
        assert s.by("fencepost_acquire_wait_seconds_count", "prefix") == want
        assert s.by("fencepost_hold_seconds_count", "prefix") == want
    finally:
        await asyncio.wait_for(coord.stop(grace=0), 20)


def test_coordinator_refuses_name_prefixes_without_metrics(etcd: EmbeddedEtcd) -> None:
    """Name prefixes label metrics: without ``metrics_listen`` they are refused, and so is an empty one."""
    with pytest.raises(ValueError, match="need metrics_listen"):
        Coordinator([etcd.endpoint], listen="127.0.0.1:0", metrics_name_prefixes=["a/"])
    with pytest.raises(ValueError, match="non-empty"):
        Coordinator([etcd.endpoint], listen="127.0.0.1:0", metrics_listen="127.0.0.1:0", metrics_name_prefixes=[""])


@pytest.mark.parametrize(("args", "message"), [
    (["--metrics-name-prefix", "orders/"], "--metrics-name-prefix needs --metrics-listen"),
    (["--metrics-listen", "127.0.0.1:0", "--metrics-name-prefix", ""], "must be a non-empty string"),
    (["--metrics-listen", "127.0.0.1:0", "--metrics-name-prefix", "a\nb"], "has a control character"),
    (["--metrics-listen", "127.0.0.1:0", *[f"--metrics-name-prefix=p{i}/" for i in range(101)]], "at most 100"),
])
def test_serve_when_metrics_name_prefix_is_bad(args: list[str], message: str, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad --metrics-name-prefix exits 2 naming the flag, before anything starts."""
    monkeypatch.delenv("FENCEPOST_METRICS_LISTEN", raising=False)
    monkeypatch.delenv("FENCEPOST_METRICS_NAME_PREFIXES", raising=False)
    assert serve.main(["--etcd-endpoints", "127.0.0.1:2379", *args]) == 2
    err = capsys.readouterr().err
    assert "--metrics-name-prefix" in err and message in err
