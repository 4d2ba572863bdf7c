"""Read holds on the command line (``run --read``, ``acquire --read``, ``release --read``; ``status`` and ``locks``
showing the mode) against a real etcd and an in-process coordinator."""

from __future__ import annotations

import json
import signal
import sys

import pytest

from fencepost.client.cli.holders import split
from fencepost.client.v1 import lock_pb2

from .cli_helpers import assert_one_line_error, holding, lock_name, run_cli, status_json
from .conftest import describe, wait_for
from .owned_stub import OwnedStub
from .test_run import running

# A command under `fencepost run`: prints "TOKEN LEASE_ID SECRET" and its lock mode, then holds until SIGTERM
# (forwarded by run), on which it exits 0 (run then releases and exits 0).
HOLD_UNTIL_SIGTERM = r"""
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print(os.environ["FENCEPOST_TOKEN"], os.environ["FENCEPOST_LEASE_ID"], os.environ["FENCEPOST_LEASE_SECRET"],
      flush=True)
print("mode", os.environ.get("FENCEPOST_LOCK_MODE", "-"), flush=True)
time.sleep(60)
"""


async def test_run_read_two_readers_hold_together_a_writer_waits_and_gets_a_larger_token(
        address: str, stub: OwnedStub) -> None:
    """Two `run --read` hold at once; a plain `run` waits for both, shown by status and locks as a read hold with
    two readers and a writing waiter; once they exit it runs with a token above both readers'."""
    name = lock_name()
    hold = [sys.executable, "-c", HOLD_UNTIL_SIGTERM]
    async with running(name, "--read", "--ttl", "10", "--timeout", "20", "--address", address, "--", *hold) as r1, \
            running(name, "--read", "--ttl", "10", "--timeout", "20", "--address", address, "--", *hold) as r2:
        (t1, lease1), (t2, lease2) = await r1.grant(), await r2.grant()  # both hold: neither command has ended
        assert lease1 != lease2
        async with running(name, "--ttl", "10", "--timeout", "30", "--address", address, "--",
                           *hold) as writer:
            await wait_for(lambda: _writer_waits(stub, name), 15, what="the writer queued behind the readers")

            status = await status_json(address, name)
            assert (status["held"], status["mode"]) == (True, "read")
            assert status["holder"]["mode"] == "read"  # type: ignore[index]
            assert {(r["lease_id"], r["token"]) for r in status["readers"]} == {(lease1, t1), (lease2, t2)}  # type: ignore[union-attr]
            assert status["waiter_count"] == 1
            [waiter] = status["waiters"]  # type: ignore[misc]
            assert waiter["mode"] == "write" and waiter["lease_id"] not in (lease1, lease2)
            text = await run_cli("status", name, "--address", address)
            assert text.rc == 0, text.err
            assert text.out.splitlines()[0] == f"{name}: held for reading by 2 readers"
            assert f"lease 0x{lease1:x} ({lease1}), fencing token {t1}" in text.out
            assert f"lease 0x{lease2:x} ({lease2}), fencing token {t2}" in text.out
            assert "waiters        1" in text.out and ", write, queued at revision" in text.out

            listing = await run_cli("locks", name, "--json", "--address", address)
            assert listing.rc == 0, listing.err
            [entry] = json.loads(listing.out)["locks"]
            assert entry["mode"] == "read" and entry["holder_lease_id"] in (lease1, lease2)
            assert (entry["holder_count"], entry["waiter_count"]) == (2, 1)
            table = await run_cli("locks", name, "--address", address)
            assert table.rc == 0, table.err
            header, row = table.out.splitlines()[:2]
            assert header.split()[-1] == "MODE" and row.split()[-1] == "read(2)"

            for r in (r1, r2):
                r.proc.send_signal(signal.SIGTERM)
            for r in (r1, r2):
                rc, out, err = await r.finish()
                assert rc == 0, err
                assert "mode read" in out
            tw, _ = await writer.grant()
            assert tw > max(t1, t2)
            writer.proc.send_signal(signal.SIGTERM)
            rc, out, err = await writer.finish()
            assert rc == 0, err
            assert "mode -" in out  # a writer's command gets no FENCEPOST_LOCK_MODE


