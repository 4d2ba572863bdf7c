"""The one event loop thread of every sync client of a process, and a coroutine handed to it from a thread.

Every :class:`~fencepost.client.LockClient` runs its
:class:`~fencepost.client.AsyncLockClient` on one shared loop thread
(``fencepost-client``): :func:`attach` starts it for the first client that
connects, :func:`detach` stops it when the last one has closed. One loop,
not one per client: grpc.aio's poller wakes every event loop bound to it
for each completion of any call (it writes one byte to one socket all those
loops watch, and the loop that reads it forwards the event to the call's own
loop with ``call_soon_threadsafe``): 64 clients on 64 loops ran about 32
loop iterations per acquire-and-release cycle and spent 2.5 to 2.8 ms of the
process's CPU on it, 64 on one loop about 5 and 0.58 to 0.95 ms
(docs/benchmarks.md, "The sync client with 64 threads").

A thread hands a coroutine over as a :class:`Call`: appended to the loop's
queue, where only the first call of a batch wakes the loop (one
``call_soon_threadsafe``); the loop drains the queue, starts each call as a
task in a copy of its caller's context (so that an OpenTelemetry span
current in the caller is the parent of the call's spans), and when the task
ends releases the call's lock, on which the caller waits. An exception
(KeyboardInterrupt) while the caller waits cancels the task and is raised
in the caller at once.
"""

from __future__ import annotations

import _thread
import asyncio
import collections
import concurrent.futures
import contextlib
import contextvars
import os
import threading
from collections.abc import Coroutine
from typing import Any, Generic, TypeVar

__all__ = ["Call", "SharedLoop", "attach", "detach"]

T = TypeVar("T")


class Call(Generic[T]):
    """One coroutine run on the shared loop for a thread that waits for it (:meth:`wait`), or a future (:attr:`future`).

    Made by :meth:`SharedLoop.submit` on the calling thread; :meth:`begin`
    and the task's end run on the loop thread.
    """

    __slots__ = ("future", "_cancelled", "_context", "_coro", "_done", "_error", "_loop", "_result", "_stop",
                 "_task", "_tasks")

    def __init__(self, coro: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop,
                 tasks: set[asyncio.Task[Any]] | None, future: bool) -> None:
        self._coro: Coroutine[Any, Any, T] | None = coro
        self._context = contextvars.copy_context()
        self._loop = loop
        self._tasks = tasks
        self._task: asyncio.Task[T] | None = None
        self._stop = False  # cancelled before it began
        self._cancelled = False
        self._result: T | None = None
        self._error: BaseException | None = None
        self._done = _thread.allocate_lock()
        self._done.acquire()  # released once, by the loop, when the call has ended
        #: For :meth:`SharedLoop.submit` with ``future=True``: the call's outcome; cancelling it cancels the call.
        self.future: concurrent.futures.Future[T] | None = None
        if future:
            self.future = concurrent.futures.Future()
            self.future.add_done_callback(self._future_done)

    def wait(self) -> T:
        """Block the calling thread until the call has ended; return its result or raise its exception.

        Raises:
            asyncio.CancelledError: the task was cancelled (by its client's close()).
            Whatever the coroutine raised; whatever interrupted the wait
            (KeyboardInterrupt), after asking the loop to cancel the task.
        """
        try:
            self._done.acquire()
        except BaseException:
            self.cancel()
            raise
        if self._cancelled:
            raise asyncio.CancelledError
        error, self._error = self._error, None
        if error is not None:
            raise error
        return self._result  # type: ignore[return-value]

    def cancel(self) -> None:
        """Cancel the call from any thread (nothing happens once it has ended)."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: every task on it has ended
            self._loop.call_soon_threadsafe(self._cancel_on_loop)

    def begin(self) -> None:
        """On the loop: start the coroutine as a task in the caller's context."""
        coro, self._coro = self._coro, None
        assert coro is not None
        if self._stop:
            coro.close()
            self._cancelled = True
            self._end()
            return
        task = self._loop.create_task(coro, context=self._context)
        self._task = task
        if self._tasks is not None:
            self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _cancel_on_loop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        elif self._coro is not None:
            self._stop = True

    def _task_done(self, task: asyncio.Task[T]) -> None:
        self._task = None
        if self._tasks is not None:
            self._tasks.discard(task)
        if task.cancelled():
            self._cancelled = True
        elif (error := task.exception()) is not None:
            self._error = error
        else:
            self._result = task.result()
        self._end()

    def _end(self) -> None:
        future = self.future
        if future is not None:
            with contextlib.suppress(concurrent.futures.InvalidStateError):  # cancelled by its holder meanwhile
                if self._cancelled:
                    future.cancel()
                elif self._error is not None:
                    future.set_exception(self._error)
                else:
                    future.set_result(self._result)  # type: ignore[arg-type]
        self._done.release()

    def _future_done(self, future: concurrent.futures.Future[T]) -> None:
        if future.cancelled():
            self.cancel()


