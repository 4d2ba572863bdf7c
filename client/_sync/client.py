"""The synchronous lock client: the asyncio client on a private event loop thread.

:class:`LockClient` owns a daemon thread running an event loop with one
:class:`~fencepost.client.AsyncLockClient` on it, and proxies every call with
``asyncio.run_coroutine_threadsafe``. It is usable from any thread. Each call
runs in a copy of the calling thread's context (``run_coroutine_threadsafe``
schedules it from there), so that an OpenTelemetry span current in the
caller is the parent of the call's spans.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Coroutine, Iterator, Sequence
from types import TracebackType
from typing import Any, TypeVar

import grpc
from opentelemetry.trace import TracerProvider

from .. import _fork
from .._transport import wire
from .._aio.client import DEFAULT_ADDRESS, AsyncLockClient, HeldLock, LockInfo
from .._recipes.election import LeaderInfo, Leadership, check_election, check_value
from .._info import Revoked, ServerInfo, Session, check_revoke
from .._leases.lease import IDLE_LEASE_TIMEOUT, MAX_IDLE_LEASES
from .._recipes.semaphore import SemaphoreInfo, check_permits
from .._transport.tls import TlsConfig
from ..errors import FencepostError
from ..handle import AsyncLockHandle
from ..v1 import lock_pb2 as pb

__all__ = ["LeaderObserver", "LockClient", "LockHandle", "Semaphore", "SyncLeadership"]

T = TypeVar("T")

log = logging.getLogger("fencepost.client")


def _check(name: str, ttl: float, timeout: float | None, lock_delay: float = 0) -> None:
    """Check arguments on the caller's thread, before the loop thread starts or connects."""
    wire.check_name(name)
    wire.ttl_to_wire(ttl)
    wire.check_timeout(timeout)
    wire.lock_delay_to_wire(lock_delay)


class LockHandle:
    """One grant of a lock with its fencing token (sync twin of :class:`AsyncLockHandle`).

    Returned by :meth:`LockClient.acquire` and friends. Usable from any
    thread. Pass :attr:`token` to the storage with every write.

    Attributes:
        lost: A ``threading.Event`` set (once) when the hold is lost; never
            set by a release.
    """

    def __init__(self, inner: AsyncLockHandle, client: LockClient) -> None:
        # Built on the client's loop thread, so that the hook is registered
        # before any loss can be signalled.
        self._inner = inner
        self._client = client
        self.lost = threading.Event()
        if inner.lost_reason is not None:
            self.lost.set()
        inner._hooks.append(lambda _h: self.lost.set())

    @property
    def name(self) -> str:
        """The lock name."""
        return self._inner.name

    @property
    def lease_id(self) -> int:
        """The id of the lease holding the lock."""
        return self._inner.lease_id

    @property
    def slot(self) -> int:
        """The permit slot (0 .. permits-1) of a semaphore permit; 0 for a lock."""
        return self._inner.slot

    @property
    def lease_secret(self) -> str:
        """The secret of the lease holding the lock (see :attr:`AsyncLockHandle.lease_secret`); never log it."""
        return self._inner.lease_secret

    @property
    def token(self) -> int:
        """The fencing token of this grant (> 0: its key's create revision + the token floor)."""
        return self._inner.token

    @property
    def ttl(self) -> int:
        """The lease's TTL in seconds as granted by the server."""
        return self._inner.ttl

    @property
    def lost_reason(self) -> str | None:
        """Why the hold was lost (``"DEADLINE"``, ``"LEASE_EXPIRED"``, ...), None while not lost."""
        return self._inner.lost_reason

    @property
    def released(self) -> bool:
        """Whether :meth:`release` has completed (or the client closed)."""
        return self._inner.released

    @property
    def deadline(self) -> float:
        """The conservative local deadline of the hold's lease, on ``time.monotonic()`` (see AsyncLockHandle)."""
        return self._inner.deadline

    @property
    def margin(self) -> float:
        """Seconds the local deadline keeps short of the granted TTL."""
        return self._inner.margin

    def valid_for(self) -> float:
        """Seconds left on the conservative local deadline (0.0 once lost or released)."""
        return self._inner.valid_for()

    def is_valid(self) -> bool:
        """Whether the hold is still believed live (``valid_for() > 0``)."""
        return self._inner.is_valid()

    def check(self) -> None:
        """Raise unless the hold is still believed live.

        Raises:
            LeaseLost: the hold was lost or its local deadline passed.
            NotHolder: the handle was released.
            FencepostError: the handle was inherited through fork (reason "FORKED").
        """
        self._inner.check()

    def release(self) -> None:
        """Release the lock (one Release RPC); ownership is kept if it fails.

        Raises:
            NotHolder: the lease no longer holds the lock, or already released.
            StaleTokenError: the lease holds the lock under a newer token.
            LeaseLost: the lease is gone, or the hold was lost before release.
            Unavailable: no coordinator reachable.
            FencepostError: the client is closed, also by ``close()`` from another
                thread during the call, or the handle was inherited through
                fork (reason "FORKED"; the parent keeps the hold).
        """
        self._inner._check_fork()
        self._client._run(self._inner.release(), self.name)

    def wait_lost(self, timeout: float | None = None) -> bool:
        """Block until the hold is lost or ``timeout`` seconds pass.

        Args:
            timeout: Seconds to wait; None waits forever.

        Returns:
            True if the hold was lost, False on timeout.

        Raises:
            FencepostError: the handle was inherited through fork (reason "FORKED").
        """
        self._inner._check_fork()
        return self.lost.wait(timeout)

    def on_lost(self, callback: Callable[[LockHandle], object]) -> None:
        """Call ``callback(handle)`` once, in a new daemon thread, when the hold is lost.

        Called at once if it already is; never for a released handle.
        Exceptions are logged.

        Args:
            callback: Called with this handle; its return value is ignored.

        Raises:
            FencepostError: the handle was inherited through fork (reason "FORKED").
        """
        self._inner._check_fork()

        async def register() -> None:
            self._inner.on_lost(lambda _h: callback(self))

        self._client._run(register())

    def __repr__(self) -> str:
        return repr(self._inner).replace("AsyncLockHandle", "LockHandle", 1)


