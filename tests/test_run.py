"""``fencepost run``, as a subprocess, against a real coordinator."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import pytest

from fencepost.client import AsyncLockClient
from fencepost.client.cli.child import exit_status
from fencepost.client.cli.run import RUN_EXIT_CODES
from fencepost.client.v1 import lock_pb2

from .conftest import CliResult, cli_env, wait_for
from .owned_stub import SECRETS, OwnedStub

# A Python child that reports its environment, then waits; on SIGTERM it says so
# and exits 42, unless told to ignore SIGTERM.
CHILD = r"""
import os, signal, sys, time
mode = sys.argv[1]
def on_term(signum, frame):
    print("child got SIGTERM", flush=True)
    sys.exit(42)
signal.signal(signal.SIGTERM, signal.SIG_IGN if mode == "ignore" else on_term)
print(os.environ["FENCEPOST_TOKEN"], os.environ["FENCEPOST_LEASE_ID"], os.environ["FENCEPOST_LEASE_SECRET"],
      flush=True)
time.sleep(60)
"""




def _argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "fencepost.client.cli", "run", *args]


def lock_name() -> str:
    """A fresh lock name for one test."""
    return f"job:{uuid.uuid4().hex[:8]}"


async def run(*args: str, timeout: float = 30.0) -> CliResult:
    """Run ``fencepost run ARGS...`` to completion without blocking the event loop."""
    proc = await asyncio.create_subprocess_exec(
        *_argv(*args), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=cli_env())
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
        pytest.fail(f"fencepost run {' '.join(args)} did not exit in {timeout} s\n{out.decode()}\n{err.decode()}")
    assert proc.returncode is not None
    return CliResult(proc.returncode, out.decode(), err.decode())


class Running:
    """A ``fencepost run`` child whose command prints ``TOKEN LEASE_ID`` first."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def grant(self, timeout: float = 20.0) -> tuple[int, int]:
        """Read the command's first line: (token, lease id[, lease secret, remembered for OwnedStub])."""
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if not line:
            rc, out, err = await self.finish()
            pytest.fail(f"fencepost run exited ({rc}) before its command printed: {out}\n{err}")
        token, lease, *secret = line.decode().split()
        if secret:  # FENCEPOST_LEASE_SECRET, which fencepost run passes: the test acts as the lease's owner
            SECRETS[int(lease)] = secret[0]
        return int(token), int(lease)

    async def finish(self, timeout: float = 30.0) -> tuple[int, str, str]:
        """Wait for the exit; returns (rc, rest of stdout, stderr)."""
        try:
            out, err = await asyncio.wait_for(self.proc.communicate(), timeout)
        except TimeoutError:
            self.proc.kill()
            out, err = await self.proc.communicate()
            pytest.fail(f"fencepost run did not exit in {timeout} s: {err.decode()}")
        assert self.proc.returncode is not None
        return self.proc.returncode, out.decode(), err.decode()


@asynccontextmanager
async def running(*args: str) -> AsyncIterator[Running]:
    """Start ``fencepost run ARGS...``; killed and reaped on the way out."""
    proc = await asyncio.create_subprocess_exec(
        *_argv(*args), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=cli_env())
    try:
        yield Running(proc)
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.communicate()


async def held(address: str, name: str) -> bool:
    """Whether lock ``name`` is held right now."""
    async with AsyncLockClient(address) as client:
        return (await client.describe(name)).held


def python_child(mode: str) -> list[str]:
    """The command line of the CHILD script in ``mode`` ("obey" or "ignore" SIGTERM)."""
    return [sys.executable, "-c", CHILD, mode]


# ---------------------------------------------------------------- the happy path


async def test_run_prints_token_in_child_and_releases(address: str) -> None:
    """The README line: the child sees its token and lock; run exits 0 and the lock is free after."""
    name = lock_name()
    result = await run(name, "--ttl", "3", "--address", address, "--",
                       "sh", "-c", 'echo $FENCEPOST_TOKEN; echo "$FENCEPOST_LOCK|$FENCEPOST_ADDRESS|$FENCEPOST_TTL"; sleep 1')
    assert result.rc == 0, result
    token_line, info = result.out.splitlines()
    assert int(token_line) > 0
    assert info == f"{name}|{address}|3"
    assert f"token {token_line}" in result.err and "Traceback" not in result.err
    assert not await held(address, name)


