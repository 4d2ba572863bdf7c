"""``fencepost locks`` against a real etcd and an in-process coordinator: JSON, table, pages, watch, errors."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import AsyncIterator

import pytest

from fencepost.client import AsyncLockClient, AsyncLockHandle
from fencepost.client.cli.locks import COLUMNS
from fencepost.client.v1 import lock_pb2_grpc

from .cli_helpers import assert_one_line_error, cli_argv, run_cli
from .conftest import cli_env, describe_waiters_is, wait_for


@contextlib.asynccontextmanager
async def _two_held_and_a_waiter(address: str, stub: lock_pb2_grpc.LockServiceStub
                                  ) -> AsyncIterator[tuple[AsyncLockHandle, AsyncLockHandle, int]]:
    """Hold ``orders/1`` and ``orders/2`` (one lease); a second client waits for ``orders/1``."""
    async with AsyncLockClient(address) as holder, AsyncLockClient(address) as other:
        one = await holder.acquire("orders/1", ttl=20.0, timeout=5.0)
        two = await holder.acquire("orders/2", ttl=20.0, timeout=5.0)
        waiter = asyncio.create_task(other.acquire("orders/1", ttl=20.0, timeout=60.0))
        try:
            await wait_for(lambda: describe_waiters_is(stub, "orders/1", 1), 10, what="a waiter on orders/1")
            yield one, two, 1
        finally:
            waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiter


async def test_locks_json_lists_two_held_locks_and_a_waiter(
    address: str, stub: lock_pb2_grpc.LockServiceStub
) -> None:
    """``fencepost locks --json``: each lock's name, holder lease, token, TTLs, held seconds and waiters."""
    async with _two_held_and_a_waiter(address, stub) as (one, two, _):
        result = await run_cli("locks", "--json", "--address", address)
    assert result.rc == 0, result.err
    obj = json.loads(result.out)
    assert set(obj) == {"address", "revision", "locks"}
    assert obj["address"] == address
    assert obj["revision"] >= two.token > one.token
    first, second = obj["locks"]
    for entry, handle, waiters in ((first, one, 1), (second, two, 0)):
        assert set(entry) == {"name", "holder_lease_id", "holder_lease_id_hex", "token", "ttl_remaining_seconds",
                              "ttl_seconds", "held_seconds", "waiter_count", "lock_delay_seconds",
                              "lock_delay_remaining_ms", "mode", "holder_count"}
        assert (entry["mode"], entry["holder_count"]) == ("write", 1)
        assert (entry["lock_delay_seconds"], entry["lock_delay_remaining_ms"]) == (0, 0)
        assert entry["name"] == handle.name
        assert entry["holder_lease_id"] == handle.lease_id
        assert entry["holder_lease_id_hex"] == f"0x{handle.lease_id:x}"
        assert entry["token"] == handle.token
        assert entry["ttl_seconds"] >= 20
        assert 0 < entry["ttl_remaining_seconds"] <= entry["ttl_seconds"]
        assert 0 <= entry["held_seconds"] < 60
        assert entry["waiter_count"] == waiters
    assert first["holder_lease_id"] == second["holder_lease_id"]  # one client, one lease


async def test_locks_table_has_a_row_per_lock(address: str, stub: lock_pb2_grpc.LockServiceStub) -> None:
    """The table: the column titles, then one row per held lock with its lease, token and waiters."""
    async with _two_held_and_a_waiter(address, stub) as (one, two, _):
        result = await run_cli("locks", "orders/", "--address", address)
    assert result.rc == 0, result.err
    lines = result.out.splitlines()
    assert lines[0].split() == " ".join(COLUMNS).split()
    rows = [line.split() for line in lines[1:3]]
    assert rows[0][:3] == ["orders/1", f"0x{one.lease_id:x}", str(one.token)]
    assert rows[1][:3] == ["orders/2", f"0x{two.lease_id:x}", str(two.token)]
    assert (rows[0][-1], rows[1][-1]) == ("1", "0")
    assert lines[3].startswith("2 held, etcd revision ")


async def test_locks_reads_every_page_and_filters_by_prefix(address: str) -> None:
    """With --page-size 1 all three 'p/' locks are listed, and not 'q'."""
    async with AsyncLockClient(address) as client:
        for name in ("p/a", "p/b", "p/c", "q"):
            await client.acquire(name, ttl=20.0, timeout=5.0)
        result = await run_cli("locks", "p/", "--page-size", "1", "--json", "--address", address)
        empty = await run_cli("locks", "nothing-here/", "--address", address)
    assert result.rc == 0, result.err
    assert [lock["name"] for lock in json.loads(result.out)["locks"]] == ["p/a", "p/b", "p/c"]
    assert empty.rc == 0 and empty.out.splitlines()[0] == "no held locks", empty


@pytest.mark.parametrize("size", ["0x", "-1", "1001"])
async def test_locks_when_page_size_is_bad_exits_2_naming_it(address: str, size: str) -> None:
    """A page size that is not a number exits 2 at parsing; one outside 1..1000 exits 2 naming page_size."""
    result = await run_cli("locks", "--page-size", size, "--address", address)
    assert result.rc == 2, result
    assert "page" in result.err and "Traceback" not in result.err, result.err
    if size != "0x":
        assert_one_line_error(result, "invalid page_size")


@pytest.mark.parametrize("bad_prefix", ["a\udcff", "a\x01b"], ids=["not-utf8", "control"])
@pytest.mark.parametrize("watch", [False, True], ids=["once", "watch"])
async def test_locks_when_prefix_is_bad_exits_2_naming_it(address: str, bad_prefix: str, watch: bool) -> None:
    """A PREFIX with a byte that is not UTF-8 (a lone surrogate in sys.argv) or a control character exits 2
    with one line naming the prefix, never a traceback."""
    result = await run_cli("locks", bad_prefix, *(["--watch"] if watch else []), "--address", address)
    assert result.rc == 2, result
    assert_one_line_error(result, "invalid prefix")


async def test_locks_watch_lists_again_until_interrupted(address: str) -> None:
    """``--watch --json`` prints a listing per interval, shows a new lock, and exits 0 on SIGINT."""
    proc = await asyncio.create_subprocess_exec(
        *cli_argv("locks", "--watch", "--interval", "0.2", "--json", "--address", address),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=cli_env())
    assert proc.stdout is not None
    try:
        first = json.loads(await asyncio.wait_for(proc.stdout.readline(), 20))
        assert first["locks"] == []
        async with AsyncLockClient(address) as client:
            handle = await client.acquire("watched", ttl=20.0, timeout=5.0)
            seen: list[str] = []
            while not seen:  # each line is one listing; stop at the first that shows the lock
                listing = json.loads(await asyncio.wait_for(proc.stdout.readline(), 20))
                seen = [lock["name"] for lock in listing["locks"]]
            assert seen == ["watched"] and listing["locks"][0]["token"] == handle.token
        proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), 20)
        assert proc.returncode == 0, err.decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.communicate()
