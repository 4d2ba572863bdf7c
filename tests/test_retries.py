"""Retries safe to repeat (issue 13, item 4): request ids and request records, against a real etcd.

The done-when test: a server interceptor lets a call through to the real
LockService and LOSES ITS ANSWER (the caller sees UNAVAILABLE, as after a
broken connection), for the first Acquire, the first Release, and the first
Withdraw of a waiting Acquire the client gave up; the client retries each
with the same request id, and the outcome is one grant, one release and no
waiter key left in etcd. Calls on the KeepAlive stream are off in these
clients (``stream_calls=False``): the interceptor sees unary calls only.
The request record store itself (:mod:`fencepost.coordinator.recipes.requests`):
tests/test_request_records.py.
"""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio
import pytest
from etcd3aio import Etcd3Client

from fencepost.client import AsyncLockClient
from fencepost.client.v1 import lock_pb2_grpc
from fencepost.client.v1.keys import Keys
from fencepost.coordinator.admission.access import Access, Policy
from fencepost.coordinator.api.service import LockService
from fencepost.coordinator.etcd import EtcdClient
from fencepost.coordinator.process.coordinator import SERVER_OPTIONS
from fencepost.coordinator.recipes.lease import Leases
from fencepost.coordinator.recipes.lock import LockManager
from fencepost.coordinator.recipes.watch import DeleteWatcher

from .conftest import describe_waiters_is, list_keys, wait_for


#: Every caller may do everything (AdminRevoke needs a policy that grants "admin").
OPEN_POLICY = """
[[allow]]
anonymous = true
actions = ["acquire", "release", "describe", "admin"]
names = ["*"]
"""


class LoseAnswers(grpc.aio.ServerInterceptor):
    """Lets unary calls through to the servicer, and loses the answer of the next ``n`` calls of a method.

    A lost answer: the handler ran to its end (its change is made), then the
    call ends with UNAVAILABLE instead of the response.
    """

    def __init__(self) -> None:
        self._lose: collections.Counter[str] = collections.Counter()
        self._silently: set[str] = set()  # methods whose lost answers never come (the caller's deadline ends them)
        #: method -> [(request, response, lost)] of each call whose handler returned, in order.
        self.calls: dict[str, list[tuple[Any, Any, bool]]] = collections.defaultdict(list)
        self._changed = asyncio.Event()

    def lose(self, method: str, n: int = 1, *, silently: bool = False) -> None:
        """Lose the answers of the next ``n`` calls of ``method`` (``"Release"``, ...) that succeed: with
        UNAVAILABLE, or ``silently`` (no answer at all: the caller's deadline ends the call)."""
        self._lose[method] += n
        if silently:
            self._silently.add(method)

    async def answered(self, method: str, n: int, timeout: float = 10.0) -> None:
        """Wait until ``n`` calls of ``method`` had their answer delivered (not lost)."""
        async with asyncio.timeout(timeout):
            while sum(1 for *_, lost in self.calls[method] if not lost) < n:
                self._changed.clear()
                await self._changed.wait()

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if handler is None or handler.unary_unary is None:
            return handler
        method = details.method.rsplit("/", 1)[-1]
        inner = handler.unary_unary

        async def lossy(request: Any, context: grpc.aio.ServicerContext) -> Any:
            response = await inner(request, context)
            lost = self._lose[method] > 0
            if lost:
                self._lose[method] -= 1
            self.calls[method].append((request, response, lost))
            self._changed.set()
            if lost and method in self._silently:
                await asyncio.Event().wait()  # never answered: cancelled at the caller's deadline
            if lost:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "the answer was lost (test)")
            return response

        return grpc.unary_unary_rpc_method_handler(lossy, request_deserializer=handler.request_deserializer,
                                                   response_serializer=handler.response_serializer)


