"""Administration that fences (issue 9): AdminRevoke and ListSessions on a real coordinator with mTLS and an
access policy, the `fencepost admin revoke` and `fencepost admin sessions` commands against it, and the refusal
of admin calls on a coordinator without a policy."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import trustme

from fencepost.client import AccessDenied, AsyncLockClient, InvalidArgument, LockClient, Revoked, Session, TlsConfig
from fencepost.client.v1 import details, lock_pb2
from fencepost.coordinator.admission.access import Policy
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.process.embedded import EmbeddedEtcd
from fencepost.coordinator.process.tls import ServerTls

from .cli_helpers import run_cli
from .client_identities import BILLING, WORKER, Identity, spiffe_certificate, write_identity
from .conftest import describe_waiters_is, wait_for
from .owned_stub import OwnedStub
from .tls_helpers import install_server_cert, open_channel

OPERATOR = "operator.example"
NAME = "jobs/nightly"

POLICY = f"""
[[allow]]
identities = ["{OPERATOR}"]
actions = ["admin", "describe"]
names = ["*"]

[[allow]]
identities = ["{BILLING}", "{WORKER}"]
actions = ["acquire", "release", "describe"]
names = ["jobs/*"]

# the worker may administer the jobs, but not every name: no ListSessions
[[allow]]
identities = ["{WORKER}"]
actions = ["admin"]
names = ["jobs/weekly"]
"""


@dataclass
class Pki:
    dir: Path
    operator: Identity
    billing: Identity  # holder A
    worker: Identity  # waiter B, no admin on NAME

    def tls(self, who: Identity) -> TlsConfig:
        return TlsConfig(ca=self.dir / "client-ca.pem", cert=who.cert, key=who.key)

    def flags(self, who: Identity) -> list[str]:
        return ["--ca", str(self.dir / "client-ca.pem"), "--cert", str(who.cert), "--key", str(who.key)]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("admin-pki")
    ca = trustme.CA()
    install_server_cert(ca, directory)
    ca.cert_pem.write_to_path(directory / "client-ca.pem")

    def leaf(label: str, dns: str) -> Identity:
        cert = ca.issue_cert(dns)
        return write_identity(ca, directory, label, cert.cert_chain_pems[0].bytes(), cert.private_key_pem.bytes())

    return Pki(directory, leaf("operator", OPERATOR),
               write_identity(ca, directory, "billing", *spiffe_certificate(ca, BILLING)), leaf("worker", WORKER))


@pytest.fixture
async def policed(etcd: EmbeddedEtcd, prefix: str, pki: Pki, tmp_path: Path) -> AsyncIterator[Coordinator]:
    """A coordinator with mTLS and :data:`POLICY`."""
    (tmp_path / "policy.toml").write_text(POLICY)
    coordinator = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix,
                              tls=ServerTls(pki.dir / "cert.pem", pki.dir / "key.pem", pki.dir / "client-ca.pem"),
                              policy=Policy.from_file(tmp_path / "policy.toml"))
    await asyncio.wait_for(coordinator.start(), 20)
    try:
        yield coordinator
    finally:
        await coordinator.stop(0)


async def refused(call: object, *, name: str, text: str) -> None:
    """Await ``call``; check it failed PERMISSION_DENIED / ACCESS_DENIED, action admin on ``name``, saying ``text``."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call  # type: ignore[misc]
    status = details.parse(caught.value)
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert status.reason == "ACCESS_DENIED"
    assert status.metadata.get(details.ACTION) == "admin" and status.metadata.get(details.NAME) == name
    assert text in status.message, status.message


def _audits(caplog: pytest.LogCaptureFixture, action: str) -> list[dict[str, object]]:
    return [{"level": r.levelno, **r.event_fields} for r in caplog.records  # type: ignore[attr-defined]
            if getattr(r, "event", None) == "admin" and r.event_fields.get("action") == action]  # type: ignore


@contextlib.asynccontextmanager
async def held_with_a_waiter(address: str, pki: Pki, operator: OwnedStub):
    """Billing (A) holds NAME; the worker (B) waits for it. Yields (A's handle, B's acquire task)."""
    async with AsyncLockClient(address, tls=pki.tls(pki.billing)) as a, \
            AsyncLockClient(address, tls=pki.tls(pki.worker)) as b:
        held = await a.acquire(NAME, ttl=30.0, timeout=10.0)
        waiting = asyncio.create_task(b.acquire(NAME, ttl=30.0, timeout=60.0))
        try:
            await wait_for(lambda: describe_waiters_is(operator, NAME, 1), 10, what="B waiting")
            yield held, waiting
        finally:
            if not waiting.done():
                waiting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                got = await waiting
                await got.release()


