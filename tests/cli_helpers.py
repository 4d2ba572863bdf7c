"""Running the ``fencepost`` command line in tests: as subprocesses of the test, in :func:`cli_env`.

- :func:`cli_argv`: the argv of ``fencepost ARGS...`` (this interpreter, ``-m fencepost.client.cli``).
- :func:`run_cli`: run one command to completion without blocking the event loop.
- :func:`holding`: a ``fencepost acquire`` child that prints its token and lease secret (:class:`Holder`).
- :func:`assert_one_line_error`, :func:`status_json`, :func:`lock_name`, :func:`free_port`.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from .child_processes import CliResult, cli_env


def cli_argv(*args: str) -> list[str]:
    """The argv of ``fencepost ARGS...``, run by this interpreter."""
    return [sys.executable, "-m", "fencepost.client.cli", *args]


async def run_cli(*args: str, timeout: float = 30.0, env: dict[str, str] | None = None,
                  cwd: str | None = None) -> CliResult:
    """Run ``fencepost ARGS...`` to completion without blocking the event loop.

    Args:
        env: Variables added to the test environment (:func:`cli_env`).
        cwd: The working directory of the command; the test's by default.
    """
    proc = await asyncio.create_subprocess_exec(
        *cli_argv(*args), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**cli_env(), **(env or {})}, cwd=cwd)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
        pytest.fail(f"fencepost {' '.join(args)} did not exit in {timeout} s\n{out.decode()}\n{err.decode()}")
    assert proc.returncode is not None
    return CliResult(proc.returncode, out.decode(), err.decode())


def assert_one_line_error(result: CliResult, *needles: str) -> None:
    """The run failed with exactly one stderr line, no traceback, containing every needle."""
    assert "Traceback" not in result.err, result.err
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert len(lines) == 1, result.err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


class Holder:
    """A running ``fencepost acquire`` child process."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.token: int | None = None
        self.secret = ""  # the lease secret, from the second line (FENCEPOST_LEASE_SECRET=...)

    async def read_token(self, timeout: float = 20.0) -> int:
        """Wait for the first stdout line and parse it as the fencing token; then read the lease secret's line."""
        assert self.proc.stdout is not None
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        except TimeoutError:
            pytest.fail(f"fencepost acquire printed no token within {timeout} s")
        if not line:
            rc, _, err = await self.finish()
            pytest.fail(f"fencepost acquire exited ({rc}) without a token: {err}")
        self.token = int(line.decode().strip())
        secret = (await asyncio.wait_for(self.proc.stdout.readline(), timeout)).decode().strip()
        assert secret.startswith("FENCEPOST_LEASE_SECRET="), secret
        self.secret = secret.partition("=")[2]
        return self.token

    async def finish(self, sig: int | None = None, timeout: float = 20.0) -> tuple[int, str, str]:
        """Optionally send ``sig``, then wait for the exit; returns (rc, rest of stdout, stderr)."""
        if sig is not None and self.proc.returncode is None:
            self.proc.send_signal(sig)
        try:
            out, err = await asyncio.wait_for(self.proc.communicate(), timeout)
        except TimeoutError:
            self.proc.kill()
            out, err = await self.proc.communicate()
            pytest.fail(f"fencepost acquire did not exit in {timeout} s: {err.decode()}")
        assert self.proc.returncode is not None
        return self.proc.returncode, out.decode(), err.decode()


@asynccontextmanager
async def holding(*args: str) -> AsyncIterator[Holder]:
    """Start ``fencepost acquire ARGS...``; the child is killed and reaped on the way out."""
    proc = await asyncio.create_subprocess_exec(
        *cli_argv("acquire", *args), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=cli_env())
    holder = Holder(proc)
    try:
        yield holder
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.communicate()


def lock_name() -> str:
    """A fresh lock name for one test."""
    return f"inv:{uuid.uuid4().hex[:8]}"


async def status_json(address: str, name: str) -> dict[str, object]:
    """``fencepost status NAME --json``, parsed."""
    result = await run_cli("status", name, "--json", "--address", address)
    assert result.rc == 0, result.err
    obj = json.loads(result.out)
    assert isinstance(obj, dict)
    return obj


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (right now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