class SharedLoop:
    """The event loop and its thread; :meth:`submit` hands it a coroutine from any thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=_run_loop, args=(self.loop,), name="fencepost-client", daemon=True)
        self._queue: collections.deque[Call[Any]] = collections.deque()
        self._woken = False
        self.thread.start()

    def submit(self, coro: Coroutine[Any, Any, T], tasks: set[asyncio.Task[Any]] | None = None, *,
               future: bool = False) -> Call[T]:
        """Hand ``coro`` to the loop, where it runs as a task; return its :class:`Call` (:meth:`put` + :meth:`wake`).

        Args:
            coro: The coroutine.
            tasks: A set the call's task is in while it runs (touched on the loop thread only).
            future: Also give the call a ``concurrent.futures.Future`` (:attr:`Call.future`).
        """
        call = self.put(coro, tasks, future=future)
        self.wake()
        return call

    def put(self, coro: Coroutine[Any, Any, T], tasks: set[asyncio.Task[Any]] | None = None, *,
            future: bool = False) -> Call[T]:
        """Queue ``coro`` as a :class:`Call` without waking the loop: call :meth:`wake` next (outside any lock of
        the caller's: waking the loop is a write to a socket, during which other threads run).

        Calls put from one thread begin in order.
        """
        call = Call(coro, self.loop, tasks, future)
        self._queue.append(call)
        return call

    def wake(self) -> None:
        """Have the loop drain the queue. Only the first wake of a batch writes to the loop's socket: the others
        find the loop woken and not yet draining, and their calls are drained with it."""
        # A drain resets the flag before it pops: a call queued after that
        # either is drained by it or finds the flag down here and wakes the loop.
        if not self._woken:
            self._woken = True
            self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        self._woken = False
        queue = self._queue
        while queue:
            queue.popleft().begin()

    def stop(self) -> None:
        """Stop the loop (what is left on it is cancelled) and wait for its thread, unless called from it."""
        if self.thread is threading.current_thread():
            self.loop.stop()
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()


# The loop shared now (None: no client is attached) and how many clients are attached to it.
_shared: SharedLoop | None = None
_users = 0
_mutex = threading.Lock()


def attach() -> SharedLoop:
    """The shared loop, started if no client is attached; the caller must :func:`detach` it once."""
    global _shared, _users
    with _mutex:
        if _shared is None:
            _shared = SharedLoop()
        _users += 1
        return _shared


def detach(shared: SharedLoop) -> None:
    """Undo one :func:`attach`; the last client detached stops the loop thread."""
    global _shared, _users
    with _mutex:
        _users -= 1
        last = _users == 0
        if last:
            _shared = None
    if last:
        shared.stop()


def _forget_in_child() -> None:
    # A forked child has no loop thread and perhaps a copy of a held mutex;
    # its inherited clients refuse every call before reaching this module.
    global _shared, _users, _mutex
    _shared, _users, _mutex = None, 0, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


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
