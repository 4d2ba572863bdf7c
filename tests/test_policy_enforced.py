"""The access policy (issue 9), enforced: a real coordinator with mTLS that allows and denies two trustme-signed
client identities (a SPIFFE URI SAN; a DNS SAN only) exactly as the policy file says, then a real `fencepost serve`
that reloads the policy on SIGHUP and keeps it when the new file is broken."""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import trustme

from fencepost.client import AccessDenied, AsyncLockClient, PermissionDenied, TlsConfig
from fencepost.client.errors import from_rpc_error
from fencepost.client.v1 import details, lock_pb2
from fencepost.coordinator.admission.access import Policy
from fencepost.coordinator.process import flags
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.process.embedded import EmbeddedEtcd
from fencepost.coordinator.process.tls import ServerTls

from .client_identities import BILLING, WORKER, Identity, spiffe_certificate, write_identity
from .owned_stub import OwnedStub
from .tls_helpers import install, install_server_cert, open_channel


# ---------------------------------------------------------------- certificates


@dataclass
class Pki:
    ca: trustme.CA
    dir: Path
    billing: Identity  # SPIFFE URI SAN (and a DNS SAN and a CN, passed over)
    worker: Identity  # a DNS SAN only


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA, the coordinator's certificate (cert.pem, key.pem, client-ca.pem) and two client identities."""
    directory = tmp_path_factory.mktemp("policy-pki")
    ca = trustme.CA()
    install_server_cert(ca, directory)
    ca.cert_pem.write_to_path(directory / "client-ca.pem")
    billing = write_identity(ca, directory, "billing", *spiffe_certificate(ca, BILLING))
    leaf = ca.issue_cert(WORKER)
    worker = write_identity(ca, directory, "worker", leaf.cert_chain_pems[0].bytes(), leaf.private_key_pem.bytes())
    return Pki(ca, directory, billing, worker)


def test_identities_when_read_from_the_certificates(pki: Pki) -> None:
    """The SPIFFE certificate's identity is its URI SAN (not its DNS SAN or CN); trustme's is its DNS SAN."""
    from fencepost.coordinator.admission.identity import identity_of_pem

    assert identity_of_pem(pki.billing.cert.read_bytes()) == BILLING
    assert identity_of_pem(pki.worker.cert.read_bytes()) == WORKER


# ---------------------------------------------------------------- a real coordinator with mTLS

POLICY = f"""
# billing: its own locks, all of them
[[allow]]
identities = ["{BILLING}"]
actions = ["acquire", "release", "describe"]
names = ["billing/*"]

# the worker: one exact lock; it may look at every job
[[allow]]
identities = ["{WORKER}"]
actions = ["acquire", "release"]
names = ["jobs/nightly"]

[[allow]]
identities = ["{WORKER}"]
actions = ["describe"]
names = ["jobs/*"]
"""


@pytest.fixture
async def policed(etcd: EmbeddedEtcd, prefix: str, pki: Pki, tmp_path: Path) -> AsyncIterator[Coordinator]:
    """A coordinator with mTLS (client certificates required) and :data:`POLICY`."""
    (tmp_path / "policy.toml").write_text(POLICY)
    coordinator = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix,
                              tls=ServerTls(pki.dir / "cert.pem", pki.dir / "key.pem", pki.dir / "client-ca.pem"),
                              policy=Policy.from_file(tmp_path / "policy.toml"))
    await asyncio.wait_for(coordinator.start(), 20)
    try:
        yield coordinator
    finally:
        await coordinator.stop(0)


