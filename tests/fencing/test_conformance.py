"""The fencing contract, run against every adapter on its real server.

Each test runs once per adapter (sqlite, postgres, redis, etcd, dynamodb,
mariadb, s3)
through the ``driver`` fixture of conftest.py.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
from dataclasses import dataclass

import pytest

from fencepost.client import InvalidArgument, StaleTokenError
from fencepost.client.fencing import StoredTokenAheadError

from .conftest import FIGURES, MAX_TOKEN, Driver

WRITERS = 8
WRITES_PER_WRITER = 50


async def test_first_write_inserts(driver: Driver) -> None:
    """A record with no token yet takes the first write, whatever its token."""
    write = await driver.writer()
    assert await driver.read("r") == (None, None)
    await write("r", "v1", 5)
    assert await driver.read("r") == ("v1", 5)


async def test_same_token_writes_twice(driver: Driver) -> None:
    """One holder may write many times with its token: t == stored is accepted."""
    write = await driver.writer()
    await write("r", "v1", 5)
    await write("r", "v2", 5)
    assert await driver.read("r") == ("v2", 5)


async def test_lower_token_rejected_and_record_untouched(driver: Driver) -> None:
    """t < stored raises StaleTokenError (record, token, current_token) and writes nothing."""
    rejected: list[StaleTokenError] = []
    write = await driver.writer(on_reject=rejected.append)
    await write("r", "new", 9)
    with pytest.raises(StaleTokenError) as info:
        await write("r", "old", 7)
    err = info.value
    assert driver.conformance_token(err.token) == 7
    assert driver.conformance_token(err.current_token) == 9
    assert err.record == driver.record("r")
    # The etcd driver's contender keys all exist at once: its guard sees writer 7 holding the lock, so
    # the higher stored token is ahead of the lock service (tests/fencing/test_token_ahead.py).
    assert err.reason == ("TOKEN_AHEAD" if driver.name == "etcd" else "STALE_TOKEN")
    assert await driver.read("r") == ("new", 9)
    assert rejected == [err]


@pytest.mark.parametrize("bad", [0, True, "5"])
async def test_bad_token_refused_before_any_write(driver: Driver, bad: object) -> None:
    """A token that is not a positive int raises InvalidArgument (field "token"); nothing is written."""
    write = await driver.writer()
    with pytest.raises(InvalidArgument) as info:
        await write("r", "v", bad)  # type: ignore[arg-type]
    assert info.value.field == "token"
    assert await driver.read("r") == (None, None)


async def test_higher_token_accepted(driver: Driver) -> None:
    """t > stored is accepted and becomes the stored token."""
    write = await driver.writer()
    await write("r", "a", 3)
    await write("r", "b", 4)
    await write("r", "c", 60)
    assert await driver.read("r") == ("c", 60)


async def test_rejections_counted_through_hook(driver: Driver) -> None:
    """Every refused write reaches on_reject once, and only refused writes do."""
    seen: list[StaleTokenError] = []
    write = await driver.writer(on_reject=seen.append)
    await write("r", "x", 10)
    for t in (2, 9, 10, 1, 11):
        try:
            await write("r", f"t{t}", t)
        except StaleTokenError:
            pass
    assert [driver.conformance_token(e.token) for e in seen] == [2, 9, 1]
    assert {driver.conformance_token(e.current_token) for e in seen} == {10}


@dataclass(frozen=True)
class Held:
    """A hold as a guard sees one in place of the token: a lock handle's ``token`` and ``is_valid()``."""

    token: int
    live: bool

    def is_valid(self) -> bool:
        return self.live


