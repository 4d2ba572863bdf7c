"""The sync clients' shared event loop thread: many threads and clients on it, one call interrupted among them.

Every LockClient of a process runs on one loop thread (client/_sync/shared.py); a thread hands each call to it
and waits on a lock. These tests run the sync calls from plain threads against a coordinator in a child process
(the test's own thread blocks, so the coordinator cannot share its loop). Nothing here is timed.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from fencepost.client import FencepostError, LockClient
from fencepost.client._sync import shared

from .child_processes import CoordinatorProcess


class Interrupted(BaseException):
    """What the test's SIGINT handler raises in the main thread (not KeyboardInterrupt: pytest's own)."""


@pytest.fixture
def sync_address(coordinator_process: CoordinatorProcess) -> str:
    return coordinator_process.start()


@pytest.fixture
def interrupt_main() -> Iterator[threading.Event]:
    """Set the event to raise Interrupted in the main thread 0.3 s later (SIGINT, with a handler of the test's),
    when it waits in a call."""
    assert threading.current_thread() is threading.main_thread()
    go, stop = threading.Event(), threading.Event()

    def handler(signum: int, frame: object) -> None:
        raise Interrupted

    def sender() -> None:
        go.wait(60)
        if not stop.is_set() and not stop.wait(0.3):
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # type: ignore[arg-type]

    before = signal.signal(signal.SIGINT, handler)
    thread = threading.Thread(target=sender, daemon=True)
    thread.start()
    try:
        yield go
    finally:
        stop.set()
        go.set()
        thread.join(5)
        # A SIGINT the sender sent before it saw ``stop`` was delivered to this thread by pthread_kill before
        # join() returned; Python runs its handler at the next bytecode, before the old handler is back.
        signal.signal(signal.SIGINT, before)


def _cycles(client: LockClient, name: str, count: int, tokens: list[int]) -> None:
    for _ in range(count):
        handle = client.acquire(name, ttl=10.0, timeout=20.0)
        tokens.append(handle.token)
        handle.release()


def _run_threads(targets: list[threading.Thread], errors: list[BaseException]) -> None:
    for t in targets:
        t.start()
    for t in targets:
        t.join(60)
        assert not t.is_alive(), "a thread's calls did not end"
    assert not errors, repr(errors[:3])


def _guarded(errors: list[BaseException], fn: object, *args: object) -> threading.Thread:
    def run() -> None:
        try:
            fn(*args)  # type: ignore[operator]
        except BaseException as err:  # noqa: BLE001 - reported by _run_threads
            errors.append(err)

    return threading.Thread(target=run, daemon=True)


def _loop_threads() -> int:
    return sum(t.name == "fencepost-client" for t in threading.enumerate())


def test_sync_clients_when_64_threads_cycle_on_distinct_names(sync_address: str) -> None:
    """64 threads (32 with a client each, 32 sharing one) all finish their cycles; each name's tokens only grow."""
    before = _loop_threads()
    common = LockClient(sync_address)
    own = [LockClient(sync_address) for _ in range(32)]
    tokens: dict[str, list[int]] = {f"n-{i}": [] for i in range(64)}
    errors: list[BaseException] = []
    threads = [_guarded(errors, _cycles, own[i] if i < 32 else common, f"n-{i}", 5, tokens[f"n-{i}"])
               for i in range(64)]
    try:
        _run_threads(threads, errors)
        assert _loop_threads() == 1, "the clients share one loop thread"
    finally:
        for client in [common, *own]:
            client.close()
    for name, got in tokens.items():
        assert len(got) == 5 and all(a < b for a, b in zip(got, got[1:])), (name, got)
    assert _loop_threads() == before, "the last client closed stops the loop thread"


def test_sync_acquire_when_interrupted_in_its_thread(sync_address: str, interrupt_main: threading.Event) -> None:
    """An acquire queued in the main thread and interrupted there raises at once and is withdrawn; the other
    threads' calls on the same client and loop go on, and the client works afterwards."""
    with LockClient(sync_address) as client, LockClient(sync_address) as holder_client:
        held = holder_client.acquire("busy", ttl=10.0, timeout=5.0)
        tokens: dict[str, list[int]] = {f"m-{i}": [] for i in range(8)}
        errors: list[BaseException] = []
        others = [_guarded(errors, _cycles, client, name, 10, got) for name, got in tokens.items()]
        for t in others:
            t.start()

        def interrupt_when_queued() -> None:
            deadline = time.monotonic() + 20
            while holder_client.describe("busy").waiter_count < 1 and time.monotonic() < deadline:
                time.sleep(0.02)
            interrupt_main.set()

        threading.Thread(target=interrupt_when_queued, daemon=True).start()
        with pytest.raises(Interrupted):
            client.acquire("busy", ttl=10.0, timeout=30.0)
        deadline = time.monotonic() + 10
        while holder_client.describe("busy").waiter_count and time.monotonic() < deadline:
            time.sleep(0.02)
        assert holder_client.describe("busy").waiter_count == 0, "the interrupted acquire was withdrawn"
        for t in others:
            t.join(60)
        assert not errors, repr(errors[:3])
        for name, got in tokens.items():
            assert len(got) == 10 and all(a < b for a, b in zip(got, got[1:])), (name, got)
        held.release()
        again = client.acquire("busy", ttl=10.0, timeout=5.0)
        assert again.token > held.token
        again.release()


def test_sync_acquire_when_it_times_out_among_other_threads(sync_address: str) -> None:
    """An acquire that times out in one thread raises there; the other threads' cycles all finish."""
    with LockClient(sync_address) as client, LockClient(sync_address) as holder_client:
        held = holder_client.acquire("busy", ttl=10.0, timeout=5.0)
        tokens: dict[str, list[int]] = {f"t-{i}": [] for i in range(8)}
        errors: list[BaseException] = []
        timed_out: list[BaseException] = []

        def wait_in_vain() -> None:
            try:
                client.acquire("busy", ttl=10.0, timeout=0.3)
            except FencepostError as err:
                timed_out.append(err)

        threads = [_guarded(errors, _cycles, client, name, 10, got) for name, got in tokens.items()]
        threads.append(_guarded(errors, wait_in_vain))
        _run_threads(threads, errors)
        assert len(timed_out) == 1, "the acquire behind the holder timed out"
        for name, got in tokens.items():
            assert len(got) == 10 and all(a < b for a, b in zip(got, got[1:])), (name, got)
        held.release()


def test_shared_call_when_its_wait_is_interrupted(interrupt_main: threading.Event) -> None:
    """Interrupting a thread's wait cancels its task on the loop; calls of other threads on it complete."""
    loop = shared.attach()
    try:
        cancelled = threading.Event()
        started = threading.Event()

        async def forever() -> None:
            started.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        async def answer(i: int) -> int:
            await asyncio.sleep(0.01)
            return i

        results: list[int] = []
        errors: list[BaseException] = []

        def other(i: int) -> None:
            results.append(loop.submit(answer(i)).wait())

        call = loop.submit(forever())
        assert started.wait(10)
        threads = [_guarded(errors, other, i) for i in range(16)]
        for t in threads:
            t.start()
        interrupt_main.set()
        with pytest.raises(Interrupted):
            call.wait()
        assert cancelled.wait(10), "the interrupted call's task was cancelled"
        for t in threads:
            t.join(10)
        assert not errors, repr(errors)
        assert sorted(results) == list(range(16))
    finally:
        shared.detach(loop)


def test_shared_call_when_the_coroutine_raises_or_is_cancelled() -> None:
    """A call raises its coroutine's exception in the waiting thread; a cancelled one raises CancelledError;
    a future call's future is cancelled with it."""
    loop = shared.attach()
    try:
        async def fail() -> None:
            raise ValueError("no")

        with pytest.raises(ValueError, match="no"):
            loop.submit(fail()).wait()

        async def forever() -> None:
            await asyncio.sleep(3600)

        call = loop.submit(forever())
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            call.wait()

        future_call = loop.submit(forever(), future=True)
        assert future_call.future is not None
        future_call.future.cancel()
        with pytest.raises(asyncio.CancelledError):
            future_call.wait()
    finally:
        shared.detach(loop)
