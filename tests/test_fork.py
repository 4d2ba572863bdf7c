"""fork and multiprocessing (issue 14, item 7), against a real etcd and coordinator.

Each scenario runs in a Python subprocess with a timeout, so a hang fails
the test instead of blocking the suite; a forked child also arms
``signal.alarm``. The scripts print one JSON object per line, which the
tests read back.

Before: in a forked child, an inherited handle said ``is_valid() == True``,
``release()`` and ``acquire()`` hung past 10 s, some children died with
SIGSEGV, and a new client in the child hung (and with
``GRPC_ENABLE_FORK_SUPPORT=1`` the parent then lost its hold).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from etcd3aio import Etcd3Client

from .conftest import child_env, count_keys

# Seconds a whole scenario may take; a hang fails the test.
SCENARIO_SECONDS = 60

COMMON = r'''
import json, os, signal, sys, time

def report(**fields):
    # One write per line: a child that gRPC kills (SIGSEGV, see below) between print's two writes (the text,
    # then "\n") would glue its half line to the parent's next one.
    sys.stdout.flush()
    os.write(1, (json.dumps(fields) + "\n").encode())

def attempt(what, call):
    """Run call() in the child: report what it returned or raised, and how long it took."""
    from fencepost.client import FencepostError
    started = time.monotonic()
    try:
        result = call()
    except FencepostError as err:
        report(what=what, error=type(err).__name__, reason=err.reason, message=err.message,
               seconds=time.monotonic() - started)
    except BaseException as err:
        report(what=what, error=type(err).__name__, reason=None, message=str(err), seconds=time.monotonic() - started)
    else:
        report(what=what, result=repr(result), seconds=time.monotonic() - started)

def wait_child(pid, seconds):
    """The child's exit status (as os.waitpid gives it); SIGKILL it after ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    return os.waitpid(pid, 0)[1]
'''

SYNC_INHERITED = COMMON + r'''
from fencepost.client import AsyncLockClient, LockClient

address = sys.argv[1]
client = LockClient(address)
handle = client.acquire("forked", ttl=2.0, timeout=5.0)
report(what="parent", token=handle.token, lease_id=handle.lease_id)
pid = os.fork()
if pid == 0:
    signal.alarm(20)
    attempt("is_valid", handle.is_valid)
    attempt("valid_for", handle.valid_for)
    attempt("check", handle.check)
    attempt("release", handle.release)
    attempt("wait_lost", lambda: handle.wait_lost(5))
    attempt("on_lost", lambda: handle.on_lost(print))
    attempt("acquire", lambda: client.acquire("forked", ttl=3.0, timeout=5.0))
    attempt("try_acquire", lambda: client.try_acquire("other", ttl=3.0))
    attempt("describe", lambda: client.describe("forked"))
    attempt("lock", lambda: client.lock("other", ttl=3.0).__enter__())
    attempt("connect", client.connect)
    attempt("close", client.close)
    attempt("new LockClient", lambda: LockClient(address))
    attempt("new AsyncLockClient", lambda: AsyncLockClient(address))
    os._exit(0)
status = wait_child(pid, 30)
# Past two TTLs: the parent's keepalives went on while and after the child ran.
time.sleep(0) if handle.wait_lost(4.5) else None
info = client.describe("forked")
report(what="after", child_status=status, valid=handle.is_valid(), holder_token=info.holder_token,
       holder_lease_id=info.holder_lease_id)
handle.release()
client.close()
report(what="released")
'''

MP_FORK_INHERITED = COMMON + r'''
import multiprocessing
from fencepost.client import LockClient

def child(conn):
    signal.alarm(20)
    started = time.monotonic()
    try:
        handle.release()
    except Exception as err:
        conn.send((type(err).__name__, getattr(err, "reason", None), str(err), time.monotonic() - started))
    else:
        conn.send(("released", None, "", time.monotonic() - started))
    conn.send(("is_valid", handle.is_valid(), "", 0.0))

if __name__ == "__main__":
    client = LockClient(sys.argv[1])
    handle = client.acquire("forked", ttl=3.0, timeout=5.0)
    ctx = multiprocessing.get_context("fork")
    parent_end, child_end = ctx.Pipe()
    proc = ctx.Process(target=child, args=(child_end,))
    proc.start()
    first = parent_end.recv() if parent_end.poll(20) else None
    second = parent_end.recv() if parent_end.poll(5) else None
    proc.join(20)
    report(what="child", release=first, is_valid=second, exitcode=proc.exitcode)
    info = client.describe("forked")
    report(what="after", token=handle.token, valid=handle.is_valid(), holder_token=info.holder_token)
    handle.release()
    client.close()
    report(what="released")