class SyncLeadership(LockHandle):
    """The leadership of an election (sync twin of :class:`~fencepost.client.Leadership`).

    Returned by :meth:`LockClient.campaign`: a :class:`LockHandle` (``token``,
    ``lost``, ``on_lost``, ...) whose ``name`` is the election's, plus its
    ``value``, :meth:`proclaim` and :meth:`resign`.
    """

    _inner: Leadership

    @property
    def value(self) -> bytes:
        """The value the leader publishes (Campaign's, then the last Proclaim's)."""
        return self._inner.value

    def proclaim(self, value: bytes | str) -> None:
        """Publish a new value without a new election (see :meth:`Leadership.proclaim`).

        Raises:
            InvalidArgument, NotHolder, LeaseLost, Unavailable: as :meth:`Leadership.proclaim`.
        """
        self._inner._check_fork()
        raw = check_value(value)
        self._client._run(self._inner.proclaim(raw), self.name)

    def resign(self) -> None:
        """Give up the leadership (Resign); as :meth:`release`."""
        self.release()

    def __repr__(self) -> str:
        return repr(self._inner)


class LeaderObserver:
    """A thread calling ``callback`` with each change of an election's leader (:meth:`LockClient.on_leader`).

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


class _Changes(Iterator["LeaderInfo | None"]):
    """The sync side of :meth:`AsyncLockClient.observe`: the iteration runs on the loop, items come by a queue."""

    _END = object()

    def __init__(self, client: LockClient, election: str) -> None:
        self._queue: queue.Queue[Any] = queue.Queue()
        self._closed = False

        async def pump() -> None:
            try:
                async for info in client._aio.observe(election):
                    self._queue.put(info)
            except BaseException as exc:  # noqa: BLE001 - handed to the reader
                self._queue.put(exc if isinstance(exc, Exception) else self._END)
                if not isinstance(exc, Exception):
                    raise

        def start() -> concurrent.futures.Future[None]:
            assert client._loop is not None
            return asyncio.run_coroutine_threadsafe(pump(), client._loop)

        client._run(_noop())  # connect (and start the loop thread) on the caller's thread
        self._future = start()
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


async def _noop() -> None:
    return None


class LockClient:
    """Synchronous client of a Fencepost coordinator: locks with fencing tokens.

    Same semantics as :class:`~fencepost.client.AsyncLockClient` (read its
    docstring: a TTL lock is not mutual exclusion; pass ``handle.token`` to
    the storage), run on an event loop in a private daemon thread. Every
    method may be called from any thread, including ``on_lost`` callbacks;
    not from inside a coroutine of that private loop.

    fork: in a forked child, an inherited LockClient and its handles raise
    FencepostError (reason "FORKED") from every method at once, without
    touching the parent's channel or loop thread (``is_valid()`` is False);
    the parent keeps its holds. A new client cannot be made in a child
    forked from a process that had opened one; use multiprocessing's
    ``spawn`` or ``forkserver`` start method, or make the client after fork
    in a process that never had one (README, "fork and multiprocessing").

    Example::

        with LockClient("127.0.0.1:7420") as client:
            with client.lock("inv:42", ttl=10.0, timeout=5.0) as h:
                db.write(key, value, fencing_token=h.token)

    Args:
        address: ``"host:port"`` of a coordinator, or several, tried in turn
            (the forms of :class:`AsyncLockClient`).
        tls: A :class:`~fencepost.client.TlsConfig`, ready
            ``grpc.ChannelCredentials``, or None for plaintext (as for
            :class:`AsyncLockClient`; a failed handshake raises
            :class:`~fencepost.client.TlsError` at once).
        keepalive_fraction: Keepalive period as a fraction of the TTL, (0, 0.5].
        connect_timeout: Seconds to keep trying to reach a coordinator.
        idle_lease_timeout: Seconds an idle lease (no hold, no acquire) is
            kept before it is revoked (see AsyncLockClient).
        max_idle_leases: Most idle leases kept at once, 0 to 1000.
        metrics: A ``prometheus_client.CollectorRegistry`` to record the
            client's metrics in (as for :class:`AsyncLockClient`); None
            records nothing.
        tracer_provider: The OpenTelemetry tracer provider; None for the
            global one (as for :class:`AsyncLockClient`: the client never sets
            one up; without an SDK no span is made).
        trace_lock_names: Record lock names on spans; False leaves them out.
        stream_calls: Send Acquire, Release and Withdraw as messages on the
            KeepAlive stream when the coordinator serves them there (as for
            :class:`AsyncLockClient`); False always makes unary calls.

    Raises:
        InvalidArgument: an argument is out of range, or a TLS file is bad
            (field "tls.ca", "tls.cert", "tls.key", ...), or ``metrics`` is
            not a registry (field "metrics").
        FencepostError: this process was forked from one that had opened a
            client (reason "FORKED").
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
        self._generation = _fork.generation()
        self._aio = AsyncLockClient(address, tls=tls, keepalive_fraction=keepalive_fraction,
                                    connect_timeout=connect_timeout, idle_lease_timeout=idle_lease_timeout,
                                    max_idle_leases=max_idle_leases, metrics=metrics,
                                    tracer_provider=tracer_provider, trace_lock_names=trace_lock_names,
                                    stream_calls=stream_calls)
        self._mutex = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

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
        """How many leases the client keeps alive now (see AsyncLockClient.lease_count)."""
        return self._aio.lease_count

    def connect(self, timeout: float | None = None) -> None:
        """Start the loop thread, connect to a coordinator and start the keepalive stream.

        Called by ``with`` and by the first call; calling it again is a no-op.

        Args:
            timeout: Seconds to try for; None: ``connect_timeout``. Later
                calls' retries still use ``connect_timeout``.

        Raises:
            TlsError: every address failed its TLS handshake (raised at once).
            Unavailable: no coordinator answered within ``timeout``.
            FencepostError: the client is closed, or was inherited through
                fork (reason "FORKED").
        """
        self._check_fork()
        with self._mutex:
            if self._closed:
                raise FencepostError("client is closed")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=self._run_loop, args=(loop,), name="fencepost-client", daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
        try:
            self._submit(self._aio.connect(timeout))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Release every held lock, revoke the leases and stop the loop thread. Idempotent.

        Raises:
            FencepostError: the client was inherited through fork (reason
                "FORKED"): the parent's channel, loop thread, leases and
                holds are left alone.
        """
        self._check_fork()
        with self._mutex:
            if self._closed:
                return
            self._closed = True
            loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            if thread is not threading.current_thread():
                asyncio.run_coroutine_threadsafe(self._aio.close(), loop).result()
        finally:
            loop.call_soon_threadsafe(loop.stop)
            if thread is not threading.current_thread():
                thread.join()

    def __enter__(self) -> LockClient:
        self.connect()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _check_fork(self) -> None:
        """Raise at once in a forked child: the loop thread is the parent's (and gone), its mutex may be held."""
        if self._generation != _fork.generation():
            raise _fork.inherited_error("LockClient")

    @staticmethod
    def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
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

    def _submit(self, coro: Coroutine[Any, Any, T], name: str | None = None) -> T:
        """Run ``coro`` on the loop thread and wait for it.

        Raises:
            FencepostError: the client is closed, before or while ``coro``
                runs (``close()`` from another thread cancels it): never a
                bare ``concurrent.futures.CancelledError``.
        """
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

    def _run(self, coro: Coroutine[Any, Any, T], name: str | None = None) -> T:
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

    def acquire(self, name: str, ttl: float = 10.0, timeout: float | None = None, *,
                lock_delay: float = 0) -> LockHandle:
        """Acquire the lock ``name``, waiting up to ``timeout`` seconds.

        Args:
            name: The lock name.
            ttl: Lease TTL in seconds, finite, 1 to 86400 (rounded up).
            timeout: Seconds to wait, 0 to 86400 (0 tries once); None waits forever.
            lock_delay: Lock-delay in seconds, 0 to 3600 (rounded up; 0: none): after
                this hold is lost (lease expired or revoked, not released), the next
                grant waits this long (see :meth:`AsyncLockClient.acquire`).

        Returns:
            The handle of the grant, with its fencing token.

        Raises:
            InvalidArgument: bad name, ttl, timeout or lock_delay (before any RPC).
            LockTimeout: not granted within ``timeout``.
            ResourceExhausted: too many waiters on the coordinator.
            Unavailable: no coordinator reachable.
            FencepostError: the client is closed, also by ``close()`` from another
                thread during the call, or was inherited through fork
                (reason "FORKED").
        """

        self._check_fork()
        _check(name, ttl, timeout, lock_delay)

        async def run() -> LockHandle:
            return LockHandle(await self._aio.acquire(name, ttl=ttl, timeout=timeout, lock_delay=lock_delay), self)

        return self._run(run(), name)

    def try_acquire(self, name: str, ttl: float = 10.0, *, lock_delay: float = 0) -> LockHandle:
        """Acquire the lock ``name`` if it is free, without waiting.

        Args:
            name: The lock name.
            ttl: Lease TTL in seconds.
            lock_delay: As for :meth:`acquire`.

        Returns:
            The handle of the grant.

        Raises:
            LockHeld: the lock is held; carries the holder's lease id and token
                (both 0 while the lock-delay of a lost holder runs).
            InvalidArgument: bad name, ttl or lock_delay.
            Unavailable: no coordinator reachable.
            FencepostError: the client is closed, also by ``close()`` from another
                thread during the call, or was inherited through fork
                (reason "FORKED").
        """

        self._check_fork()
        _check(name, ttl, None, lock_delay)

        async def run() -> LockHandle:
            return LockHandle(await self._aio.try_acquire(name, ttl=ttl, lock_delay=lock_delay), self)

        return self._run(run(), name)

    @contextlib.contextmanager
    def lock(self, name: str, ttl: float = 10.0, timeout: float | None = None, *,
             lock_delay: float = 0) -> Iterator[LockHandle]:
        """Hold the lock ``name`` for the body of a ``with`` block.

        Releases on exit. If the hold was lost while the body ran and the body
        raised nothing, LeaseLost is raised on exit.

        Args:
            name: The lock name.
            ttl: Lease TTL in seconds.
            timeout: Seconds to wait for the lock; None waits forever.
            lock_delay: As for :meth:`acquire`.

        Yields:
            The handle of the grant.

        Raises:
            LeaseLost: the hold was lost before the block ended.
            (and everything :meth:`acquire` and :meth:`LockHandle.release` raise)
        """
        handle = self.acquire(name, ttl=ttl, timeout=timeout, lock_delay=lock_delay)
        try:
            yield handle
        except BaseException:
            with contextlib.suppress(FencepostError):
                handle.release()
            raise
        handle.release()

    def semaphore(self, name: str, permits: int, ttl: float = 10.0) -> Semaphore:
        """Semaphore ``name`` of ``permits`` permits (sync twin of :meth:`AsyncLockClient.semaphore`). Makes no call.

        Raises:
            InvalidArgument: bad name, permits or ttl.
        """
        self._check_fork()
        wire.check_name(name)
        check_permits(permits)
        wire.ttl_to_wire(ttl)
        return Semaphore(self, name, permits, ttl)

    def describe(self, name: str) -> LockInfo:
        """Report the holder, fencing token, waiters and TTL left of one lock.

        Args:
            name: The lock name.

        Returns:
            A snapshot taken at one etcd revision.

        Raises:
            InvalidArgument: bad name.
            Unavailable: no coordinator reachable.
            FencepostError: the client is closed, also by ``close()`` from another
                thread during the call, or was inherited through fork
                (reason "FORKED").
        """
        self._check_fork()
        wire.check_name(name)
        return self._run(self._aio.describe(name), name)

    def list_locks(self, prefix: str = "", *, page_size: int = 0) -> list[HeldLock]:
        """List every held lock whose name starts with ``prefix``, reading all pages.

        Args:
            prefix: The name prefix; "" lists every lock.
            page_size: Locks per ListLocks call, 1 to 1000; 0 lets the coordinator choose (100).

        Returns:
            The held locks in the order of their etcd keys, all read at one etcd revision.

        Raises:
            InvalidArgument: bad prefix or page size (``field`` names it).
            Unavailable: no coordinator reachable.
        """
        self._check_fork()
        return self._run(self._aio.list_locks(prefix, page_size=page_size))

    def server_info(self) -> ServerInfo:
        """Report on the coordinator currently used: version, uptime, addresses, etcd, counts.

        Answers also while etcd is out of reach (``info.etcd.available`` is
        then False, ``info.etcd.error`` says why): the coordinator gives etcd
        at most 2 s. The counts of ``keepalive_streams`` to ``waiting_acquires``
        are that coordinator's own; ``contender_keys``, ``held_locks`` and
        ``waiters`` are cluster-wide.

        Returns:
            The coordinator's report.

        Raises:
            Unavailable: no coordinator reachable.
            FencepostError: the coordinator does not implement ServerInfo
                (``code`` UNIMPLEMENTED); the client is closed, or was
                inherited through fork.
        """
        self._check_fork()
        return self._run(self._aio.server_info())

    def admin_revoke(self, name: str, *, kind: int | str = pb.HoldKind.HOLD_KIND_LOCK,
                     slot: int | None = None) -> Revoked:
        """End the hold of lock ``name`` (with ``kind``: election ``name``'s leadership, semaphore ``name``'s
        permit ``slot``) by revoking its holder's lease (see :meth:`AsyncLockClient.admin_revoke`).

        Returns:
            What was revoked; ``revoked`` False when the lock (election, permit slot) was free.

        Raises:
            InvalidArgument: bad name, kind or slot.
            AccessDenied: no access policy on the coordinator, or no ``admin`` on ``name`` for this identity.
            Unavailable: no coordinator reachable.
        """
        self._check_fork()
        wire.check_name(name)
        check_revoke(kind, slot)
        return self._run(self._aio.admin_revoke(name, kind=kind, slot=slot), name)

    def list_sessions(self, *, page_size: int = 0) -> list[Session]:
        """List the live leases (see :meth:`AsyncLockClient.list_sessions`).

        Returns:
            The sessions in lease id order.

        Raises:
            InvalidArgument: bad page size.
            AccessDenied: no access policy on the coordinator, or no ``admin`` on every name for this identity.
            Unavailable: no coordinator reachable.
        """
        self._check_fork()
        return self._run(self._aio.list_sessions(page_size=page_size))

    # ------------------------------------------------------------------ elections

    def campaign(self, election: str, value: bytes | str, *, ttl: float | None = None,
                 timeout: float | None = None) -> SyncLeadership:
        """Campaign in ``election`` with ``value``; block until this client leads it.

        See :meth:`AsyncLockClient.campaign` (same arguments, errors and guarantees).

        Returns:
            The :class:`SyncLeadership`: ``token``, ``value``, ``lost``, ``proclaim()``, ``resign()``.
        """
        self._check_fork()
        check_election(election)
        raw = check_value(value)
        wire.ttl_to_wire(10.0 if ttl is None else ttl)
        wire.check_timeout(timeout)

        async def run() -> SyncLeadership:
            return SyncLeadership(await self._aio.campaign(election, raw, ttl=ttl, timeout=timeout), self)

        return self._run(run(), election)

    def leader(self, election: str) -> LeaderInfo | None:
        """The current leader of ``election`` (see :meth:`AsyncLockClient.leader`); None when it has none."""
        self._check_fork()
        check_election(election)
        return self._run(self._aio.leader(election), election)

    def observe(self, election: str) -> _Changes:
        """Every change of the leader of ``election``, as an iterator (see :meth:`AsyncLockClient.observe`).

        Blocks in ``next()`` until the next change. ``close()`` the iterator
        (or the client) to stop; the iterator then ends.

        Raises:
            InvalidArgument: bad election (at once); the other errors of
                :meth:`AsyncLockClient.observe` from ``next()``.
        """
        self._check_fork()
        check_election(election)
        return _Changes(self, election)

    def on_leader(self, election: str, callback: Callable[[LeaderInfo | None], object]) -> LeaderObserver:
        """Call ``callback(leader)`` in a thread of its own with each change of the leader of ``election``.

        The first call is with the current leader (None: none). The
        observation resumes across coordinator failover, as :meth:`observe`.

        Returns:
            The :class:`LeaderObserver`; ``stop()`` it when done.
        """
        self._check_fork()
        check_election(election)
        return LeaderObserver(self, election, callback)


