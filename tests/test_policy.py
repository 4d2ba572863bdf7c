"""The access policy (issue 9): parsing and matching, and a real coordinator with mTLS that allows and denies two
trustme-signed client identities (a SPIFFE URI SAN; a DNS SAN only) exactly as the policy file says, then a real
`fencepost serve` that reloads the policy on SIGHUP and keeps it when the new file is broken."""

from __future__ import annotations

import asyncio
import datetime
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
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fencepost.client import AccessDenied, AsyncLockClient, PermissionDenied, TlsConfig
from fencepost.client.errors import from_rpc_error
from fencepost.client.v1 import details, lock_pb2
from fencepost.coordinator.admission.access import Access, Policy, PolicyError, require
from fencepost.coordinator.admission.identity import Caller
from fencepost.coordinator.process import flags
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.process.embedded import EmbeddedEtcd
from fencepost.coordinator.process.listen import is_local
from fencepost.coordinator.process.tls import ServerTls

from .owned_stub import OwnedStub

from .tls_helpers import install, install_server_cert, open_channel

BILLING = "spiffe://example.org/billing"
WORKER = "worker.example"

# ---------------------------------------------------------------- parsing


def _toml(rule: str, *, head: str = "") -> str:
    return f"{head}\n[[allow]]\n{rule}\n"


GOOD_RULE = 'identities = ["a"]\nactions = ["acquire"]\nnames = ["x"]'


@pytest.mark.parametrize(("text", "where", "problem"), [
    (_toml(GOOD_RULE, head='version = 1'), None, "unknown key 'version'"),
    ("allow = []", "allow", "must be a non-empty list of rules"),
    ("", "allow", "must be a non-empty list of rules"),
    ('allow = ["x"]', "allow[0]", "must be a table"),
    (_toml(GOOD_RULE + '\nname = ["y"]'), "allow[0].name", "unknown key"),
    (_toml('actions = ["acquire"]\nnames = ["x"]'), "allow[0].identities", "missing"),
    (_toml('identities = []\nactions = ["acquire"]\nnames = ["x"]'), "allow[0].identities", "non-empty list"),
    (_toml('identities = [1]\nactions = ["acquire"]\nnames = ["x"]'), "allow[0].identities", "holds 1"),
    (_toml('identities = [" a"]\nactions = ["acquire"]\nnames = ["x"]'), "allow[0].identities", "spaces"),
    (_toml('identities = ["a"]\nnames = ["x"]'), "allow[0].actions", "missing"),
    (_toml('identities = ["a"]\nactions = []\nnames = ["x"]'), "allow[0].actions", "non-empty list"),
    (_toml('identities = ["a"]\nactions = ["aquire"]\nnames = ["x"]'), "allow[0].actions",
     "'aquire' is not an action; use acquire, release, describe, admin"),
    (_toml('identities = ["a"]\nactions = ["acquire"]'), "allow[0].names", "missing"),
    (_toml('identities = ["a"]\nactions = ["acquire"]\nnames = "x"'), "allow[0].names", "non-empty list"),
    (_toml('identities = ["a"]\nactions = ["acquire"]\nnames = ["a*b"]'), "allow[0].names",
     "'a*b' has '*' before its end"),
    (_toml('identities = ["a"]\nactions = ["acquire"]\nnames = ["**"]'), "allow[0].names", "before its end"),
    (_toml('identities = ["a"]\nactions = ["acquire"]\nnames = ["' + "n" * 257 + '"]'), "allow[0].names",
     "longer than a lock name"),
    (_toml('anonymous = "yes"\nactions = ["acquire"]\nnames = ["x"]'), "allow[0].anonymous", "true or false"),
    (_toml(GOOD_RULE) + _toml('identities = ["b"]\nactions = ["describe"]\nnames = ["x*y"]'), "allow[1].names",
     "before its end"),
])
def test_parse_when_a_field_is_bad(text: str, where: str | None, problem: str, tmp_path: Path) -> None:
    """A policy file that breaks the schema is refused with an error naming the file, the rule index and the key."""
    path = tmp_path / "policy.toml"
    path.write_text(text)
    with pytest.raises(PolicyError) as caught:
        Policy.from_file(path)
    assert caught.value.where == where
    assert problem in caught.value.problem
    assert str(caught.value).startswith(f"policy {path}: {where + ': ' if where else ''}")


