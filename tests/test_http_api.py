"""The HTTP/JSON API's envelope (issue 24): paths, verbs and percent-encoding, canonical JSON in and out, the
request's own refusals (unknown path or field, wrong method or media type, too large a body), a Unix socket
listener, every kind of route (leases, locks, elections, semaphores, admin) answered, and a wait in flight
when the coordinator stops. Route matching is unit-tested; the rest runs against a real coordinator."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from fencepost.client.errors import InvalidArgument
from fencepost.client.v1 import lock_pb2
from fencepost.coordinator.http import ROUTES
from fencepost.coordinator.http.routes import match, request_of
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.process.embedded import EmbeddedEtcd

from .conftest import wait_for
from .test_http_twins import start


# ---------------------------------------------------------------- the route table, alone


@pytest.mark.parametrize(("method", "path", "rpc", "fields"), [
    ("POST", "/v1/locks/invoice:42:acquire", "Acquire", {"name": "invoice:42"}),
    ("GET", "/v1/locks/invoice:42", "Describe", {"name": "invoice:42"}),
    ("GET", "/v1/locks/a%2Fb", "Describe", {"name": "a/b"}),
    ("GET", "/v1/locks/x%3Aacquire", "Describe", {"name": "x:acquire"}),
    ("GET", "/v1/locks/x:watch", "KeepAlive", {"name": "x"}),
    ("POST", "/v1/leases/12:keepalive", "LeaseKeepAlive", {"lease_id": "12"}),
    ("DELETE", "/v1/leases/12", "LeaseRevoke", {"lease_id": "12"}),
    ("GET", "/v1/locks", "ListLocks", {}),
    ("GET", "/v1/elections/e%C3%A9:observe", "Observe", {"election": "eé"}),
])
def test_match_when_the_path_is_a_route(method: str, path: str, rpc: str, fields: dict[str, str]) -> None:
    """A path finds its row; the verb is what follows the last ``:``; the name is percent-decoded."""
    found, _ = match(method, path)
    assert found is not None and (found.route.rpc, found.fields) == (rpc, fields)


def test_match_when_the_method_or_path_is_not_served() -> None:
    """A verb's path with another method is refused (with the methods it has), not read as a name; an unknown
    path matches nothing; a name that is not UTF-8 once decoded is INVALID_FIELD naming it."""
    assert match("GET", "/v1/locks/x:acquire") == (None, ["POST"])
    assert match("GET", "/v1/nothing") == (None, [])
    with pytest.raises(InvalidArgument) as raised:
        match("GET", "/v1/locks/%FF")
    assert raised.value.field == "name"


def test_request_when_fields_come_from_body_query_and_path() -> None:
    """JSON names or proto names, strings or numbers for int64, booleans from a query; a field the path fixes
    must agree; an unknown field or a bad value names the field."""
    found, _ = match("POST", "/v1/locks/job:acquire")
    assert found is not None
    request = request_of(found.route, {"leaseId": "7", "wait_ms": 250, "waitForever": False}, found.fields,
                         query=False)
    assert request == lock_pb2.AcquireRequest(name="job", lease_id=7, wait_ms=250)
    query, _ = match("GET", "/v1/locks/job:watch")
    assert query is not None
    assert request_of(query.route, {"leaseId": "7", "token": "9"}, query.fields, query=True).token == 9
    for data, field in (({"name": "other", "leaseId": "7"}, "name"), ({"bogus": 1}, "bogus"),
                        ({"leaseId": "seven"}, "lease_id"), ({"waitForever": "yes"}, "wait_forever")):
        with pytest.raises(InvalidArgument) as raised:
            request_of(found.route, data, found.fields, query="waitForever" in data)
        assert raised.value.field == field, data
    # An enum is a name or a JSON integer (protobuf's parser took these: 1.5 and true read, 0.9 wrote).
    for mode in (1.5, True, "1", 0.9, "LOCK_MODE_READX"):
        with pytest.raises(InvalidArgument) as raised:
            request_of(found.route, {"leaseId": "7", "mode": mode}, found.fields, query=False)
        assert raised.value.field == "mode", mode
    for mode, want in (("LOCK_MODE_READ", 1), (1, 1), (0, 0), ("LOCK_MODE_WRITE", 0), (None, 0)):
        assert request_of(found.route, {"leaseId": "7", "mode": mode}, found.fields, query=False).mode == want


def test_every_rpc_has_a_route() -> None:
    """Every unary RPC of LockService is reachable over HTTP; KeepAlive through its watches, Observe too."""
    methods = {m.name for m in lock_pb2.DESCRIPTOR.services_by_name["LockService"].methods}
    assert {route.rpc for route in ROUTES} == methods


# ---------------------------------------------------------------- against a coordinator


class Http:
    """A session on a coordinator's HTTP API: ``call`` returns (status, JSON body, headers)."""

    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session = session
        self.base = base

    async def call(self, method: str, path: str, body: Any = None, secret: str | None = None,
                   headers: dict[str, str] | None = None, **options: Any) -> tuple[int, Any, Any]:
        headers = {**({"Fencepost-Lease-Secret": secret} if secret else {}), **(headers or {})}
        async with self.session.request(method, self.base + path, json=body, headers=headers, **options) as answer:
            return answer.status, await answer.json(content_type=None), answer.headers

    async def ok(self, method: str, path: str, body: Any = None, secret: str | None = None) -> Any:
        status, answer, _ = await self.call(method, path, body, secret)
        assert status == 200, answer
        return answer


