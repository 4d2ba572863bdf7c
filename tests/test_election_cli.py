"""Leader election on the command line: ``fencepost elect`` and ``fencepost leader``, as subprocesses against a
real etcd and an in-process coordinator."""

from __future__ import annotations

import asyncio
import sys

from etcd3aio import Etcd3Client

from fencepost.client import AsyncLockClient

from .conftest import cli_env, wait_for
from .election_helpers import has_candidates

ELECT_CHILD = r"""
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (print("child got SIGTERM", flush=True), sys.exit(42)))
print(os.environ["FENCEPOST_TOKEN"], os.environ["FENCEPOST_LEASE_ID"], os.environ["FENCEPOST_LOCK"],
      os.environ["FENCEPOST_ELECTION_VALUE"], flush=True)
if sys.argv[1] == "wait":
    time.sleep(60)
"""


async def _fencepost(*args: str, timeout: float = 30.0) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fencepost.client.cli", *args, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=cli_env())
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_cli_elect_value_that_is_not_utf8_is_published_as_given(address: str) -> None:
    """elect --value with bytes that are not UTF-8 publishes those bytes (a traceback before)."""
    script = ("import asyncio, sys\n"
              "from fencepost.client import AsyncLockClient\n"
              "async def main():\n"
              "    async with AsyncLockClient(sys.argv[1]) as c:\n"
              "        print((await c.leader('raw')).value.hex())\n"
              "asyncio.run(main())\n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fencepost.client.cli", "elect", "raw", "--value", b"\xff\xfeok", "--try",
        "--address", address, "--", sys.executable, "-c", script, address, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=cli_env())
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    assert out.decode().split() == [b"\xff\xfeok".hex()], (out, err)  # the leader's value, read while it leads


async def test_cli_elect_and_leader(address: str, etcd_client: Etcd3Client) -> None:
    """``fencepost elect`` runs the command as leader with its token and value; ``fencepost leader`` shows the
    leader, exits 6 without one (1 is "unreachable"), and ``--watch`` prints each change; losing the leadership
    stops the command."""
    rc, out, err = await _fencepost("leader", "cli", "--address", address)
    assert rc == 6 and "no leader" in err, (rc, out, err)
    rc, out, err = await _fencepost("elect", "cli", "--value", "node-1", "--address", address, "--",
                                    sys.executable, "-c", ELECT_CHILD, "exit")
    assert rc == 0, (rc, out, err)
    token, lease, name, value = out.split()
    assert int(token) > 0 and int(lease) > 0 and name == "cli" and value == "node-1"
    assert "Traceback" not in err
    watch = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fencepost.client.cli", "leader", "cli", "--watch", "--address", address,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=cli_env())
    elect: asyncio.subprocess.Process | None = None
    try:
        assert watch.stdout is not None
        assert (await asyncio.wait_for(watch.stdout.readline(), 20)).decode().strip() == "cli: no leader"
        elect = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "fencepost.client.cli", "elect", "cli", "--value", "node-2", "--ttl", "5",
            "--address", address, "--", sys.executable, "-c", ELECT_CHILD, "wait",
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=cli_env())
        assert elect.stdout is not None
        token2, lease2, _, value2 = (await asyncio.wait_for(elect.stdout.readline(), 20)).decode().split()
        assert int(token2) > int(token) and value2 == "node-2"
        shown = (await asyncio.wait_for(watch.stdout.readline(), 20)).decode()
        assert "'node-2'" in shown and f"token {token2}" in shown, shown
        rc, out, err = await _fencepost("leader", "cli", "--address", address)
        assert rc == 0 and "'node-2'" in out and f"token {token2}" in out, (rc, out, err)
        rc, out, err = await _fencepost("elect", "cli", "--value", "node-3", "--try", "--address", address, "--",
                                        sys.executable, "-c", ELECT_CHILD, "exit")
        assert rc == 5 and not out and "command not run" in err, (rc, out, err)
        assert etcd_client.lease is not None
        await etcd_client.lease.revoke(int(lease2), timeout=5)  # the leadership is lost: the command is stopped
        out2, err2 = await asyncio.wait_for(elect.communicate(), 20)
        assert elect.returncode == 3, (elect.returncode, out2, err2)
        assert "child got SIGTERM" in out2.decode() and "lost" in err2.decode()
        assert (await asyncio.wait_for(watch.stdout.readline(), 20)).decode().strip() == "cli: no leader"
        watch.send_signal(2)
        await asyncio.wait_for(watch.wait(), 20)
        assert watch.returncode == 0
    finally:
        for proc in (watch, elect):
            if proc is None:
                continue
            if proc.returncode is None:
                proc.kill()
            await proc.communicate()


async def test_cli_elect_interrupted_while_waiting_exits_130_and_withdraws(address: str, etcd_client: Etcd3Client,
                                                                           prefix: str) -> None:
    """SIGINT while fencepost elect waits behind a leader: exit 130, the command not run, its candidacy gone."""
    import signal

    async with AsyncLockClient(address) as client:
        lead = await client.campaign("intr", b"first", timeout=5)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "fencepost.client.cli", "elect", "intr", "--value", "second", "--address", address,
            "--", sys.executable, "-c", "print('ran')", stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=cli_env())
        try:
            await wait_for(lambda: has_candidates(etcd_client, prefix, "intr", 2), 20, what="the CLI candidate queued")
            proc.send_signal(signal.SIGINT)
            out, err = await asyncio.wait_for(proc.communicate(), 20)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert proc.returncode == 130, err.decode()
        assert b"ran" not in out
        assert await has_candidates(etcd_client, prefix, "intr", 1)  # only the leader's key is left
        await lead.resign()


def test_leader_line_when_skipped_says_so() -> None:
    """`leader --watch` marks a leader reported after a compaction gap, in text and in JSON; others are unmarked."""
    import json

    from fencepost.client import LeaderInfo
    from fencepost.client.cli.leader import SKIPPED_NOTE, line

    after_gap = LeaderInfo(b"n", 0x10, 42, 50, skipped=True)
    assert line("e", after_gap, False).endswith(SKIPPED_NOTE)
    assert json.loads(line("e", after_gap, True))["leader"]["skipped"] is True
    in_order = LeaderInfo(b"n", 0x10, 42, 50)
    assert SKIPPED_NOTE not in line("e", in_order, False)
    assert json.loads(line("e", in_order, True))["leader"]["skipped"] is False
