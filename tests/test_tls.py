"""TLS on the coordinator's port, against a real etcd and real certificates (trustme): server TLS, client
certificates required or optional, and certificate reload without dropping established streams."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import trustme

from fencepost.client.v1 import lock_pb2
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.process.embedded import EmbeddedEtcd
from fencepost.coordinator.process.tls import ServerTls, TlsFileError

from .tls_helpers import acquire_release, call_fails, client_credentials, install, install_server_cert, open_channel
from .owned_stub import OwnedStub

# ---------------------------------------------------------------- certificates and channels


@pytest.fixture(scope="module")
def ca1() -> trustme.CA:
    """The CA of certificate A (the first server certificate) and of the good client certificates."""
    return trustme.CA()


@pytest.fixture(scope="module")
def ca2() -> trustme.CA:
    """The CA of certificate B (the server certificate after a reload), and of clients ca1 does not know."""
    return trustme.CA()


@pytest.fixture
def files(tmp_path: Path, ca1: trustme.CA) -> Path:
    """A directory with certificate A (from ca1) in cert.pem/key.pem and ca1 in client-ca.pem."""
    install_server_cert(ca1, tmp_path)
    ca1.cert_pem.write_to_path(tmp_path / "client-ca.pem")
    return tmp_path


async def started(etcd: EmbeddedEtcd, prefix: str, tls: ServerTls) -> Coordinator:
    coordinator = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix, tls=tls)
    await asyncio.wait_for(coordinator.start(), 20)
    return coordinator


@pytest.fixture
async def tls_coordinator(etcd: EmbeddedEtcd, prefix: str, files: Path) -> AsyncIterator[Coordinator]:
    """A coordinator with server TLS (certificate A), no client certificates."""
    coordinator = await started(etcd, prefix, ServerTls(files / "cert.pem", files / "key.pem"))
    try:
        yield coordinator
    finally:
        await coordinator.stop(0)


# ---------------------------------------------------------------- server TLS and mTLS


async def test_tls_when_the_client_trusts_the_servers_ca(tls_coordinator: Coordinator, ca1: trustme.CA,
                                                         ca2: trustme.CA) -> None:
    """Over TLS a full acquire/release works; a plaintext client and a client trusting another CA are refused."""
    first = await acquire_release(tls_coordinator.address, client_credentials(ca1), "over-tls")
    assert await acquire_release(tls_coordinator.address, client_credentials(ca1), "over-tls") > first
    assert await call_fails(tls_coordinator.address, None) == grpc.StatusCode.UNAVAILABLE
    assert await call_fails(tls_coordinator.address, client_credentials(ca2)) == grpc.StatusCode.UNAVAILABLE


async def test_mtls_when_client_certificates_are_required(etcd: EmbeddedEtcd, prefix: str, files: Path,
                                                          ca1: trustme.CA, ca2: trustme.CA) -> None:
    """With a client CA and require: no certificate and a certificate of another CA are refused at the handshake;
    a certificate of the client CA works."""
    tls = ServerTls(files / "cert.pem", files / "key.pem", client_ca=files / "client-ca.pem")
    assert tls.client_auth == "require"
    coordinator = await started(etcd, prefix, tls)
    try:
        assert await call_fails(coordinator.address, client_credentials(ca1)) == grpc.StatusCode.UNAVAILABLE
        assert await call_fails(coordinator.address, client_credentials(ca1, ca2)) == grpc.StatusCode.UNAVAILABLE
        assert await call_fails(coordinator.address, client_credentials(ca1, ca1)) is None
        await acquire_release(coordinator.address, client_credentials(ca1, ca1), "over-mtls")
    finally:
        await coordinator.stop(0)


async def test_mtls_when_client_certificates_are_optional(etcd: EmbeddedEtcd, prefix: str, files: Path,
                                                          ca1: trustme.CA, ca2: trustme.CA) -> None:
    """With a client CA and optional: a client without a certificate works, and so does one with a certificate
    (gRPC Python does not ask for it then: even one of another CA is not looked at)."""
    tls = ServerTls(files / "cert.pem", files / "key.pem", client_ca=files / "client-ca.pem",
                    require_client_cert=False)
    assert tls.client_auth == "optional"
    coordinator = await started(etcd, prefix, tls)
    try:
        await acquire_release(coordinator.address, client_credentials(ca1), "without-a-certificate")
        assert await call_fails(coordinator.address, client_credentials(ca1, ca1)) is None
        assert await call_fails(coordinator.address, client_credentials(ca1, ca2)) is None
        assert await call_fails(coordinator.address, None) == grpc.StatusCode.UNAVAILABLE  # still TLS
    finally:
        await coordinator.stop(0)


@pytest.mark.parametrize(("case", "role", "says"), [
    ("missing key", "key", "cannot be read"),
    ("key of another certificate", "key", "is not the private key of the certificate in"),
    ("client CA holds a key", "ca", "holds no certificate"),
    ("certificate is not PEM", "cert", "is not a PEM file"),
])
def test_server_tls_when_a_file_is_bad(case: str, role: str, says: str, files: Path, ca2: trustme.CA,
                                       etcd: EmbeddedEtcd) -> None:
    """Coordinator(tls=...) reads the files at once: a bad one raises TlsFileError naming it and what is wrong."""
    cert, key, client_ca = files / "cert.pem", files / "key.pem", files / "client-ca.pem"
    if case == "missing key":
        key = files / "nonexistent.pem"
    elif case == "key of another certificate":
        install(key, ca2.issue_cert("127.0.0.1").private_key_pem.bytes())
    elif case == "client CA holds a key":
        client_ca = key
    else:
        cert.write_bytes(b"\x30\x82 DER, not PEM")
    bad = {"cert": cert, "key": key, "ca": client_ca}[role]
    with pytest.raises(TlsFileError) as info:
        Coordinator([etcd.endpoint], listen="127.0.0.1:0", tls=ServerTls(cert, key, client_ca))
    assert info.value.role == role and info.value.path == str(bad)
    assert says in str(info.value) and str(bad) in str(info.value), str(info.value)


# ---------------------------------------------------------------- reload


async def test_reload_keeps_established_streams(tls_coordinator: Coordinator, files: Path, ca1: trustme.CA,
                                                ca2: trustme.CA) -> None:
    """Certificate A replaced by B (another CA) and reloaded: the KeepAlive stream opened under A still gets its
    keepalives acknowledged and its lock stays held; new connections need to trust B's CA."""
    address = tls_coordinator.address
    async with open_channel(address, client_credentials(ca1)) as channel:
        stub = OwnedStub(channel)
        lease = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10), timeout=10)
        got = await stub.Acquire(lock_pb2.AcquireRequest(name="held", lease_id=lease.lease_id, wait_ms=5000),
                                 timeout=10)
        stream = stub.KeepAlive()
        await stream.write(lock_pb2.KeepAliveRequest(keepalive=lock_pb2.LeaseKeepAlive(
            lease_id=lease.lease_id, request_id=1)))
        first = await asyncio.wait_for(stream.read(), 10)
        assert first.keepalive.request_id == 1 and first.keepalive.ttl_seconds > 0

        install_server_cert(ca2, files)
        assert tls_coordinator.reload_tls() is True

        assert await call_fails(address, client_credentials(ca1)) == grpc.StatusCode.UNAVAILABLE
        assert await call_fails(address, client_credentials(ca2)) is None
        await stream.write(lock_pb2.KeepAliveRequest(keepalive=lock_pb2.LeaseKeepAlive(
            lease_id=lease.lease_id, request_id=2)))
        second = await asyncio.wait_for(stream.read(), 10)
        assert second.keepalive.request_id == 2 and second.keepalive.ttl_seconds > 0
        async with open_channel(address, client_credentials(ca2)) as new:
            held = await OwnedStub(new).Describe(lock_pb2.DescribeRequest(name="held"),
                                                                     timeout=10)
        assert held.held and held.holder.lease_id == lease.lease_id and held.holder.token == got.token
        # The old connection still carries unary calls too.
        await stub.Release(lock_pb2.ReleaseRequest(name="held", lease_id=lease.lease_id, token=got.token),
                           timeout=10)
        await stream.done_writing()
        await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease.lease_id), timeout=10)


