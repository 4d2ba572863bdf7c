"""How the coordinator reaches etcd, against real etcd servers: a host name, TLS with client
certificates (mTLS), and etcd user/password authentication; and the serve flags for them."""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import trustme

from fencepost.client import AsyncLockClient
from fencepost.client.v1 import lock_pb2
from fencepost.client.v1.etcd import auth_pb2, rpc_pb2, rpc_pb2_grpc
from fencepost.client.v1.keys import prefix_end
from fencepost.coordinator.etcd import EtcdAuth, EtcdTls
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.process.embedded import EmbeddedEtcd
from fencepost.coordinator.process.main import main

from .conftest import LISTENING, ChildProcess, child_env, error_info, wait_for
from .owned_stub import OwnedStub

#: The lock watch's logger (coordinator/recipes/watch.py).
WATCH_LOGGER = "fencepost.coordinator.recipes.watch"


async def _acquire_and_release(coordinator: Coordinator, name: str) -> int:
    """One full acquire/release through the coordinator; returns the token."""
    async with AsyncLockClient(coordinator.address) as client:
        handle = await client.acquire(name, ttl=5.0, timeout=10.0)
        token = handle.token
        await handle.release()
    assert token > 0
    return token


async def _started(coordinator: Coordinator) -> Coordinator:
    await asyncio.wait_for(coordinator.start(), 20)
    return coordinator


# ---------------------------------------------------------------- host names


@pytest.mark.parametrize("whose", ["localhost", "this-machine"])
async def test_endpoint_when_given_as_a_host_name(whose: str, tmp_path: Path, prefix: str) -> None:
    """--etcd-endpoints accepts a host name: etcd listens on the address the name resolves to.

    ``localhost`` resolves on every machine (RFC 6761, and every /etc/hosts),
    so a host name is tested everywhere; the machine's own name, which some
    containers do not resolve, is tested too where it resolves, and skipped
    with the reason where it does not.
    """
    name = "localhost" if whose == "localhost" else socket.gethostname()
    try:
        address = socket.gethostbyname(name)
    except OSError as exc:
        if whose == "localhost":
            raise
        pytest.skip(f"this machine's host name {name!r} does not resolve ({exc}); the localhost case "
                    f"tests a host name")
    etcd = EmbeddedEtcd(tmp_path / "etcd", host=address)
    await asyncio.to_thread(etcd.start)
    coordinator = Coordinator([f"{name}:{etcd.client_port}"], listen="127.0.0.1:0", prefix=prefix)
    try:
        await _started(coordinator)
        first = await _acquire_and_release(coordinator, "by-host-name")
        assert await _acquire_and_release(coordinator, "by-host-name") > first
    finally:
        await coordinator.stop(0)
        await asyncio.to_thread(etcd.stop)


# ---------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    """A throwaway certificate authority for etcd's server and the coordinator's client certificates."""
    return trustme.CA()


@pytest.fixture(scope="module")
def tls_etcd(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedEtcd]:
    """A real etcd serving https with --client-cert-auth: clients need a certificate from ``ca``."""
    files = tmp_path_factory.mktemp("tls")
    server = ca.issue_cert("127.0.0.1", "localhost")
    server.cert_chain_pems[0].write_to_path(files / "server.pem")
    server.private_key_pem.write_to_path(files / "server-key.pem")
    ca.cert_pem.write_to_path(files / "ca.pem")
    etcd = EmbeddedEtcd(files / "etcd", cert_file=files / "server.pem", key_file=files / "server-key.pem",
                        trusted_ca_file=files / "ca.pem", client_cert_auth=True)
    etcd.start()
    try:
        yield etcd
    finally:
        etcd.stop()


def _client_tls(ca: trustme.CA, *, with_cert: bool = True) -> EtcdTls:
    if not with_cert:
        return EtcdTls(ca=ca.cert_pem.bytes())
    cert = ca.issue_cert("fencepost-coordinator")
    return EtcdTls(ca=ca.cert_pem.bytes(), cert=cert.cert_chain_pems[0].bytes(), key=cert.private_key_pem.bytes())


