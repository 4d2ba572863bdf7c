"""What keeps two coordinators from stepping on each other: the port and the data directory."""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from fencepost.client import AsyncLockClient
from fencepost.client.v1 import lock_pb2
from fencepost.coordinator.process.coordinator import Coordinator, check_listen
from fencepost.coordinator.process.embedded import EmbeddedEtcd

from .conftest import LISTENING, ChildProcess, child_env
from .owned_stub import OwnedStub


async def test_start_when_port_is_taken_by_another_coordinator(etcd: EmbeddedEtcd, prefix: str) -> None:
    """A second coordinator on a bound port fails to start (no SO_REUSEPORT sharing of the port)."""
    first = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix)
    port = await first.start()
    try:
        second = Coordinator([etcd.endpoint], listen=f"127.0.0.1:{port}", prefix=prefix)
        with pytest.raises(RuntimeError, match="cannot listen"):
            await second.start()
        await second.stop(0)
    finally:
        await first.stop(0)


@pytest.mark.parametrize("flag", ["--listen", "--health-listen", "--metrics-listen", "--http-listen"])
def test_serve_when_an_address_is_in_use(flag: str, tmp_path: Path) -> None:
    """A taken port: exit 1 at once, one line naming the flag, the address and why; no embedded etcd started."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        argv = [sys.executable, "-m", "fencepost.client.cli", "serve", "--data-dir", str(tmp_path / "data"),
                "--listen", "127.0.0.1:0", flag, address]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=child_env())
    assert result.returncode == 1, result
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [f"fencepost serve: cannot listen on {address} ({flag}): address already in use"], result.stderr
    assert "embedded etcd" not in result.stdout, result.stdout
    assert not (tmp_path / "data").exists() and not _etcds_on(tmp_path / "data")


def test_serve_when_data_dir_is_in_use(tmp_path: Path) -> None:
    """A second `fencepost serve` on the same data directory exits 1 at once, naming the directory."""
    argv = [sys.executable, "-m", "fencepost.client.cli", "serve", "--listen", "127.0.0.1:0",
            "--data-dir", str(tmp_path)]
    first = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env())
    try:
        assert first.stdout is not None
        deadline = time.monotonic() + 30
        for line in first.stdout:
            if LISTENING.search(line) or time.monotonic() > deadline:
                break
        started = time.monotonic()
        second = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=child_env())
        assert second.returncode == 1
        assert "in use by another fencepost serve" in second.stderr
        assert str(tmp_path) in second.stderr
        assert time.monotonic() - started < 5
    finally:
        first.terminate()
        first.communicate(timeout=30)


def _etcds_on(data_dir: Path) -> list[int]:
    """The pids of the live (not zombie) etcd processes whose data is in ``data_dir``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # gone meanwhile
        if state != "Z" and Path(os.fsdecode(args[0])).name == "etcd" and os.fsencode(data_dir / "data") in args:
            pids.append(int(entry.name))
    return pids


async def test_serve_when_the_previous_serve_was_killed(tmp_path: Path) -> None:
    """A SIGKILLed serve leaves its embedded etcd running (in its own session, out of Ctrl-C's reach); the next
    serve on the same data directory stops that etcd, says so, and serves within seconds."""
    argv = [sys.executable, "-m", "fencepost.client.cli", "serve", "--listen", "127.0.0.1:0",
            "--data-dir", str(tmp_path)]
    first = ChildProcess(argv, log_path=tmp_path / "serve-1.log")
    second: ChildProcess | None = None
    try:
        await first.await_line(LISTENING, 30)
        orphans = _etcds_on(tmp_path)
        assert len(orphans) == 1, orphans
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait()
        assert _etcds_on(tmp_path) == orphans  # it outlived its serve

        second = ChildProcess(argv, log_path=tmp_path / "serve-2.log")
        match = await second.await_line(LISTENING, 15)
        assert _etcds_on(tmp_path) not in ([], orphans)
        assert any(f"pid {orphans[0]}" in line and "stopped" in line for line in second.output), second.output
        async with AsyncLockClient(f"127.0.0.1:{match.group(2)}") as client:
            handle = await client.acquire("after-a-killed-serve", ttl=5.0, timeout=10.0)
            await handle.release()
            info = await client.server_info()
        assert info.etcd.embedded is True and info.etcd.available, info.etcd  # ServerInfo says whose etcd
        assert second.terminate() == 0
        assert _etcds_on(tmp_path) == []
    finally:
        first.kill()
        if second is not None:
            second.kill()
        for pid in _etcds_on(tmp_path):  # left by a failure above: ours, on our data directory
            os.kill(pid, signal.SIGKILL)


