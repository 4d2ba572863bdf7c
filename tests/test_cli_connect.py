"""The ``fencepost`` command line while it connects: an unreachable coordinator exits 1 in bounded time,
a signal while connecting stops the command at once, ``--try`` and ``--timeout 0`` connect for the minimum."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from fencepost.client.cli import common

from .cli_helpers import assert_one_line_error, cli_argv, free_port, holding, lock_name, run_cli
from .conftest import cli_env


@pytest.mark.parametrize(
    "args",
    [
        ["status", "x"],
        ["status"],
        ["release", "x", "--lease-id", "0x10", "--token", "3"],
        ["acquire", "x", "--ttl", "2", "--timeout", "1"],
        ["run", "x", "--ttl", "2", "--timeout", "1", "--", "true"],
        ["elect", "x", "--value", "v", "--timeout", "1", "--", "true"],
    ],
)
async def test_commands_when_coordinator_unreachable_exit_1(args: list[str]) -> None:
    """With nothing listening, every client command exits 1 with one error line, no traceback; a --timeout
    bounds the time spent trying to connect too (the client's own connect_timeout is 10 s)."""
    started = time.monotonic()
    address = ["--address", f"127.0.0.1:{free_port()}"]
    cut = args.index("--") if "--" in args else len(args)  # before a command's own arguments
    result = await run_cli(*args[:cut], *address, *args[cut:], timeout=60)
    elapsed = time.monotonic() - started
    assert result.rc == 1, result
    assert_one_line_error(result)
    assert elapsed < 8, (args, elapsed)  # not the 10 s of connect_timeout (status and release: 5 s)


async def test_acquire_with_timeout_0_still_connects_and_is_granted(address: str) -> None:
    """--timeout 0 waits for no lock, but connecting still gets its minimum (MIN_CONNECT_SECONDS)."""
    name = lock_name()
    async with holding(name, "--ttl", "5", "--timeout", "0", "--address", address) as holder:
        assert await holder.read_token() > 0
        rc, _, err = await holder.finish(signal.SIGINT)
        assert rc == 0, err


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["acquire", "x", "--ttl", "2"], 130),
        (["run", "x", "--ttl", "2", "--timeout", "30", "--", "true"], 130),
        (["run", "x", "--ttl", "2", "--permits", "2", "--", "true"], 130),
        (["elect", "x", "--value", "v", "--", "true"], 130),
        (["leader", "x", "--watch"], 0),  # as a watch stopped later
    ],
)
async def test_signal_while_connecting_stops_the_command(args: list[str], code: int) -> None:
    """SIGINT while the command is still connecting (a coordinator that accepts TCP and never answers) ends it
    at once with its "interrupted" code, not after the connect wait (10 s, or all of --timeout)."""
    connected = asyncio.Event()
    held: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # say nothing, keep the connection open
        connected.set()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    cut = args.index("--") if "--" in args else len(args)
    proc = await asyncio.create_subprocess_exec(
        *cli_argv(*args[:cut], "--address", address, *args[cut:]), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=cli_env())
    try:
        await asyncio.wait_for(connected.wait(), 20)  # it is connecting: its signal handlers are in place
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = await asyncio.wait_for(proc.communicate(), 20)
        assert proc.returncode == code, (proc.returncode, err.decode())
        assert time.monotonic() - started < 5, err.decode()
        assert "Traceback" not in err.decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(
    "args",
    [
        ["acquire", "x", "--ttl", "2", "--try"],  # run and elect: the same connect_within
        ["elect", "x", "--value", "v", "--timeout", "0", "--", "true"],
    ],
)
async def test_try_and_timeout_0_connect_for_the_minimum_only(args: list[str]) -> None:
    """--try and --timeout 0 with no coordinator: exit 1 after about MIN_CONNECT_SECONDS, not connect_timeout."""
    started = time.monotonic()
    cut = args.index("--") if "--" in args else len(args)
    result = await run_cli(*args[:cut], "--address", f"127.0.0.1:{free_port()}", *args[cut:], timeout=60)
    assert result.rc == 1, result
    assert_one_line_error(result)
    assert time.monotonic() - started < common.MIN_CONNECT_SECONDS + 4, result