@pytest.fixture
async def served(etcd: EmbeddedEtcd, prefix: str) -> AsyncIterator[tuple[Coordinator, Http]]:
    coordinator = await start(etcd, prefix)
    try:
        async with aiohttp.ClientSession() as session:
            yield coordinator, Http(session, f"http://{coordinator.http_address}")
    finally:
        await asyncio.wait_for(coordinator.stop(grace=0), 20)


async def test_refusals_of_the_request_itself_are_status_bodies(served: tuple[Coordinator, Http]) -> None:
    """404 (no route), 405 with Allow, 415 (not JSON), 400 (a body that is not an object, an unknown field, a bad
    Fencepost-Timeout-Ms), 413 (past --max-message-bytes): each a google.rpc.Status body."""
    coordinator, http = served
    status, body, _ = await http.call("GET", "/v1/nowhere")
    assert (status, body["code"]) == (404, 5)
    status, body, headers = await http.call("GET", "/v1/locks/x:acquire")
    assert (status, body["code"], headers["Allow"]) == (405, 12, "POST")
    status, body, _ = await http.call("POST", "/v1/leases", data=b'{"ttlSeconds": 5}')
    assert status == 415 and "application/json" in body["message"]
    status, body, _ = await http.call("POST", "/v1/leases", [5])
    assert status == 400 and body["details"][0]["reason"] == "INVALID_FIELD"
    status, body, _ = await http.call("POST", "/v1/leases", {"ttl": 5})
    assert status == 400 and body["details"][0]["metadata"]["field"] == "ttl"
    status, body, _ = await http.call("POST", "/v1/leases", {"pad": "x" * coordinator.limits.max_message_bytes})
    assert status == 413 and body["code"] == 8
    status, body, _ = await http.call("GET", "/v1/locks/x", headers={"Fencepost-Timeout-Ms": "soon"})
    assert status == 400 and body["details"][0]["metadata"]["field"] == "Fencepost-Timeout-Ms"
    # A newline in a name is refused naming it, as every other control character is (it is not "no route").
    status, body, _ = await http.call("GET", "/v1/locks/a%0Ab")
    assert status == 400 and body["details"][0]["metadata"]["field"] == "name", body
    # A member given twice is refused (not the last one taken); a body that is not an object says what it is.
    status, body, _ = await http.call("POST", "/v1/leases", data=b'{"ttlSeconds": 10, "ttlSeconds": 20}',
                                      headers={"Content-Type": "application/json"})
    assert status == 400 and body["details"][0]["metadata"]["field"] == "ttlSeconds", body
    status, body, _ = await http.call("POST", "/v1/leases", data=b"null", headers={"Content-Type": "application/json"})
    assert status == 400 and body["message"].endswith("not null"), body


