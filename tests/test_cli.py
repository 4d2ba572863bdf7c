"""The ``fencepost`` command line, run as subprocesses against a real coordinator: acquire, release and
status (bad input: tests/test_cli_input.py; connecting: tests/test_cli_connect.py)."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import pytest

from fencepost.client import AsyncLockClient
from fencepost.client.cli import common
from fencepost.client.cli.acquire import acquire_unless

from .cli_helpers import assert_one_line_error, cli_argv, free_port, holding, lock_name, run_cli, status_json
from .conftest import cli_env, wait_for

REASONS = ("NOT_HOLDER", "STALE_TOKEN", "LEASE_EXPIRED")


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


async def test_acquire_unless_when_the_signal_and_the_grant_come_together_the_signal_wins(address: str) -> None:
    """A grant and a signal seen in the same wake-up: the grant is released and None returned.

    Before, the grant won and the signal, already taken from the queue, was lost: ``fencepost run`` then ran
    its command and ignored the SIGTERM (a lock-delay CLI test waited 15 s for it in a full run).
    """
    name = lock_name()
    async with AsyncLockClient([address]) as client:
        granted = asyncio.ensure_future(client.acquire(name, ttl=5))
        await asyncio.wait_for(asyncio.shield(granted), 10)
        signalled: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        signalled.set_result(signal.SIGTERM)
        assert await acquire_unless(client, name, ttl=5, timeout=None, try_once=False, interrupt=signalled,
                                    acquiring=granted) is None
        assert (await client.describe(name)).held is False


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
    assert info["health_address"] is None and info["metrics_address"] is None and info["http_address"] is None
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
        *cli_argv("status", "some-lock", "--json"), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    obj = json.loads(out)
    assert obj["address"] == address and obj["held"] is False


async def test_help_lists_exit_codes() -> None:
    """--help documents every exit code."""
    result = await run_cli("acquire", "--help")
    assert result.rc == 0
    for code, text in common.EXIT_CODES.items():
        assert f"{code:<4} {text}" in result.out


# ---------------------------------------------------------------- serve, end to end


def test_serve_then_acquire_and_status_from_another_process(coordinator_process: object, tmp_path: Path) -> None:
    """`fencepost serve` in one process, `fencepost acquire` and `status` in others (the README flow)."""
    import subprocess

    address = coordinator_process.start()  # type: ignore[attr-defined]
    name = lock_name()
    env = cli_env()
    with subprocess.Popen(cli_argv("acquire", name, "--ttl", "5", "--address", address),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True) as proc:
        try:
            assert proc.stdout is not None
            token = int(proc.stdout.readline())
            st = subprocess.run(cli_argv("status", name, "--address", address), capture_output=True,
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
