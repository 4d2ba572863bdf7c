"""The ``fencepost`` command line, run as subprocesses against a real coordinator."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from fencepost.client import cli
from fencepost.client.cli import common, flags

from .conftest import CliResult, cli_env, wait_for

REASONS = ("NOT_HOLDER", "STALE_TOKEN", "LEASE_EXPIRED")




def _argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "fencepost.client.cli", *args]


async def run_cli(*args: str, timeout: float = 30.0, env: dict[str, str] | None = None,
                  cwd: str | None = None) -> CliResult:
    """Run ``fencepost ARGS...`` to completion without blocking the event loop.

    Args:
        env: Variables added to the test environment (:func:`cli_env`).
        cwd: The working directory of the command; the test's by default.
    """
    proc = await asyncio.create_subprocess_exec(
        *_argv(*args), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
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
        *_argv("acquire", *args), stdin=asyncio.subprocess.DEVNULL,
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


# ---------------------------------------------------------------- against a coordinator


async def test_acquire_prints_token_then_sigint_releases(address: str) -> None:
    """acquire prints the token; status shows that holder; SIGINT releases and exits 0."""
    name = lock_name()
    async with holding(name, "--ttl", "5", "--address", address) as holder:
        token = await holder.read_token()
        assert token > 0

        st = await status_json(address, name)
        assert st["held"] is True
        assert st["token"] == token
        holder_info = st["holder"]
        assert isinstance(holder_info, dict) and holder_info["token"] == token
        assert holder_info["lease_id_hex"] == f"0x{holder_info['lease_id']:x}"
        assert st["ttl_seconds"] == 5 and 0 <= int(st["ttl_remaining_seconds"]) <= 5  # type: ignore[call-overload]

        text = await run_cli("status", name, "--address", address)
        assert text.rc == 0 and f"fencing token  {token}" in text.out, text

        rc, _, err = await holder.finish(signal.SIGINT)
        assert rc == 0, err
        assert "Traceback" not in err
        assert name in err and "ttl 5" in err, err

    st = await status_json(address, name)
    assert st["held"] is False and st["holder"] is None
    text = await run_cli("status", name, "--address", address)
    assert text.rc == 0 and f"{name}: not held" in text.out


async def test_acquire_then_sigterm_releases_and_next_token_is_larger(address: str) -> None:
    """SIGTERM releases too, and the next acquire of the name gets a larger token."""
    name = lock_name()
    async with holding(name, "--ttl", "5", "--address", address) as first:
        t1 = await first.read_token()
        rc, _, err = await first.finish(signal.SIGTERM)
        assert rc == 0, err
    async with holding(name, "--ttl", "5", "--try", "--address", address) as second:
        t2 = await second.read_token()
        assert t2 > t1
        rc, _, err = await second.finish(signal.SIGINT)
        assert rc == 0, err


async def test_release_when_token_is_wrong_exits_6_with_reason(address: str) -> None:
    """release with the holder's lease but an older token exits 6 naming STALE_TOKEN."""
    name = lock_name()
    async with holding(name, "--ttl", "5", "--address", address) as holder:
        token = await holder.read_token()
        st = await status_json(address, name)
        lease = st["holder"]["lease_id"]  # type: ignore[index]

        stale = await run_cli("release", name, "--lease-id", hex(lease), "--token", str(token - 1),
                              "--lease-secret", holder.secret, "--address", address)
        assert stale.rc == 6, stale
        assert_one_line_error(stale, "STALE_TOKEN", name)

        # Without the lease's secret, the lease is not the caller's: refused, whatever the token.
        foreign = await run_cli("release", name, "--lease-id", hex(lease), "--token", str(token),
                                "--address", address)
        assert foreign.rc == 6, foreign
        assert_one_line_error(foreign, "NOT_LEASE_OWNER", "--lease-secret")
        assert holder.secret not in foreign.err

        other = await run_cli("release", name, "--lease-id", "12345", "--token", str(token),
                              "--address", address)
        assert other.rc == 6, other
        assert_one_line_error(other)
        assert any(reason in other.err for reason in REASONS), other.err

        still = await status_json(address, name)
        assert still["held"] is True and still["token"] == token
        rc, _, err = await holder.finish(signal.SIGINT)
        assert rc == 0, err


