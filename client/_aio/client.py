"""The asyncio lock client: the public API over the transport, the leases and the keepalive stream.

This is the one implementation; the sync :class:`~fencepost.client.LockClient`
runs it on a private event loop thread. The parts it is built from:

- :mod:`~fencepost.client._transport.transport`: addresses, the channel, the unary call
  retry loop;
- :mod:`~fencepost.client._leases.lease`: leases and their deadline rules, the pool
  of leases by TTL, holds and the local exclusion of one (lease, name);
- :mod:`~fencepost.client._leases.stream`: the KeepAlive stream and the deadline watcher;
- :mod:`~fencepost.client._recipes.lock`: the calls of the lock recipe (grant, acquire,
  release, revoke) and how their answers change the leases and holds;
- :mod:`~fencepost.client.tracing`: OpenTelemetry spans, when the
  application has set up an SDK (``fencepost.acquire`` around an acquire,
  with its calls as children).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Sequence
from types import TracebackType
from typing import Any

import grpc
import grpc.aio
from opentelemetry import context as otel_context
from opentelemetry.trace import TracerProvider

from .. import _fork
from .._transport import wire
from .._recipes.election import Elector, LeaderInfo, Leadership, check_election, check_value
from .._recipes.election import leader as leader_of
from .._recipes.election import observe as observe_leader
from .._info import HeldLock, LockInfo, Revoked, ServerInfo, Session, check_revoke
from .._leases.lease import IDLE_LEASE_TIMEOUT, MAX_IDLE_LEASES, Lease, LeasePool
from .._recipes.lock import Locker
from .._recipes.semaphore import AsyncSemaphore, PermitLocker, check_permits
from .._metrics import client_metrics
from .._leases.stream import DeadlineWatcher, KeepAliveStream
from .._transport.tls import TlsConfig
from .._transport.tls import security as tls_security
from ..tracing import LEASE_ID, OUTCOME, TOKEN, Tracing, failed
from .._transport.transport import Transport
from .._transport.wire import DEFAULT_ADDRESS
from ..errors import FencepostError, LeaseLost, LockHeld, LockTimeout, Unavailable
from ..handle import AsyncLockHandle
from ..v1 import kinds
from ..v1 import lock_pb2 as pb

__all__ = ["AsyncLockClient", "HeldLock", "LockInfo", "DEFAULT_ADDRESS"]

log = logging.getLogger("fencepost.client")

# An acquire with less than this left to wait (timeout=0) makes one try (the wire's wait_ms counts in ms).
_ONE_MS = 0.001

# Upper bound on the time close() spends releasing locks and revoking leases.
_CLOSE_BUDGET_SECONDS = 5.0


class AsyncLockClient:
    """asyncio client of a Fencepost coordinator: locks with fencing tokens.

    Guarantee and non-guarantee: a lock held under a TTL lease is **not**
    mutual exclusion. A holder that stalls longer than its TTL (GC pause,
    swap, partition) loses its lease while it may still believe it holds the
    lock, and another client is then granted it. What *is* guaranteed is that
    every grant of a name carries a fencing token strictly larger than every
    earlier grant's. Pass ``handle.token`` to the storage with each write and
    let it reject writes carrying a token lower than one it has accepted.
    ``handle.valid_for()`` and ``handle.lost`` are early warnings only.

    The client keeps one lease per distinct TTL, granted at the first lock
    with that TTL and reused by later ones, as long as it is used: a lease
    with no hold and no acquire (idle) is revoked after
    ``idle_lease_timeout`` seconds, or at once when more than
    ``max_idle_leases`` are idle (the longest idle first); see
    :attr:`lease_count`. And one KeepAlive stream that
    renews every lease about every ``ttl * keepalive_fraction`` seconds and
    carries the events that end holds. A lease whose local
    deadline (send time of the last acknowledged keepalive + TTL - margin)
    passes, or that the server reports gone, is lost with all its holds and
    never reused. When the stream breaks the client reconnects (exponential
    backoff with full jitter from 0.05 s, capped at 2 s and at half the
    shortest lease's keepalive period, trying the addresses in turn);
    leases and tokens are unchanged by a reconnect.

    Calls on the stream: a coordinator that serves them gets Acquire,
    Release and Withdraw as messages on the KeepAlive stream (the fast path;
    see ``stream_calls``). A call whose stream breaks before its answer is
    treated as a unary call whose connection broke.

    Retries: idempotent calls (Acquire, Withdraw, LeaseRevoke, Describe) that
    fail with UNAVAILABLE are retried on the next address, and so are Release
    and AdminRevoke, which carry a ``request_id`` (one per hold, per call),
    the same on each retry: a retry of one whose answer was lost gets the
    first attempt's outcome (OK) from the coordinator, not NotHolder.
    LeaseGrant is not idempotent: it is retried only while no connection
    could be made (so the request cannot have reached a server); once sent,
    an UNAVAILABLE answer raises :class:`Unavailable`. Either way a call
    stops trying ``connect_timeout`` seconds after its first failure (or at
    its own timeout).

    Traces: the client never sets up OpenTelemetry; it uses the
    ``tracer_provider`` given, else the application's global one. While that
    is the API's default (no SDK set up) it makes no span. Otherwise each
    acquire is a span ``fencepost.acquire`` and each release a span
    ``fencepost.release`` (attributes ``fencepost.lock.name``,
    ``fencepost.lease_id``, ``fencepost.token``, ``fencepost.outcome``), with
    a CLIENT span ``fencepost.v1.LockService/<Method>`` per call attempt
    under them, whose W3C trace context goes to the coordinator in the call
    metadata (or, for a call on the KeepAlive stream, in its message): one
    trace from the caller's span through the coordinator to its etcd
    requests.

    TLS: with ``tls`` set, every channel is TLS. A connection whose TLS
    handshake fails is not retried until ``connect_timeout``: once every
    address has failed its handshake, the call (or :meth:`connect`) raises
    :class:`~fencepost.client.TlsError` naming the cause. The KeepAlive
    stream keeps reconnecting through such failures (certificates may be
    rotated) and logs the cause once, at WARNING, on the
    ``fencepost.client`` logger.

    fork: a client and its handles inherited by a forked child raise
    FencepostError (reason "FORKED") from every method there, at once
    (``is_valid()`` is False), and never renew or release the parent's
    holds; the parent keeps them. A new client cannot be made in a child
    forked from a process that had opened one (gRPC cannot be used there).
    Use multiprocessing's ``spawn`` or ``forkserver`` start method, or make
    the client after fork in a process that never had one. A forked child
    must not go on running the parent's event loop.

    Example::

        async with AsyncLockClient("127.0.0.1:7420") as client:
            async with client.lock("inv:42", ttl=10.0, timeout=5.0) as h:
                await store.write(key, value, fencing_token=h.token)

    Args:
        address: ``"host:port"`` of a coordinator, or several (a sequence or
            a comma-separated string), tried in turn. Each is ``HOST:PORT``
            (host name, IPv4 or ``[IPv6]``; port 1 to 65535),
            ``dns:///HOST:PORT``, or a unix socket ``unix:/ABSOLUTE/PATH``
            (``unix:///ABSOLUTE/PATH``; a relative path is refused).
        tls: TLS settings: a :class:`~fencepost.client.TlsConfig` (PEM files,
            read here), or ready ``grpc.ChannelCredentials`` (e.g. from
            ``grpc.ssl_channel_credentials``), used as they are; None (the
            default) for plaintext.
        keepalive_fraction: Keepalive period as a fraction of the granted
            TTL, in (0, 0.5]; 1/3 by default.
        connect_timeout: Seconds to keep trying to reach a coordinator, for
            :meth:`connect` and for each call; finite, > 0.
        idle_lease_timeout: Seconds an idle lease is kept for a later lock
            with its TTL before it is revoked; > 0, at most 86400 (30 s by default).
        max_idle_leases: Most idle leases kept at once, 0 to 1000 (8 by
            default; 0 revokes a lease as soon as it is idle).
        metrics: A ``prometheus_client.CollectorRegistry``: the client counts
            its acquires by outcome, their wait, its lost holds by reason
            and its keepalives' round trips there (see
            :mod:`fencepost.client._metrics`; clients given the same
            registry share the metrics). None (the default) records nothing
            and never imports prometheus_client.
        tracer_provider: The OpenTelemetry tracer provider to make spans
            with; None (the default) for the global one, looked up at each call.
        trace_lock_names: Record lock names on spans (``fencepost.lock.name``);
            False leaves them out (names that carry customer ids, ...).
        stream_calls: Send Acquire, Release and Withdraw as messages on the
            KeepAlive stream when the coordinator serves them there (it says
            so as each stream opens; older coordinators do not, and get unary
            calls): one message each way instead of a gRPC call, with the
            same results, errors, retries and spans. False (for comparisons
            and tests) always makes unary calls.

    Raises:
        InvalidArgument: an argument is out of range, an address is none of
            the forms above (field "address"), or a TLS file is missing,
            unreadable or holds no PEM, or ``cert`` comes without ``key``
            (field "tls.ca", "tls.cert", "tls.key", ...), or ``metrics`` is not
            a registry (field "metrics"). Nothing is contacted.
        FencepostError: this process was forked from one that had opened a
            client (reason "FORKED"; see "fork" above).
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
        _fork.check_new_client()
        self._generation = _fork.generation()
        addresses = wire.check_addresses(address)
        fraction = wire.check_fraction(keepalive_fraction)
        self._connect_timeout = wire.check_connect_timeout(connect_timeout)
        idle_timeout, max_idle = wire.check_idle_leases(idle_lease_timeout, max_idle_leases)
        security = tls_security(tls)
        self._metrics = client_metrics(metrics)
        self._state = "new"  # new -> open -> closing -> closed
        self._closed_event: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._transport = Transport(addresses, connect_timeout=self._connect_timeout, security=security,
                                    tracing=Tracing(tracer_provider, lock_names=bool(trace_lock_names)))
        self._leases = LeasePool(idle_timeout=idle_timeout, max_idle=max_idle, metrics=self._metrics)
        self._stream = KeepAliveStream(
            self._transport, self._leases, fraction=fraction, spawn=self._spawn, metrics=self._metrics,
            on_open=self._resend_all, on_response=self._on_response, send_keepalive=self._send_keepalive,
            stream_calls=bool(stream_calls),
        )
        self._deadlines = DeadlineWatcher(self._leases, on_retired=self._revoke_retired)
        self._locker = Locker(self._transport, self._leases, self._stream, spawn=self._spawn,
                              on_new_lease=self._on_new_lease, state=lambda: self._state,
                              on_idle=self._deadlines.wake)
        self._permits: PermitLocker | None = None  # semaphore permits (client/_semaphore.py), made at first use

    # ------------------------------------------------------------------ lifecycle

    @property
    def addresses(self) -> tuple[str, ...]:
        """The coordinator addresses, in the order they are tried."""
        return self._transport.addresses

    @property
    def address(self) -> str:
        """The address of the coordinator currently used."""
        return self._transport.address

    async def connect(self, timeout: float | None = None) -> None:
        """Connect to a coordinator and start the keepalive stream.

        Tries the addresses in turn, with backoff, for up to ``timeout``
        seconds. Called by ``async with``; calling it again is a no-op.

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
        if self._state == "open":
            return
        if self._state != "new":
            raise FencepostError("client is closed")
        self._state = "open"
        _fork.opened_channel()
        self._transport.open()
        try:
            wait = self._connect_timeout if timeout is None else max(0.0, timeout)
            await self._transport.wait_connected(asyncio.get_running_loop().time() + wait)
        except BaseException:
            await self.close()
            raise
        # The client's own tasks belong to no caller's trace (a connect made by an acquire would
        # otherwise make the idle-lease revocations of the next hours children of that acquire).
        detached = otel_context.attach(otel_context.Context())
        try:
            self._spawn(self._stream.run(), "fencepost-keepalive-stream")
            self._spawn(self._deadlines.run(), "fencepost-deadline-watcher")
        finally:
            otel_context.detach(detached)

    async def close(self) -> None:
        """Release every held lock, revoke the leases, stop the stream, close the channel.

        Spends at most about 5 seconds on the server (errors are ignored:
        leases that could not be revoked expire by their TTL). Handles still
        held become released (``on_lost`` callbacks are not called).
        Idempotent.

        Raises:
            FencepostError: the client was inherited through fork (reason
                "FORKED"): the parent's channel, leases and holds are left
                alone.
        """
        self._check_fork()
        if self._state == "closed":
            return
        if self._state == "closing":
            assert self._closed_event is not None
            await self._closed_event.wait()
            return
        self._closed_event = asyncio.Event()
        was_open = self._state == "open"
        self._state = "closing"
        self._stream.begin_close()
        try:
            if was_open:
                await self._release_and_revoke_all()
        finally:
            self._leases.close()
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            await self._transport.close()
            self._state = "closed"
            self._closed_event.set()

    async def __aenter__(self) -> AsyncLockClient:
        await self.connect()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def _check_fork(self) -> None:
        """Raise at once in a forked child: nothing of the parent's client may be touched there."""
        if self._generation != _fork.generation():
            raise _fork.inherited_error("AsyncLockClient")

    async def _ensure_open(self, name: str | None = None) -> None:
        if self._state == "new":
            await self.connect()
        elif self._state != "open":
            raise FencepostError("client is closed", name=name)

    async def _release_and_revoke_all(self) -> None:
        loop = asyncio.get_running_loop()
        until = loop.time() + min(self._connect_timeout, _CLOSE_BUDGET_SECONDS)

        async def quietly(aw: Awaitable[Any]) -> None:
            try:
                await asyncio.wait_for(aw, max(0.0, until - loop.time()))
            except (FencepostError, TimeoutError, grpc.aio.AioRpcError) as err:
                log.debug("fencepost: ignored during close: %r", err)

        # Each hold through its own handle: a lock's Release, an election's Resign, ...
        await asyncio.gather(*(quietly(h.release()) for h in self._leases.holds()))
        leases = self._leases.leases()
        await asyncio.gather(*(quietly(self._locker.revoke(lease.lease_id, until=until, secret=lease.secret)) for lease in leases))

    def _spawn(self, coro: Awaitable[Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("fencepost: background task %s failed", task.get_name(), exc_info=task.exception())

    def _revoke_retired(self, lease: Lease) -> None:
        if self._state == "open":
            self._spawn(self._locker._revoke_quietly(lease.lease_id, lease.secret), "fencepost-revoke-idle-lease")

    @property
    def lease_count(self) -> int:
        """How many leases the client keeps alive now (at most one per TTL in use, plus the idle ones)."""
        return len(self._leases.leases())

    def _on_new_lease(self, lease: Lease) -> None:
        self._stream.start_keepalives(lease)
        self._deadlines.wake()

    # ------------------------------------------------------------------ the stream's hooks
    #
    # The stream calls these methods of the client (not its own), so that a
    # subclass can observe it: the fault suite's probe (tests/faults/
    # test_restart_load.py) counts reconnects, acknowledgements and keepalives
    # by overriding them, and test_holders.py feeds _on_response directly.

    def _resend_all(self) -> None:
        """A new stream is open: queue a keepalive per lease and a watch per hold."""
        self._stream.resend_all()

    def _on_response(self, response: pb.KeepAliveResponse) -> None:
        """A message arrived on the stream."""
        self._stream.dispatch(response)

    def _send_keepalive(self, lease: Lease) -> None:
        """Queue one keepalive of ``lease``."""
        self._stream.send_keepalive(lease)

    @property
    def _outbox(self) -> asyncio.Queue[pb.KeepAliveRequest | None] | None:
        return self._stream.outbox

    @property
    def _pending(self) -> dict[int, tuple[Lease, float]]:
        return self._stream.pending

    @property
    def _channel(self) -> grpc.aio.Channel | None:
        return self._transport.channel

    def _rotate(self, failed: grpc.aio.Channel | None, *, force: bool = False) -> None:
        self._transport.rotate(failed, force=force)

    # ------------------------------------------------------------------ acquire / release

    async def acquire(self, name: str, ttl: float = 10.0, timeout: float | None = None, *,
                      lock_delay: float = 0) -> AsyncLockHandle:
        """Acquire the lock ``name``, waiting up to ``timeout`` seconds.

        Contenders are granted first come, first served. A second local
        acquire of a name this client holds under the same TTL waits for the
        local holder to release it (within the same timeout).

        Args:
            name: The lock name (non-empty; at most 256 UTF-8 bytes, no
                control characters, checked by the server).
            ttl: Lease TTL in seconds, finite, 1 to 86400; rounded up to whole
                seconds. The server may grant more (see ``handle.ttl``).
            timeout: Seconds to wait, 0 to 86400 (0 tries once); None waits
                until granted. Includes the lock-delay of an earlier holder.
            lock_delay: Lock-delay in seconds, 0 to 3600 (rounded up to whole
                seconds; 0: none): if this hold ends because its lease expired or
                was revoked (not by a release), the lock's next grant waits this
                long after the end (README, "Lock-delay"). A mitigation for
                storage that cannot check tokens, never a replacement for fencing.

        Returns:
            The handle of the grant, with its fencing token.

        Raises:
            InvalidArgument: bad name, ttl, timeout or lock_delay (before any RPC).
            LockTimeout: not granted within ``timeout``.
            LeaseLost: the lease was lost while waiting, twice in a row.
            ResourceExhausted: too many waiters on the coordinator.
            Unavailable: no coordinator reachable.
            FencepostError: the client is closed, or was inherited through
                fork (reason "FORKED").
        """
        return await self._acquire(name, ttl, timeout, try_once=False, lock_delay=lock_delay)

    async def try_acquire(self, name: str, ttl: float = 10.0, *, lock_delay: float = 0) -> AsyncLockHandle:
        """Acquire the lock ``name`` if it is free, without waiting.

        Args:
            name: The lock name.
            ttl: Lease TTL in seconds, as for :meth:`acquire`.
            lock_delay: As for :meth:`acquire`.

        Returns:
            The handle of the grant, with its fencing token.

        Raises:
            LockHeld: the lock is held (by another client, or by this one
                under the same TTL); carries the holder's lease id and token.
                Also while the lock-delay of a holder that was lost runs: then
                with holder lease id and token 0.
            InvalidArgument: bad name, ttl or lock_delay (before any RPC).
            Unavailable: no coordinator reachable.
            FencepostError: the client is closed, or was inherited through
                fork (reason "FORKED").
        """
        return await self._acquire(name, ttl, None, try_once=True, lock_delay=lock_delay)

    @contextlib.asynccontextmanager
    async def lock(
        self, name: str, ttl: float = 10.0, timeout: float | None = None, *, lock_delay: float = 0
    ) -> AsyncIterator[AsyncLockHandle]:
        """Hold the lock ``name`` for the body of an ``async with`` block.

        Acquires as :meth:`acquire`, releases on exit. If the hold was lost
        while the body ran and the body raised nothing, LeaseLost is raised
        on exit (if the body raised, its exception propagates). A
        cancellation caused by ``handle.cancel_on_lost()`` also surfaces as
        LeaseLost.

        Args:
            name: The lock name.
            ttl: Lease TTL in seconds.
            timeout: Seconds to wait for the lock; None waits forever.
            lock_delay: As for :meth:`acquire`.

        Yields:
            The handle of the grant.

        Raises:
            LeaseLost: the hold was lost before the block ended.
            (and everything :meth:`acquire` and :meth:`AsyncLockHandle.release` raise)
        """
        handle = await self.acquire(name, ttl=ttl, timeout=timeout, lock_delay=lock_delay)
        try:
            yield handle
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task in handle._cancelled_tasks and task.uncancel() == 0:
                await self._locker.release_quietly(handle)
                raise LeaseLost(
                    "lock hold was lost", name=handle.name, lease_id=handle.lease_id, reason=handle.lost_reason
                ) from exc
            await self._locker.release_quietly(handle)
            raise
        except BaseException:
            await self._locker.release_quietly(handle)
            raise
        await handle.release()

    async def _acquire(self, name: str, ttl: float, timeout: float | None, *, try_once: bool,
                       lock_delay: float = 0) -> AsyncLockHandle:
        self._check_fork()
        wire.check_name(name)
        ttl_s = wire.ttl_to_wire(ttl)
        timeout = wire.check_timeout(timeout)
        delay_s = wire.lock_delay_to_wire(lock_delay)
        with self._metrics.acquiring(self._leases.clock):
            return await self._acquire_traced(name, ttl_s, timeout, try_once, delay_s)

    async def _acquire_traced(self, name: str, ttl_s: int, timeout: float | None, try_once: bool,
                              delay_s: int = 0) -> AsyncLockHandle:
        await self._ensure_open(name)
        until = None if timeout is None else asyncio.get_running_loop().time() + timeout
        tracing = self._transport.tracing
        tracer = tracing.tracer()
        if tracer is None:
            return await self._acquire_or_closed(name, ttl_s, until, try_once, delay_s)
        attributes = tracing.lock_attributes(name)
        attributes.update({"fencepost.ttl_seconds": ttl_s, "fencepost.try_once": try_once})
        if timeout is not None:
            attributes["fencepost.timeout_seconds"] = timeout
        with tracer.start_as_current_span("fencepost.acquire", attributes=attributes, record_exception=False,
                                          set_status_on_exception=False) as span:
            try:
                handle = await self._acquire_or_closed(name, ttl_s, until, try_once, delay_s)
            except BaseException as exc:
                failed(span, exc)
                raise
            span.set_attributes({LEASE_ID: handle.lease_id, TOKEN: handle.token, OUTCOME: "granted"})
            return handle

    async def _acquire_or_closed(self, name: str, ttl_s: int, until: float | None, try_once: bool,
                                 delay_s: int = 0) -> AsyncLockHandle:
        try:
            if until is not None and not try_once and until - asyncio.get_running_loop().time() < _ONE_MS:
                return await self._acquire_now(name, ttl_s, delay_s)  # no time to wait (the wire counts in ms)
            return await self._locker.acquire(name, ttl_s, until, try_once=try_once, lock_delay=delay_s)
        except FencepostError as exc:
            closed = self._closed_error(name)
            if closed is None:
                raise
            if isinstance(exc, Unavailable):  # the channel closed under the call
                raise closed from exc
            if type(exc) is FencepostError and exc.name is None:
                exc.name = name  # "client is closed" from the lease pool: say which lock
            raise

    async def _acquire_now(self, name: str, ttl_s: int, delay_s: int = 0) -> AsyncLockHandle:
        """``acquire(timeout=0)``: one try, as ``try_acquire`` (its calls get the usual time to reach a
        coordinator and be answered: a budget of 0 s would fail them all), LockTimeout when the lock is held."""
        try:
            return await self._locker.acquire(name, ttl_s, None, try_once=True, lock_delay=delay_s)
        except LockHeld as held:
            raise LockTimeout(f"lock {name!r} not granted within 0 s: it is held (lease {held.holder_lease_id}, "
                              f"token {held.holder_token})", name=name, lease_id=held.lease_id) from None

    def _closed_error(self, name: str | None) -> FencepostError | None:
        """The error of a call that close() ended (its channel closed under it), None while open."""
        return FencepostError("client is closed", name=name) if self._state != "open" else None

    def semaphore(self, name: str, permits: int, ttl: float = 10.0) -> AsyncSemaphore:
        """Semaphore ``name`` of ``permits`` permits: at most that many holders at once, each with a slot and a
        fencing token per slot (see :class:`~fencepost.client.AsyncSemaphore`). Makes no call.

        Args:
            name: The semaphore's name (rules of a lock name; semaphores and locks are independent).
            permits: Its number of permits, 1 to 1000, fixed at its first use.
            ttl: Lease TTL in seconds of its permits, as for :meth:`acquire`.

        Returns:
            The semaphore (``acquire``, ``try_acquire``, ``describe``, ``async with``).

        Raises:
            InvalidArgument: bad name, permits or ttl.
            FencepostError: the client was inherited through fork.
        """
        self._check_fork()
        wire.check_name(name)
        check_permits(permits)
        ttl_s = wire.ttl_to_wire(ttl)
        if self._permits is None:
            self._permits = PermitLocker(self._locker)
        return AsyncSemaphore(self, self._permits, name, permits, ttl_s)

    async def describe(self, name: str) -> LockInfo:
        """Report the holder, fencing token, waiters and TTL left of one lock.

        Args:
            name: The lock name.

        Returns:
            A snapshot taken at one etcd revision.

        Raises:
            InvalidArgument: bad name.
            Unavailable: no coordinator reachable.
            FencepostError: the client is closed, or was inherited through
                fork (reason "FORKED").
        """
        self._check_fork()
        wire.check_name(name)
        await self._ensure_open(name)
        try:
            resp = await self._transport.call(
                "Describe",
                lambda _left: (pb.DescribeRequest(name=name), self._connect_timeout),
                until=None,
                idempotent=True,
                name=name,
            )
        except Unavailable as exc:
            raise self._closed_error(name) or exc from exc
        return LockInfo.from_response(name, resp)

    async def list_locks(self, prefix: str = "", *, page_size: int = 0) -> list[HeldLock]:
        """List every held lock whose name starts with ``prefix``, reading all pages.

        Args:
            prefix: The name prefix; "" lists every lock.
            page_size: Locks per ListLocks call, 1 to 1000; 0 lets the
                coordinator choose (100).

        Returns:
            The held locks in the order of their etcd keys, all read at the
            revision of the first page (TTLs as etcd reported them per page).

        Raises:
            InvalidArgument: bad prefix or page size (``field`` names it).
            Unavailable: no coordinator reachable.
            FencepostError: the client is closed, or was inherited through fork.
        """
        self._check_fork()
        await self._ensure_open()
        locks: list[HeldLock] = []
        token = ""
        while True:
            request = pb.ListLocksRequest(prefix=prefix, page_size=page_size, page_token=token)
            resp = await self._transport.call(
                "ListLocks", lambda _left, r=request: (r, self._connect_timeout), until=None, idempotent=True)
            locks.extend(HeldLock.from_message(info, resp.revision) for info in resp.locks)
            token = resp.next_page_token
            if not token:
                return locks

    async def server_info(self) -> ServerInfo:
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
                (``code`` UNIMPLEMENTED: older than this client, or not a
                coordinator); the client is closed, or was inherited through fork.
        """
        self._check_fork()
        await self._ensure_open()
        try:
            resp = await self._transport.call(
                "ServerInfo", lambda _left: (pb.ServerInfoRequest(), self._connect_timeout), until=None,
                idempotent=True)
        except Unavailable as exc:
            raise self._closed_error(None) or exc from exc
        return ServerInfo.from_response(resp)

    async def admin_revoke(self, name: str, *, kind: int | str = pb.HoldKind.HOLD_KIND_LOCK,
                           slot: int | None = None) -> Revoked:
        """End the hold of lock ``name`` by revoking its holder's lease (AdminRevoke; an operator's call).

        With ``kind``, end the leadership of election ``name`` (its leader's
        lease) or permit ``slot`` of semaphore ``name`` (that permit holder's
        lease) the same way. The lease ends with all its holds and waits; its
        holder is told at once (its handle's ``lost``) and the next waiter
        (candidate, semaphore waiter) is granted with a larger fencing token.
        Carries a request id, the same on each retry, so that a retry after
        a lost answer (within 60 s) answers as the first attempt did instead
        of revoking the next holder.

        Args:
            name: The lock name (the election's, the semaphore's).
            kind: What ``name`` names: ``"lock"`` (the default), ``"election"`` or ``"semaphore"``,
                or a ``HoldKind`` (``fencepost.client.HoldKind``): ``HOLD_KIND_LOCK``,
                ``HOLD_KIND_ELECTION`` or ``HOLD_KIND_SEMAPHORE``.
            slot: ``HOLD_KIND_SEMAPHORE`` only, and then required: the permit slot, 0 to the
                semaphore's permits - 1.

        Returns:
            What was revoked; ``revoked`` False when the lock was free (the
            election had no leader, the slot no holder).

        Raises:
            InvalidArgument: bad name, kind or slot (before any RPC); a slot not below the
                semaphore's number of permits (the coordinator's, field ``slot``).
            AccessDenied: the coordinator has no access policy, or it does not
                grant this client's identity ``admin`` on ``name``.
            Unavailable: no coordinator reachable.
            FencepostError: the client is closed, or was inherited through fork.
        """
        self._check_fork()
        wire.check_name(name)
        kind, wire_slot = check_revoke(kind, slot)
        await self._ensure_open(name)
        try:
            request = pb.AdminRevokeRequest(name=name, kind=kind, slot=wire_slot, request_id=wire.new_request_id())
            resp = await self._transport.call(
                "AdminRevoke", lambda _left: (request, self._connect_timeout), until=None, idempotent=True, name=name)
        except Unavailable as exc:
            raise self._closed_error(name) or exc from exc
        return Revoked(name, bool(resp.revoked), int(resp.lease_id), int(resp.token), kind, wire_slot)

    async def list_sessions(self, *, page_size: int = 0) -> list[Session]:
        """List the live leases with their owner identity, TTLs, holds and waits (ListSessions; every page).

        Args:
            page_size: Leases per ListSessions call, 1 to 1000; 0 lets the coordinator choose (100).

        Returns:
            The sessions in lease id order.

        Raises:
            InvalidArgument: bad page size.
            AccessDenied: the coordinator has no access policy, or it does not
                grant this client's identity ``admin`` on every name.
            Unavailable: no coordinator reachable.
            FencepostError: the client is closed, or was inherited through fork.
        """
        self._check_fork()
        await self._ensure_open()
        sessions: list[Session] = []
        token = ""
        while True:
            request = pb.ListSessionsRequest(page_size=page_size, page_token=token)
            resp = await self._transport.call(
                "ListSessions", lambda _left, r=request: (r, self._connect_timeout), until=None, idempotent=True)
            sessions.extend(Session.from_message(info) for info in resp.sessions)
            token = resp.next_page_token
            if not token:
                return sessions

    # ------------------------------------------------------------------ elections (see _election)

    async def campaign(self, election: str, value: bytes | str, *, ttl: float | None = None,
                       timeout: float | None = None) -> Leadership:
        """Campaign in ``election`` with ``value`` and wait until this client leads it.

        Candidates lead first come, first served, one at a time (etcd's
        ``concurrency.Election``). The leadership is a hold like a lock's:
        its fencing token is strictly larger than every earlier leader's of
        the election, and its loss (the lease expired, a local deadline, a
        resignation by someone holding the lease) is signalled exactly like a
        lock's (``lost``, ``on_lost``, ``cancel_on_lost``). Pass the token to
        the storage with every write the leader makes.

        Args:
            election: The election's name (the rules of a lock name).
            value: What the leader publishes (an address, an id): bytes, or a
                str sent as UTF-8; 0 to 65536 bytes.
            ttl: Lease TTL in seconds (as for :meth:`acquire`); None: 10 s.
            timeout: Seconds to wait, 0 to 86400 (0 tries once); None waits until elected.

        Returns:
            The :class:`~fencepost.client.Leadership` (its ``token``, ``value``,
            ``proclaim()``, ``resign()``).

        Raises:
            InvalidArgument: bad election, value, ttl or timeout (before any RPC).
            LockTimeout: not elected within ``timeout``.
            LeaseLost: the lease was lost while waiting, twice in a row.
            AccessDenied, NotLeaseOwner: refused by the coordinator's policy.
            Unavailable: no coordinator reachable.
            FencepostError: the client is closed, or was inherited through fork.
        """
        self._check_fork()
        check_election(election)
        raw = check_value(value)
        ttl_s = wire.ttl_to_wire(10.0 if ttl is None else ttl)
        timeout = wire.check_timeout(timeout)
        await self._ensure_open(election)
        elector = Elector(self._locker, raw)
        try:
            if timeout is not None and timeout < _ONE_MS:
                try:
                    return await elector.campaign(election, ttl_s, None, try_once=True)
                except LockHeld as held:
                    raise LockTimeout(f"election {election!r}: not elected within 0 s: led by lease "
                                      f"{held.holder_lease_id:#x} (token {held.holder_token})", name=election,
                                      lease_id=held.lease_id) from None
            until = None if timeout is None else asyncio.get_running_loop().time() + timeout
            return await elector.campaign(election, ttl_s, until, try_once=False)
        except FencepostError as exc:
            if exc.name == kinds.election_lock(election):  # the recipe's own errors name the internal lock
                exc.name = election
            if isinstance(exc, Unavailable):
                raise self._closed_error(election) or exc from exc
            raise

    async def leader(self, election: str) -> LeaderInfo | None:
        """The current leader of ``election``: its value, lease and token, read at one etcd revision.

        Returns:
            A :class:`~fencepost.client.LeaderInfo`, or None when the election has no leader.

        Raises:
            InvalidArgument: bad election.
            AccessDenied: the policy does not allow ``describe`` on it.
            Unavailable: no coordinator reachable.
            FencepostError: the client is closed, or was inherited through fork.
        """
        self._check_fork()
        check_election(election)
        await self._ensure_open(election)
        try:
            return await leader_of(self._transport, election, self._connect_timeout)
        except Unavailable as exc:
            raise self._closed_error(election) or exc from exc

    async def observe(self, election: str) -> AsyncIterator[LeaderInfo | None]:
        """Every change of the leader of ``election``, as an async iterator.

        The first item is the current leader; then one per change: a new
        leader (larger token), a new value (``proclaim``), or None when the
        election has no leader. Reconnects across coordinator failover and
        resumes where it was (``after_revision``): no change is missed (unless
        etcd compacted that history meanwhile, then the current leader comes
        next), and none is yielded twice or out of order. Stop by breaking
        out of the loop (or cancelling the task).

        Raises:
            InvalidArgument: bad election.
            AccessDenied: the policy does not allow ``describe`` on it.
            Unavailable: no coordinator reachable for ``connect_timeout`` seconds.
            FencepostError: the client is closed, or was inherited through fork.
        """
        self._check_fork()
        check_election(election)
        await self._ensure_open(election)
        async for info in observe_leader(self._transport, election, ensure_open=lambda: self._ensure_open(election)):
            yield info