async def _writer_waits(stub: OwnedStub, name: str) -> bool:
    return any(not w.read for w in (await describe(stub, name)).waiters)


async def test_acquire_read_is_released_by_hand_with_release_read_only(address: str) -> None:
    """A read hold taken by `acquire --read` is not released by a plain `release` (NOT_HOLDER, exit 6); `release
    --read` releases it, and the holding `acquire` reports the loss (exit 3)."""
    name = lock_name()
    async with holding(name, "--read", "--ttl", "10", "--address", address) as holder:
        token = await holder.read_token()
        status = await status_json(address, name)
        assert status["mode"] == "read"
        lease = str(status["holder"]["lease_id"])  # type: ignore[index]
        args = (name, "--lease-id", lease, "--token", str(token), "--lease-secret", holder.secret, "--address", address)
        plain = await run_cli("release", *args)
        assert plain.rc == 6, plain
        assert_one_line_error(plain, "NOT_HOLDER", name)
        released = await run_cli("release", *args, "--read")
        assert released.rc == 0, released.err
        assert released.out.strip() == "released"
        rc, _, err = await holder.finish()
        assert rc == 3 and "lost: " in err, err
    assert (await status_json(address, name))["held"] is False


@pytest.mark.parametrize(("args", "needles"), [
    (["run", "job", "--read", "--lock-delay", "5", "--ttl", "3", "--", "true"], ["--read", "--lock-delay"]),
    (["acquire", "job", "--read", "--lock-delay", "5"], ["--read", "--lock-delay"]),
    (["run", "job", "--read", "--permits", "2", "--ttl", "3", "--", "true"], ["--read", "--permits"]),
    (["run", "a", "b", "--read", "--ttl", "3", "--", "true"], ["--read", "one NAME"]),
    (["acquire", "a", "b", "--read"], ["--read", "one NAME"]),
    (["release", "a", "b", "--read", "--lease-id", "7", "--token", "3"], ["--read", "one NAME"]),
])
async def test_read_when_combined_with_what_readers_do_not_take_exits_2_naming_the_flag(
        args: list[str], needles: list[str]) -> None:
    """--read with --lock-delay, --permits or several names is refused before any call, one line naming it."""
    result = await run_cli(*args, "--address", "127.0.0.1:1")
    assert result.rc == 2, result
    assert_one_line_error(result, *needles)


def _contender(lease_id: int, token: int, read: bool) -> lock_pb2.Holder:
    return lock_pb2.Holder(lease_id=lease_id, token=token, read=read)


def test_split_when_holder_reads_makes_the_readers_before_the_first_writer_holders() -> None:
    """From a coordinator without DescribeResponse.holders: the readers queued before the first writer hold with
    a reading holder; the writer and the reader after it wait; a writing holder holds alone, and nobody holds a
    lock that is not held. With holders, they are the holders and the waiters are as answered."""
    waiters = [_contender(2, 11, True), _contender(3, 12, False), _contender(4, 13, True)]
    read = lock_pb2.DescribeResponse(held=True, holder=_contender(1, 10, True), waiters=waiters, waiter_count=3)
    holders, queued, count = split(read)
    assert ([h.lease_id for h in holders], [w.lease_id for w in queued], count) == ([1, 2], [3, 4], 2)
    write = lock_pb2.DescribeResponse(held=True, holder=_contender(1, 10, False), waiters=waiters, waiter_count=3)
    holders, queued, count = split(write)
    assert ([h.lease_id for h in holders], [w.lease_id for w in queued], count) == ([1], [2, 3, 4], 3)
    held_back = lock_pb2.DescribeResponse(held=False, waiters=waiters, waiter_count=3)
    assert split(held_back) == ([], waiters, 3)
    both = [_contender(1, 10, True), _contender(2, 11, True)]
    current = lock_pb2.DescribeResponse(held=True, holder=both[0], holders=both, waiters=waiters[1:], waiter_count=2)
    holders, queued, count = split(current)
    assert ([h.lease_id for h in holders], [w.lease_id for w in queued], count) == ([1, 2], [3, 4], 2)
