"""What the command line says while it waits, and what `status` says it could not see (issue 26, item 3).

``fencepost acquire`` (and ``run``, ``elect``) on a terminal: after about a
second of connecting or of waiting it prints one line on stderr (the
address it tries; the holder, the TTL left and its place in the queue) and
rewrites it every second until the wait ends; not on a terminal it prints
nothing of the kind. The child's stderr here is a pseudo-terminal
(:mod:`pty`); its stdout a pipe. ``fencepost status`` for an identity the
access policy does not let see the coordinator's details says so.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import pty
import re
import signal
import struct
import termios
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fencepost.client import AsyncLockClient
from fencepost.coordinator.process.coordinator import Coordinator

from .child_processes import cli_env
from .cli_helpers import cli_argv, free_port, lock_name, run_cli
from .conftest import wait_for
from .test_admin import Pki, pki, policed  # noqa: F401  (fixtures: a coordinator with mTLS and an access policy)

#: The progress line: carriage return, erase the line, then the text.
LINE = re.compile(r"\r\x1b\[K(fencepost: [^\r\n]*)")


class Terminal:
    """A ``fencepost`` child whose stderr is a pseudo-terminal 200 columns wide; what it wrote there so far."""

    def __init__(self, proc: asyncio.subprocess.Process, master: int) -> None:
        self.proc = proc
        self.master = master
        self.text = ""
        self.times: list[tuple[float, str]] = []  # (loop time, line) of each progress line as it arrived

    def read(self) -> None:
        try:
            chunk = os.read(self.master, 65536).decode(errors="replace")
        except OSError:  # the child closed its end
            asyncio.get_running_loop().remove_reader(self.master)
            return
        now = asyncio.get_running_loop().time()
        self.times += [(now, line) for line in LINE.findall(chunk)]
        self.text += chunk

    def lines(self) -> list[str]:
        """The progress lines written so far, in order."""
        return LINE.findall(self.text)

    async def shows(self, pattern: str, timeout: float = 10.0) -> re.Match[str]:
        """Wait for a progress line matching ``pattern``; return its match."""
        found: list[re.Match[str]] = []

        def seen() -> bool:
            found[:] = [m for line in self.lines() if (m := re.search(pattern, line))]
            return bool(found)

        await wait_for(seen, timeout, what=f"a progress line matching {pattern!r}; got {self.lines()[-3:]}")
        return found[-1]


@asynccontextmanager
async def on_terminal(*args: str) -> AsyncIterator[Terminal]:
    """Run ``fencepost ARGS...`` with stderr on a pseudo-terminal; killed and reaped on the way out."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    proc = await asyncio.create_subprocess_exec(*cli_argv(*args), stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.PIPE, stderr=slave, env=cli_env())
    os.close(slave)
    terminal = Terminal(proc, master)
    asyncio.get_running_loop().add_reader(master, terminal.read)
    try:
        yield terminal
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        asyncio.get_running_loop().remove_reader(master)
        os.close(master)


async def test_acquire_when_no_coordinator_answers_says_so_every_second() -> None:
    """Within about a second: `connecting to ADDRESS: no answer yet, N s (gives up after 4 s)`, again each
    second; the line is erased before the error line. (Before: nothing for the whole wait.)"""
    address = f"127.0.0.1:{free_port()}"
    async with on_terminal("acquire", "x", "--timeout", "4", "--address", address) as term:
        started = asyncio.get_running_loop().time()
        await term.shows(rf"connecting to {re.escape(address)}: no answer yet, 1 s \(gives up after 4 s\)")
        assert asyncio.get_running_loop().time() - started < 5  # about a second, with room for a loaded machine
        await term.shows(r"no answer yet, 2 s")
        assert await asyncio.wait_for(term.proc.wait(), 20) == 1
        await wait_for(lambda: "coordinator unavailable" in term.text, 5, what="the error line")
    tail = term.text[term.text.rindex("fencepost: connecting"):]
    assert re.search(r"\r\x1b\[Kfencepost acquire: coordinator unavailable at ", tail), repr(tail)
    gaps = [b - a for (a, _), (b, _) in zip(term.times, term.times[1:])]
    assert gaps and max(gaps) < 3.5, gaps  # never silent for more than a few seconds


