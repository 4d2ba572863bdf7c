"""The asyncio lock client: the public API of locks, semaphores and elections.

This is the one implementation; the sync :class:`~fencepost.client.LockClient`
runs it on an event loop thread of its own (one for every LockClient of a process). :class:`AsyncLockClient` is built in
layers: :class:`~.core.ClientCore` (its parts and lifecycle),
:class:`~.queries.QueryCalls` (the calls that make no hold), :class:`~.multilocks.MultiLockCalls`
(multi-locks), and here the
calls that make holds: each acquire runs the one acquire loop
(:class:`~fencepost.client._recipes.holds.Holds`) with the recipe of its kind
(:mod:`~fencepost.client._recipes.lock`, ``.semaphore``, ``.election``). With
tracing on, an acquire is a span ``fencepost.acquire`` with its calls as
children (:mod:`~fencepost.client.tracing`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from .._recipes.election import CampaignRecipe, LeaderInfo, Leadership, check_election, check_value
from .._recipes.election import leader as leader_of
from .._recipes.election import observe as observe_leader
from .._recipes.lock import LockRecipe
from .._recipes.semaphore import AsyncSemaphore, check_permits
from .._transport import wire
from ..errors import FencepostError, InvalidArgument, LeaseLost, Unavailable
from ..handle import AsyncLockHandle
from ..tracing import LEASE_ID, OUTCOME, TOKEN, failed
from ..v1 import kinds
from .multilocks import MultiLockCalls

__all__ = ["AsyncLockClient"]


class AsyncLockClient(MultiLockCalls):
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

    # ------------------------------------------------------------------ acquire / release

    async def acquire(self, name: str, ttl: float = 10.0, timeout: float | None = None, *,
                      lock_delay: float = 0, read: bool = False) -> AsyncLockHandle:
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
                long after the end (docs/fencing.md, "Lock-delay"). A mitigation for
                storage that cannot check tokens, never a replacement for fencing.
            read: Take a read hold (docs/rwlocks.md, after etcd's and Curator's read-write locks): shared
                with other readers, excluded by a writer (any hold of ``name`` without ``read``), granted
                first come, first served with the writers (a waiting writer blocks later readers). Its token
                is its own; a later writer's token is larger than every earlier reader's. No lock_delay;
                a client holding ``name`` in one mode under a TTL and asking for the other under the same
                TTL (one lease) waits for itself until ``timeout`` (no upgrade or downgrade).

        Returns:
            The handle of the grant, with its fencing token.

        Raises:
            InvalidArgument: bad name, ttl, timeout or lock_delay, or lock_delay with read (before any RPC).
            LockTimeout: not granted within ``timeout``.
            LeaseLost: the lease was lost while waiting, twice in a row.
            ResourceExhausted: too many waiters on the coordinator.
            Unavailable: no coordinator reachable.
            FencepostError: the client is closed, or was inherited through
                fork (reason "FORKED").
        """
        return await self._acquire(name, ttl, timeout, try_once=False, lock_delay=lock_delay, read=read)

    async def try_acquire(self, name: str, ttl: float = 10.0, *, lock_delay: float = 0,
                          read: bool = False) -> AsyncLockHandle:
        """Acquire the lock ``name`` if it is free, without waiting.

        Args:
            name: The lock name.
            ttl: Lease TTL in seconds, as for :meth:`acquire`.
            lock_delay: As for :meth:`acquire`.
            read: A read hold, as for :meth:`acquire` (refused while a writer holds or waits).

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
        return await self._acquire(name, ttl, None, try_once=True, lock_delay=lock_delay, read=read)

    @contextlib.asynccontextmanager
    async def lock(
        self, name: str, ttl: float = 10.0, timeout: float | None = None, *, lock_delay: float = 0,
        read: bool = False,
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
            read: A read hold, as for :meth:`acquire`.

        Yields:
            The handle of the grant.

        Raises:
            LeaseLost: the hold was lost before the block ended.
            (and everything :meth:`acquire` and :meth:`AsyncLockHandle.release` raise)
        """
        handle = await self.acquire(name, ttl=ttl, timeout=timeout, lock_delay=lock_delay, read=read)
        try:
            yield handle
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and handle._cancelled_by_loss(task) and task.uncancel() == 0:
                await self._holds.release_quietly(handle)
                raise LeaseLost(
                    "lock hold was lost", name=handle.name, lease_id=handle.lease_id, reason=handle.lost_reason
                ) from exc
            await self._holds.release_quietly(handle)
            raise
        except BaseException:
            await self._holds.release_quietly(handle)
            raise
        await handle.release()

    async def _acquire(self, name: str, ttl: float, timeout: float | None, *, try_once: bool,
                       lock_delay: float = 0, read: bool = False) -> AsyncLockHandle:
        self._check_fork()
        wire.check_name(name)
        ttl_s = wire.ttl_to_wire(ttl)
        timeout = wire.check_timeout(timeout)
        delay_s = wire.lock_delay_to_wire(lock_delay)
        if read and delay_s:
            raise InvalidArgument("a read hold takes no lock_delay", field="lock_delay", name=name)
        with self._metrics.acquiring(self._leases.clock):
            return await self._acquire_traced(name, ttl_s, timeout, try_once, delay_s, read)

    async def _acquire_traced(self, name: str, ttl_s: int, timeout: float | None, try_once: bool,
                              delay_s: int = 0, read: bool = False) -> AsyncLockHandle:
        await self._ensure_open(name)
        until = None if timeout is None else asyncio.get_running_loop().time() + timeout
        tracing = self._transport.tracing
        tracer = tracing.tracer()
        if tracer is None:
            return await self._acquire_or_closed(name, ttl_s, until, try_once, delay_s, read)
        attributes = tracing.lock_attributes(name)
        attributes.update({"fencepost.ttl_seconds": ttl_s, "fencepost.try_once": try_once, "fencepost.read": read})
        if timeout is not None:
            attributes["fencepost.timeout_seconds"] = timeout
        with tracer.start_as_current_span("fencepost.acquire", attributes=attributes, record_exception=False,
                                          set_status_on_exception=False) as span:
            try:
                handle = await self._acquire_or_closed(name, ttl_s, until, try_once, delay_s, read)
            except BaseException as exc:
                failed(span, exc)
                raise
            span.set_attributes({LEASE_ID: handle.lease_id, TOKEN: handle.token, OUTCOME: "granted"})
            return handle

    async def _acquire_or_closed(self, name: str, ttl_s: int, until: float | None, try_once: bool,
                                 delay_s: int = 0, read: bool = False) -> AsyncLockHandle:
        try:
            return await self._holds.acquire(LockRecipe(self._holds, name, delay_s, read=read), ttl_s, until,
                                             try_once=try_once)
        except FencepostError as exc:
            closed = self._closed_error(name)
            if closed is None:
                raise
            if isinstance(exc, Unavailable):  # the channel closed under the call
                raise closed from exc
            if type(exc) is FencepostError and exc.name is None:
                exc.name = name  # "client is closed" from the lease pool: say which lock
            raise

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
        return AsyncSemaphore(self._holds, name, permits, ttl_s, usable=self._usable, closed_error=self._closed_error)

    # ------------------------------------------------------------------ elections

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
                str sent as UTF-8; 0 to 32768 bytes (MAX_VALUE_BYTES).
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
        until = None if timeout is None else asyncio.get_running_loop().time() + timeout
        try:
            handle = await self._holds.acquire(CampaignRecipe(self._holds, election, raw), ttl_s, until, try_once=False)
        except FencepostError as exc:
            if exc.name == kinds.election_lock(election):  # the recipe's own errors name the internal lock
                exc.name = election
            if isinstance(exc, Unavailable):
                raise self._closed_error(election) or exc from exc
            raise
        assert isinstance(handle, Leadership)
        return handle

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
        etcd compacted that history meanwhile: then the current leader comes
        next, with :attr:`LeaderInfo.skipped` True to say that leaders
        between it and the previous one may be missing), and none is yielded
        twice or out of order. Stop by breaking out of the loop (or
        cancelling the task).

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