async def test_acquire_when_released_by_hand_reports_lost_and_exits_3(address: str) -> None:
    """A release by hand (decimal lease id) frees the lock; the holder prints "lost:" and exits 3."""
    name = lock_name()
    async with holding(name, "--ttl", "5", "--address", address) as holder:
        token = await holder.read_token()
        st = await status_json(address, name)
        lease = st["holder"]["lease_id"]  # type: ignore[index]

        done = await run_cli("release", name, "--lease-id", str(lease), "--token", str(token),
                             "--address", address, env={"FENCEPOST_LEASE_SECRET": holder.secret})
        assert done.rc == 0 and done.out.strip() == "released", done  # the secret from the environment

        rc, _, err = await holder.finish(timeout=20)
        assert rc == 3, err
        assert any(line.startswith("lost: ") for line in err.splitlines()), err
        assert "Traceback" not in err
    assert (await status_json(address, name))["held"] is False


async def test_acquire_try_when_held_exits_5_and_timeout_exits_4(address: str) -> None:
    """--try on a held lock exits 5 naming the holder; --timeout exits 4; neither leaves a waiter."""
    name = lock_name()
    async with holding(name, "--ttl", "5", "--address", address) as holder:
        token = await holder.read_token()

        held = await run_cli("acquire", name, "--try", "--address", address)
        assert held.rc == 5, held
        assert held.out == ""
        assert_one_line_error(held, name, str(token))

        late = await run_cli("acquire", name, "--timeout", "0.5", "--address", address)
        assert late.rc == 4, late
        assert_one_line_error(late, "timeout", name)

        st = await status_json(address, name)
        assert st["waiter_count"] == 0 and st["token"] == token
        rc, _, err = await holder.finish(signal.SIGINT)
        assert rc == 0, err


async def test_acquire_when_interrupted_while_waiting_leaves_no_waiter(address: str) -> None:
    """SIGINT while queued exits 130 and removes the waiter from the queue."""
    name = lock_name()
    async with holding(name, "--ttl", "5", "--address", address) as holder:
        await holder.read_token()
        async with holding(name, "--ttl", "5", "--address", address) as waiter:
            for _ in range(200):
                if (await status_json(address, name))["waiter_count"] == 1:
                    break
                await asyncio.sleep(0.05)
            else:
                pytest.fail("the second acquire never queued")
            rc, out, err = await waiter.finish(signal.SIGINT)
            assert rc == 130 and out == "", (rc, out, err)
            assert "Traceback" not in err
        assert (await status_json(address, name))["waiter_count"] == 0
        rc, _, err = await holder.finish(signal.SIGINT)
        assert rc == 0, err


async def test_status_without_name_reports_serving(address: str) -> None:
    """status without NAME asks the health service: SERVING, exit 0; --json is one object."""
    text = await run_cli("status", "--address", address)
    assert text.rc == 0 and f"coordinator {address}: SERVING" in text.out, text
    obj = json.loads((await run_cli("status", "--json", "--address", address)).out)
    assert obj["serving"] is True
    assert [{k: v for k, v in c.items() if k != "info"} for c in obj["coordinators"]] == [
        {"address": address, "status": "SERVING"}]