async def test_tls_when_coordinator_has_a_client_certificate(tls_etcd: EmbeddedEtcd, ca: trustme.CA,
                                                             prefix: str) -> None:
    """Over mTLS to an etcd with --client-cert-auth, a full acquire/release works."""
    assert tls_etcd.client_url.startswith("https://")
    coordinator = Coordinator([tls_etcd.client_url], listen="127.0.0.1:0", prefix=prefix,
                              etcd_tls=_client_tls(ca))
    try:
        await _started(coordinator)
        await _acquire_and_release(coordinator, "over-mtls")
    finally:
        await coordinator.stop(0)


async def test_tls_when_client_certificate_is_missing(tls_etcd: EmbeddedEtcd, ca: trustme.CA,
                                                      prefix: str) -> None:
    """Without a client certificate etcd refuses the handshake: calls fail UNAVAILABLE / ETCD_UNAVAILABLE, fast."""
    coordinator = Coordinator([tls_etcd.endpoint], listen="127.0.0.1:0", prefix=prefix,
                              etcd_tls=_client_tls(ca, with_cert=False))
    try:
        await _started(coordinator)
        async with grpc.aio.insecure_channel(coordinator.address) as channel:
            stub = OwnedStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=5), timeout=15)
    finally:
        await coordinator.stop(0)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    detail = error_info(info.value)
    assert detail is not None and detail.reason == "ETCD_UNAVAILABLE"
    said = info.value.details() or ""
    assert "LeaseGrant unreachable" in said and "handshake" in said.lower(), said


@pytest.mark.parametrize("ca_by", ["--etcd-ca", "--etcd-cacert", "FENCEPOST_ETCD_CA", "FENCEPOST_ETCD_CACERT"])
async def test_serve_when_tls_flags_are_given(ca_by: str, tls_etcd: EmbeddedEtcd, ca: trustme.CA, prefix: str,
                                              tmp_path: Path) -> None:
    """`fencepost serve --etcd-ca --etcd-cert --etcd-key` serves locks over mTLS to etcd; the CA may also come by
    --etcd-cacert (its old name) or either's environment variable."""
    cert = ca.issue_cert("fencepost-serve")
    ca.cert_pem.write_to_path(tmp_path / "ca.pem")
    cert.cert_chain_pems[0].write_to_path(tmp_path / "client.pem")
    cert.private_key_pem.write_to_path(tmp_path / "client-key.pem")
    env = child_env()
    ca_flag: list[str] = []
    if ca_by.startswith("--"):
        ca_flag = [ca_by, str(tmp_path / "ca.pem")]
    else:
        env[ca_by] = str(tmp_path / "ca.pem")
    child = ChildProcess([sys.executable, "-m", "fencepost.client.cli", "serve", "--listen", "127.0.0.1:0",
                          "--etcd-endpoints", tls_etcd.client_url, "--prefix", prefix, *ca_flag,
                          "--etcd-cert", str(tmp_path / "client.pem"),
                          "--etcd-key", str(tmp_path / "client-key.pem")], log_path=tmp_path / "serve.log", env=env)
    try:
        match = await child.await_line(LISTENING, 30)
        assert any("(mTLS)" in line for line in child.output), child.output
        async with AsyncLockClient(f"127.0.0.1:{match.group(2)}") as client:
            handle = await client.acquire("serve-mtls", ttl=5.0, timeout=10.0)
            await handle.release()
    finally:
        child.kill()