async def test_admin_revoke_when_a_holder_has_a_waiter(policed: Coordinator, pki: Pki,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """ListSessions shows A's lease with A's identity and hold and B's wait; a non-admin is refused both calls;
    AdminRevoke ends A's hold at once (its handle is lost), B is granted with a larger token, each call is audited;
    a second AdminRevoke of the free lock revokes nothing."""
    caplog.set_level(logging.INFO, "fencepost.coordinator.api")
    async with open_channel(policed.address, pki.operator.credentials) as oc, \
            open_channel(policed.address, pki.worker.credentials) as wc:
        operator, worker = OwnedStub(oc), OwnedStub(wc)
        async with held_with_a_waiter(policed.address, pki, operator) as (held, waiting):
            listed = await operator.ListSessions(lock_pb2.ListSessionsRequest(), timeout=10)
            by_lease = {s.lease_id: s for s in listed.sessions}
            a = by_lease[held.lease_id]
            assert (a.owner_identity, list(a.holds), list(a.waits)) == (BILLING, [NAME], [])
            assert 0 < a.ttl_remaining_seconds <= a.ttl_seconds and a.ttl_seconds >= 30
            (b,) = [s for s in listed.sessions if s.lease_id != held.lease_id]
            assert (b.owner_identity, list(b.holds), list(b.waits)) == (WORKER, [], [NAME])
            assert listed.revision > 0 and listed.next_page_token == ""
            paged = await operator.ListSessions(lock_pb2.ListSessionsRequest(page_size=1), timeout=10)
            assert len(paged.sessions) == 1 and paged.next_page_token
            rest = await operator.ListSessions(lock_pb2.ListSessionsRequest(page_token=paged.next_page_token),
                                               timeout=10)
            assert sorted(s.lease_id for s in [*paged.sessions, *rest.sessions]) == sorted(by_lease)

            await refused(worker.AdminRevoke(lock_pb2.AdminRevokeRequest(name=NAME), timeout=10), name=NAME,
                          text=f"{WORKER!r} may not admin {NAME!r}")
            await refused(worker.ListSessions(lock_pb2.ListSessionsRequest(), timeout=10), name="*",
                          text="may not admin '*'")
            assert not held.lost.is_set() and not waiting.done()

            revoked = await operator.AdminRevoke(lock_pb2.AdminRevokeRequest(name=NAME), timeout=10)
            assert (revoked.revoked, revoked.lease_id, revoked.token) == (True, held.lease_id, held.token)
            await asyncio.wait_for(held.lost.wait(), 10)
            # its key was deleted (NOT_HOLDER), or a keepalive found its lease gone first (LEASE_EXPIRED)
            assert not held.is_valid() and held.lost_reason in ("NOT_HOLDER", "LEASE_EXPIRED"), held.lost_reason
            granted = await asyncio.wait_for(waiting, 10)
            assert granted.token > held.token

            again = await operator.ListSessions(lock_pb2.ListSessionsRequest(), timeout=10)
            assert held.lease_id not in {s.lease_id for s in again.sessions}
            assert [list(s.holds) for s in again.sessions if s.lease_id == granted.lease_id] == [[NAME]]

        free = await operator.AdminRevoke(lock_pb2.AdminRevokeRequest(name="jobs/free"), timeout=10)
        assert (free.revoked, free.lease_id, free.token) == (False, 0, 0)

    audit = _audits(caplog, "revoke")
    done = [line for line in audit if line["outcome"] == "revoked"]
    assert len(done) == 1
    assert done[0]["level"] == logging.WARNING and done[0]["identity"] == OPERATOR and done[0]["name"] == NAME
    assert (done[0]["lease_id"], done[0]["token"]) == (held.lease_id, held.token)
    assert str(done[0]["peer"]).startswith("ipv4:127.0.0.1:")
    assert [line["identity"] for line in audit if line["outcome"] == "denied"] == [WORKER]
    assert [line["name"] for line in audit if line["outcome"] == "not_held"] == ["jobs/free"]
    listings = _audits(caplog, "list_sessions")
    assert {line["level"] for line in listings if line["outcome"] == "listed"} == {logging.INFO}
    assert [line["identity"] for line in listings if line["outcome"] == "denied"] == [WORKER]


async def test_admin_calls_when_there_is_no_policy(stub: OwnedStub) -> None:
    """Without an access policy, AdminRevoke and ListSessions are refused to every caller, and nothing is revoked."""
    lease = (await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10), timeout=10)).lease_id
    got = await stub.Acquire(lock_pb2.AcquireRequest(name="open", lease_id=lease), timeout=10)
    assert got.acquired
    await refused(stub.AdminRevoke(lock_pb2.AdminRevokeRequest(name="open"), timeout=10), name="open",
                  text="admin calls need an access policy (--policy)")
    await refused(stub.ListSessions(lock_pb2.ListSessionsRequest(), timeout=10), name="*",
                  text="admin calls need an access policy (--policy)")
    held = await stub.Describe(lock_pb2.DescribeRequest(name="open"), timeout=10)
    assert held.holder.lease_id == lease and held.holder.token == got.token
    await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease), timeout=10)


