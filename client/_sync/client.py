"""The synchronous lock client: the asyncio client on an event loop thread of its own.

:class:`LockClient` owns a :class:`~.loop.LoopThread` running one
:class:`~fencepost.client.AsyncLockClient`, and every method is that
client's: it checks its arguments on the caller's thread (before the loop
thread starts or connects), then runs the async method there with the one
blocking helper (:meth:`LoopThread.run`), wrapping a handle it returns in a
sync one. A method's docstring is its asyncio twin's (:func:`twin`): the
arguments, results and errors are the same.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import Any, TypeVar

import grpc
from opentelemetry.trace import TracerProvider

from .._aio.client import AsyncLockClient
from .._info import HeldLock, LockInfo, Revoked, ServerInfo, Session, check_revoke
from .._leases.lease import IDLE_LEASE_TIMEOUT, MAX_IDLE_LEASES
from .._recipes.election import LeaderInfo, check_election, check_value
from .._recipes.multilock import check_names
from .._recipes.semaphore import AsyncSemaphore, SemaphoreInfo, check_permits
from .._transport import wire
from .._transport.tls import TlsConfig
from .._transport.wire import DEFAULT_ADDRESS
from ..errors import FencepostError, StaleTokenError
from ..v1 import lock_pb2 as pb
from .handle import LockHandle, MultiLockHandle, SyncLeadership
from .loop import LoopThread
from .observe import LeaderChanges, LeaderObserver

__all__ = ["LockClient", "Semaphore", "twin"]

F = TypeVar("F", bound=Callable[..., Any])


log = logging.getLogger("fencepost.client")


def twin(of: Callable[..., Any]) -> Callable[[F], F]:
    """Give a sync method the docstring of its asyncio twin ``of`` (same arguments, results and errors)."""

    def share(method: F) -> F:
        method.__doc__ = of.__doc__
        return method

    return share


def _check(name: str, ttl: float, timeout: float | None, lock_delay: float = 0) -> None:
    """Check arguments on the caller's thread, before the loop thread starts or connects."""
    wire.check_name(name)
    wire.ttl_to_wire(ttl)
    wire.check_timeout(timeout)
    wire.lock_delay_to_wire(lock_delay)