@pytest.mark.parametrize(("case", "flag", "says"), [
    ("key of another certificate", "--etcd-key", "not the private key of"),
    ("certificate and key swapped", "--etcd-cert", "no certificate"),
    ("key given as the certificate too", "--etcd-key", "no private key"),
    ("encrypted key", "--etcd-key", "encrypted"),
    ("CA file holds a private key", "--etcd-cacert", "no certificate"),
    ("CA file by its new flag holds a private key", "--etcd-ca", "no certificate"),
])
def test_serve_when_tls_files_do_not_fit(case: str, flag: str, says: str, ca: trustme.CA, tmp_path: Path) -> None:
    """PEM files that gRPC would only fail on in the handshake (for ever, NOT_SERVING): exit 2 at start, one line."""
    from cryptography.hazmat.primitives import serialization

    mine, other = ca.issue_cert("fencepost-serve"), ca.issue_cert("someone-else")
    ca.cert_pem.write_to_path(tmp_path / "ca.pem")
    mine.cert_chain_pems[0].write_to_path(tmp_path / "client.pem")
    mine.private_key_pem.write_to_path(tmp_path / "client-key.pem")
    other.private_key_pem.write_to_path(tmp_path / "other-key.pem")
    key = serialization.load_pem_private_key(mine.private_key_pem.bytes(), password=None)
    (tmp_path / "encrypted-key.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"passphrase")))
    files = {
        "key of another certificate": ["--etcd-cacert", "ca.pem", "--etcd-cert", "client.pem",
                                       "--etcd-key", "other-key.pem"],
        "certificate and key swapped": ["--etcd-cacert", "ca.pem", "--etcd-cert", "client-key.pem",
                                        "--etcd-key", "client.pem"],
        "key given as the certificate too": ["--etcd-cacert", "ca.pem", "--etcd-cert", "client.pem",
                                             "--etcd-key", "client.pem"],
        "encrypted key": ["--etcd-cacert", "ca.pem", "--etcd-cert", "client.pem", "--etcd-key", "encrypted-key.pem"],
        "CA file holds a private key": ["--etcd-cacert", "client-key.pem"],
        "CA file by its new flag holds a private key": ["--etcd-ca", "client-key.pem"],
    }[case]
    argv = [str(tmp_path / a) if a.endswith(".pem") else a for a in files]
    result = subprocess.run([sys.executable, "-m", "fencepost.client.cli", "serve", "--listen", "127.0.0.1:0",
                             "--etcd-endpoints", "https://127.0.0.1:1", *argv],
                            capture_output=True, text=True, timeout=20, env=child_env())
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"fencepost serve: error: {flag} "), result.stderr
    assert says in lines[0], lines[0]
    assert "listening" not in result.stdout


# ---------------------------------------------------------------- authentication

PASSWORD = "s3cret-pw"


@pytest.fixture(scope="module")
def auth_prefix() -> str:
    return "/fencepost-auth/"


@pytest.fixture(scope="module")
def auth_etcd(tmp_path_factory: pytest.TempPathFactory, auth_prefix: str) -> Iterator[EmbeddedEtcd]:
    """A real etcd with auth enabled: root, and user ``locks`` whose role grants only the lock prefix."""
    etcd = EmbeddedEtcd(tmp_path_factory.mktemp("auth-etcd"))
    etcd.start()
    try:
        asyncio.run(enable_auth(etcd.endpoint, auth_prefix))
        yield etcd
    finally:
        etcd.stop()


async def enable_auth(endpoint: str, prefix: str) -> None:
    """Enable auth on the etcd at ``endpoint``: users root and locks (role fencepost: readwrite on ``prefix``)."""
    async with grpc.aio.insecure_channel(f"dns:///{endpoint}") as channel:
        auth = rpc_pb2_grpc.AuthStub(channel)
        await auth.RoleAdd(rpc_pb2.AuthRoleAddRequest(name="root"), timeout=5)
        await auth.UserAdd(rpc_pb2.AuthUserAddRequest(name="root", password="root-pw"), timeout=5)
        await auth.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="root", role="root"), timeout=5)
        await auth.RoleAdd(rpc_pb2.AuthRoleAddRequest(name="fencepost"), timeout=5)
        key = prefix.encode()
        await auth.RoleGrantPermission(rpc_pb2.AuthRoleGrantPermissionRequest(
            name="fencepost", perm=auth_pb2.Permission(permType=auth_pb2.Permission.READWRITE, key=key,
                                                       range_end=prefix_end(key))), timeout=5)
        await auth.UserAdd(rpc_pb2.AuthUserAddRequest(name="locks", password=PASSWORD), timeout=5)
        await auth.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="locks", role="fencepost"), timeout=5)
        await auth.AuthEnable(rpc_pb2.AuthEnableRequest(), timeout=5)


async def test_auth_when_password_is_right(auth_etcd: EmbeddedEtcd, auth_prefix: str) -> None:
    """With etcd auth on, a coordinator whose user may use only the lock prefix serves locks."""
    coordinator = Coordinator([auth_etcd.endpoint], listen="127.0.0.1:0", prefix=auth_prefix + "right/",
                              etcd_auth=EtcdAuth("locks", PASSWORD))
    try:
        await _started(coordinator)
        first = await _acquire_and_release(coordinator, "authenticated")
        assert await _acquire_and_release(coordinator, "authenticated") > first
    finally:
        await coordinator.stop(0)