class LossyServer:
    """The real LockService (with a policy granting all) behind :class:`LoseAnswers`, on 127.0.0.1:0.

    Waiter keys of Acquires that end without an answer are kept 60 s (not 2 s), so that only a
    Withdraw can delete them within a test.
    """

    def __init__(self, etcd_endpoint: str, prefix: str) -> None:
        self.keys = Keys(prefix)
        self.etcd = EtcdClient([etcd_endpoint])
        self.watcher = DeleteWatcher(self.etcd, self.keys)
        self.locks = LockManager(self.etcd, self.keys, self.watcher, reattach_seconds=60.0)
        self.service = LockService(Leases(self.etcd), self.locks, self.watcher, self.keys,
                                   access=Access(Policy.from_text(OPEN_POLICY)))
        self.lossy = LoseAnswers()
        self.server = grpc.aio.server(options=SERVER_OPTIONS, interceptors=[self.lossy])
        lock_pb2_grpc.add_LockServiceServicer_to_server(self.service, self.server)
        self.address = ""

    async def start(self) -> None:
        await self.etcd.connect()
        self.watcher.start()
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        self.address = f"127.0.0.1:{port}"

    async def close(self) -> None:
        self.service.enter_graceful_shutdown()
        await self.server.stop(0)
        await self.service.close()
        await self.locks.close()
        await self.watcher.close()
        await self.etcd.close()


@pytest.fixture
async def lossy(etcd: Any, prefix: str) -> AsyncIterator[LossyServer]:
    server = LossyServer(etcd.endpoint, prefix)
    await server.start()
    try:
        yield server
    finally:
        await server.close()


def _client(server: LossyServer) -> AsyncLockClient:
    return AsyncLockClient(server.address, stream_calls=False, connect_timeout=5.0)


# ---------------------------------------------------------------- the done-when test


async def test_acquire_whose_answer_is_lost_is_granted_once(lossy: LossyServer, prefix: str,
                                                            etcd_client: Etcd3Client) -> None:
    """An Acquire whose grant answer is lost is retried with the same request id and gets the same grant."""
    lossy.lossy.lose("Acquire")
    async with _client(lossy) as client:
        handle = await client.acquire("retried-acquire", ttl=10.0, timeout=5.0)
        calls = lossy.lossy.calls["Acquire"]
        assert [lost for *_, lost in calls] == [True, False]
        (first, lost_answer, _), (retry, answer, _) = calls
        assert first.request_id and retry.request_id == first.request_id
        assert lost_answer.acquired and lost_answer.token == answer.token == handle.token
        keys = await list_keys(etcd_client, prefix)
        assert keys == [lossy.keys.contender("retried-acquire", handle.lease_id)]  # one key: one grant
        assert (await etcd_client.kv.get(keys[0], timeout=5)).kvs[0].create_revision == handle.token
        await handle.release()
    assert await list_keys(etcd_client, prefix) == []


async def test_release_whose_answer_is_lost_answers_ok_and_the_next_waiter_gets_the_lock(
        lossy: LossyServer, prefix: str, etcd_client: Etcd3Client) -> None:
    """A Release whose answer is lost is retried with the same request id and answers OK (not NotHolder):
    the lock was released once and the next waiter is granted."""
    name = "retried-release"
    async with _client(lossy) as holder_client, _client(lossy) as waiter_client:
        handle = await holder_client.acquire(name, ttl=10.0, timeout=5.0)
        waiting = asyncio.create_task(waiter_client.acquire(name, ttl=10.0, timeout=15.0))
        stub = lock_pb2_grpc.LockServiceStub(holder_client._transport.channel)
        await wait_for(lambda: describe_waiters_is(stub, name, 1), 10, what="the waiter to queue")
        lossy.lossy.lose("Release")
        await handle.release()  # raises NotHolder if the retry did the release again
        assert handle.released
        calls = lossy.lossy.calls["Release"]
        assert [lost for *_, lost in calls] == [True, False]
        (first, lost_answer, _), (retry, answer, _) = calls
        assert first.request_id and retry.request_id == first.request_id
        assert answer.revision == lost_answer.revision  # the retry answered from the first attempt's record
        successor = await asyncio.wait_for(waiting, 10)
        assert successor.token > handle.token
        assert await list_keys(etcd_client, prefix) == [lossy.keys.contender(name, successor.lease_id)]
        await successor.release()


