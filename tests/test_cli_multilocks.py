"""Multi-locks on the command line (``run A B``, ``acquire A B``, ``release A B``: every lock or none, one token
per name) against a real etcd and an in-process coordinator."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys

import pytest

from .cli_helpers import assert_one_line_error, holding, lock_name, run_cli, status_json
from .conftest import describe_waiters_is, wait_for
from .owned_stub import OwnedStub
from .test_run import run, running

# A command under `fencepost run` with several names: prints "TOKEN_0 LEASE_ID SECRET" (the first line that
# test_run's Running.grant reads), then every name and token it was given, then holds until SIGTERM when told to.
TOKENS = r"""
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
e = os.environ
print(e["FENCEPOST_TOKEN_0"], e["FENCEPOST_LEASE_ID"], e["FENCEPOST_LEASE_SECRET"], flush=True)
count = int(e["FENCEPOST_LOCK_COUNT"])
print(" ".join(f"{e[f'FENCEPOST_LOCK_{i}']}={e[f'FENCEPOST_TOKEN_{i}']}" for i in range(count)),
      e.get("FENCEPOST_LOCK", "-"), e.get("FENCEPOST_TOKEN", "-"), flush=True)
if sys.argv[1] == "hold":
    time.sleep(60)
"""


def _tokens(out: str) -> dict[str, int]:
    """The names and tokens the TOKENS command printed on its second line (``out``: its output from there on)."""
    pairs = out.splitlines()[0].split()[:-2]
    return {name: int(token) for name, _, token in (pair.rpartition("=") for pair in pairs)}


def _command(mode: str) -> list[str]:
    return [sys.executable, "-c", TOKENS, mode]


async def test_run_several_names_gives_the_command_each_names_token(address: str) -> None:
    """`run A B`: the command gets FENCEPOST_LOCK_COUNT and each name's lock and token in the order given (no
    FENCEPOST_LOCK or FENCEPOST_TOKEN); both locks are free after it exits."""
    a, b = lock_name(), lock_name()
    result = await run(b, a, "--ttl", "5", "--address", address, "--", *_command("exit"))
    assert result.rc == 0, result
    assert result.out.splitlines()[1].split()[0].startswith(f"{b}=")  # the order given
    assert result.out.splitlines()[1].split()[-2:] == ["-", "-"]
    tokens = _tokens(result.out.partition("\n")[2])
    assert set(tokens) == {a, b} and all(t > 0 for t in tokens.values())
    assert f"holding {b}, {a} with tokens {tokens[b]}, {tokens[a]}" in result.err
    for name in (a, b):
        assert (await status_json(address, name))["held"] is False


async def test_run_overlapping_sets_in_other_orders_do_not_deadlock(address: str, stub: OwnedStub) -> None:
    """While `run A B` holds, `run B A`, `run B C` and `run C A` start together and wait; once it ends, each of them
    runs (none times out), and each name's tokens grow in grant order."""
    a, b, c = lock_name(), lock_name(), lock_name()
    async with running(a, b, "--ttl", "10", "--address", address, "--", *_command("hold")) as first:
        await first.grant()
        assert first.proc.stdout is not None
        first_tokens = _tokens((await first.proc.stdout.readline()).decode())
        others = [asyncio.ensure_future(run(*names, "--ttl", "10", "--timeout", "30", "--address", address, "--",
                                            *_command("exit")))
                  for names in ((b, a), (b, c), (c, a))]
        try:
            await wait_for(lambda: describe_waiters_is(stub, a, 2), 20, what="two runs queued for a")
            await wait_for(lambda: describe_waiters_is(stub, b, 2), 20, what="two runs queued for b")
            assert not any(o.done() for o in others)
            first.proc.send_signal(signal.SIGTERM)
            rc, _, err = await first.finish()
            assert rc == 0, err
            results = await asyncio.wait_for(asyncio.gather(*others), 60)
        finally:
            for o in others:
                o.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await o
    grants = [_tokens(r.out.partition("\n")[2]) for r in results if r.rc == 0]
    assert len(grants) == 3, results
    for name in (a, b, c):
        seen = sorted(g[name] for g in [first_tokens, *grants] if name in g)
        assert len(set(seen)) == len(seen)  # one grant per token
    assert all(g[n] > first_tokens[n] for g in grants for n in g if n in first_tokens)
    for name in (a, b, c):
        assert (await status_json(address, name))["held"] is False


async def test_run_try_several_names_when_one_is_held_exits_5_naming_it_and_takes_none(address: str) -> None:
    """`run --try A B` while B is held exits 5 naming B, without running the command; A is left free."""
    a, b = lock_name(), lock_name()
    async with holding(b, "--ttl", "10", "--address", address) as holder:
        await holder.read_token()
        result = await run(a, b, "--ttl", "5", "--try", "--address", address, "--", "sh", "-c", "echo ran")
        assert result.rc == 5, result
        assert_one_line_error(result, f"held: {b} is held by lease", "command not run")
        assert "ran" not in result.out
        status = await status_json(address, a)
        assert (status["held"], status["waiter_count"]) == (False, 0)


async def test_acquire_several_names_prints_each_token_and_release_of_them_frees_all(address: str) -> None:
    """`acquire A B` prints both tokens on its first line (in the order given) and holds both; `release A B` by
    hand releases both (one ReleaseAll), and the holding `acquire` reports the loss."""
    a, b = lock_name(), lock_name()
    async with holding(a, b, "--ttl", "10", "--address", address) as holder:
        assert holder.proc.stdout is not None
        tokens = [int(t) for t in (await asyncio.wait_for(holder.proc.stdout.readline(), 20)).decode().split()]
        secret = (await asyncio.wait_for(holder.proc.stdout.readline(), 20)).decode().strip().partition("=")[2]
        statuses = [await status_json(address, name) for name in (a, b)]
        assert [s["token"] for s in statuses] == tokens
        lease = statuses[0]["holder"]["lease_id"]  # type: ignore[index]
        assert statuses[1]["holder"]["lease_id"] == lease  # type: ignore[index]
        released = await run_cli("release", b, a, "--lease-id", str(lease), "--token", str(tokens[0]),
                                 "--lease-secret", secret, "--address", address)
        assert released.rc == 0, released.err
        rc, _, err = await holder.finish()
        assert rc == 3 and "lost: " in err, err
    for name in (a, b):
        assert (await status_json(address, name))["held"] is False


@pytest.mark.parametrize(("args", "needles"), [
    (["run", "a", "b", "--lock-delay", "5", "--ttl", "3", "--", "true"], ["--lock-delay", "one NAME"]),
    (["run", "a", "b", "--permits", "2", "--ttl", "3", "--", "true"], ["--permits", "one NAME"]),
    (["run", "a", "b", "a", "--ttl", "3", "--", "true"], ["invalid names", "'a' more than once"]),
    (["acquire", *[f"n{i}" for i in range(33)]], ["invalid names", "2 to 32"]),
    (["release", "a", "a", "--lease-id", "7", "--token", "3"], ["invalid names", "more than once"]),
])
async def test_several_names_when_combined_with_what_they_do_not_take_exits_2(args: list[str],
                                                                                needles: list[str]) -> None:
    """Several names with --lock-delay or --permits, a name twice, or over 32 names: exit 2 before any call."""
    result = await run_cli(*args, "--address", "127.0.0.1:1")
    assert result.rc == 2, result
    assert_one_line_error(result, *needles)
