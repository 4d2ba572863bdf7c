"""What a waiting command says on a terminal: one status line on stderr, rewritten every second.

``fencepost acquire``, ``run`` and ``elect`` wait twice: for a coordinator
to answer (up to ``--timeout`` or the client's 10 s ``connect_timeout``),
then for the lock, the permit or the leadership (as long as it takes). When
stderr is a terminal, a wait that lasts :data:`FIRST_SECONDS` gets one line
saying what the command waits for, rewritten every :data:`EVERY_SECONDS`
and cleared when the wait ends::

    fencepost: connecting to 127.0.0.1:7420: no answer yet, 3 s (gives up after 10 s)
    fencepost: waiting 12 s for inv:42: held by lease 0x694d7f2c10a3e1b4 (token 17, TTL left 9 s); 2nd of 3 waiters

The holder and the queue come from a Describe (a semaphore's DescribeSemaphore,
an election's Leader) made every :data:`LOOK_EVERY_SECONDS` through the same
client; a look that fails leaves them out. Not on a terminal (a pipe, a
file, a service's log) nothing is printed, so that scripts read stderr as
documented (docs/cli.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TextIO

from fencepost.client import AsyncLockClient, FencepostError


__all__ = ["EVERY_SECONDS", "FIRST_SECONDS", "LOOK_EVERY_SECONDS", "Look", "Say", "Waiting", "connecting",
           "election_look", "lock_look", "semaphore_look", "showing"]

#: Seconds of a wait before its line is first printed.
FIRST_SECONDS = 1.0
#: Seconds between two writes of the line.
EVERY_SECONDS = 1.0
#: Seconds between two looks at the lock (Describe) while waiting for it.
LOOK_EVERY_SECONDS = 3.0

#: What to say after ``elapsed`` seconds of a wait (may call the coordinator).
Say = Callable[[float], Awaitable[str]]
#: One look at what a wait waits for: the words after ``waiting N s for NAME``, or "" when unknown.
Look = Callable[[], Awaitable[str]]


def _lease(lease_id: int) -> str:
    return f"lease 0x{lease_id:x}"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


@contextlib.asynccontextmanager
async def showing(say: Say, stream: TextIO | None = None) -> AsyncIterator[None]:
    """While the body runs, show ``say(elapsed)`` on ``stream`` (stderr) when it is a terminal.

    Args:
        say: The line's text (after ``fencepost: ``) after ``elapsed`` seconds.
        stream: Where to write; ``sys.stderr`` by default. Nothing is written unless it is a terminal.
    """
    out = sys.stderr if stream is None else stream
    if not out.isatty():
        yield
        return
    shown = asyncio.Event()
    task = asyncio.create_task(_show(say, out, shown), name="fencepost-progress")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if isinstance(say, Waiting):
            say.close()
        if shown.is_set():
            out.write("\r\x1b[K")  # the line goes: what follows starts on a clean line
            out.flush()


async def _show(say: Say, out: TextIO, shown: asyncio.Event) -> None:
    started = time.monotonic()
    await asyncio.sleep(FIRST_SECONDS)
    while True:
        text = f"fencepost: {await say(time.monotonic() - started)}"
        width = _columns(out)
        out.write("\r\x1b[K" + (text if len(text) < width else text[:max(10, width - 4)] + "..."))
        out.flush()
        shown.set()
        await asyncio.sleep(EVERY_SECONDS)


def _columns(out: TextIO) -> int:
    """The width of the terminal ``out`` writes to (its own size, else $COLUMNS, else 100)."""
    try:
        columns = os.get_terminal_size(out.fileno()).columns
    except (OSError, ValueError):
        columns = 0
    return columns or shutil.get_terminal_size((100, 24)).columns


def connecting(client: AsyncLockClient, limit: float) -> Say:
    """The line while ``client`` connects: the address it tries now, the time so far, when it gives up."""

    async def say(elapsed: float) -> str:
        return f"connecting to {client.address}: no answer yet, {elapsed:.0f} s (gives up after {limit:g} s)"

    return say


class Waiting:
    """The line while waiting for ``what`` (``inv:42``, ``a permit of semaphore jobs``; its name escaped by
    the caller with :func:`.printable.shown_name`): the time so far and the last :data:`LOOK_EVERY_SECONDS` look.

    A look runs in the background (the line keeps its rhythm while a Describe waits on a slow coordinator);
    :meth:`close` (called by :func:`showing` at the end) cancels one still in flight.
    """

    def __init__(self, what: str, look: Look) -> None:
        self.what = what
        self.look = look
        self.words = ""
        self.looking: asyncio.Future[str] | None = None
        self.looked_at = float("-inf")

    async def __call__(self, elapsed: float) -> str:
        if (self.looking is None or self.looking.done()) and time.monotonic() - self.looked_at >= LOOK_EVERY_SECONDS:
            self.looked_at = time.monotonic()
            self.looking = asyncio.ensure_future(_quietly(self.look))
            self.looking.add_done_callback(self._looked)
            await asyncio.wait({self.looking}, timeout=0.2)  # the first look usually makes the first line
        return f"waiting {elapsed:.0f} s for {self.what}" + (f": {self.words}" if self.words else "")

    def _looked(self, looking: asyncio.Future[str]) -> None:
        if not looking.cancelled() and looking.exception() is None:
            self.words = looking.result()

    def close(self) -> None:
        """Cancel the look in flight, if any."""
        if self.looking is not None:
            self.looking.cancel()


async def _quietly(look: Look) -> str:
    """``look()``, or "" when the coordinator does not answer it (refused, unreachable)."""
    try:
        return await look()
    except (FencepostError, OSError):
        return ""


def lock_look(client: AsyncLockClient, name: str) -> Look:
    """A look at lock ``name``: its holder (lease, token, TTL left) and this client's place among its waiters."""

    async def look() -> str:
        info = await client.describe(name)
        if not info.held:
            return "not held at the last look (granted next, or held back by a lock-delay)"
        ttl = f", TTL left {info.ttl_remaining:.0f} s" if info.ttl_remaining is not None else ""
        reading = " for reading" if info.holder_lease_id in info.readers else ""
        words = f"held{reading} by {_lease(info.holder_lease_id)} (token {info.holder_token}{ttl})"
        ours = set(client.lease_ids)
        places = [i for i, (lease, _) in enumerate(info.waiters, 1) if lease in ours]
        if places:
            words += f"; {_ordinal(places[0])} of {info.waiter_count} waiter{'s' if info.waiter_count > 1 else ''}"
        elif info.waiter_count:
            words += f"; {info.waiter_count} waiter{'s' if info.waiter_count > 1 else ''}"
        return words

    return look


def semaphore_look(client: AsyncLockClient, name: str, permits: int) -> Look:
    """A look at semaphore ``name``: how many of its permits are held, and how many wait."""

    async def look() -> str:
        info = await client.semaphore(name, permits).describe()
        return f"{len(info.holders)} of {info.permits or permits} permits held, {info.waiter_count} waiting"

    return look


def election_look(client: AsyncLockClient, name: str) -> Look:
    """A look at election ``name``: its leader (lease, token)."""

    async def look() -> str:
        leader = await client.leader(name)
        if leader is None:
            return "no leader at the last look (this candidate leads next)"
        return f"led by {_lease(leader.lease_id)} (token {leader.token})"

    return look