async def test_acquire_waiting_behind_a_holder_names_it_and_its_place(address: str) -> None:
    """While held by A with B queued first: the holder's lease and token, the TTL left, `2nd of 2 waiters`;
    once granted, the line is erased and the token printed."""
    name = lock_name()
    async with AsyncLockClient(address) as a, AsyncLockClient(address) as b:
        held = await a.acquire(name, ttl=30.0, timeout=5.0)
        first = asyncio.create_task(b.acquire(name, ttl=30.0))
        await wait_for(lambda: _waiters(a, name, 1), 10, what="B queued")
        async with on_terminal("acquire", name, "--ttl", "5", "--address", address) as term:
            match = await term.shows(rf"waiting \d+ s for {re.escape(name)}: held by lease 0x{held.lease_id:x} "
                                     rf"\(token {held.token}, TTL left \d+ s\); (\w+) of 2 waiters")
            assert match.group(1) == "2nd"
            await held.release()
            second = await asyncio.wait_for(first, 10)
            await term.shows(r"; 1st of 1 waiter\b", timeout=15)  # the next look: B holds, this one is first
            await second.release()
            assert term.proc.stdout is not None
            token = int(await asyncio.wait_for(term.proc.stdout.readline(), 15))
            assert token > second.token
            term.proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(term.proc.wait(), 15) == 0
            await wait_for(lambda: "released" in term.text, 5, what="the release line")
        after = term.text[term.text.rindex("fencepost: waiting"):]
        assert re.search(r"\r\x1b\[K(\r\n)*fencepost: holding ", after), repr(after)


async def _waiters(client: AsyncLockClient, name: str, count: int) -> bool:
    return (await client.describe(name)).waiter_count == count


async def test_acquire_not_on_a_terminal_prints_no_progress() -> None:
    """With stderr a pipe, an acquire that cannot connect prints only its error line."""
    result = await run_cli("acquire", "x", "--timeout", "2", "--address", f"127.0.0.1:{free_port()}")
    assert result.rc == 1 and "connecting" not in result.err and "\x1b" not in result.err, result
    assert len(result.err.strip().splitlines()) == 1, result.err


async def test_status_when_the_identity_may_not_see_the_details(policed: Coordinator, pki: Pki) -> None:
    """`fencepost status` as a caller without the admin action: SERVING, and a `details` line saying that the
    version, uptime, addresses, etcd and counts were refused and why; `--json` has it as info_error. (Before: a
    bare SERVING.) With admin, the details and no such line."""
    base = ["--address", policed.address]
    refused = await run_cli("status", *base, *pki.flags(pki.billing))
    assert refused.rc == 0, refused
    lines = refused.out.splitlines()
    assert lines[0] == f"coordinator {policed.address}: SERVING", refused.out
    assert re.match(r"  details +version, uptime, addresses, etcd and counts refused: PERMISSION_DENIED/ACCESS_DENIED: "
                    r".*billing.*admin", lines[1]), refused.out
    assert "needs the admin action" in lines[1]
    as_json = json.loads((await run_cli("status", "--json", *base, *pki.flags(pki.billing))).out)
    (coordinator,) = as_json["coordinators"]
    assert coordinator["info"] is None and "ACCESS_DENIED" in coordinator["info_error"]
    allowed = await run_cli("status", *base, *pki.flags(pki.operator))
    assert allowed.rc == 0 and "  version " in allowed.out and "details" not in allowed.out, allowed.out
    assert "info_error" not in (await run_cli("status", "--json", *base, *pki.flags(pki.operator))).out