async def test_admin_commands_when_run_against_the_coordinator(policed: Coordinator, pki: Pki) -> None:
    """`fencepost admin sessions --json` lists A's lease, identity, hold and B's wait; `fencepost admin revoke NAME`
    revokes A's lease (B is granted); for a non-admin identity both exit 1 with one ACCESS_DENIED line."""
    async with open_channel(policed.address, pki.operator.credentials) as oc:
        operator = OwnedStub(oc)
        async with held_with_a_waiter(policed.address, pki, operator) as (held, waiting):
            base = ["--address", policed.address]
            listed = await run_cli("admin", "sessions", "--json", *base, *pki.flags(pki.operator))
            assert listed.rc == 0, listed.err
            obj = json.loads(listed.out)
            sessions = {s["lease_id"]: s for s in obj["sessions"]}
            assert sessions[held.lease_id]["owner_identity"] == BILLING
            assert sessions[held.lease_id]["holds"] == [NAME] and sessions[held.lease_id]["waits"] == []
            assert [s["waits"] for s in obj["sessions"] if s["owner_identity"] == WORKER] == [[NAME]]
            table = await run_cli("admin", "sessions", *base, *pki.flags(pki.operator))
            assert table.rc == 0 and BILLING in table.out and "2 sessions" in table.out, table

            denied = await run_cli("admin", "revoke", NAME, *base, *pki.flags(pki.worker))
            assert denied.rc == 1 and "ACCESS_DENIED" in denied.err and len(denied.err.splitlines()) == 1, denied
            assert not held.lost.is_set()

            revoked = await run_cli("admin", "revoke", NAME, *base, *pki.flags(pki.operator))
            assert revoked.rc == 0, revoked.err
            assert f"revoked lease 0x{held.lease_id:x} ({held.lease_id})" in revoked.out
            assert f"token {held.token}" in revoked.out
            await asyncio.wait_for(held.lost.wait(), 10)
            assert (await asyncio.wait_for(waiting, 10)).token > held.token
        free = await run_cli("admin", "revoke", NAME, "--json", *base, *pki.flags(pki.operator))
        assert free.rc == 0 and json.loads(free.out)["revoked"] is False, free


async def test_client_admin_calls_when_allowed_or_not(policed: Coordinator, pki: Pki) -> None:
    """AsyncLockClient.admin_revoke and list_sessions (and LockClient's twins, in a thread) return Revoked and
    Session; a non-admin identity gets AccessDenied; a bad name is InvalidArgument before any call."""
    async with AsyncLockClient(policed.address, tls=pki.tls(pki.billing)) as a, \
            AsyncLockClient(policed.address, tls=pki.tls(pki.operator)) as operator, \
            AsyncLockClient(policed.address, tls=pki.tls(pki.worker)) as worker:
        held = await a.acquire(NAME, ttl=30.0, timeout=10.0)
        (session,) = [s for s in await operator.list_sessions() if s.lease_id == held.lease_id]
        assert session == Session(held.lease_id, BILLING, session.ttl, session.ttl_remaining, (NAME,), ())
        assert session.ttl >= 30 and 0 < session.ttl_remaining <= session.ttl

        with LockClient(policed.address, tls=pki.tls(pki.operator)) as sync_operator:
            listed = await asyncio.to_thread(sync_operator.list_sessions, page_size=1)
        assert held.lease_id in {s.lease_id for s in listed}

        with pytest.raises(AccessDenied) as caught:
            await worker.admin_revoke(NAME)
        assert (caught.value.action, caught.value.name) == ("admin", NAME)
        with pytest.raises(AccessDenied):
            await worker.list_sessions()
        with pytest.raises(InvalidArgument):
            await operator.admin_revoke("")

        assert await operator.admin_revoke(NAME) == Revoked(NAME, True, held.lease_id, held.token)
        await asyncio.wait_for(held.lost.wait(), 10)
        assert await operator.admin_revoke(NAME) == Revoked(NAME, False, 0, 0)