async def test_every_kind_of_route_is_answered(served: tuple[Coordinator, Http]) -> None:
    """A lease renewed and revoked; a lock acquired, described, listed, released; an election campaigned,
    proclaimed, led and resigned; a semaphore permit acquired, described, released; ServerInfo. Answers carry
    every field, int64 as strings, bytes as base64."""
    _, http = served
    lease = await http.ok("POST", "/v1/leases", {"ttlSeconds": 30})
    lid, secret = lease["leaseId"], lease["leaseSecret"]
    assert (await http.ok("POST", f"/v1/leases/{lid}:keepalive", {}, secret))["ttlSeconds"] == "30"
    held = await http.ok("POST", "/v1/locks/a%2Fb:acquire", {"leaseId": lid}, secret)
    assert held["acquired"] is True and int(held["token"]) > 0
    described = await http.ok("GET", "/v1/locks/a%2Fb")
    assert described["holder"] == {"leaseId": lid, "token": held["token"], "read": False} and described["waiters"] == []
    listed = await http.ok("GET", "/v1/locks?prefix=a%2F&pageSize=5")
    assert [lock["name"] for lock in listed["locks"]] == ["a/b"] and listed["nextPageToken"] == ""
    await http.ok("POST", "/v1/locks/a%2Fb:release", {"leaseId": lid, "token": held["token"]}, secret)
    assert (await http.ok("GET", "/v1/locks/a%2Fb"))["held"] is False
    value = base64.b64encode(b"node-1").decode()
    led = await http.ok("POST", "/v1/elections/chair:campaign", {"leaseId": lid, "value": value}, secret)
    assert led["elected"] is True
    await http.ok("POST", "/v1/elections/chair:proclaim", {"leaseId": lid, "token": led["token"],
                                                          "value": base64.b64encode(b"node-2").decode()}, secret)
    assert (await http.ok("GET", "/v1/elections/chair"))["leader"]["value"] == base64.b64encode(b"node-2").decode()
    assert (await http.ok("POST", "/v1/elections/chair:resign", {"leaseId": lid, "token": led["token"]},
                          secret))["found"] is True
    permit = await http.ok("POST", "/v1/semaphores/pool:acquire", {"leaseId": lid, "permits": 2}, secret)
    assert permit["acquired"] is True and permit["slot"] == 0
    assert (await http.ok("GET", "/v1/semaphores/pool"))["permits"] == 2
    await http.ok("POST", "/v1/semaphores/pool:release", {"leaseId": lid, "slot": 0, "token": permit["token"]},
                  secret)
    assert (await http.ok("GET", "/v1/server"))["serving"] is True
    assert (await http.ok("DELETE", f"/v1/leases/{lid}", None, secret))["found"] is True


async def test_read_holds_over_http(served: tuple[Coordinator, Http]) -> None:
    """Two leases read one lock at once with ``"mode": "LOCK_MODE_READ"``; a try-once writer is refused; a read
    hold is released with its mode (without it: NOT_HOLDER), and ListLocks shows both readers."""
    _, http = served
    leases = [await http.ok("POST", "/v1/leases", {"ttlSeconds": 30}) for _ in range(3)]
    reads = [await http.ok("POST", "/v1/locks/r:acquire", {"leaseId": lease["leaseId"], "mode": "LOCK_MODE_READ"},
                           lease["leaseSecret"]) for lease in leases[:2]]
    assert all(read["acquired"] for read in reads)
    refused = await http.ok("POST", "/v1/locks/r:acquire", {"leaseId": leases[2]["leaseId"]},
                            leases[2]["leaseSecret"])
    assert refused["acquired"] is False
    listed = await http.ok("GET", "/v1/locks?prefix=r")
    assert [(int(lock["holderCount"]), int(lock.get("waiterCount", 0))) for lock in listed["locks"]] == [(2, 0)]
    status, body, _ = await http.call("POST", "/v1/locks/r:release", {"leaseId": leases[0]["leaseId"],
                                                                      "token": reads[0]["token"]},
                                      leases[0]["leaseSecret"])
    assert status == 400 and "NOT_HOLDER" in str(body)  # FAILED_PRECONDITION
    for lease, read in zip(leases, reads):
        await http.ok("POST", "/v1/locks/r:release", {"leaseId": lease["leaseId"], "token": read["token"],
                                                      "mode": "LOCK_MODE_READ"}, lease["leaseSecret"])
    assert (await http.ok("GET", "/v1/locks/r"))["held"] is False


async def test_a_wait_in_flight_when_the_coordinator_stops_is_withdrawn(etcd: EmbeddedEtcd, prefix: str) -> None:
    """Stopping the coordinator ends an HTTP Acquire still waiting (its client sees the connection end) and
    withdraws its place: nothing of it is left in the queue."""
    coordinator = await start(etcd, prefix)
    other = await start(etcd, prefix)
    try:
        async with aiohttp.ClientSession() as session:
            http = Http(session, f"http://{coordinator.http_address}")
            holder = await http.ok("POST", "/v1/leases", {"ttlSeconds": 30})
            waiter = await http.ok("POST", "/v1/leases", {"ttlSeconds": 30})
            await http.ok("POST", "/v1/locks/q:acquire", {"leaseId": holder["leaseId"]}, holder["leaseSecret"])
            waiting = asyncio.ensure_future(http.call("POST", "/v1/locks/q:acquire", {
                "leaseId": waiter["leaseId"], "waitMs": 60_000}, waiter["leaseSecret"]))
            look = Http(session, f"http://{other.http_address}")

            async def waiters() -> int:
                return int((await look.ok("GET", "/v1/locks/q"))["waiterCount"])

            await wait_for(lambda: _is(waiters(), 1), 10, what="the HTTP waiter queued")
            await coordinator.stop(0.2)
            with pytest.raises(aiohttp.ClientError):
                await waiting
            assert await waiters() == 0  # withdrawn before the stop returned
            for lease in (holder, waiter):
                await look.ok("DELETE", f"/v1/leases/{lease['leaseId']}", None, lease["leaseSecret"])
    finally:
        await asyncio.gather(coordinator.stop(0), other.stop(0))


