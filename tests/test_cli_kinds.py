"""`fencepost status NAME --semaphore | --election` and `fencepost leader NAME`'s exit codes, against a real
coordinator: a semaphore is described slot by slot (not "not held"), an election by its leader, and "no leader"
is exit 6, told apart from "coordinator unreachable" (exit 1)."""

from __future__ import annotations

import asyncio
import json

from fencepost.client import AsyncLockClient

from .cli_helpers import run_cli


async def test_status_of_a_semaphore_lists_each_slot_and_the_waiters(address: str) -> None:
    """--semaphore shows the permits, each slot's holder (lease, token) or "free", and the waiters, as text and
    JSON; a semaphore never used says so; the plain form still describes a lock of that name."""
    async with AsyncLockClient(address) as a, AsyncLockClient(address) as b:
        first = await a.semaphore("pool", 3, ttl=10.0).acquire(timeout=10.0)
        second = await b.semaphore("pool", 3, ttl=10.0).acquire(timeout=10.0)
        holders = {first.slot: first, second.slot: second}
        (free,) = {0, 1, 2} - set(holders)

        text = await run_cli("status", "pool", "--semaphore", "--address", address)
        assert text.rc == 0, text.err
        lines = text.out.splitlines()
        assert lines[0] == "pool: semaphore of 3 permits, 2 held"
        for slot, permit in holders.items():
            assert (f"  slot {slot}  lease 0x{permit.lease_id:x} ({permit.lease_id}), fencing token {permit.token}"
                    in lines), text.out
        assert f"  slot {free}  free" in lines and "  waiters        0" in lines, text.out

        obj = json.loads((await run_cli("status", "pool", "--semaphore", "--json", "--address", address)).out)
        assert (obj["name"], obj["kind"], obj["permits"], obj["held"], obj["waiter_count"]) == ("pool", "semaphore",
                                                                                              3, 2, 0)
        assert [(h["slot"], h["lease_id"], h["token"]) for h in obj["holders"]] == sorted(
            (s, p.lease_id, p.token) for s, p in holders.items())
        assert obj["address"] == address and obj["revision"] >= second.token

        plain = await run_cli("status", "pool", "--address", address)  # a lock named pool: unchanged, not held
        assert plain.rc == 0 and plain.out.splitlines()[0] == "pool: not held", plain
        await first.release()
        await second.release()

    never = await run_cli("status", "unused", "--semaphore", "--address", address)
    assert never.rc == 0 and never.out.splitlines()[0] == "unused: semaphore never used (no permits record)", never
    unused = json.loads((await run_cli("status", "unused", "--semaphore", "--json", "--address", address)).out)
    assert (unused["permits"], unused["holders"], unused["waiter_count"]) == (0, [], 0)


async def test_status_of_an_election_and_leader_exit_codes(address: str) -> None:
    """--election prints what `fencepost leader` prints (exit 0 with or without a leader); `leader` exits 6 for
    "no leader" (--json prints the null leader too) and 1 when no coordinator answers; both refuse a bad pair
    of flags with exit 2; `leader --help` lists its own exit codes."""
    none = await run_cli("status", "e1", "--election", "--address", address)
    assert (none.rc, none.out.strip()) == (0, "e1: no leader"), none
    no_leader = await run_cli("leader", "e1", "--address", address)
    assert no_leader.rc == 6 and no_leader.err.strip() == "fencepost leader: election e1 has no leader", no_leader
    as_json = await run_cli("leader", "e1", "--json", "--address", address)
    assert as_json.rc == 6 and json.loads(as_json.out)["leader"] is None, as_json

    async with AsyncLockClient(address) as a:
        leading = await a.campaign("e1", "node-1", ttl=10.0)
        shown = await run_cli("status", "e1", "--election", "--address", address)
        led = await run_cli("leader", "e1", "--address", address)
        assert shown.rc == led.rc == 0 and shown.out == led.out, (shown, led)
        assert f"token {leading.token}" in shown.out and "'node-1'" in shown.out
        obj = json.loads((await run_cli("status", "e1", "--election", "--json", "--address", address)).out)
        assert (obj["leader"]["lease_id"], obj["leader"]["token"]) == (leading.lease_id, leading.token)
        await leading.release()

    unreachable = await run_cli("leader", "e1", "--address", "127.0.0.1:1")
    assert unreachable.rc == 1 and "cannot reach" in unreachable.err, unreachable
    for argv in (["status", "e1", "--election", "--semaphore"], ["status", "--semaphore"]):
        bad = await run_cli(*argv, "--address", address)
        assert bad.rc == 2 and len(bad.err.splitlines()) == 1, (argv, bad)
    helped = await run_cli("leader", "--help")
    table = helped.out[helped.out.index("exit codes:"):]
    assert "  6    the election has no leader" in table and "  1    coordinator unreachable" in table, table


async def test_status_election_and_semaphore_when_coordinator_unreachable() -> None:
    """Unreachable is exit 1 for both forms, as for a lock."""
    results = await asyncio.gather(*(run_cli("status", "x", flag, "--address", "127.0.0.1:1")
                                     for flag in ("--semaphore", "--election")))
    assert [r.rc for r in results] == [1, 1], results