def test_embedded_etcd_when_a_living_owner_runs_etcd_on_the_data_dir(tmp_path: Path) -> None:
    """Only an orphan is stopped: an etcd whose owner still runs is left alone, and a second start fails at once."""
    first = EmbeddedEtcd(tmp_path)
    first.start()
    try:
        second = EmbeddedEtcd(tmp_path)
        started = time.monotonic()
        with pytest.raises(RuntimeError, match=f"etcd \\(pid {first.pid}\\) of the running process {os.getpid()}"):
            second.start()
        assert time.monotonic() - started < 5
        assert first.healthy()
    finally:
        first.stop()
    assert not first.pid_path.exists()


@pytest.mark.parametrize("grace", ["-3", "nan", "4000"])
def test_serve_when_grace_seconds_is_out_of_range(grace: str) -> None:
    """`fencepost serve` refuses a negative, NaN or huge --grace-seconds with exit 2, before starting anything."""
    result = subprocess.run([sys.executable, "-m", "fencepost.client.cli", "serve", "--grace-seconds", grace],
                            capture_output=True, text=True, timeout=30, env=child_env())
    assert result.returncode == 2
    assert "--grace-seconds" in result.stderr


def _serve_fails_at_once(argv: list[str], env: dict[str, str] | None = None) -> str:
    """Run `fencepost serve ARGV` and expect exit 2 with one line on stderr; returns that line."""
    child = child_env()
    child.update(env or {})
    result = subprocess.run([sys.executable, "-m", "fencepost.client.cli", "serve", *argv],
                            capture_output=True, text=True, timeout=20, env=child)
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stdout == "", result.stdout
    return lines[0]


@pytest.mark.parametrize(("argv", "env"), [
    (["--listen", "127.0.0.1"], {}),
    (["--listen", "127.0.0.1:abc"], {}),
    (["--listen", "127.0.0.1:65536"], {}),
    (["--listen", "::1:7420"], {}),
    (["--listen", ":7420"], {}),
    ([], {"FENCEPOST_LISTEN": "nope"}),
])
def test_serve_when_listen_is_not_host_port(argv: list[str], env: dict[str, str], tmp_path: Path) -> None:
    """A --listen without a port, with a bad port or an unbracketed IPv6 address: exit 2 before etcd starts."""
    line = _serve_fails_at_once(["--data-dir", str(tmp_path / "data"), *argv], env)
    assert "--listen" in line and "HOST:PORT" in line, line
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("listen", ["127.0.0.1:0", "127.0.0.1:7420", "0.0.0.0:65535", "localhost:7420",
                                    "[::1]:7420", "[::]:0", "etcd-1.example.com:80"])
def test_listen_when_host_port_is_well_formed(listen: str) -> None:
    """Addresses, host names and bracketed IPv6 addresses with a port 0 to 65535 are accepted as they are."""
    assert check_listen(listen) == listen