async def _is(count: Any, expected: int) -> bool:
    return bool(await count == expected)


async def test_unix_socket_listener_serves_the_api(etcd: EmbeddedEtcd, prefix: str, tmp_path: Path) -> None:
    """``--http-listen unix:/PATH``: the API on a Unix socket (curl --unix-socket), claimed like the gRPC one."""
    path = tmp_path / "http.sock"
    coordinator = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix, http_listen=f"unix:{path}")
    await asyncio.wait_for(coordinator.start(), 20)
    try:
        assert coordinator.http_address == f"unix:{path}"
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(path))) as session:
            async with session.get("http://fencepost/v1/locks/probe") as answer:
                assert answer.status == 200 and (await answer.json())["held"] is False
    finally:
        await coordinator.stop(0)


async def test_http_calls_are_counted_traced_and_logged_as_their_rpcs(etcd: EmbeddedEtcd, prefix: str,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """An HTTP Acquire and a refused Release are counted in grpc_server_handled_total under their RPCs (OK,
    FailedPrecondition), each is a SERVER span whose parent is the request's traceparent, and the refusal is one
    ``refusal`` log event and one fencepost_refusals_total, as over gRPC."""
    import logging

    from .metrics_scrape import scrape
    from .trace_spans import LOCKS, PARENT_ID, TRACE_ID, TRACEPARENT, Spans, parent_of, trace_id

    caplog.set_level(logging.INFO, "fencepost.coordinator.api")
    spans = Spans()
    coordinator = await start(etcd, prefix, metrics_listen="127.0.0.1:0", tracer_provider=spans.provider)
    try:
        async with aiohttp.ClientSession(headers={"traceparent": TRACEPARENT}) as session:
            http = Http(session, f"http://{coordinator.http_address}")
            lease = await http.ok("POST", "/v1/leases", {"ttlSeconds": 30})
            await http.ok("POST", "/v1/locks/counted:acquire", {"leaseId": lease["leaseId"]}, lease["leaseSecret"])
            status, _, _ = await http.call("POST", "/v1/locks/counted:release", {
                "leaseId": lease["leaseId"], "token": "1"}, lease["leaseSecret"])
            assert status == 400
            await http.ok("DELETE", f"/v1/leases/{lease['leaseId']}", None, lease["leaseSecret"])
        metrics = await scrape(coordinator.metrics_address)
        assert metrics.handled("Acquire") == {"OK": 1.0}
        assert metrics.handled("Release") == {"FailedPrecondition": 1.0}
        assert metrics.value("fencepost_refusals_total", reason="STALE_TOKEN") == 1.0
        acquire = await spans.one(f"{LOCKS}/Acquire")
        assert format(trace_id(acquire), "032x") == TRACE_ID
        assert format(parent_of(acquire) or 0, "016x") == PARENT_ID
        assert acquire.attributes is not None and acquire.attributes["fencepost.lock.name"] == "counted"
        refusals = [r for r in caplog.records if getattr(r, "event", None) == "refusal"]
        assert [r.event_fields["call"] for r in refusals] == ["Release"]  # type: ignore[attr-defined]
        assert refusals[0].event_fields["trace_id"] == TRACE_ID  # type: ignore[attr-defined]
    finally:
        await coordinator.stop(0)
        spans.shutdown()


async def test_a_grpc_client_pointed_at_the_http_port_is_told_so(served: tuple[Coordinator, Http]) -> None:
    """The Python client (and the CLI, which uses it) dialled at the HTTP port fails with Unavailable whose
    message names the HTTP port, not only gRPC's "Trying to connect an http1.x server"."""
    from fencepost.client import AsyncLockClient
    from fencepost.client.errors import Unavailable

    _, http = served
    with pytest.raises(Unavailable) as raised:
        async with AsyncLockClient(http.base.removeprefix("http://"), connect_timeout=1.0) as client:
            await client.acquire("x", ttl=5, timeout=1.0)
    assert "--http-listen" in str(raised.value), raised.value