async def test_resign_whose_answer_is_lost_answers_ok_and_the_next_candidate_leads(
        lossy: LossyServer, prefix: str, etcd_client: Etcd3Client) -> None:
    """A Resign whose answer is lost is retried with the same request id and answers OK (not NotHolder):
    one resignation, and the next candidate leads with a larger token."""
    async with _client(lossy) as leader_client, _client(lossy) as candidate_client:
        leadership = await leader_client.campaign("retried-resign", b"a", ttl=10.0, timeout=5.0)
        waiting = asyncio.create_task(candidate_client.campaign("retried-resign", b"b", ttl=10.0, timeout=15.0))
        await lossy.lossy.answered("LeaseGrant", 2)
        lossy.lossy.lose("Resign")
        await leadership.resign()  # raises NotHolder if the retry resigned again
        calls = lossy.lossy.calls["Resign"]
        assert [lost for *_, lost in calls] == [True, False]
        (first, lost_answer, _), (retry, answer, _) = calls
        assert first.request_id and retry.request_id == first.request_id
        assert answer.revision == lost_answer.revision
        successor = await asyncio.wait_for(waiting, 10)
        assert successor.token > leadership.token
        await successor.resign()
    assert await list_keys(etcd_client, prefix) == []


async def test_release_permit_whose_answer_is_lost_answers_ok_and_frees_the_slot(
        lossy: LossyServer, prefix: str, etcd_client: Etcd3Client) -> None:
    """A ReleasePermit whose answer is lost is retried with the same request id and answers OK: one release,
    and the next contender gets the slot with a larger token."""
    async with _client(lossy) as holder_client, _client(lossy) as waiter_client:
        permit = await holder_client.semaphore("retried-permit", 1, ttl=10.0).acquire(timeout=5.0)
        waiting = asyncio.create_task(waiter_client.semaphore("retried-permit", 1, ttl=10.0).acquire(timeout=15.0))
        await lossy.lossy.answered("LeaseGrant", 2)
        lossy.lossy.lose("ReleasePermit")
        await permit.release()
        calls = lossy.lossy.calls["ReleasePermit"]
        assert [lost for *_, lost in calls] == [True, False]
        (first, lost_answer, _), (retry, answer, _) = calls
        assert first.request_id and retry.request_id == first.request_id
        assert answer.revision == lost_answer.revision
        successor = await asyncio.wait_for(waiting, 10)
        assert successor.slot == permit.slot == 0 and successor.token > permit.token
        await successor.release()


async def test_abandoned_wait_whose_withdraw_answer_is_lost_leaves_no_waiter_key(
        lossy: LossyServer, prefix: str, etcd_client: Etcd3Client) -> None:
    """A waiting Acquire the client gives up is withdrawn; the Withdraw whose answer is lost is retried
    and no waiter key stays in etcd (under a lease the client keeps alive)."""
    name = "retried-withdraw"
    async with _client(lossy) as holder_client, _client(lossy) as waiter_client:
        handle = await holder_client.acquire(name, ttl=10.0, timeout=5.0)
        other = await waiter_client.acquire("keeps-the-lease-alive", ttl=10.0, timeout=5.0)
        waiting = asyncio.create_task(waiter_client.acquire(name, ttl=10.0, timeout=30.0))
        stub = lock_pb2_grpc.LockServiceStub(holder_client._transport.channel)
        await wait_for(lambda: describe_waiters_is(stub, name, 1), 10, what="the waiter to queue")
        waiter_key = lossy.keys.contender(name, other.lease_id)
        assert waiter_key in await list_keys(etcd_client, prefix)
        lossy.lossy.lose("Withdraw")
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await lossy.lossy.answered("Withdraw", 1)
        calls = lossy.lossy.calls["Withdraw"]
        assert [lost for *_, lost in calls] == [True, False]
        (first, lost_answer, _), (retry, answer, _) = calls
        assert first.request_id and retry.request_id == first.request_id
        assert lost_answer.found and not lost_answer.held and not answer.found
        # Read etcd directly: the holder's key and the other lock's, no waiter key (the lease lives on).
        assert sorted(await list_keys(etcd_client, prefix)) == sorted(
            [lossy.keys.contender(name, handle.lease_id), lossy.keys.contender("keeps-the-lease-alive",
                                                                                other.lease_id)])
        assert not other.lost.is_set()
        await other.release()
        await handle.release()