async def test_status_without_name_prints_server_info(address: str, prefix: str, etcd: Any, stub: Any) -> None:
    """status without NAME prints each coordinator's ServerInfo under its health line; --json has it as "info"."""
    import importlib.metadata

    from fencepost.client.v1 import lock_pb2

    async def counted() -> bool:  # the holder's keepalive and watch have reached the coordinator
        info = await stub.ServerInfo(lock_pb2.ServerInfoRequest(), timeout=5)
        return (info.keepalive_leases, info.watched_holds) == (1, 1)

    version = importlib.metadata.version("fencepost")
    name = lock_name()
    async with holding(name, "--ttl", "10", "--address", address) as holder:
        await holder.read_token()
        await wait_for(counted, 10, what="the holder's stream counted")
        text = await run_cli("status", "--address", address)
        obj = json.loads((await run_cli("status", "--json", "--address", address)).out)
    assert text.rc == 0, text
    lines = text.out.splitlines()
    assert lines[0] == f"coordinator {address}: SERVING", text.out
    assert f"  version         {version}, instance " in text.out, text.out
    assert f"  listening       {address}" in lines, text.out
    assert f"  key prefix      {prefix}" in lines, text.out
    assert f"  etcd            {etcd.endpoint}" in lines, text.out
    assert "etcd server     3.5." in text.out and "raft term" in text.out, text.out
    assert "  this replica    1 KeepAlive stream, 1 lease kept alive, 1 watched hold, 0 waiting acquires" in lines
    assert "  cluster-wide    1 held lock, 0 waiters" in lines, text.out
    (entry,) = obj["coordinators"]
    info = entry["info"]
    assert info["version"] == version and len(info["instance_id"]) == 16
    assert info["listen_address"] == address and info["key_prefix"] == prefix and info["serving"] is True
    assert isinstance(info["uptime_seconds"], float) and info["uptime_seconds"] > 0
    assert info["health_address"] is None and info["metrics_address"] is None
    e = info["etcd"]
    assert e["endpoints"] == [etcd.endpoint] and e["embedded"] is False
    assert e["available"] is True and e["error"] is None and e["server_version"].startswith("3.5.")
    assert e["leader"] == e["member_id"] and int(e["cluster_id"], 16) > 0 and e["revision"] >= holder.token
    assert info["coordinator"] == {"keepalive_streams": 1, "keepalive_leases": 1, "watched_holds": 1,
                                   "waiting_acquires": 0}
    assert info["cluster"] == {"contender_keys": 1, "held_locks": 1, "waiters": 0}


async def test_status_without_name_when_server_info_is_unimplemented_prints_health_only() -> None:
    """A coordinator without ServerInfo (here: a server with only a SERVING health service) gets today's output."""
    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    servicer = health.aio.HealthServicer()
    await servicer.set("fencepost.v1.LockService", health_pb2.HealthCheckResponse.SERVING)
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    try:
        text = await run_cli("status", "--address", address)
        obj = json.loads((await run_cli("status", "--json", "--address", address)).out)
    finally:
        await server.stop(0)
    assert text.rc == 0 and text.out == f"coordinator {address}: SERVING\n", text
    assert obj == {"serving": True, "coordinators": [{"address": address, "status": "SERVING", "info": None}]}


async def test_status_without_name_when_address_is_not_a_coordinator(etcd: Any) -> None:
    """status without NAME against another gRPC server with a health service (an etcd) is not SERVING: exit 1."""
    result = await run_cli("status", "--address", etcd.endpoint)
    assert result.rc == 1, result
    assert "SERVING" not in result.out.replace("NOT_SERVING", ""), result


async def test_status_when_name_is_invalid_exits_2_naming_the_field(address: str) -> None:
    """A lock name the server rejects (too long) exits 2 naming the field."""
    result = await run_cli("status", "x" * 300, "--address", address)
    assert result.rc == 2, result
    assert_one_line_error(result, "name")