async def test_auth_when_password_is_wrong(auth_etcd: EmbeddedEtcd, auth_prefix: str) -> None:
    """A wrong password stops the coordinator at start with a message naming the user, not the password."""
    coordinator = Coordinator([auth_etcd.endpoint], listen="127.0.0.1:0", prefix=auth_prefix,
                              etcd_auth=EtcdAuth("locks", "not-" + PASSWORD))
    try:
        with pytest.raises(RuntimeError) as info:
            await coordinator.start()
    finally:
        await coordinator.stop(0)
    assert "'locks'" in str(info.value) and "authentication failed" in str(info.value)
    assert PASSWORD not in str(info.value)


async def test_auth_when_prefix_is_outside_the_role(auth_etcd: EmbeddedEtcd) -> None:
    """A prefix the user's role does not grant: calls fail UNAVAILABLE saying permission denied."""
    coordinator = Coordinator([auth_etcd.endpoint], listen="127.0.0.1:0", prefix="/elsewhere/",
                              etcd_auth=EtcdAuth("locks", PASSWORD))
    try:
        await _started(coordinator)
        async with grpc.aio.insecure_channel(coordinator.address) as channel:
            stub = OwnedStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Describe(lock_pb2.DescribeRequest(name="x"), timeout=15)
    finally:
        await coordinator.stop(0)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "permission denied" in (info.value.details() or "") and "'locks'" in (info.value.details() or "")


def _logged(caplog: pytest.LogCaptureFixture, logger: str, text: str, level: int | None = None) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == logger and text in r.getMessage() and (level is None or r.levelno == level)]


