"""``fencepost serve --workers N`` (N coordinator processes on one port) and ``--loop`` (uvloop or asyncio)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from etcd3aio import Etcd3Client, prefix_range_end

from fencepost.client import AsyncLockClient
from fencepost.client.v1 import lock_pb2
from fencepost.coordinator.process.embedded import EmbeddedEtcd
from fencepost.coordinator.process.eventloop import LoopUnavailable, pick_loop

from .conftest import LISTENING, ChildProcess, child_env
from .http_callers import events, next_event
from .owned_stub import OwnedStub

#: The parent's line naming its workers once they all listen.
WORKERS_LINE = re.compile(r"fencepost: (\d+) workers \(pids ([\d, ]+)\) share (\S+) \(SO_REUSEPORT\), event loop (\w+)")


def _serve_argv(*extra: str) -> list[str]:
    return [sys.executable, "-m", "fencepost.client.cli", "serve", "--listen", "127.0.0.1:0", "--log-format", "text",
            "--grace-seconds", "2", *extra]


@pytest.fixture
def workers(etcd: EmbeddedEtcd, prefix: str, tmp_path: Path) -> Iterator[ChildProcess]:
    """``fencepost serve --workers 2`` on the test etcd, started (not yet listening); killed after the test."""
    child = ChildProcess(_serve_argv("--workers", "2", "--etcd-endpoints", etcd.endpoint, "--prefix", prefix),
                         log_path=tmp_path / "serve.log")
    try:
        yield child
    finally:
        child.kill()


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


async def _started(child: ChildProcess) -> tuple[list[int], str]:
    """Wait until the parent says its workers listen: (the worker pids, the address)."""
    named = await child.await_line(WORKERS_LINE, 30)
    listening = await child.await_line(LISTENING, 5)
    pids = [int(pid) for pid in named.group(2).split(", ")]
    assert int(named.group(1)) == len(pids) and named.group(3) == f"{listening.group(1)}:{listening.group(2)}"
    return pids, named.group(3)


async def _cycle_on_new_connection(address: str, name: str) -> str:
    """Acquire and release ``name`` on a client of its own (its own connection); the serving coordinator's instance id."""
    async with AsyncLockClient(address) as client:
        handle = await client.acquire(name, ttl=5.0, timeout=10.0)
        await handle.release()
        return (await client.server_info()).instance_id


async def _instances(address: str, want: int, tries: int = 40) -> set[str]:
    """Instance ids reached over new connections, until ``want`` distinct ones (or ``tries`` connections)."""
    seen: set[str] = set()
    for i in range(tries):
        seen.add(await _cycle_on_new_connection(address, f"spread/{i}"))
        if len(seen) >= want:
            break
    return seen


async def test_workers_serve_from_every_worker(workers: ChildProcess) -> None:
    """Two workers share one port: one listening line, and new connections reach both (two instance ids)."""
    pids, address = await _started(workers)
    assert len(pids) == 2 and all(_alive(pid) for pid in pids) and os.getpid() not in pids
    assert len(await _instances(address, 2)) == 2
    assert sum(1 for line in workers.output if LISTENING.search(line)) == 1, workers.output
    for more in (["--workers", "2"], []):  # the port is theirs: another serve, with workers or not, cannot join
        other = subprocess.run([*_serve_argv("--etcd-endpoints", "127.0.0.1:1", *more), "--listen", address],
                               capture_output=True, text=True, timeout=30, env=child_env())
        assert other.returncode == 1 and "address already in use" in other.stderr, other
    workers.signal(signal.SIGHUP)  # goes to each worker
    for _ in (1, 2):
        await workers.await_line(r"fencepost: worker [12]: SIGHUP: no TLS files to reload", 10)
    assert {line.split(":")[1] for line in workers.output if "SIGHUP: no TLS" in line} == {" worker 1", " worker 2"}
    assert workers.terminate(30) == 0, workers.log_tail()