async def test_address_from_env_and_list_skips_unreachable(address: str) -> None:
    """FENCEPOST_ADDRESS is used, and an unreachable first address is skipped."""
    dead = f"127.0.0.1:{free_port()}"
    env = cli_env()
    env[common.ADDRESS_ENV] = f"{dead},{address}"
    proc = await asyncio.create_subprocess_exec(
        *_argv("status", "some-lock", "--json"), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    obj = json.loads(out)
    assert obj["address"] == address and obj["held"] is False


NAME_COMMANDS = {
    "acquire": ["acquire", "{name}", "--try", "--address", "{address}"],
    "status": ["status", "{name}", "--address", "{address}"],
    "release": ["release", "{name}", "--lease-id", "0x10", "--token", "3", "--address", "{address}"],
    "run": ["run", "{name}", "--ttl", "3", "--try", "--address", "{address}", "--", "true"],
    "admin revoke": ["admin", "revoke", "{name}", "--address", "{address}"],
}


@pytest.mark.parametrize(
    ("name", "needle"),
    [("\udcff", "name must be valid UTF-8: character 0 is the byte 0xff, not UTF-8"),
     ("", "name must not be empty"),
     ("n" * 300, "name is 300 bytes; at most 256 bytes of UTF-8"),
     ("a\tb", "name must not contain control characters")],
    ids=["byte-0xff", "empty", "300-bytes", "tab"],
)
async def test_commands_when_name_is_bad_exit_2_with_one_wording(address: str, name: str, needle: str) -> None:
    """Every command refuses a bad NAME with exit 2 and the same line, whatever the command.

    A byte that is not UTF-8 (``fencepost acquire $'\\xff'``; sys.argv holds a lone
    surrogate) was a UnicodeEncodeError traceback with exit 1; an empty name
    was worded one way by acquire and run, another by status and release.
    """
    lines = set()
    results = await asyncio.gather(*(run_cli(*({"{name}": name, "{address}": address}.get(a, a) for a in argv))
                                     for argv in NAME_COMMANDS.values()))  # independent processes, run at once
    for command, result in zip(NAME_COMMANDS, results, strict=True):
        assert result.rc == 2, (command, result)
        assert_one_line_error(result, f"fencepost {command}: invalid name: {needle}")
        lines.add(result.err.strip().split(": ", 1)[1])
    assert len(lines) == 1, lines


@pytest.mark.parametrize("secret", ["x\ny", "\u00e9", "s" * 100_000, "a b"], ids=["newline", "non-ascii", "100k", "space"])
async def test_release_when_lease_secret_is_malformed_exits_2(address: str, secret: str) -> None:
    """A secret gRPC cannot send as metadata is bad input (exit 2, one line), not a traceback or RESOURCE_EXHAUSTED."""
    result = await run_cli("release", "x", "--lease-id", "0x10", "--token", "3", "--address", address,
                           "--lease-secret", secret)
    assert result.rc == 2, result
    assert_one_line_error(result, "fencepost release: invalid lease secret")


async def test_release_takes_a_lease_secret_with_a_trailing_carriage_return(address: str) -> None:
    """``FENCEPOST_LEASE_SECRET`` from a CRLF env file: the ``\\r`` is dropped and the release is answered."""
    result = await run_cli("release", "x", "--lease-id", "0x10", "--token", "3", "--address", address,
                           env={"FENCEPOST_LEASE_SECRET": "abc\r"})
    assert result.rc == 6 and "invalid lease secret" not in result.err, result  # answered: the lease is gone


# ---------------------------------------------------------------- no coordinator needed


@pytest.mark.parametrize("ttl", ["0", "-3", "abc", "0.5", "86401", "nan"])
async def test_acquire_when_ttl_is_bad_exits_2_naming_ttl(ttl: str) -> None:
    """A bad --ttl exits 2 with one line naming ttl, before any network call."""
    result = await run_cli("acquire", "x", f"--ttl={ttl}", "--address", f"127.0.0.1:{free_port()}")
    assert result.rc == 2, result
    assert_one_line_error(result, "ttl")


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["acquire", "x", "--timeout=-1"], "timeout"),
        (["release", "x", "--lease-id", "zz", "--token", "1"], "lease-id"),
        (["release", "x", "--lease-id", "0x10", "--token", "0"], "token"),
        (["status", "x", "--address", "nohost"], "address"),
    ],
)
async def test_bad_input_exits_2_naming_the_field(args: list[str], field: str) -> None:
    """Bad flags exit 2 with one line naming the flag."""
    result = await run_cli(*args)
    assert result.rc == 2, result
    assert_one_line_error(result, field)


ADDRESS_COMMANDS = {
    "status": ["status", "x"],
    "status-health": ["status"],
    "acquire": ["acquire", "x", "--ttl", "2"],
    "release": ["release", "x", "--lease-id", "0x10", "--token", "3"],
    "run": ["run", "x", "--ttl", "2", "--address", "{address}", "--", "true"],
}


@pytest.mark.parametrize(
    ("address", "needle"),
    [("http://127.0.0.1:{port}", "is a URL"), ("", "is empty"), (",", "has an empty entry"),
     ("127.0.0.1", "has no port"), ("127.0.0.1:99999", "has port '99999'")],
    ids=["http-url", "empty", "comma", "no-port", "port-too-big"],
)
async def test_commands_when_address_is_bad_exit_2_at_once(address: str, needle: str) -> None:
    """A bad --address exits 2 with one line before any connection attempt, in every command.

    ``--address http://127.0.0.1:PORT`` waited 10 s then exited 1; an empty
    ``--address ""`` or ``","`` silently used the default 127.0.0.1:7420.
    """
    value = address.format(port=free_port())

    async def timed(argv: list[str]) -> tuple[CliResult, float]:
        started = time.monotonic()
        if "{address}" not in argv:
            argv = [*argv, "--address", "{address}"]
        result = await run_cli(*(value if a == "{address}" else a for a in argv))
        return result, time.monotonic() - started

    # The commands are independent processes: run at once, each timed from its own start.
    results = await asyncio.gather(*(timed(argv) for argv in ADDRESS_COMMANDS.values()))
    for command, (result, took) in zip(ADDRESS_COMMANDS, results, strict=True):
        assert result.rc == 2, (command, result)
        assert_one_line_error(result, "invalid address: ", needle)
        assert took < 5, (command, "took", took)