class Semaphore:
    """Semaphore ``name`` of ``permits`` permits used through a :class:`LockClient` (sync twin of
    :class:`~fencepost.client.AsyncSemaphore`; made by :meth:`LockClient.semaphore`).

    Usable as ``with sem as permit:`` (acquire without timeout, release on exit).
    """

    def __init__(self, client: LockClient, name: str, permits: int, ttl: float) -> None:
        self._client = client
        self.name = name
        self.permits = permits
        self.ttl = ttl
        self._entered = threading.local()

    def acquire(self, timeout: float | None = None) -> LockHandle:
        """Take a permit, waiting up to ``timeout`` seconds (see :meth:`AsyncSemaphore.acquire`).

        Returns:
            The permit's handle (``.slot``, ``.token``, ``release()``).

        Raises:
            InvalidArgument, PermitsMismatch, LockTimeout, LeaseLost, Unavailable, FencepostError:
                as :meth:`AsyncSemaphore.acquire`.
        """
        self._client._check_fork()
        wire.check_timeout(timeout)

        async def run() -> LockHandle:
            aio = self._client._aio.semaphore(self.name, self.permits, ttl=self.ttl)
            return LockHandle(await aio.acquire(timeout), self._client)

        return self._client._run(run(), self.name)

    def try_acquire(self) -> LockHandle:
        """Take a permit if one is free, without waiting.

        Raises:
            LockHeld: every permit is held. (And as :meth:`acquire`.)
        """
        self._client._check_fork()

        async def run() -> LockHandle:
            aio = self._client._aio.semaphore(self.name, self.permits, ttl=self.ttl)
            return LockHandle(await aio.try_acquire(), self._client)

        return self._client._run(run(), self.name)

    def describe(self) -> SemaphoreInfo:
        """Report the permits, holders (slot, lease, token) and waiters of the semaphore.

        Raises:
            Unavailable, FencepostError: as :meth:`AsyncSemaphore.describe`.
        """
        self._client._check_fork()

        async def run() -> SemaphoreInfo:
            return await self._client._aio.semaphore(self.name, self.permits, ttl=self.ttl).describe()

        return self._client._run(run(), self.name)

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
