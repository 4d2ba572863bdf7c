"""HoldTracker unit tests: fakes for the lock watch and the etcd reads, an injected clock, a real registry.

The tracker's behaviour against a real etcd is in tests/test_metrics.py (the known workload); these pin
the branches that a real run reaches only by timing: a deletion seen while the Release is in flight, the
bounded hand-off memory, and background reads made without the caller's deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from fencepost.client.v1.keys import Hold
from fencepost.coordinator.etcd import bounded
from fencepost.coordinator.etcd.deadline import left
from fencepost.coordinator.recipes.holds import HANDOFF_MEMORY_SECONDS, HoldTracker
from fencepost.coordinator.telemetry.metrics import LockMetrics


class FakeWatcher:
    """The lock watch: subscriptions by key, deletions fired by the test."""

    def __init__(self) -> None:
        self.subs: dict[bytes, list[Callable[[int | None], None]]] = {}
        self.known: bool | None = False

    def subscribe(self, key: bytes, callback: Callable[[int | None], None]) -> Callable[[], None]:
        self.subs.setdefault(key, []).append(callback)
        return lambda: self.subs[key].remove(callback)

    def deleted_after(self, key: bytes, revision: int) -> bool | None:
        return self.known

    def delete(self, key: bytes, revision: int) -> None:
        for callback in list(self.subs.get(key, [])):
            callback(revision)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Setup:
    def __init__(self, alive: bool = False) -> None:
        self.registry = CollectorRegistry()
        self.watcher = FakeWatcher()
        self.clock = Clock()
        self.alive = alive
        self.asked: list[float | None] = []  # the caller's deadline left, at each lease read
        self.tracker = HoldTracker(self.watcher, self.key, self.exists, self.lease_alive,  # type: ignore[arg-type]
                                   metrics=LockMetrics(self.registry), clock=self.clock)

    @staticmethod
    def key(name: str, lease_id: int) -> bytes:
        return f"{name}/{lease_id}".encode()

    async def exists(self, hold: Hold) -> bool:
        return False

    async def lease_alive(self, lease_id: int) -> bool:
        self.asked.append(left())
        return self.alive

    def value(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)

    def ends(self) -> dict[str, float]:
        return {r: v for r in ("released", "expired", "revoked", "key_deleted")
                if (v := self.value("fencepost_losses_total", reason=r))}

    async def settle(self) -> None:
        while self.tracker._tasks:
            await asyncio.gather(*self.tracker._tasks, return_exceptions=True)


async def test_end_when_deleted_while_release_in_flight() -> None:
    """A deletion seen before the Release returns waits for its outcome: released at the deletion's time."""
    s = Setup()
    hold = Hold("a", 1, 10)
    s.tracker.granted(hold)
    assert s.value("fencepost_holds") == 1
    s.clock.now += 2.0
    followed = s.tracker.releasing("a", 1)
    s.watcher.delete(s.key("a", 1), 11)
    s.clock.now += 5.0  # the Release's answer comes late
    assert s.ends() == {}
    s.tracker.release_done(followed, released=True)
    assert s.ends() == {"released": 1}
    assert s.value("fencepost_hold_seconds_sum", prefix="") == 2.0
    assert s.value("fencepost_holds") == 0 and s.asked == []


async def test_end_when_release_fails_after_deletion() -> None:
    """A deletion during a Release that then fails is classified by the lease: gone, not revoked here: expired."""
    s = Setup(alive=False)
    s.tracker.granted(Hold("a", 1, 10))
    followed = s.tracker.releasing("a", 1)
    s.watcher.delete(s.key("a", 1), 11)
    s.tracker.release_done(followed, released=False)
    await s.settle()
    assert s.ends() == {"expired": 1}


async def test_end_reasons_by_lease() -> None:
    """Lease alive: key_deleted; lease revoked here: revoked (no read); a deletion before the hold's token: no end."""
    s = Setup(alive=True)
    s.tracker.granted(Hold("a", 1, 10))
    s.watcher.delete(s.key("a", 1), 9)  # an earlier key of that lease: not this hold
    s.watcher.delete(s.key("a", 1), 12)
    s.tracker.granted(Hold("b", 2, 20))
    s.tracker.revoking(2)
    s.watcher.delete(s.key("b", 2), 21)
    await s.settle()
    assert s.ends() == {"key_deleted": 1, "revoked": 1}
    assert len(s.asked) == 1


async def test_background_reads_have_no_callers_deadline() -> None:
    """An end found while an Acquire is served (its deadline passed meanwhile) is read without that deadline."""
    s = Setup()
    s.watcher.known = True  # deleted between the grant's Txn and the subscription
    with bounded(0.0):
        s.tracker.granted(Hold("a", 1, 10))
    await s.settle()
    assert s.asked == [None]
    assert s.ends() == {"expired": 1}


async def test_handoff_memory() -> None:
    """A hand-off is observed once per end, within HANDOFF_MEMORY_SECONDS; queued when the call had started."""
    s = Setup()
    s.tracker.granted(Hold("a", 1, 10))
    s.tracker.release_done(s.tracker.releasing("a", 1), released=True)
    asked = s.clock.now
    s.clock.now += 0.25
    s.tracker.granted(Hold("a", 2, 12), asked_at=asked)  # asked at the end: queued
    s.tracker.granted(Hold("b", 3, 13))  # a name never ended here: no hand-off
    s.tracker.release_done(s.tracker.releasing("a", 2), released=True)
    s.clock.now += HANDOFF_MEMORY_SECONDS + 1
    s.tracker.granted(Hold("a", 1, 14))  # too late: forgotten
    s.tracker.release_done(s.tracker.releasing("a", 1), released=True)
    s.clock.now += 3.0
    s.tracker.granted(Hold("a", 1, 16), freed_at=s.clock.now - 0.5)  # the waiter's end is the later: 0.5 s
    s.tracker.release_done(s.tracker.releasing("b", 3), released=True)
    s.clock.now += 2.0
    s.tracker.granted(Hold("b", 3, 17), asked_at=s.clock.now - 1.0)  # asked once b was free: not queued
    assert s.value("fencepost_handoff_seconds_count", queued="true") == 2
    assert s.value("fencepost_handoff_seconds_sum", queued="true") == 0.75
    assert s.value("fencepost_handoff_seconds_count", queued="false") == 1
    assert s.value("fencepost_handoff_seconds_sum", queued="false") == 2.0