class LockClient:
    """Synchronous client of a Fencepost coordinator: locks with fencing tokens.

    Same semantics, arguments and errors as
    :class:`~fencepost.client.AsyncLockClient` (read its docstring: a TTL
    lock is not mutual exclusion; pass ``handle.token`` to the storage), run
    on an event loop in a daemon thread of Fencepost's, which every
    LockClient of the process shares (started by the first to connect,
    stopped when the last one closes). Every method may be called from any
    thread, including ``on_lost`` callbacks; not from inside a coroutine of
    that loop. A call that ``close()`` from another thread ends raises
    FencepostError ("client is closed"); other clients' calls go on.

    fork: in a forked child, an inherited LockClient and its handles raise
    FencepostError (reason "FORKED") from every method at once, without
    touching the parent's channel or loop thread (``is_valid()`` is False);
    the parent keeps its holds. A new client cannot be made in a child
    forked from a process that had opened one; use multiprocessing's
    ``spawn`` or ``forkserver`` start method, or make the client after fork
    in a process that never had one (docs/python.md, "fork and multiprocessing").

    Example::

        with LockClient("127.0.0.1:7420") as client:
            with client.lock("inv:42", ttl=10.0, timeout=5.0) as h:
                db.write(key, value, fencing_token=h.token)

    Args:
        address, tls, keepalive_fraction, connect_timeout, idle_lease_timeout,
        max_idle_leases, metrics, tracer_provider, trace_lock_names,
        stream_calls: As for :class:`AsyncLockClient`.

    Raises:
        InvalidArgument, FencepostError: as :class:`AsyncLockClient` (nothing is contacted).
    """

    def __init__(
        self,
        address: str | Sequence[str] = DEFAULT_ADDRESS,
        *,
        tls: TlsConfig | grpc.ChannelCredentials | None = None,
        keepalive_fraction: float = 1 / 3,
        connect_timeout: float = 10.0,
        idle_lease_timeout: float = IDLE_LEASE_TIMEOUT,
        max_idle_leases: int = MAX_IDLE_LEASES,
        metrics: Any = None,
        tracer_provider: TracerProvider | None = None,
        trace_lock_names: bool = True,
        stream_calls: bool = True,
    ) -> None:
        self._aio = AsyncLockClient(address, tls=tls, keepalive_fraction=keepalive_fraction,
                                    connect_timeout=connect_timeout, idle_lease_timeout=idle_lease_timeout,
                                    max_idle_leases=max_idle_leases, metrics=metrics,
                                    tracer_provider=tracer_provider, trace_lock_names=trace_lock_names,
                                    stream_calls=stream_calls)
        self._loop = LoopThread(self._aio)

    @property
    def addresses(self) -> tuple[str, ...]:
        """The coordinator addresses, in the order they are tried."""
        return self._aio.addresses

    @property
    def address(self) -> str:
        """The address of the coordinator currently used."""
        return self._aio.address

    @property
    def lease_count(self) -> int:
        """How many leases the client keeps alive now (see :attr:`AsyncLockClient.lease_count`)."""
        return self._aio.lease_count

    @property
    def lease_ids(self) -> tuple[int, ...]:
        """The ids of the leases the client keeps alive now (see :attr:`AsyncLockClient.lease_ids`)."""
        return self._aio.lease_ids

    def connect(self, timeout: float | None = None) -> None:
        """Start (or join) the loop thread, connect to a coordinator and start the keepalive stream.

        Called by ``with`` and by the first call; calling it again is a no-op.
        Arguments and errors: :meth:`AsyncLockClient.connect`.
        """
        self._loop.connect(timeout)

    def close(self) -> None:
        """Release every held lock, revoke the leases, end this client's calls left; the last client closed
        stops the loop thread. Idempotent.

        Raises:
            FencepostError: the client was inherited through fork (reason
                "FORKED"): the parent's channel, loop thread, leases and
                holds are left alone.
        """
        self._loop.close()

    def __enter__(self) -> LockClient:
        self.connect()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @twin(AsyncLockClient.acquire)
    def acquire(self, name: str, ttl: float = 10.0, timeout: float | None = None, *,
                lock_delay: float = 0, read: bool = False) -> LockHandle:
        self._loop.check_fork()
        _check(name, ttl, timeout, lock_delay)

        async def run() -> LockHandle:
            return LockHandle(await self._aio.acquire(name, ttl=ttl, timeout=timeout, lock_delay=lock_delay,
                                                      read=read), self._loop)

        return self._loop.run(run(), name)

    @twin(AsyncLockClient.try_acquire)
    def try_acquire(self, name: str, ttl: float = 10.0, *, lock_delay: float = 0, read: bool = False) -> LockHandle:
        self._loop.check_fork()
        _check(name, ttl, None, lock_delay)

        async def run() -> LockHandle:
            return LockHandle(await self._aio.try_acquire(name, ttl=ttl, lock_delay=lock_delay, read=read),
                              self._loop)

        return self._loop.run(run(), name)

    @contextlib.contextmanager
    def lock(self, name: str, ttl: float = 10.0, timeout: float | None = None, *,
             lock_delay: float = 0, read: bool = False) -> Iterator[LockHandle]:
        """Hold the lock ``name`` for the body of a ``with`` block (see :meth:`AsyncLockClient.lock`).

        Acquires as :meth:`acquire`, releases on exit. If the hold was lost
        while the body ran and the body raised nothing, LeaseLost is raised on exit.
        """
        handle = self.acquire(name, ttl=ttl, timeout=timeout, lock_delay=lock_delay, read=read)
        try:
            yield handle
        except BaseException:
            with contextlib.suppress(FencepostError):
                handle.release()
            raise
        handle.release()

    @twin(AsyncLockClient.acquire_all)
    def acquire_all(self, names: Sequence[str], ttl: float = 10.0, timeout: float | None = None) -> MultiLockHandle:
        self._loop.check_fork()
        checked = check_names(names)
        _check(checked[0], ttl, timeout)

        async def run() -> MultiLockHandle:
            return MultiLockHandle(await self._aio.acquire_all(checked, ttl=ttl, timeout=timeout), self._loop)

        return self._loop.run(run(), checked[0])

    @twin(AsyncLockClient.try_acquire_all)
    def try_acquire_all(self, names: Sequence[str], ttl: float = 10.0) -> MultiLockHandle:
        self._loop.check_fork()
        checked = check_names(names)
        _check(checked[0], ttl, None)

        async def run() -> MultiLockHandle:
            return MultiLockHandle(await self._aio.try_acquire_all(checked, ttl=ttl), self._loop)

        return self._loop.run(run(), checked[0])

    @contextlib.contextmanager
    def lock_all(self, names: Sequence[str], ttl: float = 10.0,
                 timeout: float | None = None) -> Iterator[MultiLockHandle]:
        """Hold every lock of ``names`` for the body of a ``with`` block (see :meth:`AsyncLockClient.lock_all`).

        Acquires as :meth:`acquire_all`, releases on exit (one call).
        """
        handle = self.acquire_all(names, ttl=ttl, timeout=timeout)
        try:
            yield handle
        except BaseException:
            with contextlib.suppress(FencepostError):
                handle.release()
            raise
        handle.release()

    @twin(AsyncLockClient.semaphore)
    def semaphore(self, name: str, permits: int, ttl: float = 10.0) -> Semaphore:
        self._loop.check_fork()
        wire.check_name(name)
        check_permits(permits)
        wire.ttl_to_wire(ttl)
        return Semaphore(self._loop, name, permits, ttl)

    @twin(AsyncLockClient.describe)
    def describe(self, name: str) -> LockInfo:
        self._loop.check_fork()
        wire.check_name(name)
        return self._loop.run(self._aio.describe(name), name)

    @twin(AsyncLockClient.list_locks)
    def list_locks(self, prefix: str = "", *, page_size: int = 0) -> list[HeldLock]:
        self._loop.check_fork()
        wire.check_prefix(prefix)
        return self._loop.run(self._aio.list_locks(prefix, page_size=page_size))

    @twin(AsyncLockClient.server_info)
    def server_info(self) -> ServerInfo:
        self._loop.check_fork()
        return self._loop.run(self._aio.server_info())

    @twin(AsyncLockClient.report_stale_write)
    def report_stale_write(self, err: StaleTokenError) -> None:
        self._loop.check_fork()
        self._loop.run(self._aio.report_stale_write(err))

    @twin(AsyncLockClient.stale_write_reporter)
    def stale_write_reporter(self) -> Callable[[StaleTokenError], None]:
        on_loop = self._aio.stale_write_reporter()

        async def report_on_loop(err: StaleTokenError) -> None:
            on_loop(err)

        def report(err: StaleTokenError) -> None:
            try:
                self._loop.start(report_on_loop(err))  # not waited for
            except FencepostError as exc:  # closed, not connected yet, forked
                log.debug("stale write not reported: %s", exc)

        return report

    @twin(AsyncLockClient.admin_revoke)
    def admin_revoke(self, name: str, *, kind: int | str = pb.HoldKind.HOLD_KIND_LOCK,
                     slot: int | None = None) -> Revoked:
        self._loop.check_fork()
        wire.check_name(name)
        check_revoke(kind, slot)
        return self._loop.run(self._aio.admin_revoke(name, kind=kind, slot=slot), name)

    @twin(AsyncLockClient.list_sessions)
    def list_sessions(self, *, page_size: int = 0) -> list[Session]:
        self._loop.check_fork()
        return self._loop.run(self._aio.list_sessions(page_size=page_size))

    # ------------------------------------------------------------------ elections

    @twin(AsyncLockClient.campaign)
    def campaign(self, election: str, value: bytes | str, *, ttl: float | None = None,
                 timeout: float | None = None) -> SyncLeadership:
        self._loop.check_fork()
        check_election(election)
        raw = check_value(value)
        wire.ttl_to_wire(10.0 if ttl is None else ttl)
        wire.check_timeout(timeout)

        async def run() -> SyncLeadership:
            return SyncLeadership(await self._aio.campaign(election, raw, ttl=ttl, timeout=timeout), self._loop)

        return self._loop.run(run(), election)

    @twin(AsyncLockClient.leader)
    def leader(self, election: str) -> LeaderInfo | None:
        self._loop.check_fork()
        check_election(election)
        return self._loop.run(self._aio.leader(election), election)

    def observe(self, election: str) -> LeaderChanges:
        """Every change of the leader of ``election``, as an iterator (see :meth:`AsyncLockClient.observe`).

        Blocks in ``next()`` until the next change. ``close()`` the iterator
        (or the client) to stop; the iterator then ends.

        Raises:
            InvalidArgument: bad election (at once); the other errors of
                :meth:`AsyncLockClient.observe` from ``next()``.
        """
        self._loop.check_fork()
        check_election(election)
        return LeaderChanges(self._loop, self._aio, election)

    def on_leader(self, election: str, callback: Callable[[LeaderInfo | None], object]) -> LeaderObserver:
        """Call ``callback(leader)`` in a thread of its own with each change of the leader of ``election``.

        The first call is with the current leader (None: none). The
        observation resumes across coordinator failover, as :meth:`observe`;
        a leader reported after history etcd compacted away has
        :attr:`LeaderInfo.skipped` True.

        Returns:
            The :class:`LeaderObserver`; ``stop()`` it when done.
        """
        return LeaderObserver(self, election, callback)