'''

ASYNC_INHERITED = COMMON + r'''
import asyncio
from fencepost.client import AsyncLockClient

def run_at_once(coro_fn):
    """Drive a coroutine in the child without the parent's loop: it must finish without suspending."""
    def call():
        coro = coro_fn()
        try:
            coro.send(None)
        except StopIteration as done:
            return done.value
        coro.close()
        raise AssertionError("the coroutine suspended (it would need the parent's event loop)")
    return call

async def main(address):
    client = AsyncLockClient(address)
    await client.connect()
    handle = await client.acquire("forked", ttl=2.0, timeout=5.0)
    pid = os.fork()
    if pid == 0:
        signal.alarm(20)
        attempt("is_valid", handle.is_valid)
        attempt("valid_for", handle.valid_for)
        attempt("check", handle.check)
        attempt("release", run_at_once(handle.release))
        attempt("cancel_on_lost", handle.cancel_on_lost)
        attempt("acquire", run_at_once(lambda: client.acquire("forked", ttl=3.0, timeout=5.0)))
        attempt("try_acquire", run_at_once(lambda: client.try_acquire("other", ttl=3.0)))
        attempt("describe", run_at_once(lambda: client.describe("forked")))
        attempt("connect", run_at_once(client.connect))
        attempt("close", run_at_once(client.close))
        attempt("new AsyncLockClient", lambda: AsyncLockClient(address))
        os._exit(0)
    status = await asyncio.to_thread(wait_child, pid, 30)
    try:
        await asyncio.wait_for(handle.lost.wait(), 4.5)
    except TimeoutError:
        pass
    info = await client.describe("forked")
    report(what="after", child_status=status, valid=handle.is_valid(), holder_token=info.holder_token,
           token=handle.token)
    await handle.release()
    await client.close()
    report(what="released")

asyncio.run(main(sys.argv[1]))
'''

NEW_CLIENT_IN_CHILD = COMMON + r'''
from fencepost.client import LockClient

address = sys.argv[1]
parent_had_client = sys.argv[2] == "yes"
if parent_had_client:
    client = LockClient(address)
    handle = client.acquire("forked", ttl=3.0, timeout=5.0)
else:
    import fencepost.client  # imported, but no client was ever made
pid = os.fork()
if pid == 0:
    signal.alarm(20)
    def use():
        with LockClient(address, connect_timeout=5.0) as fresh:
            got = fresh.acquire("child-lock", ttl=3.0, timeout=5.0)
            token = got.token
            got.release()
            return token
    attempt("new client", use)
    os._exit(0)
status = wait_child(pid, 30)
if parent_had_client:
    info = client.describe("forked")
    report(what="after", child_status=status, valid=handle.is_valid(), holder_token=info.holder_token,
           token=handle.token)
    handle.release()
    client.close()
else:
    report(what="after", child_status=status)
report(what="released")
'''

SPAWN = COMMON + r'''
import multiprocessing
from fencepost.client import LockClient

def child(address, conn):
    with LockClient(address) as fresh:
        got = fresh.acquire("child-lock", ttl=3.0, timeout=5.0)
        conn.send(got.token)
        got.release()

if __name__ == "__main__":
    client = LockClient(sys.argv[1])
    handle = client.acquire("forked", ttl=3.0, timeout=5.0)
    ctx = multiprocessing.get_context(sys.argv[2])
    parent_end, child_end = ctx.Pipe()
    proc = ctx.Process(target=child, args=(sys.argv[1], child_end))
    proc.start()
    token = parent_end.recv() if parent_end.poll(30) else None
    proc.join(20)
    report(what="child", token=token, exitcode=proc.exitcode)
    report(what="after", valid=handle.is_valid(), holder_token=client.describe("forked").holder_token,
           token=handle.token)
    handle.release()
    client.close()
    report(what="released")
