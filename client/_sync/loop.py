"""A sync client's way into the shared event loop thread, and the one blocking helper every sync method uses.

A :class:`LoopThread` runs one :class:`~fencepost.client.AsyncLockClient`
on the event loop thread all sync clients of the process share
(:mod:`.shared`). :meth:`LoopThread.run` runs a coroutine there and waits
for it (connecting first, on the first call); it is usable from any thread.
Each call runs in a copy of the calling thread's context, so that an
OpenTelemetry span current in the caller is the parent of the call's spans.
``close()`` ends this client's calls still running ("client is closed"),
not the other clients'.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from .. import _fork
from .._aio.client import AsyncLockClient
from ..errors import FencepostError
from . import shared as shared_loop

__all__ = ["LoopThread"]

T = TypeVar("T")


class LoopThread:
    """A client on the shared loop thread (attached at the first call), and the way to call into it.

    Args:
        client: The asyncio client to run there (not yet connected).
    """

    def __init__(self, client: AsyncLockClient) -> None:
        self.client = client
        self._generation = _fork.generation()
        self._mutex = threading.Lock()
        self._shared: shared_loop.SharedLoop | None = None
        self._closed = False
        # This client's calls under way: close() cancels those its client's close leaves. Loop thread only.
        self._tasks: set[asyncio.Task[Any]] = set()

    def check_fork(self) -> None:
        """Raise at once in a forked child: the loop thread is the parent's (and gone), its mutex may be held.

        Raises:
            FencepostError: reason "FORKED".
        """
        if self._generation != _fork.generation():
            raise _fork.inherited_error("LockClient")

    def connect(self, timeout: float | None = None) -> None:
        """Attach to the shared loop thread and connect the client there (see :meth:`AsyncLockClient.connect`).

        Raises:
            TlsError, Unavailable, FencepostError: as :meth:`AsyncLockClient.connect` (then the client is closed).
        """
        self.check_fork()
        with self._mutex:
            if self._closed:
                raise FencepostError("client is closed")
            if self._shared is None:
                self._shared = shared_loop.attach()
        try:
            self._submit(self.client.connect(timeout))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close the client on the loop (see :meth:`AsyncLockClient.close`), end its calls left, detach. Idempotent.

        Raises:
            FencepostError: in a forked child (reason "FORKED"): the parent's
                channel, loop thread, leases and holds are left alone.
        """
        self.check_fork()
        with self._mutex:
            if self._closed:
                return
            self._closed = True
            shared = self._shared
            if shared is None:
                return
            here = shared.thread is threading.current_thread()
            # Submitted under the mutex, after every call of this client: each
            # has begun when the close runs, and is ended by it.
            call = shared.put(self._close_on_loop(shared, detach=here))
        shared.wake()
        if here:
            return  # called on the loop itself: the close goes on there, then detaches
        try:
            call.wait()
        finally:
            shared_loop.detach(shared)

    async def _close_on_loop(self, shared: shared_loop.SharedLoop, *, detach: bool) -> None:
        try:
            await self.client.close()
        finally:
            left = list(self._tasks)
            for task in left:
                task.cancel()
            if left:
                await asyncio.gather(*left, return_exceptions=True)
            if detach:
                shared_loop.detach(shared)

    def run(self, coro: Coroutine[Any, Any, T], name: str | None = None) -> T:
        """Run ``coro`` on the loop thread and wait for its result (connecting first, on the first call).

        Args:
            coro: The coroutine; closed unrun when the client cannot run it.
            name: The lock (election, semaphore) name, for a "client is closed" error.

        Raises:
            FencepostError: the client is closed, before or while ``coro``
                runs (``close()`` from another thread cancels it): never a
                bare ``CancelledError``; or this is a forked child (reason "FORKED").
            RuntimeError: called from the loop thread itself.
            Whatever ``coro`` raises.
        """
        if self._generation != _fork.generation():
            coro.close()
            raise _fork.inherited_error("LockClient")
        if self._shared is None and not self._closed:
            try:
                self.connect()
            except BaseException:
                coro.close()  # never run: no "coroutine was never awaited" warning
                raise
        return self._submit(coro, name)

    def start(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start ``coro`` on the loop thread without waiting for it (the client must be connected: see :meth:`run`).

        Cancelling the future cancels ``coro``; :meth:`close` cancels it too.
        """
        with self._mutex:
            shared = self._shared
            if shared is None or self._closed:
                coro.close()
                raise FencepostError("client is closed")
            future = shared.put(coro, self._tasks, future=True).future
        shared.wake()
        assert future is not None
        return future

    def _submit(self, coro: Coroutine[Any, Any, T], name: str | None = None) -> T:
        if self._generation != _fork.generation():
            coro.close()
            raise _fork.inherited_error("LockClient")
        with self._mutex:
            # Submitted under the mutex, so that close() (which sets _closed
            # under it, then submits its own call) always finds the task and
            # ends it: a call never waits on a stopped loop.
            shared = self._shared
            if shared is None or self._closed:
                coro.close()
                raise FencepostError("client is closed", name=name)
            if shared.thread is threading.current_thread():
                coro.close()
                raise RuntimeError("LockClient methods must not be called from its own event loop thread")
            call = shared.put(coro, self._tasks)
        shared.wake()
        try:
            return call.wait()
        except asyncio.CancelledError as err:
            # Only close() cancels a client's calls.
            raise FencepostError("client is closed", name=name) from err