async def test_lower_token_of_a_live_hold_is_reported_ahead(driver: Driver) -> None:
    """A refusal while the writer's hold is live raises StoredTokenAheadError (counted in ahead and rejected);
    once the hold is no longer live, the same refusal is a plain StaleTokenError (the etcd guard checks the
    lock key itself, and its contenders all hold: ahead both times)."""
    seen: list[StaleTokenError] = []
    write = await driver.writer(on_reject=seen.append)
    await write("r", "new", Held(9, True))  # a hold's token is written as a token
    with pytest.raises(StoredTokenAheadError) as info:
        await write("r", "old", Held(7, True))
    err = info.value
    assert isinstance(err, StaleTokenError) and err.reason == "TOKEN_AHEAD"
    assert driver.conformance_token(err.token) == 7 and driver.conformance_token(err.current_token) == 9
    assert err.record == driver.record("r")
    assert "ahead of the lock service" in str(err) and "recover-tokens" in str(err)
    with pytest.raises(StaleTokenError) as late:
        await write("r", "old", Held(7, False))
    assert isinstance(late.value, StoredTokenAheadError) == (driver.name == "etcd")
    with pytest.raises(StaleTokenError) as bare:
        await write("r", "old", 7)
    assert isinstance(bare.value, StoredTokenAheadError) == (driver.name == "etcd")
    assert await driver.read("r") == ("new", 9)
    assert seen == [err, late.value, bare.value]
    assert driver.guard.rejected == 3 and driver.guard.ahead == (3 if driver.name == "etcd" else 1)


@dataclass
class Op:
    writer: int
    token: int
    value: str
    start: int
    end: int
    accepted: bool
    current: int | None


async def test_concurrent_writers_never_go_back(driver: Driver) -> None:
    """8 writers x 50 writes with interleaved tokens: a lower token never overwrites a higher one.

    Checked on real-time order: if an accepted write with token a finished
    before a write with token b < a started, the later write must have been
    refused; every accepted write's token is >= every token accepted before
    it started; the final token is the largest offered, with its value.
    """
    clock = itertools.count()
    clock_lock = threading.Lock()
    hooked: list[StaleTokenError] = []
    hook_lock = threading.Lock()

    def tick() -> int:
        with clock_lock:
            return next(clock)

    def on_reject(err: StaleTokenError) -> None:
        with hook_lock:
            hooked.append(err)

    rng = random.Random(20261130)
    # Tokens climb with the step (as holders hand the lock over), each writer
    # jittered below and above the others: many ties, stragglers and overtakes.
    plans = [[max(1, min(MAX_TOKEN, 2 * i + rng.randint(-6, 2))) for i in range(WRITES_PER_WRITER)]
             for _ in range(WRITERS)]
    writes = [await driver.writer(on_reject=on_reject) for _ in range(WRITERS)]
    ops: list[Op] = []

    async def run(w: int) -> None:
        for i, token in enumerate(plans[w]):
            value = f"w{w}-{i}-t{token}"
            start = tick()
            try:
                await writes[w]("hot", value, token)
                ok, current = True, None
            except StaleTokenError as err:
                ok, current = False, driver.conformance_token(err.current_token)
            ops.append(Op(w, token, value, start, tick(), ok, current))

    began = time.monotonic()
    await asyncio.gather(*(run(w) for w in range(WRITERS)))
    seconds = time.monotonic() - began

    accepted = [op for op in ops if op.accepted]
    refused = [op for op in ops if not op.accepted]
    assert len(ops) == WRITERS * WRITES_PER_WRITER
    for op in ops:
        before = [a.token for a in accepted if a.end < op.start]
        high = max(before, default=0)
        if op.accepted:
            assert op.token >= high, f"{op} accepted after token {high} was accepted"
        else:
            assert op.current is not None and op.current > op.token, op
    top = max(t for plan in plans for t in plan)
    value, token = await driver.read("hot")
    assert token == top
    assert value in {op.value for op in accepted if op.token == top}
    assert len(hooked) == len(refused)
    assert sorted(driver.conformance_token(e.token) for e in hooked) == sorted(op.token for op in refused)
    FIGURES[driver.name] = {"writes": len(ops), "accepted": len(accepted), "rejected": len(refused),
                            "final": token, "seconds": seconds}
