"""The shared etcd LeaseKeepAlive streams' watchdog (coordinator/etcd/keepalive.py), pure logic.

A fake "member" stands for etcd: it answers each LeaseKeepAliveRequest, or
stays silent (a SIGSTOPped member keeps its connection open). The real-etcd
behaviour (a stopped member, a failover) is covered by the fault suite; here:
a silent stream is replaced and the keepalive answered on the next one; an
answering stream is never replaced, even while the event loop runs late.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fencepost.client.errors import Unavailable
from fencepost.client.v1.etcd import rpc_pb2
from fencepost.coordinator.etcd.failures import RULES, Failure, Op
from fencepost.coordinator.etcd.keepalive import STREAMS, KeepAlives


class FakeCall:
    """A LeaseKeepAlive call on a fake member: answers each request with TTL 30, unless ``silent``."""

    def __init__(self, requests: AsyncIterator[Any], silent: bool) -> None:
        self._answers: asyncio.Queue[Any] = asyncio.Queue()
        self._silent = silent
        self._pump = asyncio.ensure_future(self._serve(requests))

    async def _serve(self, requests: AsyncIterator[Any]) -> None:
        async for request in requests:
            if not self._silent:
                await self._answers.put(rpc_pb2.LeaseKeepAliveResponse(ID=request.ID, TTL=30))

    def __aiter__(self) -> FakeCall:
        return self

    async def __anext__(self) -> Any:
        return await self._answers.get()

    def cancel(self) -> None:
        self._pump.cancel()


class Members:
    """Opens streams on fake members by index; ``silent`` names those that never answer."""

    def __init__(self, silent: set[int]) -> None:
        self.silent = silent
        self.current = 0
        self.opened: list[int] = []
        self.broken: list[tuple[int, Failure]] = []

    async def open(self, requests: AsyncIterator[Any]) -> tuple[int, Any]:
        index = self.current
        self.opened.append(index)
        return index, FakeCall(requests, index in self.silent)

    def on_broken(self, index: int, failure: Failure) -> None:
        self.broken.append((index, failure))
        self.current = index + 1


async def test_a_silent_member_is_left_and_the_keepalive_answered_on_the_next() -> None:
    members = Members(silent={0})
    keepalives = KeepAlives(members.open, members.on_broken)
    started = time.monotonic()
    try:
        assert await keepalives.keepalive(7) == 30
    finally:
        await keepalives.close()
    took = time.monotonic() - started
    assert members.opened == [0, 1] and members.broken[0] == (0, Failure.TIMEOUT)
    timeout = RULES[Op.KEEPALIVE].timeout
    assert timeout <= took < timeout * 1.25 + 0.5  # within the watchdog's interval of the timeout


async def test_every_member_silent_fails_after_the_attempts() -> None:
    members = Members(silent={0, 1, 2, 3})
    keepalives = KeepAlives(members.open, members.on_broken)
    try:
        with pytest.raises(Unavailable):
            await keepalives.keepalive(7)
    finally:
        await keepalives.close()
    assert members.opened == list(range(RULES[Op.KEEPALIVE].attempts))


async def test_an_answering_stream_survives_a_late_event_loop() -> None:
    """The loop blocked for longer than the timeout while keepalives were waiting: their answers came, they
    were only not read yet. The stream must not be replaced (that would fail every keepalive in flight)."""
    members = Members(silent=set())
    keepalives = KeepAlives(members.open, members.on_broken)
    try:
        assert await keepalives.keepalive(1) == 30
        for _ in range(3):
            waiting = [asyncio.ensure_future(keepalives.keepalive(lease)) for lease in range(2, 50)]
            await asyncio.sleep(0)  # sent
            time.sleep(RULES[Op.KEEPALIVE].timeout * 1.5)  # the loop blocked: a GC pause, a CPU-bound burst
            assert await asyncio.gather(*waiting) == [30] * len(waiting)
        # One stream per shard, each opened once (close() ends them: checked before it).
        assert members.opened == [0] * STREAMS and members.broken == []
    finally:
        await keepalives.close()
