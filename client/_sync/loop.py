"""The private event loop thread of a sync client, and the one blocking helper every sync method uses.

A :class:`LoopThread` owns a daemon thread running an event loop with one
:class:`~fencepost.client.AsyncLockClient` on it. :meth:`LoopThread.run`
runs a coroutine there with ``asyncio.run_coroutine_threadsafe`` and waits
for it (connecting first, on the first call). It is usable from any thread.
Each call runs in a copy of the calling thread's context
(``run_coroutine_threadsafe`` schedules it from there), so that an
OpenTelemetry span current in the caller is the parent of the call's spans.
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

__all__ = ["LoopThread"]

T = TypeVar("T")


class LoopThread:
    """The loop thread that runs ``client`` (started at the first call), and the way to call into it.

    Args:
        client: The asyncio client to run there (not yet connected).
    """

    def __init__(self, client: AsyncLockClient) -> None:
        self.client = client
        self._generation = _fork.generation()
        self._mutex = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    def check_fork(self) -> None:
        """Raise at once in a forked child: the loop thread is the parent's (and gone), its mutex may be held.

        Raises:
            FencepostError: reason "FORKED".
        """
        if self._generation != _fork.generation():
            raise _fork.inherited_error("LockClient")

    def connect(self, timeout: float | None = None) -> None:
        """Start the loop thread and connect the client there (see :meth:`AsyncLockClient.connect`).

        Raises:
            TlsError, Unavailable, FencepostError: as :meth:`AsyncLockClient.connect` (then the thread is stopped).
        """
        self.check_fork()
        with self._mutex:
            if self._closed:
                raise FencepostError("client is closed")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=_run_loop, args=(loop,), name="fencepost-client", daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
        try:
            self._submit(self.client.connect(timeout))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close the client on the loop (see :meth:`AsyncLockClient.close`) and stop the thread. Idempotent.

        Raises:
            FencepostError: in a forked child (reason "FORKED"): the parent's
                channel, loop thread, leases and holds are left alone.
        """
        self.check_fork()
        with self._mutex:
            if self._closed:
                return
            self._closed = True
            loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            if thread is not threading.current_thread():
                asyncio.run_coroutine_threadsafe(self.client.close(), loop).result()
        finally:
            loop.call_soon_threadsafe(loop.stop)
            if thread is not threading.current_thread():
                thread.join()

    def run(self, coro: Coroutine[Any, Any, T], name: str | None = None) -> T:
        """Run ``coro`` on the loop thread and wait for its result (connecting first, on the first call).

        Args:
            coro: The coroutine; closed unrun when the client cannot run it.
            name: The lock (election, semaphore) name, for a "client is closed" error.

        Raises:
            FencepostError: the client is closed, before or while ``coro``
                runs (``close()`` from another thread cancels it): never a
                bare ``concurrent.futures.CancelledError``; or this is a
                forked child (reason "FORKED").
            RuntimeError: called from the loop thread itself.
            Whatever ``coro`` raises.
        """
        if self._generation != _fork.generation():
            coro.close()
            raise _fork.inherited_error("LockClient")
        if self._loop is None and not self._closed:
            try:
                self.connect()
            except BaseException:
                coro.close()  # never run: no "coroutine was never awaited" warning
                raise
        return self._submit(coro, name)

    def start(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start ``coro`` on the loop thread without waiting for it (the thread must be running: see :meth:`run`)."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _submit(self, coro: Coroutine[Any, Any, T], name: str | None = None) -> T:
        if self._generation != _fork.generation():
            coro.close()
            raise _fork.inherited_error("LockClient")
        with self._mutex:
            # Scheduled under the mutex, so that close() (which sets _closed
            # under it, then stops the loop) always finds the task and
            # cancels it: a call never waits on a stopped loop.
            loop, thread = self._loop, self._thread
            if loop is None or thread is None or self._closed:
                coro.close()
                raise FencepostError("client is closed", name=name)
            if threading.current_thread() is thread:
                coro.close()
                raise RuntimeError("LockClient methods must not be called from its own event loop thread")
            future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return future.result()
        except concurrent.futures.CancelledError as err:
            # Only close() cancels the loop's tasks (the loop thread stops).
            raise FencepostError("client is closed", name=name) from err
        except BaseException:
            future.cancel()
            raise


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    """The loop thread: run ``loop`` until stopped, then cancel what is left and close it."""
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        try:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()