async def test_workers_share_the_http_port(etcd: EmbeddedEtcd, prefix: str, tmp_path: Path) -> None:
    """With --http-listen every worker serves the HTTP port too: requests on new connections reach both workers
    (their Fencepost-Instance headers); a lease granted through one is renewed, used and revoked through the other,
    and each worker's lock board shows the lock, read from etcd."""
    child = ChildProcess(_serve_argv("--workers", "2", "--etcd-endpoints", etcd.endpoint, "--prefix", prefix,
                                     "--http-listen", "127.0.0.1:0"), log_path=tmp_path / "serve.log")
    try:
        await _started(child)
        http = (await child.await_line(r"fencepost: HTTP API on (http://\S+)", 5)).group(1)
        assert sum(1 for line in child.output if "HTTP API on" in line) == 1, child.output

        async def call(method: str, path: str, body: dict[str, Any] | None = None, secret: str = "") -> tuple[str, Any]:
            """One request on a connection of its own: (the instance that answered, the JSON answer)."""
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
                async with session.request(method, f"{http}{path}", json=body,
                                           headers={"Fencepost-Lease-Secret": secret} if secret else {}) as answer:
                    assert answer.status == 200, await answer.text()
                    return answer.headers["Fencepost-Instance"], await answer.json()

        granted_by, lease = await call("POST", "/v1/leases", {"ttlSeconds": 20})
        lease_id, secret = lease["leaseId"], lease["leaseSecret"]
        acquired_by, held = await call("POST", "/v1/locks/shared:1:acquire", {"leaseId": lease_id}, secret)
        assert held["acquired"]
        by: dict[str, set[str]] = {}
        for _ in range(40):  # keepalives until both workers have renewed the lease
            instance, renewed = await call("POST", f"/v1/leases/{lease_id}:keepalive", {}, secret)
            assert int(renewed["ttlSeconds"]) > 0
            by.setdefault("keepalive", set()).add(instance)
            if len(by["keepalive"]) == 2:
                break
        assert len(by["keepalive"]) == 2, by
        other = (by["keepalive"] - {granted_by}).pop()
        instances = {granted_by, acquired_by} | by["keepalive"]
        assert len(instances) == 2 and other != granted_by
        for _ in range(40):  # each worker's board shows the lock
            instance, info = await call("GET", "/v1/server")
            assert info["instanceId"] == instance and info["httpAddress"] == http.removeprefix("http://")
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session, \
                    session.get(f"{http}/board/events") as answer:
                shown_by = answer.headers["Fencepost-Instance"]
                stream = events(answer)
                assert (await next_event(stream))[0] == "access"
                name, snapshot = await next_event(stream)
                assert [lock["holder"]["token"] for lock in snapshot["locks"] if lock["name"] == "shared:1"] == [
                    held["token"]]
            by.setdefault("board", set()).add(shown_by)
            if len(by["board"]) == 2:
                break
        assert by["board"] == instances
        for _ in range(40):  # a connection of its own, kept: served by the worker that did not grant the lease
            pinned = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))
            async with pinned.get(f"{http}/v1/server") as answer:
                if answer.headers["Fencepost-Instance"] == other:
                    break
            await pinned.close()
        async with pinned:
            headers = {"Fencepost-Lease-Secret": secret}
            async with pinned.post(f"{http}/v1/locks/shared:1:release", headers=headers,
                                   json={"leaseId": lease_id, "token": held["token"]}) as answer:
                assert (answer.status, answer.headers["Fencepost-Instance"]) == (200, other), await answer.text()
            async with pinned.delete(f"{http}/v1/leases/{lease_id}", headers=headers) as answer:
                assert (answer.status, answer.headers["Fencepost-Instance"]) == (200, other), await answer.text()
                assert (await answer.json())["found"] is True
        _, described = await call("GET", "/v1/locks/shared:1")
        assert described.get("holder") is None, described
        assert child.terminate(30) == 0, child.log_tail()
    finally:
        child.kill()


async def test_workers_when_sigterm(workers: ChildProcess, etcd_client: Etcd3Client, prefix: str) -> None:
    """SIGTERM: every worker shuts down gracefully (leases kept), then the parent exits 0; no worker outlives it."""
    pids, address = await _started(workers)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = OwnedStub(channel)
        lease = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=10), timeout=10)
        got = await stub.Acquire(lock_pb2.AcquireRequest(name="held-over-sigterm", lease_id=lease.lease_id,
                                                         wait_ms=5000), timeout=10)
        assert got.acquired
    workers.signal(signal.SIGTERM)
    assert await workers.await_line(r"fencepost: shutting down 2 workers \(leases are kept\)", 10)
    assert await asyncio.to_thread(workers.proc.wait, 30) == 0, workers.log_tail()
    for index in (1, 2):
        assert f"fencepost: worker {index}: shutting down (leases are kept)" in workers.output, workers.output
    assert not [pid for pid in pids if _alive(pid)]
    assert etcd_client.kv is not None and etcd_client.lease is not None
    held = await etcd_client.kv.get(prefix.encode(), prefix_range_end(prefix.encode()), keys_only=True, timeout=5)
    assert [kv.lease for kv in held.kvs if b"held-over-sigterm" in kv.key] == [lease.lease_id]  # not revoked
    await etcd_client.lease.revoke(lease.lease_id)