@pytest.mark.parametrize(("argv", "env"), [
    (["--etcd-endpoints", ""], {}),
    (["--etcd-endpoints", " , ,"], {}),
    ([], {"FENCEPOST_ETCD_ENDPOINTS": ""}),
])
def test_serve_when_etcd_endpoints_is_empty(argv: list[str], env: dict[str, str], tmp_path: Path) -> None:
    """An explicitly empty --etcd-endpoints is refused (exit 2), not taken as "start the embedded etcd"."""
    line = _serve_fails_at_once(["--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "data"), *argv], env)
    assert "--etcd-endpoints is empty" in line, line
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("where", ["a-file", "under-a-file", "/proc/forbidden", "/proc"])
def test_serve_when_data_dir_is_unusable(where: str, tmp_path: Path) -> None:
    """A --data-dir that is a file, cannot be made or cannot be written in: one line naming it, exit 2."""
    (tmp_path / "a-file").write_text("not a directory")
    data_dir = {"a-file": str(tmp_path / "a-file"), "under-a-file": str(tmp_path / "a-file" / "etcd")}.get(where, where)
    line = _serve_fails_at_once(["--listen", "127.0.0.1:0", "--data-dir", data_dir])
    assert f"--data-dir {data_dir}" in line, line


def test_embedded_etcd_when_data_dir_already_exists(tmp_path: Path) -> None:
    """An existing data directory keeps its mode (``--data-dir /tmp`` must not turn /tmp private); a new one is 0700."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    etcd = EmbeddedEtcd(shared)
    etcd.start()
    try:
        assert stat.S_IMODE(shared.stat().st_mode) == 0o755
        assert stat.S_IMODE((shared / "data").stat().st_mode) == 0o700
    finally:
        etcd.stop()
    fresh = EmbeddedEtcd(tmp_path / "fresh")
    fresh.start()
    try:
        assert stat.S_IMODE((tmp_path / "fresh").stat().st_mode) & 0o077 == 0
    finally:
        fresh.stop()


# ---------------------------------------------------------------- Unix socket


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short directory for socket files (a socket path has at most 107 bytes; pytest's tmp_path can be longer)."""
    with tempfile.TemporaryDirectory(prefix="fp-") as name:
        yield Path(name)


async def _acquire_release_raw(address: str, name: str) -> int:
    """LeaseGrant, Acquire, Release through the generated stub on a plain channel; returns the token."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = OwnedStub(channel)
        lease = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=5), timeout=10)
        got = await stub.Acquire(lock_pb2.AcquireRequest(name=name, lease_id=lease.lease_id, wait_ms=5000),
                                 timeout=10)
        assert got.acquired
        await stub.Release(lock_pb2.ReleaseRequest(name=name, lease_id=lease.lease_id, token=got.token), timeout=10)
        await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease.lease_id), timeout=10)
        return int(got.token)


@pytest.mark.parametrize("form", ["unix:{path}", "unix://{path}"])
async def test_listen_when_unix_socket(form: str, etcd: EmbeddedEtcd, prefix: str, sock_dir: Path) -> None:
    """Both unix: forms serve locks on the socket; address is unix:PATH; the socket file goes at stop."""
    path = sock_dir / "fencepost.sock"
    coordinator = Coordinator([etcd.endpoint], listen=form.format(path=path), prefix=prefix)
    try:
        assert await coordinator.start() == 0
        assert coordinator.address == f"unix:{path}"
        assert stat.S_ISSOCK(path.stat().st_mode)
        first = await _acquire_release_raw(coordinator.address, "over-a-socket")
        assert await _acquire_release_raw(f"unix://{path}", "over-a-socket") > first
    finally:
        await coordinator.stop(0)
    assert not path.exists()


@pytest.mark.parametrize(("listen", "says"), [
    ("unix:relative/fencepost.sock", "must be absolute"),
    ("unix:", "must be absolute"),
    ("unix://host/run/fencepost.sock", "unix://HOST/... is not supported"),
    ("unix:/run/fencepost/", "names a directory"),
    ("unix:/run/fence post.sock", "white space"),
    ("unix:/" + "x" * 107, "longer than 107 bytes"),
])
def test_listen_when_unix_socket_path_is_bad(listen: str, says: str) -> None:
    """A relative, empty, authority-form, directory-like, spaced or too long socket path: a ValueError saying so."""
    with pytest.raises(ValueError, match=re.escape(says)) as info:
        check_listen(listen)
    assert "unix:/ABSOLUTE/PATH" in str(info.value)


def test_serve_when_listen_is_a_relative_socket_path(tmp_path: Path) -> None:
    """`fencepost serve --listen unix:rel.sock` exits 2 naming --listen, before etcd starts."""
    line = _serve_fails_at_once(["--data-dir", str(tmp_path / "data"), "--listen", "unix:rel.sock"])
    assert line.startswith("fencepost serve: error: --listen: ") and "must be absolute" in line, line
    assert not (tmp_path / "data").exists()


async def test_listen_when_a_killed_coordinator_left_its_socket(etcd: EmbeddedEtcd, prefix: str, sock_dir: Path,
                                                               tmp_path: Path, caplog: pytest.LogCaptureFixture
                                                               ) -> None:
    """A SIGKILLed `fencepost serve` leaves its socket file; the next coordinator removes it, says so, and serves."""
    path = sock_dir / "fencepost.sock"
    child = ChildProcess([sys.executable, "-m", "fencepost.client.cli", "serve", "--listen", f"unix:{path}",
                          "--etcd-endpoints", etcd.endpoint, "--prefix", prefix], log_path=tmp_path / "serve.log")
    try:
        await child.await_line(re.escape(f"fencepost: listening on unix:{path}") + "$", 30)
        await _acquire_release_raw(f"unix:{path}", "before-the-kill")
    finally:
        child.kill()
    assert stat.S_ISSOCK(path.stat().st_mode)  # left behind
    caplog.set_level(logging.INFO, logger="fencepost.coordinator")
    coordinator = Coordinator([etcd.endpoint], listen=f"unix:{path}", prefix=prefix)
    try:
        await coordinator.start()
        await _acquire_release_raw(coordinator.address, "after-the-kill")
    finally:
        await coordinator.stop(0)
    assert any("removed the stale socket file" in r.getMessage() and str(path) in r.getMessage()
               for r in caplog.records), caplog.text


async def test_listen_when_another_coordinator_serves_on_the_socket(etcd: EmbeddedEtcd, prefix: str,
                                                                     sock_dir: Path) -> None:
    """A second coordinator on a live coordinator's socket fails to start, and leaves the first one's socket alone
    (gRPC alone would unlink it and bind its own)."""
    path = sock_dir / "fencepost.sock"
    first = Coordinator([etcd.endpoint], listen=f"unix:{path}", prefix=prefix)
    await first.start()
    try:
        inode = path.stat().st_ino
        second = Coordinator([etcd.endpoint], listen=f"unix:{path}", prefix=prefix)
        with pytest.raises(RuntimeError, match="another fencepost coordinator serves on it"):
            await second.start()
        await second.stop(0)
        assert path.stat().st_ino == inode
        await _acquire_release_raw(first.address, "still-the-first")
    finally:
        await first.stop(0)


async def test_listen_when_another_process_accepts_on_the_socket(etcd: EmbeddedEtcd, prefix: str,
                                                                  sock_dir: Path) -> None:
    """A socket some other process listens on is not stale: the coordinator refuses it and does not remove it."""
    path = sock_dir / "other.sock"
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.bind(str(path))
    other.listen()
    try:
        coordinator = Coordinator([etcd.endpoint], listen=f"unix:{path}", prefix=prefix)
        with pytest.raises(RuntimeError, match="another process accepts connections on it"):
            await coordinator.start()
        await coordinator.stop(0)
        assert stat.S_ISSOCK(path.stat().st_mode)
    finally:
        other.close()


@pytest.mark.parametrize("what", ["a regular file", "no directory"])
async def test_listen_when_the_socket_path_is_unusable(what: str, etcd: EmbeddedEtcd, prefix: str,
                                                       sock_dir: Path) -> None:
    """A regular file at the socket path is never removed; a missing directory is named."""
    path = sock_dir / ("data.txt" if what == "a regular file" else "missing/fencepost.sock")
    if what == "a regular file":
        path.write_text("keep me")
    coordinator = Coordinator([etcd.endpoint], listen=f"unix:{path}", prefix=prefix)
    with pytest.raises(RuntimeError) as info:
        await coordinator.start()
    await coordinator.stop(0)
    if what == "a regular file":
        assert "exists and is not a socket" in str(info.value)
        assert path.read_text() == "keep me"
    else:
        assert f"the directory {path.parent} does not exist" in str(info.value)