async def test_reload_when_the_files_change_on_disk(tls_coordinator: Coordinator, files: Path, ca1: trustme.CA,
                                                    ca2: trustme.CA) -> None:
    """Without a SIGHUP, the next handshake after the files changed already uses the new certificate."""
    assert await call_fails(tls_coordinator.address, client_credentials(ca1)) is None
    install_server_cert(ca2, files)
    assert await call_fails(tls_coordinator.address, client_credentials(ca2)) is None
    assert await call_fails(tls_coordinator.address, client_credentials(ca1)) == grpc.StatusCode.UNAVAILABLE


def _reload_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "fencepost.coordinator" and r.levelno == logging.WARNING and "not reloaded" in r.getMessage()]


@pytest.mark.parametrize("how", ["reload_tls", "at the next handshake"])
@pytest.mark.parametrize("case", ["half-written certificate", "key of another certificate", "key removed"])
async def test_reload_when_the_new_files_are_bad(case: str, how: str, tls_coordinator: Coordinator, files: Path,
                                                 ca1: trustme.CA, ca2: trustme.CA,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """Bad new files keep certificate A in use, with one warning naming the file however many handshakes follow;
    once good files arrive they are used."""
    caplog.set_level(logging.INFO, logger="fencepost.coordinator")
    leaf = ca2.issue_cert("127.0.0.1")
    if case == "half-written certificate":
        bad = files / "cert.pem"
        install(bad, leaf.cert_chain_pems[0].bytes()[:400])
    elif case == "key of another certificate":
        bad = files / "key.pem"
        install(files / "cert.pem", leaf.cert_chain_pems[0].bytes())  # key.pem is still A's
    else:
        bad = files / "key.pem"
        bad.unlink()
    if how == "reload_tls":
        assert tls_coordinator.reload_tls() is False
    for _ in range(3):
        assert await call_fails(tls_coordinator.address, client_credentials(ca1)) is None
    warned = _reload_warnings(caplog)
    assert len(warned) == 1 and str(bad) in warned[0] and "the certificate in use stays" in warned[0], warned

    install_server_cert(ca2, files)
    assert await call_fails(tls_coordinator.address, client_credentials(ca2)) is None
    assert await call_fails(tls_coordinator.address, client_credentials(ca1)) == grpc.StatusCode.UNAVAILABLE
    assert len(_reload_warnings(caplog)) == 1


async def test_reload_tls_when_the_coordinator_has_no_tls(coordinator: Coordinator) -> None:
    """reload_tls on a plaintext coordinator is a RuntimeError, not a silent no-op."""
    assert coordinator.tls is None
    with pytest.raises(RuntimeError, match="without TLS"):
        coordinator.reload_tls()


# ---------------------------------------------------------------- fencepost serve


def _bad_files(files: Path, ca2: trustme.CA) -> None:
    """Next to the good files: a key of another certificate, an encrypted key, a DER file, a key-only CA file."""
    from cryptography.hazmat.primitives import serialization

    install(files / "other-key.pem", ca2.issue_cert("127.0.0.1").private_key_pem.bytes())
    key = serialization.load_pem_private_key((files / "key.pem").read_bytes(), password=None)
    (files / "encrypted-key.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"passphrase")))
    (files / "cert.der").write_bytes(b"\x30\x82\x01\x0a DER bytes")


@pytest.mark.parametrize(("argv", "env", "says"), [
    (["--tls-cert", "{cert}"], {}, "--tls-cert needs --tls-key"),
    (["--tls-key", "{key}"], {}, "--tls-key needs --tls-cert"),
    ([], {"FENCEPOST_TLS_CERT": "{cert}"}, "--tls-cert needs --tls-key"),
    (["--client-ca", "{ca}"], {}, "--client-ca needs --tls-cert"),
    (["--tls-cert", "{cert}", "--tls-key", "{key}", "--client-auth", "optional"], {},
     "--client-auth optional needs --client-ca"),
    (["--tls-cert", "{cert}", "--tls-key", "{key}", "--client-ca", "{ca}"], {"FENCEPOST_CLIENT_AUTH": "sometimes"},
     "--client-auth is 'sometimes'; must be require or optional"),
    (["--tls-cert", "{dir}/missing.pem", "--tls-key", "{key}"], {}, "--tls-cert {dir}/missing.pem cannot be read"),
    (["--tls-cert", "{dir}/cert.der", "--tls-key", "{key}"], {}, "--tls-cert {dir}/cert.der is not a PEM file"),
    (["--tls-cert", "{key}", "--tls-key", "{cert}"], {}, "--tls-cert {key} holds no certificate"),
    (["--tls-cert", "{cert}", "--tls-key", "{dir}/other-key.pem"], {},
     "--tls-key {dir}/other-key.pem is not the private key of the certificate in {cert}"),
    (["--tls-cert", "{cert}", "--tls-key", "{dir}/encrypted-key.pem"], {}, "is encrypted"),
    (["--tls-cert", "{cert}", "--tls-key", "{key}", "--client-ca", "{key}"], {},
     "--client-ca {key} holds no certificate"),
    (["--tls-cert", "{cert}", "--tls-key", "{key}", "--client-ca", "{dir}"], {}, "--client-ca {dir} cannot be read"),
    (["--health-listen", "localhost"], {}, "--health-listen: "),
    (["--listen", "127.0.0.1:7499"], {"FENCEPOST_HEALTH_LISTEN": "127.0.0.1:7499"}, "the --listen address"),
    (["--listen", "unix:/tmp/fp.sock", "--health-listen", "unix:///tmp/fp.sock"], {}, "the --listen address"),
    (["--http-listen", "localhost"], {}, "--http-listen: "),
    (["--listen", "127.0.0.1:7499", "--http-listen", "127.0.0.1:7499"], {}, "the address of another listener"),
    (["--health-listen", "127.0.0.1:7498"], {"FENCEPOST_HTTP_LISTEN": "127.0.0.1:7498"},
     "the address of another listener"),
])
def test_serve_when_a_tls_or_health_flag_is_bad(argv: list[str], env: dict[str, str], says: str, files: Path,
                                               ca2: trustme.CA, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Server TLS flags or files that cannot work, a bad --health-listen or --http-listen: one line naming the flag,
    exit 2, nothing started."""
    from fencepost.coordinator.process.main import main

    _bad_files(files, ca2)

    def fill(text: str) -> str:
        return text.format(cert=files / "cert.pem", key=files / "key.pem", ca=files / "client-ca.pem", dir=files)

    for key, value in env.items():
        monkeypatch.setenv(key, fill(value))
    rc = main(["--data-dir", str(files / "data"), *[fill(a) for a in argv]])
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fencepost serve: error: ") and fill(says) in lines[0], err
    assert not (files / "data").exists()


@pytest.mark.parametrize(("argv", "client_auth"), [
    (["--client-ca", "{ca}"], "require"),
    (["--client-ca", "{ca}", "--client-auth", "require"], "require"),
    (["--client-ca", "{ca}", "--client-auth", "optional"], "optional"),
    ([], "none"),
])
def test_serve_when_client_auth_is_given(argv: list[str], client_auth: str, files: Path) -> None:
    """--client-auth defaults to require with --client-ca; optional stops requiring client certificates."""
    from fencepost.coordinator.process import flags

    args = flags.build_parser().parse_args(["--tls-cert", str(files / "cert.pem"), "--tls-key", str(files / "key.pem"),
                                            *[a.format(ca=files / "client-ca.pem") for a in argv]])
    tls = flags.settings(args).tls
    assert tls is not None and tls.client_auth == client_auth


async def test_serve_when_sighup_after_the_certificate_changed(etcd: EmbeddedEtcd, prefix: str, files: Path,
                                                               ca1: trustme.CA, ca2: trustme.CA,
                                                               tmp_path: Path) -> None:
    """`fencepost serve` with mTLS and a health port: SIGHUP after the certificate was replaced by one of another CA
    keeps the open stream (keepalives acked), new connections need the new CA; a SIGHUP with a bad key keeps the
    certificate in use and warns naming the file; health answers in plaintext throughout."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from .conftest import LISTENING, ChildProcess, child_env, wait_for

    env = child_env()
    env["FENCEPOST_CLIENT_CA"] = str(files / "client-ca.pem")  # flags and variables both work
    env["FENCEPOST_HEALTH_LISTEN"] = "127.0.0.1:0"
    child = ChildProcess([sys.executable, "-m", "fencepost.client.cli", "serve", "--listen", "127.0.0.1:0",
                          "--etcd-endpoints", etcd.endpoint, "--prefix", prefix, "--tls-cert", str(files / "cert.pem"),
                          "--tls-key", str(files / "key.pem")], log_path=tmp_path / "serve.log", env=env)
    try:
        match = await child.await_line(LISTENING, 30)
        address = f"127.0.0.1:{match.group(2)}"
        assert any("mTLS (client certificates required)" in line for line in child.output), child.output
        health_line = next(line for line in child.output if "grpc.health.v1 only" in line)
        health_address = health_line.split()[-1]

        async def health_serving() -> bool:
            async with open_channel(health_address, None) as chan:
                got = await health_pb2_grpc.HealthStub(chan).Check(health_pb2.HealthCheckRequest(), timeout=5)
            return got.status == health_pb2.HealthCheckResponse.SERVING

        await wait_for(health_serving, 10, 0.1, "SERVING on the plaintext health port")
        async with open_channel(address, client_credentials(ca1, ca1)) as channel:
            stub = OwnedStub(channel)
            lease = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10), timeout=10)
            got = await stub.Acquire(lock_pb2.AcquireRequest(name="held", lease_id=lease.lease_id), timeout=10)
            assert got.acquired
            stream = stub.KeepAlive()

            async def keepalive(request_id: int) -> lock_pb2.LeaseKeepAliveAck:
                await stream.write(lock_pb2.KeepAliveRequest(keepalive=lock_pb2.LeaseKeepAlive(
                    lease_id=lease.lease_id, request_id=request_id)))
                return (await asyncio.wait_for(stream.read(), 10)).keepalive

            assert (await keepalive(1)).ttl_seconds > 0
            install_server_cert(ca2, files)
            child.signal(signal.SIGHUP)
            await child.await_line("SIGHUP: TLS files reloaded", 10)
            ack = await keepalive(2)
            assert ack.request_id == 2 and ack.ttl_seconds > 0
            assert await call_fails(address, client_credentials(ca1, ca1)) == grpc.StatusCode.UNAVAILABLE
            assert await call_fails(address, client_credentials(ca2, ca1)) is None
            assert await call_fails(address, client_credentials(ca2)) == grpc.StatusCode.UNAVAILABLE  # still mTLS

            install(files / "key.pem", ca1.issue_cert("127.0.0.1").private_key_pem.bytes())  # not B's key
            child.signal(signal.SIGHUP)
            await child.await_line("SIGHUP: TLS files not reloaded, the certificate in use stays", 10)
            assert await call_fails(address, client_credentials(ca2, ca1)) is None
            assert (await keepalive(3)).ttl_seconds > 0
            assert await health_serving()
            await stub.Release(lock_pb2.ReleaseRequest(name="held", lease_id=lease.lease_id, token=got.token),
                               timeout=10)
            await stream.done_writing()
            await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease.lease_id), timeout=10)
        assert child.terminate() == 0
    finally:
        child.kill()
    log = (tmp_path / "serve.log").read_text()
    assert f"key file {files / 'key.pem'} is not the private key of the certificate in {files / 'cert.pem'}" in log