async def test_workers_when_a_worker_is_killed(workers: ChildProcess) -> None:
    """A worker killed with SIGKILL is logged and restarted (a new pid) on the same port; both serve again."""
    pids, address = await _started(workers)
    os.kill(pids[0], signal.SIGKILL)
    died = await workers.await_line(rf"fencepost: worker 1 \(pid {pids[0]}\) was killed by SIGKILL; "
                                    rf"restarting it in ([\d.]+) s", 10)
    assert float(died.group(1)) > 0
    restarted = await workers.await_line(r"fencepost: worker 1 restarted \(pid (\d+)\)", 30)
    new_pid = int(restarted.group(1))
    assert new_pid not in pids and _alive(new_pid) and _alive(pids[1]) and not _alive(pids[0])
    assert len(await _instances(address, 2)) == 2
    assert workers.terminate(30) == 0, workers.log_tail()
    assert not _alive(new_pid) and not _alive(pids[1])


async def test_workers_when_the_parent_is_killed(workers: ChildProcess) -> None:
    """A parent killed with SIGKILL takes its workers with it (they get SIGTERM from the kernel)."""
    pids, _ = await _started(workers)
    workers.proc.send_signal(signal.SIGKILL)
    workers.proc.wait(timeout=10)
    for pid in pids:
        await _gone(pid, 30)


async def _gone(pid: int, timeout: float) -> None:
    """Wait until process ``pid`` is gone, polling /proc (there is no event for another process's end)."""
    deadline = time.monotonic() + timeout
    while _alive(pid):
        assert time.monotonic() < deadline, f"process {pid} still alive"
        await asyncio.sleep(0.05)