async def test_run_when_child_exits_7_exits_7_and_tokens_grow(address: str) -> None:
    """The child's exit status is run's; the next run of the same lock gets a larger token."""
    name = lock_name()
    first = await run(name, "--ttl", "3", "--address", address, "--", "sh", "-c", "echo $FENCEPOST_TOKEN; exit 7")
    assert first.rc == 7, first
    second = await run(name, "--ttl", "3", "--address", address, "--", "sh", "-c", "echo $FENCEPOST_TOKEN")
    assert second.rc == 0, second
    assert int(second.out) > int(first.out)
    assert not await held(address, name)


async def test_run_when_child_is_killed_by_a_signal_exits_128_plus_n(address: str) -> None:
    """A child killed by signal N makes run exit 128+N, and the lock is released."""
    name = lock_name()
    result = await run(name, "--ttl", "3", "--address", address, "--", "sh", "-c", "kill -KILL $$")
    assert result.rc == 128 + signal.SIGKILL, result
    assert not await held(address, name)


def test_exit_status_maps_signals_to_128_plus_n() -> None:
    """Popen's -N (killed by signal N) becomes 128+N; exit codes pass through."""
    assert exit_status(0) == 0 and exit_status(7) == 7
    assert exit_status(-signal.SIGTERM) == 143


# ---------------------------------------------------------------- not acquired


async def test_run_when_lock_is_held_exits_4_or_5_and_child_never_runs(address: str, tmp_path: object) -> None:
    """--timeout on a held lock exits 4, --try exits 5; the command never runs."""
    name = lock_name()
    marker = f"{tmp_path}/ran"
    async with AsyncLockClient(address) as client:
        h = await client.acquire(name, ttl=5.0)
        late = await run(name, "--ttl", "3", "--timeout", "0.5", "--address", address, "--",
                         "sh", "-c", f"touch {marker}")
        assert late.rc == 4, late
        assert "timeout" in late.err and name in late.err and len(late.err.splitlines()) == 1, late.err
        busy = await run(name, "--ttl", "3", "--try", "--address", address, "--", "sh", "-c", f"touch {marker}")
        assert busy.rc == 5, busy
        assert str(h.token) in busy.err
        assert not os.path.exists(marker)
        assert (await client.describe(name)).waiter_count == 0
        await h.release()


@pytest.mark.parametrize(("args", "needle"), [
    (["--ttl", "3"], "no command"),
    (["--ttl", "0", "--", "true"], "ttl"),
    (["--", "true"], "--ttl"),
    (["--ttl", "3", "--grace", "-1", "--", "true"], "grace"),
])
async def test_run_when_input_is_bad_exits_2(args: list[str], needle: str) -> None:
    """A missing command, TTL or a bad --grace exits 2 with one line naming it."""
    result = await run(lock_name(), *args, "--address", "127.0.0.1:1")
    assert result.rc == 2, result
    assert needle in result.err and len(result.err.splitlines()) == 1, result.err


async def test_run_when_command_is_missing_exits_127_and_releases(address: str) -> None:
    """A command that does not exist exits 127 (as a shell would) and leaves the lock free."""
    name = lock_name()
    result = await run(name, "--ttl", "3", "--address", address, "--", "no-such-command-fencepost")
    assert result.rc == 127, result
    assert "not found" in result.err
    assert not await held(address, name)


# ---------------------------------------------------------------- lost while running