@pytest.mark.parametrize(("name", "text", "problem"), [
    ("policy.json", "{}", "must be a .toml, .yaml or .yml file"),
    ("missing.toml", None, "cannot be read: No such file or directory"),
    ("policy.toml", "[[allow]\n", "is not valid TOML"),
    ("policy.yaml", "allow: [\n", "is not valid YAML"),
    ("policy.yml", "- just\n- a list\n", "must hold a table"),
    ("policy.yaml", "allow:\n  - identities: [a]\n    actions: [acquire]\n    names: [7]\n", "holds 7"),
])
def test_parse_when_the_file_is_unusable(name: str, text: str | None, problem: str, tmp_path: Path) -> None:
    """An unknown ending, an unreadable file, a syntax error or a file that is not a table is refused, naming it."""
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(PolicyError, match=rf"^policy {path}: .*{problem}"):
        Policy.from_file(path)


def test_parse_when_yaml_and_toml_say_the_same(tmp_path: Path) -> None:
    """The YAML form of a policy allows exactly what its TOML form allows."""
    (tmp_path / "p.toml").write_text(
        '[[allow]]\nidentities = ["a", "*"]\nanonymous = true\nactions = ["acquire", "release"]\n'
        'names = ["jobs/*", "one"]\n')
    (tmp_path / "p.yaml").write_text(
        "allow:\n  - identities: [a, '*']\n    anonymous: true\n    actions: [acquire, release]\n"
        "    names: [jobs/*, one]\n")
    toml, yaml = Policy.from_file(tmp_path / "p.toml"), Policy.from_file(tmp_path / "p.yaml")
    assert toml.rules == yaml.rules
    assert yaml.source == tmp_path / "p.yaml"


# ---------------------------------------------------------------- matching


MATCHING = """
[[allow]]
identities = ["spiffe://example.org/billing"]
actions = ["acquire", "release"]
names = ["billing/*", "reports/daily"]

[[allow]]
identities = ["*"]
actions = ["describe"]
names = ["public-*"]

[[allow]]
identities = ["ops.example"]
actions = ["admin", "describe"]
names = ["*"]

[[allow]]
anonymous = true
actions = ["describe"]
names = ["status"]
"""


@pytest.mark.parametrize(("identity", "action", "name", "allowed"), [
    (BILLING, "acquire", "billing/invoices", True),  # prefix
    (BILLING, "acquire", "billing/", True),  # the prefix itself is a name that starts with it
    (BILLING, "acquire", "billing", False),  # "billing/*" needs the slash
    (BILLING, "acquire", "billingx/a", False),
    (BILLING, "release", "reports/daily", True),  # exact
    (BILLING, "release", "reports/daily/x", False),  # exact is not a prefix
    (BILLING, "describe", "billing/invoices", False),  # not among the rule's actions
    (BILLING, "describe", "public-a", True),  # "*" rules apply to named identities too
    ("SPIFFE://example.org/billing", "acquire", "billing/a", False),  # identities match exactly
    ("someone.example", "describe", "public-", True),  # any verified identity
    ("someone.example", "describe", "public", False),
    ("someone.example", "acquire", "public-a", False),
    ("ops.example", "admin", "anything at all", True),  # "*" names
    ("ops.example", "acquire", "billing/a", False),
    (None, "describe", "status", True),  # anonymous
    (None, "describe", "public-a", False),  # "*" is verified identities only
    ("anonymous", "describe", "status", False),  # no certificate can claim the anonymous rule
])
def test_allows_when_matching(identity: str | None, action: str, name: str, allowed: bool) -> None:
    """Exact names, prefixes ending in *, "*" names, "*" identities and the anonymous rule match as documented."""
    assert Policy.from_text(MATCHING).allows(identity, action, name) is allowed


def test_lister_when_listing_a_prefix() -> None:
    """A listing shows all of a prefix a rule covers, filters one it covers in part, and is refused otherwise."""
    policy = Policy.from_text(MATCHING)
    assert policy.lister("ops.example", "") is not None and policy.lister("ops.example", "")("any")
    everything = policy.lister("someone.example", "public-x")
    assert everything is not None and everything("public-xyz")
    some = policy.lister("someone.example", "")
    assert some is not None and some("public-1") and not some("billing/a")
    assert policy.lister("someone.example", "pub") is not None  # "public-*" names start with "pub"
    assert policy.lister("someone.example", "billing/") is None
    assert policy.lister(None, "st") is not None and policy.lister(None, "x") is None