def test_workers_when_a_worker_cannot_start(etcd: EmbeddedEtcd) -> None:
    """A worker that exits before it listens (here: etcd refuses its credentials) stops the start: exit 1."""
    env = {**child_env(), "FENCEPOST_ETCD_PASSWORD": "not-used"}  # the test etcd has no auth: it refuses any user
    result = subprocess.run(_serve_argv("--workers", "2", "--etcd-endpoints", etcd.endpoint, "--etcd-user", "nobody"),
                            capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 1, result
    assert re.search(r"fencepost: worker [12] \(pid \d+\) exited with status 1 before it listened; stopping the "
                     r"others", result.stdout), result.stdout
    assert "listening on" not in result.stdout and "etcd refused the coordinator's credentials" in result.stderr


def _refused(argv: list[str], env: dict[str, str] | None = None) -> str:
    """Run `fencepost serve ARGV`, expect exit 2 with one line on stderr and nothing started; returns the line."""
    result = subprocess.run([sys.executable, "-m", "fencepost.client.cli", "serve", *argv], capture_output=True,
                            text=True, timeout=30, env=env if env is not None else child_env())
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stdout == "", result.stdout
    return lines[0]


def test_workers_when_the_etcd_is_embedded(tmp_path: Path) -> None:
    """More than one worker without --etcd-endpoints: exit 2, saying why (two embedded etcds, one lock twice)."""
    line = _refused(["--workers", "2", "--data-dir", str(tmp_path / "data")])
    assert "--workers 2 needs --etcd-endpoints" in line and "grant one lock twice" in line, line
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize(("argv", "says"), [
    (["--workers", "0"], "--workers is '0'; must be a whole number from 1 to 64"),
    (["--workers", "two"], "--workers is 'two'"),
    (["--workers", "65"], "--workers is '65'"),
    (["--workers", "2", "--listen", "unix:/tmp/fencepost-workers.sock"], "is a Unix socket"),
    (["--workers", "2", "--health-listen", "unix:/tmp/fencepost-health.sock"], "--health-listen"),
    (["--workers", "2", "--metrics-listen", "127.0.0.1:0"], "cannot serve --metrics-listen"),
    (["--workers", "2", "--http-listen", "unix:/tmp/fencepost-http.sock"], "--http-listen"),
    (["--loop", "trio"], "--loop is 'trio'; must be auto, asyncio or uvloop"),
])
def test_workers_when_flags_conflict(argv: list[str], says: str) -> None:
    """Bad counts, a Unix socket, metrics or HTTP with several workers, an unknown loop: exit 2 naming the flag."""
    line = _refused(["--etcd-endpoints", "127.0.0.1:1", *argv])
    assert says in line, line


def test_workers_read_their_variable() -> None:
    """FENCEPOST_WORKERS is read like the flag."""
    env = {**child_env(), "FENCEPOST_WORKERS": "3"}
    assert "--workers 3 needs --etcd-endpoints" in _refused(["--data-dir", "/nonexistent/fencepost"], env)


@pytest.fixture
def without_uvloop(tmp_path: Path) -> dict[str, str]:
    """A child environment in which ``import uvloop`` fails, as when it is not installed."""
    hidden = tmp_path / "hide-uvloop"
    hidden.mkdir()
    (hidden / "uvloop.py").write_text("raise ImportError('uvloop hidden by the test', name='uvloop')\n")
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join([str(hidden), *filter(None, [env.get("PYTHONPATH")])])
    return env


def test_loop_when_uvloop_is_not_installed(without_uvloop: dict[str, str]) -> None:
    """--loop uvloop without uvloop: exit 2, saying how to install it; FENCEPOST_LOOP too."""
    line = _refused(["--loop", "uvloop", "--etcd-endpoints", "127.0.0.1:1"], without_uvloop)
    assert "uvloop is not installed" in line and "fencepost[uvloop]" in line, line
    line = _refused(["--etcd-endpoints", "127.0.0.1:1"], {**without_uvloop, "FENCEPOST_LOOP": "uvloop"})
    assert "uvloop is not installed" in line, line


def test_pick_loop_when_auto() -> None:
    """auto is uvloop when it imports (it is in the dev extra); asyncio is asyncio; case is ignored."""
    pytest.importorskip("uvloop")  # the dev extra installs it; only a bare install lacks it
    assert pick_loop("auto") == "uvloop" and pick_loop("UVLOOP") == "uvloop" and pick_loop("asyncio") == "asyncio"
    with pytest.raises(LoopUnavailable, match="must be auto, asyncio or uvloop"):
        pick_loop("")


@pytest.mark.parametrize(("loop", "hide", "runs"), [("uvloop", False, "uvloop"), ("asyncio", False, "asyncio"),
                                                    ("auto", True, "asyncio")])
async def test_loop_serves_calls_and_keepalives(loop: str, hide: bool, runs: str, etcd: EmbeddedEtcd, prefix: str,
                                                tmp_path: Path, without_uvloop: dict[str, str]) -> None:
    """A coordinator on each loop serves a lock cycle and a KeepAlive stream; its startup line names the loop."""
    child = ChildProcess(_serve_argv("--loop", loop, "--etcd-endpoints", etcd.endpoint, "--prefix", prefix),
                         log_path=tmp_path / "serve.log", env=without_uvloop if hide else None)
    try:
        named = await child.await_line(r"fencepost: event loop (\w+)", 30)
        assert named.group(1) == runs
        match = await child.await_line(LISTENING, 30)
        address = f"{match.group(1)}:{match.group(2)}"
        assert await _cycle_on_new_connection(address, "on-a-loop")
        async with grpc.aio.insecure_channel(address) as channel:
            stub = OwnedStub(channel)
            lease = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=5), timeout=10)
            stream = stub.KeepAlive()
            for request_id in (1, 2):
                await stream.write(lock_pb2.KeepAliveRequest(
                    keepalive=lock_pb2.LeaseKeepAlive(lease_id=lease.lease_id, request_id=request_id)))
                answer = await stream.read()
                assert answer.keepalive.lease_id == lease.lease_id and answer.keepalive.request_id == request_id
                assert answer.keepalive.ttl_seconds > 0
            await stream.done_writing()
            await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease.lease_id), timeout=10)
        assert child.terminate(30) == 0, child.log_tail()
    finally:
        child.kill()