class Semaphore:
    """Semaphore ``name`` of ``permits`` permits used through a :class:`LockClient` (sync twin of
    :class:`~fencepost.client.AsyncSemaphore`; made by :meth:`LockClient.semaphore`).

    Usable as ``with sem as permit:`` (acquire without timeout, release on exit).
    """

    def __init__(self, loop: LoopThread, name: str, permits: int, ttl: float) -> None:
        self._loop = loop
        self.name = name
        self.permits = permits
        self.ttl = ttl
        self._entered = threading.local()

    def _async(self) -> AsyncSemaphore:
        return self._loop.client.semaphore(self.name, self.permits, ttl=self.ttl)

    @twin(AsyncSemaphore.acquire)
    def acquire(self, timeout: float | None = None) -> LockHandle:
        self._loop.check_fork()
        wire.check_timeout(timeout)

        async def run() -> LockHandle:
            return LockHandle(await self._async().acquire(timeout), self._loop)

        return self._loop.run(run(), self.name)

    @twin(AsyncSemaphore.try_acquire)
    def try_acquire(self) -> LockHandle:
        self._loop.check_fork()

        async def run() -> LockHandle:
            return LockHandle(await self._async().try_acquire(), self._loop)

        return self._loop.run(run(), self.name)

    @twin(AsyncSemaphore.describe)
    def describe(self) -> SemaphoreInfo:
        self._loop.check_fork()

        async def run() -> SemaphoreInfo:
            return await self._async().describe()

        return self._loop.run(run(), self.name)

    def __enter__(self) -> LockHandle:
        handle = self.acquire()
        stack = getattr(self._entered, "handles", None)
        if stack is None:
            stack = self._entered.handles = []
        stack.append(handle)
        return handle

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        handle = self._entered.handles.pop()
        if exc is None:
            handle.release()
            return
        with contextlib.suppress(FencepostError):
            handle.release()

    def __repr__(self) -> str:
        return f"<Semaphore name={self.name!r} permits={self.permits} ttl={self.ttl}>"