async def test_admin_revoke_whose_answer_is_lost_does_not_revoke_the_next_holder(lossy: LossyServer) -> None:
    """An AdminRevoke whose answer is lost is retried with the same request id and answers as the first:
    the holder it revoked is named again, and the next holder keeps the lock."""
    name = "retried-revoke"
    async with _client(lossy) as first_client, _client(lossy) as second_client, _client(lossy) as admin:
        first = await first_client.acquire(name, ttl=10.0, timeout=5.0)
        waiting = asyncio.create_task(second_client.acquire(name, ttl=10.0, timeout=15.0))
        stub = lock_pb2_grpc.LockServiceStub(first_client._transport.channel)
        await wait_for(lambda: describe_waiters_is(stub, name, 1), 10, what="the waiter to queue")
        lossy.lossy.lose("AdminRevoke")
        revoked = await admin.admin_revoke(name)
        assert (revoked.revoked, revoked.lease_id, revoked.token) == (True, first.lease_id, first.token)
        second = await asyncio.wait_for(waiting, 10)
        calls = lossy.lossy.calls["AdminRevoke"]
        assert [lost for *_, lost in calls] == [True, False]
        assert calls[0][0].request_id and calls[1][0].request_id == calls[0][0].request_id
        assert not second.lost.is_set()
        assert (await admin.describe(name)).holder_token == second.token  # the next holder was not revoked
        await second.release()


async def test_cli_release_and_admin_revoke_whose_answers_are_lost(lossy: LossyServer) -> None:
    """``fencepost release`` and ``fencepost admin revoke`` retry after a lost answer with the same request
    id: release exits 0 (not 6: NOT_HOLDER), revoke names the lease it revoked, not the next holder's."""
    from .cli_helpers import run_cli

    async with _client(lossy) as first_client, _client(lossy) as second_client:
        first = await first_client.acquire("cli-retries", ttl=10.0, timeout=5.0)
        lossy.lossy.lose("Release")
        released = await run_cli("release", "cli-retries", "--lease-id", str(first.lease_id), "--token",
                                 str(first.token), "--lease-secret", first.lease_secret, "--address", lossy.address)
        assert released.rc == 0, released
        calls = lossy.lossy.calls["Release"]
        assert [lost for *_, lost in calls] == [True, False] and calls[0][0].request_id == calls[1][0].request_id
        second = await second_client.acquire("cli-retries", ttl=10.0, timeout=5.0)
        third = asyncio.create_task(first_client.acquire("cli-retries", ttl=10.0, timeout=15.0))
        stub = lock_pb2_grpc.LockServiceStub(first_client._transport.channel)
        await wait_for(lambda: describe_waiters_is(stub, "cli-retries", 1), 10, what="the waiter to queue")
        lossy.lossy.lose("AdminRevoke")
        revoked = await run_cli("admin", "revoke", "cli-retries", "--json", "--address", lossy.address)
        assert revoked.rc == 0, revoked
        assert json.loads(revoked.out)["lease_id"] == second.lease_id
        assert [lost for *_, lost in lossy.lossy.calls["AdminRevoke"]] == [True, False]
        holder = await asyncio.wait_for(third, 10)
        assert (await second_client.describe("cli-retries")).holder_token == holder.token  # not revoked
        await holder.release()