async def test_run_when_hold_released_by_hand_sigterms_child_and_exits_3(address: str) -> None:
    """Releasing the hold through the API stops the child with SIGTERM; run exits 3 saying "lost"."""
    name = lock_name()
    async with running(name, "--ttl", "5", "--address", address, "--", *python_child("obey")) as r:
        token, lease = await r.grant()
        channel = grpc.aio.insecure_channel(address)
        try:
            stub = OwnedStub(channel)
            await stub.Release(lock_pb2.ReleaseRequest(name=name, lease_id=lease, token=token), timeout=5)
        finally:
            await channel.close()
        rc, out, err = await r.finish()
    assert rc == 3, (rc, out, err)
    assert "child got SIGTERM" in out
    assert any(line.startswith("lost: ") for line in err.splitlines()), err
    assert "Traceback" not in err


async def test_run_when_lease_revoked_and_child_ignores_sigterm_sigkills_after_grace(address: str) -> None:
    """A revoked lease stops the child; one that ignores SIGTERM is killed after --grace; --lost-exit-code applies."""
    name = lock_name()
    async with running(name, "--ttl", "5", "--grace", "1.5", "--lost-exit-code", "99", "--address", address,
                       "--", *python_child("ignore")) as r:
        _, lease = await r.grant()
        channel = grpc.aio.insecure_channel(address)
        try:
            stub = OwnedStub(channel)
            found = await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease), timeout=5)
            assert found.found
        finally:
            await channel.close()
        revoked_at = time.monotonic()
        rc, out, err = await r.finish()
        took = time.monotonic() - revoked_at
    assert rc == 99, (rc, out, err)
    assert "child got SIGTERM" not in out
    assert "SIGKILL" in err and "status 137" in err, err
    assert 1.4 <= took < 10, took
    assert not await held(address, name)


# ---------------------------------------------------------------- the process tree

# The command: starts two grandchildren that ignore SIGTERM and keep running
# (a shell's `worker & worker &`), prints their pids, then its token and lease,
# then either waits (mode "wait") or exits 0 at once, leaving them behind ("leave").
TREE = r"""
import os, signal, subprocess, sys, time
worker = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\ntime.sleep(600)"
kids = [subprocess.Popen([sys.executable, "-c", worker], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True) for _ in range(2)]  # run's pipes are not held open
for kid in kids:
    assert kid.stdout.readline() == "up\n"  # SIGTERM is ignored from here on
print(" ".join(str(kid.pid) for kid in kids), flush=True)
print(os.environ["FENCEPOST_TOKEN"], os.environ["FENCEPOST_LEASE_ID"], os.environ["FENCEPOST_LEASE_SECRET"],
      flush=True)
if sys.argv[1] == "wait":
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    time.sleep(600)
"""


def _running_pid(pid: int) -> bool:
    """Whether ``pid`` is a process that runs (a zombie waiting for its reaper has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def _tree(r: Running) -> tuple[list[int], int, int]:
    """The TREE command's grandchild pids, then its (token, lease id)."""
    assert r.proc.stdout is not None
    line = await asyncio.wait_for(r.proc.stdout.readline(), 30)
    pids = [int(p) for p in line.split()]
    assert len(pids) == 2 and all(_running_pid(p) for p in pids), line
    token, lease = await r.grant()
    return pids, token, lease


async def test_run_when_lease_revoked_kills_the_whole_process_tree(address: str) -> None:
    """On a loss, grandchildren that ignore SIGTERM are killed too (SIGKILL to the group after --grace)."""
    name = lock_name()
    async with running(name, "--ttl", "5", "--grace", "1", "--address", address,
                       "--", sys.executable, "-c", TREE, "wait") as r:
        pids, _, lease = await _tree(r)
        try:
            channel = grpc.aio.insecure_channel(address)
            try:
                stub = OwnedStub(channel)
                assert (await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease), timeout=5)).found
            finally:
                await channel.close()
            rc, out, err = await r.finish()
            assert rc == 3, (rc, out, err)
            assert "process group" in err and "SIGKILL" in err, err
            assert [p for p in pids if _running_pid(p)] == [], "grandchildren outlived the loss"
        finally:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