async def denied(call: object, *, action: str, name: str | None) -> grpc.aio.AioRpcError:
    """Await ``call`` and check it failed with PERMISSION_DENIED / ACCESS_DENIED naming ``action`` and ``name``."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call  # type: ignore[misc]
    err = caught.value
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED, err
    status = details.parse(err)
    assert status.reason == "ACCESS_DENIED"
    assert status.metadata.get(details.ACTION) == action
    assert status.metadata.get(details.NAME) == name
    assert f"may not {action}" in status.message and (name is None or repr(name) in status.message)
    return err


async def test_policy_when_two_identities_call(policed: Coordinator, pki: Pki,
                                               caplog: pytest.LogCaptureFixture) -> None:
    """Each identity is allowed and denied exactly as the policy file says, for acquire, release, describe and
    list; a denial is PERMISSION_DENIED/ACCESS_DENIED naming action and name, one log line, and AccessDenied in
    the Python client."""
    caplog.set_level(logging.INFO, "fencepost.coordinator.api")
    async with open_channel(policed.address, pki.billing.credentials) as bc, \
            open_channel(policed.address, pki.worker.credentials) as wc:
        billing, worker = OwnedStub(bc), OwnedStub(wc)
        b_lease = (await billing.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10), timeout=10)).lease_id
        w_lease = (await worker.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10), timeout=10)).lease_id
        try:
            # billing: acquire, describe, release under billing/*; nothing of the jobs.
            got = await billing.Acquire(lock_pb2.AcquireRequest(name="billing/invoices", lease_id=b_lease), timeout=10)
            assert got.acquired
            assert (await billing.Describe(lock_pb2.DescribeRequest(name="billing/invoices"), timeout=10)).held
            err = await denied(billing.Acquire(lock_pb2.AcquireRequest(name="jobs/nightly", lease_id=b_lease),
                                               timeout=10), action="acquire", name="jobs/nightly")
            await denied(billing.Describe(lock_pb2.DescribeRequest(name="jobs/nightly"), timeout=10),
                         action="describe", name="jobs/nightly")
            await denied(billing.ListLocks(lock_pb2.ListLocksRequest(prefix="jobs/"), timeout=10),
                         action="describe", name="jobs/")
            await denied(billing.ServerInfo(lock_pb2.ServerInfoRequest(), timeout=10), action="admin", name=None)

            # the worker: acquire and release jobs/nightly only; describe any job; none of billing.
            w_got = await worker.Acquire(lock_pb2.AcquireRequest(name="jobs/nightly", lease_id=w_lease), timeout=10)
            assert w_got.acquired
            await denied(worker.Acquire(lock_pb2.AcquireRequest(name="jobs/weekly", lease_id=w_lease), timeout=10),
                         action="acquire", name="jobs/weekly")
            await denied(worker.Withdraw(lock_pb2.WithdrawRequest(name="billing/invoices", lease_id=b_lease),
                                         timeout=10), action="acquire", name="billing/invoices")
            await denied(worker.Release(lock_pb2.ReleaseRequest(name="billing/invoices", lease_id=b_lease,
                                                                token=got.token), timeout=10),
                         action="release", name="billing/invoices")
            await denied(worker.Describe(lock_pb2.DescribeRequest(name="billing/invoices"), timeout=10),
                         action="describe", name="billing/invoices")
            assert not (await worker.Describe(lock_pb2.DescribeRequest(name="jobs/weekly"), timeout=10)).held

            # Listing everything shows each caller only what it may describe.
            listed = await worker.ListLocks(lock_pb2.ListLocksRequest(prefix=""), timeout=10)
            assert [lock.name for lock in listed.locks] == ["jobs/nightly"]
            listed = await billing.ListLocks(lock_pb2.ListLocksRequest(prefix="billing/"), timeout=10)
            assert [lock.name for lock in listed.locks] == ["billing/invoices"]
            listed = await billing.ListLocks(lock_pb2.ListLocksRequest(prefix=""), timeout=10)
            assert [lock.name for lock in listed.locks] == ["billing/invoices"]

            # The refused calls changed nothing: billing still holds its lock, under its token.
            held = await billing.Describe(lock_pb2.DescribeRequest(name="billing/invoices"), timeout=10)
            assert held.holder.lease_id == b_lease and held.holder.token == got.token
            await worker.Release(lock_pb2.ReleaseRequest(name="jobs/nightly", lease_id=w_lease, token=w_got.token),
                                 timeout=10)
            await billing.Release(lock_pb2.ReleaseRequest(name="billing/invoices", lease_id=b_lease,
                                                          token=got.token), timeout=10)
        finally:
            await billing.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=b_lease), timeout=10)
            await worker.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=w_lease), timeout=10)

    exc = from_rpc_error(err)
    assert isinstance(exc, AccessDenied) and isinstance(exc, PermissionDenied)
    assert (exc.action, exc.name, exc.reason, exc.code) == ("acquire", "jobs/nightly", "ACCESS_DENIED",
                                                            grpc.StatusCode.PERMISSION_DENIED)
    lines = [r for r in caplog.records if getattr(r, "event", None) == "refusal"
             and r.event_fields.get("name") == "jobs/nightly"  # type: ignore[attr-defined]
             and r.event_fields.get("action") == "acquire"]  # type: ignore[attr-defined]
    assert len(lines) == 1
    fields = lines[0].event_fields  # type: ignore[attr-defined]
    assert fields["identity"] == BILLING and fields["reason"] == "ACCESS_DENIED" and fields["call"] == "Acquire"
    assert fields["peer"].startswith("ipv4:127.0.0.1:")


async def test_policy_when_the_python_client_is_denied(policed: Coordinator, pki: Pki) -> None:
    """The Python client raises AccessDenied (a PermissionDenied) with the action and the name, and works on."""
    tls = TlsConfig(ca=pki.dir / "client-ca.pem", cert=pki.worker.cert, key=pki.worker.key)
    async with AsyncLockClient(policed.address, tls=tls) as client:
        with pytest.raises(AccessDenied) as caught:
            await client.try_acquire("billing/invoices")
        assert (caught.value.action, caught.value.name) == ("acquire", "billing/invoices")
        with pytest.raises(AccessDenied):
            await client.describe("billing/invoices")
        handle = await client.try_acquire("jobs/nightly")
        assert handle.token > 0
        await handle.release()


async def test_lease_calls_when_the_identity_may_only_describe(etcd: EmbeddedEtcd, prefix: str, pki: Pki,
                                                               tmp_path: Path) -> None:
    """An identity that may acquire no name may not grant a lease or open a KeepAlive stream."""
    path = tmp_path / "policy.yaml"
    path.write_text(f"allow:\n  - identities: ['{WORKER}']\n    actions: [describe]\n    names: ['*']\n")
    coordinator = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix,
                              tls=ServerTls(pki.dir / "cert.pem", pki.dir / "key.pem", pki.dir / "client-ca.pem"),
                              policy=Policy.from_file(path))
    await asyncio.wait_for(coordinator.start(), 20)
    try:
        async with open_channel(coordinator.address, pki.worker.credentials) as channel:
            stub = OwnedStub(channel)
            await denied(stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=5), timeout=10),
                         action="acquire", name=None)
            stream = stub.KeepAlive(timeout=10)
            await denied(stream.read(), action="acquire", name=None)
            assert (await stub.ListLocks(lock_pb2.ListLocksRequest(prefix=""), timeout=10)).locks == []
    finally:
        await coordinator.stop(0)


# ---------------------------------------------------------------- fencepost serve


def test_serve_when_the_policy_flag_is_wrong(pki: Pki, tmp_path: Path) -> None:
    """--policy without --client-ca, with --client-auth optional, or naming a bad file stops `fencepost serve`."""
    good = tmp_path / "ok.toml"
    good.write_text(POLICY)
    bad = tmp_path / "bad.toml"
    bad.write_text('\n[[allow]]\nidentities = ["a"]\nactions = ["acquire"]\nnames = ["a*b"]\n')
    tls = ["--tls-cert", str(pki.dir / "cert.pem"), "--tls-key", str(pki.dir / "key.pem")]
    mtls = [*tls, "--client-ca", str(pki.dir / "client-ca.pem")]
    for argv, message in [
        (["--policy", str(good)], "--policy needs --client-ca"),
        ([*tls, "--policy", str(good)], "--policy needs --client-ca"),
        ([*mtls, "--client-auth", "optional", "--policy", str(good)], "--client-auth optional does not ask"),
        ([*mtls, "--policy", str(bad)], f"--policy: policy {bad}: allow[0].names: 'a*b' has '*' before its end"),
    ]:
        with pytest.raises(flags.BadFlag) as caught:
            flags.settings(flags.build_parser().parse_args(argv))
        assert message in str(caught.value)
    settings = flags.settings(flags.build_parser().parse_args([*mtls, "--policy", str(good)]))
    assert settings.policy is not None and settings.policy.allows(WORKER, "acquire", "jobs/nightly")


async def test_serve_when_sighup_reloads_the_policy(etcd: EmbeddedEtcd, prefix: str, pki: Pki,
                                                    tmp_path: Path) -> None:
    """`fencepost serve --policy`: SIGHUP applies a good new file to new calls; a broken one keeps the old policy
    and logs a warning naming the file and the problem."""
    from .conftest import LISTENING, ChildProcess, child_env

    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    env = child_env()
    env["FENCEPOST_POLICY"] = str(policy)  # the variable works as the flag
    child = ChildProcess([sys.executable, "-m", "fencepost.client.cli", "serve", "--listen", "127.0.0.1:0",
                          "--etcd-endpoints", etcd.endpoint, "--prefix", prefix, "--log-format", "json",
                          "--tls-cert", str(pki.dir / "cert.pem"), "--tls-key", str(pki.dir / "key.pem"),
                          "--client-ca", str(pki.dir / "client-ca.pem")],
                         log_path=tmp_path / "serve.log", env=env)
    try:
        match = await child.await_line(LISTENING, 30)
        address = f"127.0.0.1:{match.group(2)}"
        assert any(f"access policy {policy} (3 rules)" in line for line in child.output), child.output
        async with open_channel(address, pki.worker.credentials) as channel:
            stub = OwnedStub(channel)

            async def describe(name: str) -> lock_pb2.DescribeResponse:
                return await stub.Describe(lock_pb2.DescribeRequest(name=name), timeout=10)

            await describe("jobs/a")
            await denied(describe("reports/a"), action="describe", name="reports/a")

            install(policy, f'[[allow]]\nidentities = ["{WORKER}"]\nactions = ["describe"]\n'
                            f'names = ["reports/*"]\n'.encode())
            child.signal(signal.SIGHUP)
            await child.await_line(re.escape(f"SIGHUP: access policy reloaded from {policy} (1 rule)"), 10)
            await describe("reports/a")  # the same connection: the check is per call
            await denied(describe("jobs/a"), action="describe", name="jobs/a")

            install(policy, b'[[allow]]\nidentities = ["worker.example"]\nactions = ["describe", "peek"]\n'
                            b'names = ["*"]\n')
            child.signal(signal.SIGHUP)
            await child.await_line("SIGHUP: access policy not reloaded, the policy in use stays", 10)
            await describe("reports/a")
            await denied(describe("jobs/a"), action="describe", name="jobs/a")
        assert child.terminate() == 0
    finally:
        child.kill()
    log = (tmp_path / "serve.log").read_text()
    assert '"event": "policy_not_reloaded"' in log
    assert "allow[0].actions: 'peek' is not an action" in log and str(policy) in log
    assert '"event": "plaintext_listen"' not in log


async def test_serve_when_plaintext_on_a_reachable_address(etcd: EmbeddedEtcd, prefix: str,
                                                           tmp_path: Path) -> None:
    """`fencepost serve` in plaintext on 0.0.0.0 warns that any host may take every lock."""
    from .conftest import LISTENING, ChildProcess, child_env

    child = ChildProcess([sys.executable, "-m", "fencepost.client.cli", "serve", "--listen", "0.0.0.0:0",
                          "--etcd-endpoints", etcd.endpoint, "--prefix", prefix, "--log-format", "json"],
                         log_path=tmp_path / "serve.log", env=child_env())
    try:
        await child.await_line(LISTENING, 30)
        assert child.terminate() == 0
    finally:
        child.kill()
    log = (tmp_path / "serve.log").read_text()
    assert '"event": "plaintext_listen"' in log and '"listen": "0.0.0.0:0"' in log