# ---------------------------------------------------------------- answers that never come (issue 25, item 10)


async def test_release_whose_answer_never_comes_is_asked_again_and_answers_ok(
        lossy: LossyServer, prefix: str, etcd_client: Etcd3Client) -> None:
    """A Release applied by the coordinator whose answer never comes is sent again with the same request id
    once its attempt's time (a third of connect_timeout) passed, and answers OK from the first attempt's record:
    well within the call's time (before: LockTimeout("Deadline Exceeded") after the whole timeout)."""
    async with _client(lossy) as client:
        handle = await client.acquire("silent-release", ttl=10.0, timeout=5.0)
        lossy.lossy.lose("Release", silently=True)
        started = asyncio.get_running_loop().time()
        await handle.release()
        assert handle.released
        assert asyncio.get_running_loop().time() - started < 5.0  # connect_timeout: the call's own time
        calls = lossy.lossy.calls["Release"]
        assert [lost for *_, lost in calls] == [True, False]
        assert calls[0][0].request_id and calls[1][0].request_id == calls[0][0].request_id
        assert calls[1][1].revision == calls[0][1].revision  # answered from the first attempt's record
    assert await list_keys(etcd_client, prefix) == []


async def test_admin_revoke_and_release_whose_answers_never_come_raise_outcome_unknown(
        lossy: LossyServer) -> None:
    """An AdminRevoke and a Release applied by the coordinator whose answers never come, to any attempt, raise
    OutcomeUnknown (an Unavailable naming the method and the request id every attempt carried), not
    LockTimeout; the revoke did happen (the holder lost its lease), and so did the release."""
    from fencepost.client import LockTimeout, OutcomeUnknown

    async with _client(lossy) as holder_client, _client(lossy) as admin:
        held = await holder_client.acquire("silent-revoke", ttl=10.0, timeout=5.0)
        lossy.lossy.lose("AdminRevoke", 10, silently=True)
        with pytest.raises(OutcomeUnknown) as unknown:
            await admin.admin_revoke("silent-revoke")
        assert not isinstance(unknown.value, LockTimeout)
        calls = lossy.lossy.calls["AdminRevoke"]
        assert len(calls) >= 2 and {c[0].request_id for c in calls} == {unknown.value.request_id}
        assert unknown.value.method == "AdminRevoke" and unknown.value.reason == "OUTCOME_UNKNOWN"
        assert calls[0][1].revoked and calls[0][1].lease_id == held.lease_id
        await asyncio.wait_for(held.lost.wait(), 15)  # it was applied

        again = await holder_client.acquire("silent-release", ttl=10.0, timeout=5.0)
        lossy.lossy.lose("Release", 10, silently=True)
        with pytest.raises(OutcomeUnknown) as released:
            await again.release()
        assert released.value.method == "Release" and released.value.name == "silent-release"
        assert (await admin.describe("silent-release")).holder_token == 0  # applied: the lock is free


async def test_cli_release_whose_answers_never_come_exits_7(lossy: LossyServer) -> None:
    """``fencepost release`` whose every answer is lost exits 7 (outcome unknown), naming the request id."""
    from fencepost.client.cli.common import EXIT_OUTCOME_UNKNOWN

    from .cli_helpers import run_cli

    async with _client(lossy) as client:
        held = await client.acquire("cli-silent", ttl=10.0, timeout=5.0)
        lossy.lossy.lose("Release", 100, silently=True)
        released = await run_cli("release", "cli-silent", "--lease-id", str(held.lease_id), "--token",
                                 str(held.token), "--lease-secret", held.lease_secret, "--address", lossy.address)
        assert released.rc == EXIT_OUTCOME_UNKNOWN == 7, released
        request_id = lossy.lossy.calls["Release"][0][0].request_id
        assert "outcome unknown" in released.err and request_id in released.err, released