def test_require_when_the_call_names_no_lock() -> None:
    """A call without a lock name needs the action on at least one name; the denial names action and identity."""
    policy = Policy.from_text(MATCHING)
    require(Caller(BILLING, "ipv4:127.0.0.1:1"), "acquire", None, policy)
    require(Caller("ops.example", "ipv4:127.0.0.1:1"), "admin", None, policy)
    with pytest.raises(AccessDenied) as caught:
        require(Caller("someone.example", "ipv4:127.0.0.1:1"), "acquire", None, policy)
    assert caught.value.action == "acquire" and caught.value.name is None
    assert caught.value.identity == "someone.example"
    assert "'someone.example' may not acquire any lock name" in caught.value.message
    require(Caller(None, "ipv4:127.0.0.1:1"), "admin", None, None)  # no policy: everything allowed


def test_reload_when_the_new_file_is_broken(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Access.reload takes a good new file and keeps the policy in force when the new file is broken."""
    path = tmp_path / "p.toml"
    path.write_text(_toml('identities = ["a"]\nactions = ["acquire"]\nnames = ["x"]'))
    access = Access(Policy.from_file(path))
    path.write_text(_toml('identities = ["a"]\nactions = ["acquire"]\nnames = ["y"]'))
    assert access.reload()
    assert access.policy is not None and access.policy.allows("a", "acquire", "y")
    path.write_text(_toml('identities = ["a"]\nactions = ["grab"]\nnames = ["x"]'))
    with caplog.at_level(logging.WARNING, "fencepost.coordinator.admission.access"):
        assert not access.reload()
    assert access.policy.allows("a", "acquire", "y") and not access.policy.allows("a", "acquire", "x")
    [record] = [r for r in caplog.records if getattr(r, "event", None) == "policy_not_reloaded"]
    assert record.event_fields["file"] == str(path)  # type: ignore[attr-defined]
    assert "allow[0].actions: 'grab' is not an action" in record.event_fields["problem"]  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="no access policy file"):
        Access(Policy.from_text(MATCHING)).reload()


def test_is_local_when_listening() -> None:
    """Loopback addresses, localhost and Unix sockets are local; wildcard and other addresses are not."""
    assert all(is_local(a) for a in ("127.0.0.1:7420", "127.9.9.9:0", "[::1]:7420", "localhost:1", "unix:/tmp/s"))
    assert not any(is_local(a) for a in ("0.0.0.0:7420", "[::]:7420", "10.1.2.3:7420", "coord.example:7420"))


# ---------------------------------------------------------------- certificates


@dataclass
class Identity:
    """A client certificate and key (PEM files) and the channel credentials that present them."""

    cert: Path
    key: Path
    credentials: grpc.ChannelCredentials


def spiffe_certificate(ca: trustme.CA, spiffe_id: str) -> tuple[bytes, bytes]:
    """An X.509-SVID-like client certificate signed by ``ca``: URI SAN ``spiffe_id``, plus a DNS SAN and a CN that
    the identity rule must pass over. trustme's issue_cert takes no URIs, so it is built with cryptography, signed
    by the trustme CA's key. Returns (certificate PEM, key PEM)."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem.bytes())
    ca_key = serialization.load_pem_private_key(ca.private_key_pem.bytes(), password=None)
    assert isinstance(ca_key, (ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey))
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "billing-cn")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("billing.example"),
                                                    x509.UniformResourceIdentifier(spiffe_id)]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def _identity(ca: trustme.CA, directory: Path, label: str, cert_pem: bytes, key_pem: bytes) -> Identity:
    (directory / f"{label}.pem").write_bytes(cert_pem)
    (directory / f"{label}-key.pem").write_bytes(key_pem)
    return Identity(directory / f"{label}.pem", directory / f"{label}-key.pem",
                    grpc.ssl_channel_credentials(ca.cert_pem.bytes(), key_pem, cert_pem))


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
    billing = _identity(ca, directory, "billing", *spiffe_certificate(ca, BILLING))
    leaf = ca.issue_cert(WORKER)
    worker = _identity(ca, directory, "worker", leaf.cert_chain_pems[0].bytes(), leaf.private_key_pem.bytes())
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
    bad.write_text(_toml('identities = ["a"]\nactions = ["acquire"]\nnames = ["a*b"]'))
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
