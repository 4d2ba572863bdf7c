"""Following an election's leader from the sync client: an iterator, or a thread calling back.

:class:`LeaderChanges` is the sync side of :meth:`AsyncLockClient.observe`:
the iteration runs on the client's loop thread and its items come to the
reader through a queue. :class:`LeaderObserver` reads one in a thread of its
own and calls back with each item (:meth:`LockClient.on_leader`).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from .._aio.client import AsyncLockClient
from .._recipes.election import LeaderInfo
from ..errors import FencepostError
from .loop import LoopThread

if TYPE_CHECKING:
    from .client import LockClient

__all__ = ["LeaderChanges", "LeaderObserver"]

log = logging.getLogger("fencepost.client")


class LeaderChanges(Iterator["LeaderInfo | None"]):
    """Every change of the leader of ``election`` (see :meth:`LockClient.observe`); ``close()`` to stop.

    Args:
        loop: The client's loop thread (started here if it is not yet).
        client: The asyncio client on it.
        election: The election's name (checked).
    """

    _END = object()

    def __init__(self, loop: LoopThread, client: AsyncLockClient, election: str) -> None:
        self._queue: queue.Queue[Any] = queue.Queue()
        self._closed = False

        async def pump() -> None:
            try:
                async for info in client.observe(election):
                    self._queue.put(info)
            except BaseException as exc:  # noqa: BLE001 - handed to the reader
                self._queue.put(exc if isinstance(exc, Exception) else self._END)
                if not isinstance(exc, Exception):
                    raise

        loop.run(_noop())  # connect (and start the loop thread) on the caller's thread
        self._future = loop.start(pump())
        self._future.add_done_callback(lambda _f: self._queue.put(self._END))

    def __next__(self) -> LeaderInfo | None:
        if self._closed:
            raise StopIteration
        item = self._queue.get()
        if item is self._END:
            self._closed = True
            raise StopIteration
        if isinstance(item, BaseException):
            self._closed = True
            raise item
        return item  # type: ignore[no-any-return]

    def close(self) -> None:
        """Stop the observation (the Observe stream is cancelled); the iterator then ends."""
        self._future.cancel()
        self._queue.put(self._END)


class LeaderObserver:
    """A thread calling ``callback`` with each change of an election's leader (:meth:`LockClient.on_leader`).

    Args:
        client: the client whose :meth:`~LockClient.observe` is followed (it stays open when this stops).
        election: the election's name.
        callback: called in this object's thread with each change: a :class:`LeaderInfo`, or None when the
            election has no leader.

    Attributes:
        error: What ended the observation early (Unavailable, AccessDenied, ...), None while it runs or once stopped.
    """

    def __init__(self, client: LockClient, election: str, callback: Callable[[LeaderInfo | None], object]) -> None:
        self.error: BaseException | None = None
        self._changes = client.observe(election)
        self._callback = callback
        self._thread = threading.Thread(target=self._run, name=f"fencepost-observe-{election}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for info in self._changes:
                self._callback(info)
        except FencepostError as exc:
            self.error = exc
        except BaseException as exc:  # noqa: BLE001 - a callback's bug ends the thread, said once
            self.error = exc
            log.exception("fencepost: on_leader callback failed; observation stopped")

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop observing; returns once the thread has ended (or ``timeout`` seconds passed)."""
        self._changes.close()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)


async def _noop() -> None:
    return None