async def test_auth_when_coordinator_has_no_user(auth_etcd: EmbeddedEtcd, auth_prefix: str,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """Auth on in etcd, no user given: the coordinator stays up NOT_SERVING (etcd may change) and logs the
    refusal once, naming the missing --etcd-user, not on every restart of its watch."""
    caplog.set_level(logging.DEBUG, logger="fencepost.coordinator")
    coordinator = Coordinator([auth_etcd.endpoint], listen="127.0.0.1:0", prefix=auth_prefix + "no-user/")
    try:
        await _started(coordinator)
        await wait_for(lambda: len(_logged(caplog, WATCH_LOGGER, "lock watch failed")) >= 4, 30,
                       0.05, "four restarts of the lock watch")
        await wait_for(lambda: _logged(caplog, "fencepost.coordinator", "NOT_SERVING"), 10, 0.05, "NOT_SERVING")
    finally:
        await coordinator.stop(0)
    warned = _logged(caplog, WATCH_LOGGER, "lock watch failed", logging.WARNING)
    assert len(warned) == 1 and "--etcd-user" in warned[0], warned
    health = _logged(caplog, "fencepost.coordinator", "NOT_SERVING")
    assert len(health) == 1 and "refuses the coordinator" in health[0] and "no --etcd-user" in health[0], health


async def test_auth_when_etcd_refuses_the_password_after_start(tmp_path: Path, auth_prefix: str,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """etcd down at start, back refusing the password: NOT_SERVING (not an exit), and each change logged once:
    unreachable, then refused."""
    caplog.set_level(logging.DEBUG, logger="fencepost.coordinator")
    etcd = EmbeddedEtcd(tmp_path / "etcd")
    await asyncio.to_thread(etcd.start)
    coordinator = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=auth_prefix + "later/",
                              etcd_auth=EtcdAuth("locks", "not-" + PASSWORD))
    try:
        await enable_auth(etcd.endpoint, auth_prefix)
        await asyncio.to_thread(etcd.stop)
        await _started(coordinator)  # etcd out of reach: not a refusal yet
        await wait_for(lambda: _logged(caplog, "fencepost.coordinator", "unreachable: NOT_SERVING"), 10, 0.05,
                       "NOT_SERVING with etcd down")
        await asyncio.to_thread(etcd.start)
        await wait_for(lambda: _logged(caplog, "fencepost.coordinator", "refuses the coordinator"), 30, 0.05,
                       "the refusal to be logged")
        refused_at = len(_logged(caplog, WATCH_LOGGER, "lock watch failed"))
        await wait_for(lambda: len(_logged(caplog, WATCH_LOGGER, "lock watch failed"))
                       >= refused_at + 4, 30, 0.05, "four more restarts of the lock watch")
    finally:
        await coordinator.stop(0)
        await asyncio.to_thread(etcd.stop)
    health = _logged(caplog, "fencepost.coordinator", "NOT_SERVING")
    assert len(health) == 2 and "unreachable" in health[0], health
    assert "refuses the coordinator (authentication failed, user 'locks')" in health[1], health
    warned = _logged(caplog, WATCH_LOGGER, "refused the coordinator's credentials", logging.WARNING)
    assert len(warned) == 1, warned
    assert PASSWORD not in caplog.text


def _serve(endpoint: str, prefix: str, password: str, tmp_path: Path) -> ChildProcess:
    env = child_env()
    env["FENCEPOST_ETCD_PASSWORD"] = password
    return ChildProcess([sys.executable, "-m", "fencepost.client.cli", "serve", "--listen", "127.0.0.1:0",
                         "--etcd-endpoints", endpoint, "--prefix", prefix, "--etcd-user", "locks"],
                        log_path=tmp_path / "serve.log", env=env)


async def test_serve_when_etcd_user_is_given(auth_etcd: EmbeddedEtcd, auth_prefix: str, tmp_path: Path) -> None:
    """`fencepost serve --etcd-user` takes the password from FENCEPOST_ETCD_PASSWORD and never prints it."""
    child = _serve(auth_etcd.endpoint, auth_prefix + "serve/", PASSWORD, tmp_path)
    try:
        match = await child.await_line(LISTENING, 30)
        async with AsyncLockClient(f"127.0.0.1:{match.group(2)}") as client:
            handle = await client.acquire("serve-auth", ttl=5.0, timeout=10.0)
            await handle.release()
        assert child.terminate() == 0
    finally:
        child.kill()
    assert any("user locks" in line for line in child.output), child.output
    assert PASSWORD not in child.log_tail(100_000)


@pytest.mark.parametrize("by", ["--etcd-password-file", "FENCEPOST_ETCD_PASSWORD_FILE"])
async def test_serve_when_etcd_password_file_is_given(by: str, auth_etcd: EmbeddedEtcd, auth_prefix: str,
                                                      tmp_path: Path) -> None:
    """The password may come from a file instead (its trailing newline dropped), by flag or variable."""
    (tmp_path / "password").write_text(PASSWORD + "\n")
    env = child_env()
    env.pop("FENCEPOST_ETCD_PASSWORD", None)
    flag: list[str] = []
    if by.startswith("--"):
        flag = [by, str(tmp_path / "password")]
    else:
        env[by] = str(tmp_path / "password")
    child = ChildProcess([sys.executable, "-m", "fencepost.client.cli", "serve", "--listen", "127.0.0.1:0",
                          "--etcd-endpoints", auth_etcd.endpoint, "--prefix", auth_prefix + "file/",
                          "--etcd-user", "locks", *flag], log_path=tmp_path / "serve.log", env=env)
    try:
        match = await child.await_line(LISTENING, 30)
        async with AsyncLockClient(f"127.0.0.1:{match.group(2)}") as client:
            handle = await client.acquire("serve-password-file", ttl=5.0, timeout=10.0)
            await handle.release()
        assert child.terminate() == 0
    finally:
        child.kill()
    assert PASSWORD not in child.log_tail(100_000)


def test_serve_when_etcd_password_is_wrong(auth_etcd: EmbeddedEtcd, auth_prefix: str, tmp_path: Path) -> None:
    """A wrong password: `fencepost serve` exits 1 with one line naming the user."""
    env = child_env()
    env["FENCEPOST_ETCD_PASSWORD"] = "wrong-" + PASSWORD
    result = subprocess.run([sys.executable, "-m", "fencepost.client.cli", "serve", "--listen", "127.0.0.1:0",
                             "--etcd-endpoints", auth_etcd.endpoint, "--etcd-user", "locks"],
                            capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 1, result.stderr
    line = next(line for line in result.stderr.splitlines() if line.startswith("fencepost:"))
    assert "'locks'" in line and "authentication failed" in line
    assert PASSWORD not in result.stderr + result.stdout


# ---------------------------------------------------------------- bad flags


@pytest.mark.parametrize(("argv", "env", "says"), [
    (["--etcd-endpoints", "etcd1"], {}, "--etcd-endpoints"),
    (["--etcd-endpoints", "etcd1:70000"], {}, "port 70000"),
    (["--etcd-endpoints", "etcd1:2379", "--etcd-cert", "/nonexistent/c.pem", "--etcd-key", "/nonexistent/k.pem"],
     {}, "cannot read"),
    (["--etcd-endpoints", "etcd1:2379", "--etcd-cert", "{pem}"], {}, "needs its key"),
    (["--etcd-endpoints", "etcd1:2379", "--etcd-cacert", "{junk}"], {}, "not a PEM file"),
    (["--etcd-endpoints", "etcd1:2379", "--etcd-user", "locks"], {}, "FENCEPOST_ETCD_PASSWORD"),
    (["--etcd-endpoints", "etcd1:2379"], {"FENCEPOST_ETCD_PASSWORD": "x"}, "--etcd-user"),
    (["--etcd-user", "locks"], {"FENCEPOST_ETCD_PASSWORD": "x"}, "need --etcd-endpoints"),
    (["--etcd-endpoints", "http://etcd1:2379", "--etcd-cacert", "{pem}"], {}, "http://"),
    (["--etcd-endpoints", "etcd1:2379", "--etcd-ca", "{junk}"], {}, "--etcd-ca: not a PEM file"),
    (["--etcd-endpoints", "etcd1:2379", "--etcd-ca", "{pem}", "--etcd-cacert", "{junk}"], {}, "different files"),
    (["--etcd-endpoints", "etcd1:2379"], {"FENCEPOST_ETCD_CA": "{pem}", "FENCEPOST_ETCD_CACERT": "{junk}"},
     "different files"),
    (["--etcd-ca", "{pem}"], {}, "--etcd-ca, --etcd-cert, --etcd-key, --etcd-user and --etcd-password-file need"),
    (["--etcd-endpoints", "etcd1:2379", "--etcd-user", "locks", "--etcd-password-file", "{password}"],
     {"FENCEPOST_ETCD_PASSWORD": "x"}, "--etcd-password-file and FENCEPOST_ETCD_PASSWORD are both given"),
    (["--etcd-endpoints", "etcd1:2379", "--etcd-user", "locks", "--etcd-password-file", "/nonexistent/pw"], {},
     "--etcd-password-file /nonexistent/pw cannot be read"),
    (["--etcd-endpoints", "etcd1:2379", "--etcd-user", "locks"], {"FENCEPOST_ETCD_PASSWORD_FILE": "{dir}"},
     "--etcd-password-file {dir} cannot be read"),
    (["--etcd-endpoints", "etcd1:2379", "--etcd-user", "locks", "--etcd-password-file", "{empty}"], {}, "is empty"),
    (["--etcd-endpoints", "etcd1:2379", "--etcd-user", "locks", "--etcd-password-file", "{pem}"], {},
     "more than one line"),
    (["--etcd-endpoints", "etcd1:2379", "--etcd-password-file", "{password}"], {},
     "--etcd-password-file is given but no --etcd-user"),
    (["--etcd-password-file", "{password}"], {}, "need --etcd-endpoints"),
    (["--log-level", "chatty"], {}, "--log-level"),
    ([], {"FENCEPOST_GRACE_SECONDS": "soon"}, "--grace-seconds"),
])
def test_serve_when_a_flag_is_bad(argv: list[str], env: dict[str, str], says: str, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Bad etcd flags or environment values: one line on stderr naming the problem, exit 2, nothing started."""
    (tmp_path / "c.pem").write_text("-----BEGIN CERTIFICATE-----\nMIIB\n")
    (tmp_path / "junk.txt").write_text("not a certificate")
    (tmp_path / "password").write_text("pw\n")
    (tmp_path / "empty").write_text("\n")
    monkeypatch.delenv("FENCEPOST_ETCD_PASSWORD", raising=False)

    def fill(text: str) -> str:
        return text.format(pem=tmp_path / "c.pem", junk=tmp_path / "junk.txt", password=tmp_path / "password",
                           empty=tmp_path / "empty", dir=tmp_path)

    for key, value in env.items():
        monkeypatch.setenv(key, fill(value))
    argv = [fill(a) for a in argv]
    says = fill(says)
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1 and says in err and "Traceback" not in err, err