async def test_run_when_killed_with_sigkill_its_command_dies_too(address: str) -> None:
    """A ``fencepost run`` killed with SIGKILL cannot stop its command itself: the kernel kills the command
    with it (PR_SET_PDEATHSIG, set before the exec), so no command outlives its supervisor's hold."""
    name = lock_name()
    async with running(name, "--ttl", "5", "--address", address,
                       "--", sys.executable, "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(600)"
                       ) as r:
        assert r.proc.stdout is not None
        child = int((await asyncio.wait_for(r.proc.stdout.readline(), 30)).decode())
        try:
            assert _running_pid(child)
            with open(f"/proc/{child}/cmdline", "rb") as cmdline:  # the command itself, exec'd in place
                assert b"time.sleep(600)" in cmdline.read()
            r.proc.kill()
            await asyncio.wait_for(r.proc.wait(), 10)  # (not communicate: a surviving command holds the pipes)

            async def gone() -> bool:
                return not _running_pid(child)

            await wait_for(gone, 10, what="the command to die with its supervisor")
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)


async def test_run_when_child_exits_leaving_processes_ends_them_before_releasing(address: str) -> None:
    """A command that exits with workers still running: they are stopped while the lock is held, then released."""
    name = lock_name()
    async with running(name, "--ttl", "5", "--grace", "0.5", "--address", address,
                       "--", sys.executable, "-c", TREE, "leave") as r:
        pids, _, _ = await _tree(r)
        try:
            rc, out, err = await r.finish()
            assert rc == 0, (rc, out, err)
            assert "left processes running" in err, err
            assert [p for p in pids if _running_pid(p)] == [], "grandchildren outlived fencepost run"
            assert not await held(address, name)
        finally:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------- signals


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
async def test_run_forwards_signals_to_child_and_exits_with_its_status(address: str, sig: signal.Signals) -> None:
    """A signal sent to fencepost run reaches the child; run exits with the child's status and releases."""
    name = lock_name()
    script = ("import signal, sys, time, os\n"
              "def on(signum, frame):\n"
              "    print('child got', signal.Signals(signum).name, flush=True); sys.exit(40)\n"
              "for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP): signal.signal(s, on)\n"
              "print(os.environ['FENCEPOST_TOKEN'], os.environ['FENCEPOST_LEASE_ID'], flush=True)\n"
              "time.sleep(60)\n")
    async with running(name, "--ttl", "5", "--address", address, "--", sys.executable, "-c", script) as r:
        await r.grant()
        r.proc.send_signal(sig)
        rc, out, err = await r.finish()
    assert rc == 40, (rc, out, err)
    assert f"child got {sig.name}" in out
    assert not await held(address, name)


async def test_run_when_interrupted_while_waiting_exits_130_and_child_never_runs(address: str) -> None:
    """SIGTERM before the grant exits 130, leaves no waiter and never starts the command."""
    name = lock_name()
    async with AsyncLockClient(address) as client:
        h = await client.acquire(name, ttl=5.0)
        async with running(name, "--ttl", "3", "--address", address, "--", "echo", "ran") as r:
            for _ in range(200):
                if (await client.describe(name)).waiter_count == 1:
                    break
                await asyncio.sleep(0.05)
            else:
                pytest.fail("fencepost run never queued")
            r.proc.send_signal(signal.SIGTERM)
            rc, out, err = await r.finish()
        assert rc == 130 and out == "", (rc, out, err)
        assert (await client.describe(name)).waiter_count == 0
        await h.release()


async def test_run_help_lists_exit_codes_and_env() -> None:
    """run --help documents its exit codes and the FENCEPOST_* variables."""
    proc = await asyncio.create_subprocess_exec(*_argv("--help"), stdout=asyncio.subprocess.PIPE, env=cli_env())
    out, _ = await proc.communicate()
    assert proc.returncode == 0
    text = out.decode()
    for code, meaning in RUN_EXIT_CODES.items():
        assert f"{code:<4} {meaning[:30]}" in text
    for var in ("FENCEPOST_LOCK", "FENCEPOST_TOKEN", "FENCEPOST_LEASE_ID", "FENCEPOST_ADDRESS"):
        assert var in text
