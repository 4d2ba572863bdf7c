"""The lock board's data: every hold and waiter, kept from one etcd watch of the lock prefix, told as diffs.

:class:`BoardFeed` runs only while a board is open (its first subscriber
starts it, its last one leaving stops it). It reads the lock prefix once
(one Range, keys with their values), then follows it with one etcd watch
(PUT and DELETE events, :meth:`..etcd.EtcdClient.watch_range`): a lock's
contenders are its keys, the holder the one with the lowest create revision
(its fencing token), the waiters the others in that order, exactly as
:mod:`..recipes.listing` reads them for ListLocks. Elections and semaphores
are locks with internal names (:mod:`fencepost.client.v1.kinds`): an
election's leader is its holder (the key's value is the leader's value), a
semaphore's slot ``i`` a lock of its own, its queue the lock of slot -1.

A change marks the lock's name; every ``flush_seconds`` (a quarter of a
second) the marked names' entries, and the timeline items seen since, go to
every subscriber as one ``change`` (a name that is gone as ``null``): a
flood of changes costs a few messages a second, never a re-listing. A board
that reads too slowly (:data:`MAX_QUEUED` messages waiting) is sent one
``snapshot`` in their place.

TTL left: each holder lease's TTL is read with LeaseTimeToLive once, and
again when half of its TTL may have passed (at most every
:data:`MIN_TTL_REFRESH_SECONDS`); the page counts down from the lease's
estimated expiry (``expiresMs``, the coordinator's monotonic clock in
milliseconds: each message's ``nowMs`` says where that clock is now).

Timeline: ``granted`` when a contender becomes the holder; ``ended`` when
the holder's key is deleted, with its ``reason``, ``exact`` and ``by``
(:mod:`.board_ends`: exact for the calls served here, else inferred from
etcd and the lease's estimated expiry; an estimate that has passed while
the lease still holds is read again, so that it stays within about a second).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fencepost.client.v1 import kinds
from fencepost.client.v1.etcd import rpc_pb2
from fencepost.client.v1.keys import Hold, Keys
from fencepost.client.v1.retry import ETCD_BACKOFF

from ..api.releases import ServedEnds
from ..api.stale_writes import StaleWrite, StaleWrites
from ..recipes.snapshots import Holder, holding
from . import board_ends

__all__ = ["BoardFeed", "Subscriber"]

_log = logging.getLogger(__name__)

#: Shortest time between two LeaseTimeToLive reads of one lease, seconds.
MIN_TTL_REFRESH_SECONDS = 5.0
#: Longest wait for the TTLs of the first snapshot, seconds (then they follow as changes).
FIRST_TTLS_SECONDS = 2.0
#: LeaseTimeToLive calls in flight at once.
TTL_CONCURRENCY = 32
#: Messages waiting for a board past which it is sent one snapshot in their place.
MAX_QUEUED = 20
#: Timeline items a newly opened board is given.
TIMELINE_ITEMS = 200
_KINDS = {kinds.HoldKind.HOLD_KIND_LOCK: "lock", kinds.HoldKind.HOLD_KIND_ELECTION: "election",
          kinds.HoldKind.HOLD_KIND_SEMAPHORE: "semaphore", kinds.HoldKind.HOLD_KIND_READ: "lock"}
#: A contender of one lock: (lease, reader?); a lease may have a reader's key and a writer's in one lock.
_Contender = tuple[int, bool]


@dataclass
class _Lease:
    """What the board knows of a lease: its granted TTL and estimated expiry (monotonic clock, ms)."""

    ttl: int
    expires_ms: int
    read_at: float  # monotonic


@dataclass
class Subscriber:
    """One open board: the lock names it shows and the messages waiting for it.

    Attributes:
        shows: whether the board shows an internal lock name (its prefix filter and the access policy).
        queue: ``(event name, JSON-able payload)`` pairs, in order.
    """

    shows: Callable[[str, str], bool]
    queue: asyncio.Queue[tuple[str, Any]] = field(default_factory=asyncio.Queue)


class BoardFeed:
    """The holds of every lock under ``keys``, followed by one etcd watch while a board is open.

    Args:
        etcd: the coordinator's etcd client (``range``, ``watch_range``, ``lease_ttl``).
        keys: the lock keys.
        grant_times: the grants this coordinator made (``granted_at``), for held-for of holds read at start.
        ends: the key deletions and revokes served here, for the exact reasons of ends.
        reports: the stale writes reported here (ReportStaleWrite), told as ``stale_write`` timeline items.
        flush_seconds: how often the marked changes are sent.
    """

    def __init__(self, etcd: Any, keys: Keys, grant_times: Any, ends: ServedEnds | None = None, *,
                 reports: StaleWrites | None = None, flush_seconds: float = 0.25) -> None:
        self._etcd, self._keys, self._grant_times = etcd, keys, grant_times
        self._ends = ends if ends is not None else ServedEnds()
        self._reports = reports if reports is not None else StaleWrites()
        self._unlisten: Callable[[], None] = lambda: None
        self._flush = flush_seconds
        self._locks: dict[str, dict[_Contender, tuple[int, bytes]]] = {}  # internal name -> contender -> (token, value)
        self._since: dict[tuple[str, int, int], int] = {}  # hold -> monotonic ms it was first seen held
        self._leases: dict[int, _Lease] = {}
        self._marked: set[str] = set()
        self._told: list[dict[str, Any]] = []
        self._timeline: deque[dict[str, Any]] = deque(maxlen=TIMELINE_ITEMS)
        self._subscribers: list[Subscriber] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._ready = asyncio.Event()
        self._pending: set[asyncio.Task[None]] = set()

    @property
    def open_boards(self) -> int:
        """Boards subscribed now."""
        return len(self._subscribers)

    async def subscribe(self, shows: Callable[[str, str], bool]) -> Subscriber:
        """A new board: its first message is a ``snapshot`` (every lock it shows, the recent timeline)."""
        subscriber = Subscriber(shows)
        self._subscribers.append(subscriber)
        if not self._tasks:
            self._ready.clear()
            self._tasks = [asyncio.ensure_future(self._follow()), asyncio.ensure_future(self._flushing()),
                           asyncio.ensure_future(self._refreshing())]
            self._unlisten = self._reports.listen(self._reported)
        try:
            await self._ready.wait()
        except BaseException:  # the board went away before the first read
            await self.unsubscribe(subscriber)
            raise
        subscriber.queue.put_nowait(("snapshot", self._snapshot(shows)))
        return subscriber

    def _snapshot(self, shows: Callable[[str, str], bool]) -> dict[str, Any]:
        return {"locks": [e for n in sorted(self._locks) if (e := self._entry(n)) is not None and shows(n, e["name"])],
                "timeline": [t for t in self._timeline if shows(t["key"], t["name"])], "nowMs": _now_ms()}

    async def unsubscribe(self, subscriber: Subscriber) -> None:
        """A board closed: the last one stops the watch and forgets every lock."""
        with contextlib.suppress(ValueError):
            self._subscribers.remove(subscriber)
        if self._subscribers or not self._tasks:
            return
        tasks, self._tasks = self._tasks + list(self._pending), []
        self._unlisten()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._locks, self._since, self._leases, self._marked, self._told = {}, {}, {}, set(), []
        self._timeline.clear()

    async def _follow(self) -> None:
        """Read the prefix, then follow its watch; again after a compaction or a failure."""
        delays = ETCD_BACKOFF.delays()
        while True:
            try:
                read = await self._etcd.range(rpc_pb2.RangeRequest(key=self._keys.prefix,
                                                                   range_end=self._keys.range_end))
                first = not self._ready.is_set()
                self._reset(read.kvs)
                if first:  # the first snapshot shows the TTLs already (within a bound: etcd may be slow)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._refresh_ttls(), FIRST_TTLS_SECONDS)
                    self._marked.clear()
                self._ready.set()
                stream = self._etcd.watch_range(self._keys.prefix, self._keys.range_end, read.header.revision + 1)
                async with contextlib.aclosing(stream):
                    async for events in stream:
                        delays = ETCD_BACKOFF.delays()
                        recovered = {int(e.kv.mod_revision) for e in events  # recover-tokens: one Txn
                                     if e.type == e.PUT and bytes(e.kv.key) == self._keys.token_record}
                        for event in events:
                            self._apply(event, int(event.kv.mod_revision) in recovered)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # etcd out of reach: the board keeps what it showed, then re-reads
                delay = next(delays)
                _log.warning("the lock board's watch failed (%s); again in %.1f s", exc, delay)
                await asyncio.sleep(delay)

    def _parse(self, key: bytes) -> tuple[str, _Contender] | None:
        """(the lock's internal name, (lease, reader?)) of a contender key; None for another key."""
        if self._keys.is_record(key) or key == self._keys.token_record:
            return None
        parsed = self._keys.parse(key)
        return None if parsed is None else (parsed[0], (parsed[1], self._keys.is_reader(key)))

    def _reset(self, kvs: Any) -> None:
        before = set(self._locks)
        self._locks = {}
        now = _now_ms()
        for kv in kvs:
            parsed = self._parse(bytes(kv.key))
            if parsed is not None:
                self._locks.setdefault(parsed[0], {})[parsed[1]] = (int(kv.create_revision), bytes(kv.value))
        holds = {_hold(name, h) for name, c in self._locks.items() for h in _holders(c)}
        self._since = {hold: at for hold, at in self._since.items() if hold in holds}
        for hold in holds:
            granted = self._grant_times.granted_at(Hold(*hold))
            self._since.setdefault(hold, now if granted is None else int(now - 1000 * (time.monotonic() - granted)))
        self._marked |= before | set(self._locks)  # a re-read: every board is told what changed

    def _apply(self, event: Any, recovered: bool = False) -> None:
        parsed = self._parse(bytes(event.kv.key))
        if parsed is None:
            return
        name, contender = parsed
        contenders = self._locks.setdefault(name, {})
        before = _holders(contenders)
        if event.type == event.DELETE:
            contenders.pop(contender, None)
        else:
            contenders[contender] = (int(event.kv.create_revision), bytes(event.kv.value))
        after = _holders(contenders)
        if not contenders:
            del self._locks[name]
        self._marked.add(name)
        for gone in before:
            if gone[0] == contender and event.type == event.DELETE:
                hold = _hold(name, gone)
                why = board_ends.served(self._ends, hold[0], hold[1], self._since.pop(hold, None),
                                        recovered=recovered)
                item = self._tell("ended", hold, why)
                if why is None:
                    known = self._leases.get(hold[1])
                    task = asyncio.ensure_future(self._classify(item, hold[1], known.expires_ms if known else None))
                    self._pending.add(task)
                    task.add_done_callback(self._pending.discard)
        for new in after:
            if new not in before:
                self._since[_hold(name, new)] = _now_ms()
                self._tell("granted", _hold(name, new), None)

    async def _classify(self, item: dict[str, Any], lease: int, expires_ms: int | None) -> None:
        """Fill in why a hold ended that no call served here explains (:func:`.board_ends.inferred`)."""
        try:
            left, _ = await self._etcd.lease_ttl(lease)
        except Exception:  # etcd out of reach: the reason stays unknown
            item["reason"] = "unknown"
            return
        item.update(_why(board_ends.inferred(left >= 0, expires_ms, item["atMs"])))

    def _tell(self, what: str, hold: tuple[str, int, int], why: board_ends.Why | None) -> dict[str, Any]:
        """A timeline item about ``hold`` (internal name, lease, token): a reader's is its lock's, ``read``."""
        public = kinds.public_hold(hold[0])
        read = public.kind == kinds.HoldKind.HOLD_KIND_READ
        key = public.name if read else hold[0]  # the row's key: a reader's lock
        item = {"atMs": _now_ms(), "what": what, "reason": None, "exact": None, "by": None, "key": key,
                "kind": _KINDS[public.kind], "name": public.name, "slot": public.slot, "lease": str(hold[1]),
                "token": str(hold[2]), "read": read, **(_why(why) if why is not None else {})}
        self._timeline.append(item)
        self._told.append(item)
        return item

    def _reported(self, write: StaleWrite) -> None:
        """A stale write reported here: a ``stale_write`` timeline item (``lease`` "", its tokens, storage, record)."""
        item = {"atMs": _now_ms(), "what": "stale_write", "reason": None, "exact": None, "by": None,
                "key": write.name, "kind": "lock", "name": write.name, "slot": 0, "lease": "", "token": str(write.token),
                "currentToken": str(write.current_token), "storage": write.storage, "record": write.record}
        self._timeline.append(item)
        self._told.append(item)

    async def _flushing(self) -> None:
        """Every ``flush_seconds``: send the marked entries and the new timeline."""
        while True:
            await asyncio.sleep(self._flush)
            if self._pending:  # the reasons of the holds that just ended, read before they are told
                await asyncio.wait(set(self._pending), timeout=1.0)
            if not self._marked and not self._told:
                continue
            marked, self._marked = self._marked, set()
            told, self._told = self._told, []
            entries = {n: self._entry(n) for n in marked}
            for subscriber in self._subscribers:
                locks = {n: e for n, e in entries.items() if subscriber.shows(n, kinds.public_hold(n).name)}
                timeline = [t for t in told if subscriber.shows(t["key"], t["name"])]
                if subscriber.queue.qsize() >= MAX_QUEUED:  # a board that reads slowly: one snapshot instead
                    while not subscriber.queue.empty():
                        subscriber.queue.get_nowait()
                    subscriber.queue.put_nowait(("snapshot", self._snapshot(subscriber.shows)))
                elif locks or timeline:
                    subscriber.queue.put_nowait(("change", {"locks": locks, "timeline": timeline,
                                                            "nowMs": _now_ms()}))

    async def _refreshing(self) -> None:
        """Every second, the TTLs due (:meth:`_refresh_ttls`)."""
        while True:
            await self._refresh_ttls()
            await asyncio.sleep(1.0)

    async def _refresh_ttls(self) -> None:
        """Read the TTL of each holder lease not known yet, or whose estimate may be stale; mark what changed."""
        now, now_ms = time.monotonic(), _now_ms()
        due: set[int] = set()
        for lease in {h[0][0] for c in self._locks.values() for h in _holders(c)}:
            known = self._leases.get(lease)
            if known is None or now - known.read_at >= max(MIN_TTL_REFRESH_SECONDS, known.ttl / 2) or (
                    now_ms >= known.expires_ms and now - known.read_at >= 1.0):  # passed, yet still held: renewed
                due.add(lease)
        if not due:
            return
        gate = asyncio.Semaphore(TTL_CONCURRENCY)

        async def read(lease: int) -> tuple[int, tuple[int, int] | None]:
            async with gate:
                try:
                    return lease, await self._etcd.lease_ttl(lease)
                except Exception:  # etcd out of reach: tried again at the next refresh
                    return lease, None

        changed = set()
        for lease, ttl in await asyncio.gather(*(read(lease) for lease in due)):
            if ttl is None:
                continue
            left, granted = ttl
            before = self._leases.get(lease)
            expires = _now_ms() + 1000 * max(left, 0)
            self._leases[lease] = _Lease(granted, expires, time.monotonic())
            if before is None or abs(before.expires_ms - expires) > 1500:
                changed.add(lease)
        if changed:
            self._marked |= {n for n, c in self._locks.items() if any(h[0][0] in changed for h in _holders(c))}
        live = {h[0][0] for c in self._locks.values() for h in _holders(c)}
        for lease in [lease for lease in self._leases if lease not in live]:
            del self._leases[lease]

    def _entry(self, name: str) -> dict[str, Any] | None:
        """The board's row of internal lock ``name``; None when it has no contender.

        ``holder`` is the first holder; ``readers`` the other readers holding with it (a read-write lock held
        by readers: ``holder.read``); ``waiters`` the others, in queue order, each with ``read``.
        """
        contenders = self._locks.get(name)
        if not contenders:
            return None
        public = kinds.public_hold(name)
        holders = _holders(contenders)
        ordered = sorted(contenders.items(), key=lambda c: c[1][0])
        return {"key": name, "kind": _KINDS[public.kind], "name": public.name, "slot": public.slot,
                "holder": self._shown(name, holders[0], contenders, public.kind),
                "readers": [self._shown(name, h, contenders, public.kind) for h in holders[1:]],
                "waiters": [{"lease": str(lease), "token": str(t), "read": read}
                            for (lease, read), (t, _) in ordered[len(holders):]]}

    def _shown(self, name: str, held: tuple[_Contender, int], contenders: dict[_Contender, tuple[int, bytes]],
               kind: int) -> dict[str, Any]:
        """One holder of lock ``name`` as the board shows it."""
        (lease, read), token = held
        known = self._leases.get(lease)
        value = contenders[(lease, read)][1]
        return {"lease": str(lease), "token": str(token), "read": read,
                "sinceMs": self._since.get(_hold(name, held)), "ttl": known.ttl if known else None,
                "expiresMs": known.expires_ms if known else None,
                "value": value.decode("utf-8", "replace") if kind != kinds.HoldKind.HOLD_KIND_LOCK else ""}


def _holders(contenders: dict[_Contender, tuple[int, bytes]]) -> list[tuple[_Contender, int]]:
    """The contenders holding, (contender, token) in queue order: the first alone, or, when it reads, every
    reader before the first writer (:func:`..recipes.snapshots.holding`); [] for none."""
    ordered = sorted(((token, contender) for contender, (token, _) in contenders.items()), key=lambda c: c[0])
    count = holding([Holder(lease, token, read) for token, (lease, read) in ordered])
    return [(contender, token) for token, contender in ordered[:count]]


def _hold(name: str, held: tuple[_Contender, int]) -> tuple[str, int, int]:
    """(internal name, lease, token) of a holder of lock ``name``: a reader's internal name is its own."""
    (lease, read), token = held
    return kinds.read_lock(name) if read else name, lease, token


def _why(why: board_ends.Why) -> dict[str, Any]:
    """A timeline item's fields of ``why``."""
    return {"reason": why.reason, "exact": why.exact, "by": why.by}


def _now_ms() -> int:
    """The coordinator's monotonic clock in milliseconds (the page places it with each message's ``nowMs``)."""
    return int(time.monotonic() * 1000)