async def test_status_when_env_address_is_bad_exits_2_naming_it() -> None:
    """A bad FENCEPOST_ADDRESS is an error naming the variable (an empty one means unset)."""
    env = cli_env()
    env[common.ADDRESS_ENV] = f"127.0.0.1:{free_port()},"
    proc = await asyncio.create_subprocess_exec(*_argv("status", "x"), stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE, env=env)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    result = CliResult(proc.returncode or 0, out.decode(), err.decode())
    assert result.rc == 2, result
    assert_one_line_error(result, "invalid address", common.ADDRESS_ENV)


async def test_demo_when_target_is_bad_exits_2() -> None:
    """demo --target goes through the same parser."""
    result = await run_cli("demo", "--target", "http://127.0.0.1:1")
    assert result.rc == 2, result
    assert_one_line_error(result, "--target", "is a URL")


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


async def test_help_lists_exit_codes() -> None:
    """--help documents every exit code."""
    result = await run_cli("acquire", "--help")
    assert result.rc == 0
    for code, text in common.EXIT_CODES.items():
        assert f"{code:<4} {text}" in result.out


def test_parse_lease_id_accepts_decimal_and_hex() -> None:
    """Lease ids are accepted in decimal and as 0x-hex."""
    assert flags.parse_lease_id("7587867312345") == 7587867312345
    assert flags.parse_lease_id("0x6E6C8E1C9A") == 0x6E6C8E1C9A


def test_parse_addresses_splits_commas_and_defaults() -> None:
    """--address may repeat or be comma-separated; the default is 127.0.0.1:7420."""
    assert flags.parse_addresses(None) == [common.DEFAULT_ADDRESS]
    assert flags.parse_addresses(None, "a:1, b:2") == ["a:1", "b:2"]
    assert flags.parse_addresses(["a:1,b:2", "c:3", "a:1"], "ignored:9") == ["a:1", "b:2", "c:3"]
    assert flags.parse_addresses(None, "") == [common.DEFAULT_ADDRESS]
    for explicit in ([""], [","], ["a:1", ""]):
        with pytest.raises(common.CliError) as info:
            flags.parse_addresses(explicit)
        assert info.value.exit_code == common.EXIT_USAGE


def test_serve_when_coordinator_extra_missing_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """serve without the coordinator extra says which package to install and exits 2."""
    import builtins

    real_import = builtins.__import__

    def fake_import(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("fencepost.coordinator"):
            raise ModuleNotFoundError("No module named 'etcd3aio'", name="etcd3aio")
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", fake_import)
    assert cli.main(["serve", "--help"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'fencepost[coordinator]'" in err and "etcd3aio" in err


# ---------------------------------------------------------------- serve, end to end


def test_serve_then_acquire_and_status_from_another_process(coordinator_process: object, tmp_path: Path) -> None:
    """`fencepost serve` in one process, `fencepost acquire` and `status` in others (the README flow)."""
    import subprocess

    address = coordinator_process.start()  # type: ignore[attr-defined]
    name = lock_name()
    env = cli_env()
    with subprocess.Popen(_argv("acquire", name, "--ttl", "5", "--address", address),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True) as proc:
        try:
            assert proc.stdout is not None
            token = int(proc.stdout.readline())
            st = subprocess.run(_argv("status", name, "--address", address), capture_output=True,
                                text=True, env=env, timeout=30)
            assert st.returncode == 0 and f"fencing token  {token}" in st.stdout, st
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=20)
            assert proc.returncode == 0, err
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert coordinator_process.terminate() == 0  # type: ignore[attr-defined]


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
        *_argv(*args[:cut], "--address", address, *args[cut:]), stdin=asyncio.subprocess.DEVNULL,
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