'''


def fork_env(fork_support: str | None = "0") -> dict[str, str]:
    """The scenario's environment, with GRPC_ENABLE_FORK_SUPPORT set to ``fork_support`` (None: unset, gRPC's default).

    "0" is what the README recommends for programs that fork while a client
    is open: with gRPC's default (and with "1"), gRPC restarts its own
    threads in the child, which then sometimes die with SIGSEGV whatever the
    child does (about 1 in 5 children here, grpcio 1.85).
    """
    env = child_env()
    env.pop("GRPC_ENABLE_FORK_SUPPORT", None)
    if fork_support is not None:
        env["GRPC_ENABLE_FORK_SUPPORT"] = fork_support
    return env


def run_scenario(tmp_path: Path, script: str, *args: str, env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Run ``script`` in a Python subprocess (killed after SCENARIO_SECONDS) and return its JSON lines.

    Call it in a thread (``asyncio.to_thread``): the in-process coordinator runs on the test's event loop.
    """
    path = tmp_path / "scenario.py"
    path.write_text(script)
    try:
        done = subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True,
                              timeout=SCENARIO_SECONDS, env=env or fork_env(), cwd=tmp_path)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"the scenario hung for {SCENARIO_SECONDS} s; output: {err.stdout!r} {err.stderr!r}")
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    assert lines and lines[-1] == {"what": "released"}, f"{done.stdout}\n{done.stderr[-3000:]}"
    return lines


def by_what(lines: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {line["what"]: line for line in lines}


def assert_refused_at_once(line: dict[str, Any], what: str) -> None:
    """One call in the child raised FencepostError (reason FORKED) naming the fork, within 0.5 s."""
    assert line["error"] == "FencepostError", line
    assert line["reason"] == "FORKED", line
    assert f"this {what} was inherited through fork" in line["message"], line
    assert "'spawn' or 'forkserver'" in line["message"], line
    assert line["seconds"] < 0.5, line


def assert_new_client_refused(line: dict[str, Any]) -> None:
    assert line["error"] == "FencepostError" and line["reason"] == "FORKED", line
    assert "which had opened a client" in line["message"], line
    assert "'spawn' or 'forkserver' start method" in line["message"], line
    assert "make the client after fork in a process that never had one" in line["message"], line
    assert line["seconds"] < 0.5, line


def assert_parent_kept_its_hold(after: dict[str, Any], token: int) -> None:
    assert after["valid"] is True, after
    assert after["holder_token"] == token, after


async def test_fork_when_sync_client_holds_a_lock(
    address: str, prefix: str, etcd_client: Etcd3Client, tmp_path: Path
) -> None:
    """In an os.fork child, the inherited LockClient and handle raise FencepostError at once; the parent keeps its hold."""
    lines = by_what(await asyncio.to_thread(run_scenario, tmp_path, SYNC_INHERITED, address))
    assert lines["is_valid"]["result"] == "False"
    assert lines["valid_for"]["result"] == "0.0"
    for what in ("check", "release", "wait_lost", "on_lost"):
        assert_refused_at_once(lines[what], "lock handle")
    for what in ("acquire", "try_acquire", "describe", "lock", "connect", "close"):
        assert_refused_at_once(lines[what], "LockClient")
    assert_new_client_refused(lines["new LockClient"])
    assert_new_client_refused(lines["new AsyncLockClient"])
    assert lines["after"]["child_status"] == 0
    assert_parent_kept_its_hold(lines["after"], lines["parent"]["token"])
    assert await count_keys(etcd_client, prefix) == 0


async def test_fork_when_multiprocessing_fork_child_releases(
    address: str, prefix: str, etcd_client: Etcd3Client, tmp_path: Path
) -> None:
    """A multiprocessing 'fork' child's release of the inherited handle raises FencepostError at once."""
    lines = by_what(await asyncio.to_thread(run_scenario, tmp_path, MP_FORK_INHERITED, address))
    error, reason, message, seconds = lines["child"]["release"]
    assert (error, reason) == ("FencepostError", "FORKED"), lines["child"]
    assert "inherited through fork" in message and seconds < 0.5
    assert lines["child"]["is_valid"][1] is False
    assert lines["child"]["exitcode"] == 0
    assert_parent_kept_its_hold(lines["after"], lines["after"]["token"])
    assert await count_keys(etcd_client, prefix) == 0


async def test_fork_when_asyncio_client_holds_a_lock(
    address: str, prefix: str, etcd_client: Etcd3Client, tmp_path: Path
) -> None:
    """In an os.fork child, the inherited AsyncLockClient's coroutines raise before suspending; the parent keeps its hold."""
    lines = by_what(await asyncio.to_thread(run_scenario, tmp_path, ASYNC_INHERITED, address))
    assert lines["is_valid"]["result"] == "False"
    assert lines["valid_for"]["result"] == "0.0"
    for what in ("check", "release", "cancel_on_lost"):
        assert_refused_at_once(lines[what], "lock handle")
    for what in ("acquire", "try_acquire", "describe", "connect", "close"):
        assert_refused_at_once(lines[what], "AsyncLockClient")
    assert_new_client_refused(lines["new AsyncLockClient"])
    assert lines["after"]["child_status"] == 0
    assert_parent_kept_its_hold(lines["after"], lines["after"]["token"])
    assert await count_keys(etcd_client, prefix) == 0


async def test_fork_when_child_of_a_client_makes_a_new_client(
    address: str, prefix: str, etcd_client: Etcd3Client, tmp_path: Path
) -> None:
    """A new client in a child forked from a process with a client raises FencepostError naming the supported patterns.

    gRPC cannot be used there: such a client failed to connect, hung, or made the parent lose its hold.
    """
    lines = by_what(await asyncio.to_thread(run_scenario, tmp_path, NEW_CLIENT_IN_CHILD, address, "yes"))
    assert_new_client_refused(lines["new client"])
    assert lines["after"]["child_status"] == 0
    assert_parent_kept_its_hold(lines["after"], lines["after"]["token"])
    assert await count_keys(etcd_client, prefix) == 0


@pytest.mark.parametrize("fork_support", [None, "1"], ids=["default", "GRPC_ENABLE_FORK_SUPPORT=1"])
@pytest.mark.parametrize("script", ["inherited", "new-client"])
async def test_fork_when_grpc_restarts_its_threads_in_the_child(
    address: str, prefix: str, etcd_client: Etcd3Client, tmp_path: Path, fork_support: str | None, script: str
) -> None:
    """Without GRPC_ENABLE_FORK_SUPPORT=0 the parent still keeps its hold, and the child never hangs.

    gRPC's own threads, restarted in the child, may kill it with SIGSEGV at
    any point (Fencepost cannot prevent it): what the child did report
    before is still the right refusal.
    """
    source = SYNC_INHERITED if script == "inherited" else NEW_CLIENT_IN_CHILD
    args = (address,) if script == "inherited" else (address, "yes")
    lines = by_what(await asyncio.to_thread(run_scenario, tmp_path, source, *args, env=fork_env(fork_support)))
    status = lines["after"]["child_status"]
    assert status == 0 or (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGSEGV), status
    for what, line in lines.items():
        if what in ("check", "release", "wait_lost", "on_lost"):
            assert_refused_at_once(line, "lock handle")
        elif what in ("acquire", "try_acquire", "describe", "lock", "connect", "close"):
            assert_refused_at_once(line, "LockClient")
        elif what.startswith("new "):
            assert_new_client_refused(line)
        elif what in ("is_valid", "valid_for"):
            assert line["result"] in ("False", "0.0"), line
    assert_parent_kept_its_hold(lines["after"], lines.get("parent", lines["after"]).get("token", 0))
    assert await count_keys(etcd_client, prefix) == 0


@pytest.mark.parametrize("fork_support", [None, "0"], ids=["default", "GRPC_ENABLE_FORK_SUPPORT=0"])
async def test_fork_when_parent_never_had_a_client(
    address: str, prefix: str, etcd_client: Etcd3Client, tmp_path: Path, fork_support: str | None
) -> None:
    """A child forked from a process that never made a client makes one and takes locks as usual."""
    lines = by_what(await asyncio.to_thread(run_scenario, tmp_path, NEW_CLIENT_IN_CHILD, address, "no",
                                            env=fork_env(fork_support)))
    assert "error" not in lines["new client"], lines["new client"]
    assert int(lines["new client"]["result"]) > 0
    assert lines["after"]["child_status"] == 0
    assert await count_keys(etcd_client, prefix) == 0


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
async def test_fork_when_multiprocessing_spawns_a_client(
    address: str, prefix: str, etcd_client: Etcd3Client, tmp_path: Path, method: str
) -> None:
    """The supported pattern: a 'spawn' or 'forkserver' child of a holder makes its own client and takes a lock."""
    lines = by_what(await asyncio.to_thread(run_scenario, tmp_path, SPAWN, address, method))
    assert isinstance(lines["child"]["token"], int) and lines["child"]["token"] > 0, lines["child"]
    assert lines["child"]["exitcode"] == 0
    assert_parent_kept_its_hold(lines["after"], lines["after"]["token"])
    assert await count_keys(etcd_client, prefix) == 0
