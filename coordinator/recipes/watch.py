"""One etcd watch over every lock key, dispatching deletions by key.

Waiters wait for the deletion of the key just before theirs, and holders'
streams wait for the deletion of the holder key. Instead of one etcd watch
per waiter, the coordinator keeps a single watch on the whole lock prefix
(DELETE events only) and dispatches each deletion to the callbacks
subscribed to that key.

A subscriber learns that a key exists from a read at some revision R, then
subscribes. The deletion may have been dispatched between the two (the watch
stream and the read are different streams), so the watcher also remembers the
latest deletion revision of recently deleted keys: ``deleted_after(key, R)``
answers whether the key was deleted after R, or that it cannot tell (the
window no longer reaches back to R, or the watch had to restart after a
compaction), in which case the caller re-reads etcd.

Memory: the window holds at most ``window`` deletions, each for at most
:data:`WINDOW_SECONDS` (the gap between a read and its subscription is a
few milliseconds; a caller whose gap was longer re-reads etcd): after a
flood of deletions ends, the window empties and its tables are given back.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any, Protocol

from fencepost.client.v1 import etcdops
from fencepost.client.v1.keys import Keys
from fencepost.client.v1.retry import ETCD_BACKOFF

from ..etcd import EtcdRefused
from ..telemetry.metrics import NO_METRICS, LockMetrics

_log = logging.getLogger(__name__)

#: While the watch keeps failing for the same reason (etcd out of reach), it
#: says so again at most this often, in seconds. A refusal (credentials,
#: permissions) is logged once per change of its message.
REPEAT_INTERVAL = 30.0

#: Seconds a deletion is remembered for ``deleted_after`` (then the caller re-reads etcd).
WINDOW_SECONDS = 30.0

#: A deletion callback: called with the deletion revision, or None when
#: deletions may have been missed (the watch restarted after compaction) and
#: the subscriber must re-read etcd.
DeleteCallback = Callable[[int | None], None]


class DeleteSource(Protocol):
    """What the watcher needs of etcd: the etcd layer (:class:`..etcd.EtcdClient`), or a fake in tests."""

    async def range(self, request: Any) -> Any:
        """A Range; the watcher counts its prefix to learn the current revision."""
        ...

    def watch_deletes(self, key: bytes, range_end: bytes, start_revision: int
                      ) -> AsyncGenerator[list[tuple[bytes, int]], None]:
        """Deletions in the range from ``start_revision``, in batches; ends on compaction.

        A batch may be empty (the etcd layer yields one when etcd has created the watch).
        """
        ...


class DeleteWatcher:
    """A single etcd watch on the lock prefix, dispatching DELETE events by key.

    Args:
        etcd: the etcd layer (its ``range`` and ``watch_deletes``).
        keys: the key layout (its prefix is watched).
        window: how many recent deletions to remember for ``deleted_after``.
        metrics: counts the watch's restarts (``fencepost_watch_restarts_total``).
    """

    def __init__(self, etcd: DeleteSource, keys: Keys, *, window: int = 100_000,
                 metrics: LockMetrics = NO_METRICS) -> None:
        self._etcd = etcd
        self._metrics = metrics
        self._keys = keys
        self._window = window
        self._subs: dict[bytes, set[DeleteCallback]] = collections.defaultdict(set)
        self._latest: dict[bytes, int] = {}
        self._order: collections.deque[tuple[int, bytes, float]] = collections.deque()  # (revision, key, seen at)
        self._sweep: asyncio.TimerHandle | None = None  # forgets the deletions older than WINDOW_SECONDS
        self._known_after: int | None = None  # every deletion with revision > this is known
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()  # set while the watch runs and deletions are known
        self._outage = _Outage()

    def start(self) -> None:
        """Start watching in a background task (it retries while etcd is unreachable)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="fencepost-delete-watch")

    @property
    def sizes(self) -> dict[str, int]:
        """What the watcher holds now: ``deletions`` remembered, keys with ``subscriptions``."""
        return {"deletions": len(self._order), "subscriptions": len(self._subs)}

    async def close(self) -> None:
        """Stop watching."""
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def wait_ready(self) -> None:
        """Return once the watch runs and every deletion after its start revision is known."""
        await self._ready.wait()

    def subscribe(self, key: bytes, callback: DeleteCallback) -> Callable[[], None]:
        """Call ``callback`` on every deletion of ``key`` until unsubscribed.

        Returns:
            A function that unsubscribes.
        """
        self._subs[key].add(callback)

        def unsubscribe() -> None:
            subs = self._subs.get(key)
            if subs is not None:
                subs.discard(callback)
                if not subs:
                    del self._subs[key]
                    if not self._subs:  # a dict keeps its largest table: give it back once empty
                        self._subs = collections.defaultdict(set)

        return unsubscribe

    def deleted_after(self, key: bytes, revision: int) -> bool | None:
        """Whether ``key`` was deleted at a revision greater than ``revision``.

        Returns:
            True or False when the watcher knows; None when its memory does not
            reach back to ``revision`` (re-read etcd instead).
        """
        if self._known_after is None or revision < self._known_after:
            return None
        latest = self._latest.get(key)
        return latest is not None and latest > revision

    async def wait_deleted(self, key: bytes, revision: int) -> bool:
        """Return once ``key``, seen at ``revision``, may have been deleted.

        Returns early (a spurious wake-up) when the watcher cannot tell; the
        caller re-reads etcd either way.

        Returns:
            True when it returned on the deletion event itself (so at about
            the time the watch delivered it); False otherwise (the deletion
            was already known, or the watch could not tell).
        """
        loop = asyncio.get_running_loop()
        fired: asyncio.Future[None] = loop.create_future()

        fired_by_event = False

        def on_delete(rev: int | None) -> None:
            nonlocal fired_by_event
            if (rev is None or rev > revision) and not fired.done():
                fired_by_event = rev is not None
                fired.set_result(None)

        unsubscribe = self.subscribe(key, on_delete)
        try:
            known = self.deleted_after(key, revision)
            if known is None and not self._ready.is_set():
                # The watch is down: wait for it (or a deletion) rather than
                # re-reading etcd in a loop; the caller re-reads after.
                ready = asyncio.ensure_future(self._ready.wait())
                try:
                    await asyncio.wait([ready, fired], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    ready.cancel()
                return False
            if known is not False:
                return False
            await fired
            return fired_by_event
        finally:
            unsubscribe()

    async def _current_revision(self) -> int:
        resp = await self._etcd.range(etcdops.count(self._keys.prefix))
        return int(resp.header.revision)

    async def _run(self) -> None:
        delays = ETCD_BACKOFF.delays()
        while True:
            try:
                start = await self._current_revision()
                self._reset(start)
                stream = self._etcd.watch_deletes(self._keys.prefix, self._keys.range_end, start + 1)
                async with contextlib.aclosing(stream):
                    async for deletions in stream:
                        self._outage.ended()
                        if deletions:
                            delays = ETCD_BACKOFF.delays()
                        for key, revision in deletions:
                            if not self._keys.is_record(key):  # a lease's ownership record, a request record
                                self._on_delete(key, revision)
                self._mark_unknown()  # the watch ended (compaction): deletions may be missed until it restarts
                self._metrics.watch_restarted()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # etcd down: retry; subscribers re-read
                delay = next(delays)
                self._metrics.watch_restarted()
                self._outage.failed(exc, delay)
                self._mark_unknown()
                await asyncio.sleep(delay)

    def _reset(self, start: int) -> None:
        self._latest = {}
        self._order.clear()
        self._known_after = start
        self._ready.set()

    def _mark_unknown(self) -> None:
        self._known_after = None
        self._ready.clear()
        self._notify_all_unknown()

    def _on_delete(self, key: bytes, revision: int) -> None:
        self._latest[key] = revision
        self._order.append((revision, key, time.monotonic()))
        self._forget(len(self._order) - self._window, -math.inf)
        if self._sweep is None:
            self._sweep = asyncio.get_running_loop().call_later(WINDOW_SECONDS, self._forget_old)
        for callback in list(self._subs.get(key, ())):
            _call(callback, revision)

    def _forget_old(self) -> None:
        """Forget the deletions older than WINDOW_SECONDS; run again while some are left."""
        self._forget(0, time.monotonic() - WINDOW_SECONDS)
        self._sweep = None
        if self._order:  # again when the oldest left is due
            due = self._order[0][2] + WINDOW_SECONDS - time.monotonic()
            self._sweep = asyncio.get_running_loop().call_later(max(0.1, due), self._forget_old)

    def _forget(self, count: int, before: float) -> None:
        """Forget the ``count`` oldest deletions, and then those seen before ``before``."""
        order = self._order
        while order and (count > 0 or order[0][2] < before):
            count -= 1
            old_rev, old_key, _ = order.popleft()
            if self._latest.get(old_key) == old_rev:
                del self._latest[old_key]
            if self._known_after is not None:  # None: the watch restarts, nothing is known yet
                self._known_after = max(self._known_after, old_rev)
        if not order:
            self._latest = {}  # a dict keeps its largest table: give it back once empty

    def _notify_all_unknown(self) -> None:
        for subs in list(self._subs.values()):
            for callback in list(subs):
                _call(callback, None)


class _Outage:
    """What the watch says while it keeps failing: not one WARNING per restart (every 0.05 to 2 s).

    The first failure and each change of its kind are logged at WARNING; while
    etcd stays out of reach, a reminder at most every ``REPEAT_INTERVAL``; a
    refusal (:class:`~..etcd.failures.EtcdRefused`) is not repeated while its message
    stays the same. The other restarts are logged at DEBUG. When the watch
    runs again, one INFO line.
    """

    def __init__(self) -> None:
        self._since: float | None = None  # monotonic time of the first failure of this outage
        self._kind: str | None = None  # "failing" (etcd out of reach, mostly), or the refusal's message
        self._said_at = 0.0
        self._restarts = 0

    def failed(self, exc: Exception, delay: float) -> None:
        now = time.monotonic()
        message = getattr(exc, "message", None) or str(exc)
        refused = isinstance(exc, EtcdRefused)
        kind = message if refused else "failing"
        if self._since is None:
            self._since = now
        self._restarts += 1
        if kind != self._kind:
            self._kind, self._said_at = kind, now
            _log.warning("lock watch failed (%s); restarting it until it runs%s", message,
                         "" if refused else f", saying so again at most every {REPEAT_INTERVAL:.0f} s")
        elif not refused and now - self._said_at >= REPEAT_INTERVAL:
            self._said_at = now
            _log.warning("lock watch still failing after %.0f s (%d restarts): %s", now - self._since,
                         self._restarts, message)
        else:
            _log.debug("lock watch failed (%s); restarting in %.2f s", message, delay)

    def ended(self) -> None:
        if self._since is not None:
            _log.info("lock watch running again after %.1f s (%d restarts)", time.monotonic() - self._since,
                      self._restarts)
            self._since, self._kind, self._restarts = None, None, 0


def _call(callback: DeleteCallback, revision: int | None) -> None:
    try:
        callback(revision)
    except Exception:  # a subscriber's bug must not stop the watch
        _log.exception("delete callback failed")
