"""The asyncio lock client: sessions, acquire/release, the keepalive stream.

This is the one implementation; the sync :class:`~fencepost.client.LockClient`
runs it on a private event loop thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any

import grpc
import grpc.aio
from google.protobuf.message import Message

from . import _wire
from .errors import (
    FencepostError,
    InvalidArgument,
    LeaseLost,
    LockHeld,
    LockTimeout,
    NotHolder,
    StaleTokenError,
    Unavailable,
    from_rpc_error,
)
from .handle import REASON_DEADLINE, REASON_LEASE_EXPIRED, AsyncLockHandle, _LeaseState
from .v1 import lock_pb2 as pb
from .v1.details import ErrorReason, reason_name
from .v1 import lock_pb2_grpc as pb_grpc

__all__ = ["AsyncLockClient", "LockInfo", "DEFAULT_ADDRESS"]

log = logging.getLogger("fencepost.client")

DEFAULT_ADDRESS = "127.0.0.1:7420"

# Slack added to the gRPC deadline of a bounded Acquire, so that the
# coordinator's own ACQUIRE_TIMEOUT answer normally arrives first.
_ACQUIRE_SLACK_SECONDS = 1.0
# Upper bound on the time close() spends releasing locks and revoking leases.
_CLOSE_BUDGET_SECONDS = 5.0
# Grace given to calls still running on a channel being replaced.
_ROTATE_GRACE_SECONDS = 0.5


@dataclasses.dataclass(frozen=True)
class LockInfo:
    """A snapshot of one lock, as returned by :meth:`AsyncLockClient.describe`.

    Attributes:
        name: The lock name.
        held: Whether anyone holds the lock.
        holder_lease_id: The holder's lease id (0 when not held).
        holder_token: The holder's fencing token (0 when not held).
        ttl_remaining: Seconds left on the holder's lease as etcd reports it
            (a lower bound only), None when not held.
        ttl: The holder lease's granted TTL in seconds (0 when not held).
        waiter_count: How many contenders are queued behind the holder.
        waiters: The first (up to 100) queued contenders as
            ``(lease_id, queue revision)`` pairs, in grant order.
        revision: The etcd revision of the snapshot.
    """

    name: str
    held: bool
    holder_lease_id: int
    holder_token: int
    ttl_remaining: float | None
    ttl: int
    waiter_count: int
    waiters: tuple[tuple[int, int], ...]
    revision: int


class _Slot:
    """Local exclusion of one (lease, name): one local holder at a time."""

    __slots__ = ("lock", "users", "holder")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0
        self.holder: AsyncLockHandle | None = None


def _current_task_cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


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

    The client keeps one lease (a *session*) per distinct TTL, granted at the
    first lock with that TTL and reused by later ones, and one KeepAlive
    stream that renews every lease about every ``ttl * keepalive_fraction``
    seconds and carries the events that end holds. A lease whose local
    deadline (send time of the last acknowledged keepalive + TTL - margin)
    passes, or that the server reports gone, is lost with all its holds and
    never reused. When the stream breaks the client reconnects (exponential
    backoff with full jitter, 0.05 s to 2 s, trying the addresses in turn);
    leases and tokens are unchanged by a reconnect.

    Retries: idempotent calls (Acquire, LeaseRevoke, Describe) that fail with
    UNAVAILABLE are retried on the next address. LeaseGrant and Release are
    not idempotent: they are retried only while no connection could be made
    (so the request cannot have reached a server); once sent, an UNAVAILABLE
    answer raises :class:`Unavailable`. Either way a call stops trying
    ``connect_timeout`` seconds after its first failure (or at its own timeout).

    Example::

        async with AsyncLockClient("127.0.0.1:7420") as client:
            async with client.lock("inv:42", ttl=10.0, timeout=5.0) as h:
                await store.write(key, value, fencing_token=h.token)

    Args:
        address: ``"host:port"`` of a coordinator, or several (a sequence or
            a comma-separated string), tried in turn.
        keepalive_fraction: Keepalive period as a fraction of the granted
            TTL, in (0, 0.5]; 1/3 by default.
        connect_timeout: Seconds to keep trying to reach a coordinator, for
            :meth:`connect` and for each call; finite, > 0.

    Raises:
        InvalidArgument: an argument is out of range (nothing is contacted).
    """

    def __init__(
        self,
        address: str | Sequence[str] = DEFAULT_ADDRESS,
        *,
        keepalive_fraction: float = 1 / 3,
        connect_timeout: float = 10.0,
    ) -> None:
        self._addresses = _wire.check_addresses(address)
        self._fraction = _wire.check_fraction(keepalive_fraction)
        if (
            not isinstance(connect_timeout, (int, float))
            or isinstance(connect_timeout, bool)
            or not math.isfinite(connect_timeout)
            or connect_timeout <= 0
        ):
            raise InvalidArgument(
                f"connect_timeout must be a finite number of seconds > 0, got {connect_timeout!r}",
                field="connect_timeout",
            )
        self._connect_timeout = float(connect_timeout)
        self._clock: Callable[[], float] = time.monotonic
        self._state = "new"  # new -> open -> closing -> closed
        self._index = 0
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.LockServiceStub | None = None
        self._sessions: dict[int, _LeaseState] = {}  # requested TTL -> live lease
        self._grant_locks: dict[int, asyncio.Lock] = {}
        self._leases: dict[int, _LeaseState] = {}  # lease id -> live lease
        self._slots: dict[tuple[int, str], _Slot] = {}
        self._pending: dict[int, tuple[_LeaseState, float]] = {}  # request id -> (lease, send time)
        self._request_ids = itertools.count(1)
        self._outbox: asyncio.Queue[pb.KeepAliveRequest | None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._keepalive_tasks: dict[int, asyncio.Task[Any]] = {}
        self._wakeup: asyncio.Event | None = None
        self._closed_event: asyncio.Event | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def addresses(self) -> tuple[str, ...]:
        """The coordinator addresses, in the order they are tried."""
        return tuple(self._addresses)

    @property
    def address(self) -> str:
        """The address of the coordinator currently used."""
        return self._addresses[self._index]

    async def connect(self) -> None:
        """Connect to a coordinator and start the keepalive stream.

        Tries the addresses in turn, with backoff, for up to
        ``connect_timeout`` seconds. Called by ``async with``; calling it
        again is a no-op.

        Raises:
            Unavailable: no coordinator answered within ``connect_timeout``.
            FencepostError: the client is closed.
        """
        if self._state == "open":
            return
        if self._state != "new":
            raise FencepostError("client is closed")
        self._state = "open"
        self._wakeup = asyncio.Event()
        self._open_channel()
        try:
            await self._wait_connected(asyncio.get_running_loop().time() + self._connect_timeout)
        except BaseException:
            await self.close()
            raise
        self._spawn(self._stream_loop(), "fencepost-keepalive-stream")
        self._spawn(self._deadline_loop(), "fencepost-deadline-watcher")

    async def close(self) -> None:
        """Release every held lock, revoke the leases, stop the stream, close the channel.

        Spends at most about 5 seconds on the server (errors are ignored:
        leases that could not be revoked expire by their TTL). Handles still
        held become released (``on_lost`` callbacks are not called).
        Idempotent.
        """
        if self._state == "closed":
            return
        if self._state == "closing":
            assert self._closed_event is not None
            await self._closed_event.wait()
            return
        self._closed_event = asyncio.Event()
        was_open = self._state == "open"
        self._state = "closing"
        try:
            if was_open:
                await self._release_and_revoke_all()
        finally:
            for lease in list(self._leases.values()):
                lease.mark_lost("CLOSED")
                for handle in list(lease.holds.values()):
                    handle._mark_released()
            self._leases.clear()
            self._sessions.clear()
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            if self._channel is not None:
                await self._channel.close()
            self._state = "closed"
            self._closed_event.set()

    async def __aenter__(self) -> AsyncLockClient:
        await self.connect()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def _ensure_open(self) -> None:
        if self._state == "new":
            await self.connect()
        elif self._state != "open":
            raise FencepostError("client is closed")

    async def _release_and_revoke_all(self) -> None:
        loop = asyncio.get_running_loop()
        until = loop.time() + min(self._connect_timeout, _CLOSE_BUDGET_SECONDS)
        holds = [h for lease in self._leases.values() for h in lease.holds.values()]

        async def quietly(aw: Awaitable[Any]) -> None:
            try:
                await asyncio.wait_for(aw, max(0.0, until - loop.time()))
            except (FencepostError, TimeoutError, grpc.aio.AioRpcError) as err:
                log.debug("fencepost: ignored during close: %r", err)

        await asyncio.gather(*(quietly(self._release(h, until=until)) for h in holds))
        leases = list(self._leases.values())
        await asyncio.gather(*(quietly(self._revoke(lease.lease_id, until=until)) for lease in leases))

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

    # ------------------------------------------------------------------ channel

    def _open_channel(self) -> None:
        address = self._addresses[self._index]
        self._channel = grpc.aio.insecure_channel(address, options=_wire.CHANNEL_OPTIONS)
        self._stub = pb_grpc.LockServiceStub(self._channel)

    def _rotate(self, failed: grpc.aio.Channel | None, *, force: bool = False) -> None:
        """Move to the next address after ``failed`` misbehaved (once per channel)."""
        if failed is None or failed is not self._channel or self._state == "closed":
            return
        if not force and len(self._addresses) == 1:
            state = failed.get_state(try_to_connect=False)
            if state == grpc.ChannelConnectivity.READY:
                return
        self._index = (self._index + 1) % len(self._addresses)
        self._open_channel()
        self._spawn(failed.close(grace=_ROTATE_GRACE_SECONDS), "fencepost-close-channel")

    async def _wait_connected(self, until: float) -> None:
        """Wait until the current channel is READY, rotating addresses with backoff."""
        loop = asyncio.get_running_loop()
        delays = _wire.backoff_delays()
        per_try = max(1.0, self._connect_timeout / len(self._addresses))
        while True:
            channel = self._channel
            assert channel is not None
            if channel.get_state(try_to_connect=True) == grpc.ChannelConnectivity.READY:
                return
            left = until - loop.time()
            if left <= 0:
                raise Unavailable(f"no coordinator reachable at {', '.join(self._addresses)}")
            try:
                await asyncio.wait_for(channel.channel_ready(), min(left, per_try))
                return
            except TimeoutError:
                self._rotate(channel, force=True)
                await asyncio.sleep(min(next(delays), max(0.0, until - loop.time())))

    async def _call(
        self,
        method: str,
        make: Callable[[float | None], tuple[Message, float | None]],
        *,
        until: float | None,
        idempotent: bool,
        name: str | None = None,
        lease_id: int | None = None,
        token: int | None = None,
    ) -> Any:
        """Run one unary RPC with connection handling, retries and error mapping.

        Args:
            method: The stub method name ("Acquire", ...).
            make: Called before each attempt with the seconds left before
                ``until`` (None if unbounded); returns (request, gRPC timeout).
            until: Loop time after which to stop trying, or None.
            idempotent: Whether an UNAVAILABLE answer may be retried.
        """
        loop = asyncio.get_running_loop()
        delays = _wire.backoff_delays()
        give_up_at: float | None = None

        def budget() -> float:
            nonlocal give_up_at
            now = loop.time()
            if give_up_at is None:
                give_up_at = now + self._connect_timeout
                if until is not None:
                    give_up_at = min(give_up_at, until)
            return give_up_at - now

        while True:
            if self._state == "closed":
                raise FencepostError("client is closed", name=name, lease_id=lease_id)
            channel, stub = self._channel, self._stub
            assert channel is not None and stub is not None
            if channel.get_state(try_to_connect=True) != grpc.ChannelConnectivity.READY:
                left = budget()
                if left <= 0:
                    raise Unavailable("no coordinator reachable", name=name, lease_id=lease_id)
                try:
                    await asyncio.wait_for(channel.channel_ready(), min(left, self._per_try()))
                except TimeoutError:
                    self._rotate(channel, force=True)
                    await asyncio.sleep(min(next(delays), max(0.0, budget())))
                    continue
                except grpc.aio.UsageError as err:  # the stream's rotation closed it: use the new channel
                    if budget() <= 0:
                        raise Unavailable("channel closed", name=name, lease_id=lease_id) from err
                    await asyncio.sleep(min(next(delays), max(0.0, budget())))
                    continue
            left = None if until is None else until - loop.time()
            request, timeout = make(left)
            try:
                return await getattr(stub, method)(request, timeout=timeout)
            except grpc.aio.AioRpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE or not idempotent:
                    raise from_rpc_error(err, name=name, lease_id=lease_id, token=token) from err
                mapped = from_rpc_error(err, name=name, lease_id=lease_id, token=token)
                if budget() <= 0:
                    raise mapped from err
                self._rotate(channel, force=mapped.reason == "SHUTTING_DOWN")
            except grpc.aio.UsageError as err:  # the channel was closed by a rotation
                if budget() <= 0:
                    raise Unavailable("channel closed", name=name, lease_id=lease_id) from err
            except asyncio.CancelledError:
                if _current_task_cancelling():
                    raise
                # The call (not this task) was cancelled: its channel was closed.
                if not idempotent or budget() <= 0:
                    raise Unavailable("connection closed during the call", name=name, lease_id=lease_id) from None
            await asyncio.sleep(min(next(delays), max(0.0, budget())))

    def _per_try(self) -> float:
        return max(1.0, self._connect_timeout / len(self._addresses))

    # ------------------------------------------------------------------ sessions

    async def _session(self, ttl: int, until: float | None) -> _LeaseState:
        """Return the live lease for ``ttl`` whole seconds, granting one if needed."""
        lease = self._sessions.get(ttl)
        if lease is not None and not lease.lost:
            return lease
        grant_lock = self._grant_locks.setdefault(ttl, asyncio.Lock())
        async with grant_lock:
            lease = self._sessions.get(ttl)
            if lease is not None and not lease.lost:
                return lease
            sent = self._clock()
            resp = await self._call(
                "LeaseGrant",
                lambda _left: (pb.LeaseGrantRequest(ttl_seconds=ttl), self._connect_timeout),
                until=until,
                idempotent=False,
            )
            lease = _LeaseState(resp.lease_id, max(int(resp.ttl_seconds), ttl), sent, clock=self._clock)
            if self._state != "open":
                raise FencepostError("client is closed", lease_id=lease.lease_id)
            self._sessions[ttl] = lease
            self._leases[lease.lease_id] = lease
            self._keepalive_tasks[lease.lease_id] = self._spawn(
                self._keepalive_loop(lease), f"fencepost-keepalive-{lease.lease_id}"
            )
            assert self._wakeup is not None
            self._wakeup.set()
            return lease

    async def _revoke(self, lease_id: int, *, until: float | None) -> bool:
        resp = await self._call(
            "LeaseRevoke",
            lambda _left: (pb.LeaseRevokeRequest(lease_id=lease_id), self._connect_timeout),
            until=until,
            idempotent=True,
            lease_id=lease_id,
        )
        return bool(resp.found)

    def _lose_lease(self, lease: _LeaseState, reason: str) -> None:
        """Declare a lease lost (once): drop the session, stop keepalives, lose its holds."""
        if not lease.mark_lost(reason):
            return
        log.info("fencepost: lease %d lost (%s)", lease.lease_id, reason)
        self._leases.pop(lease.lease_id, None)
        for ttl, current in list(self._sessions.items()):
            if current is lease:
                del self._sessions[ttl]
        task = self._keepalive_tasks.pop(lease.lease_id, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()
        for handle in list(lease.holds.values()):
            self._lose_hold(handle, reason)

    def _lose_hold(self, handle: AsyncLockHandle, reason: str) -> None:
        lease = handle._lease
        if lease.holds.get(handle.name) is handle:
            del lease.holds[handle.name]
        if handle._mark_lost(reason):
            log.info("fencepost: lock %r (lease %d, token %d) lost (%s)", handle.name, handle.lease_id, handle.token,
                     reason)
        self._free_slot(handle)

    # ------------------------------------------------------------------ local exclusion

    def _slot(self, lease_id: int, name: str) -> _Slot:
        slot = self._slots.get((lease_id, name))
        if slot is None:
            slot = self._slots[(lease_id, name)] = _Slot()
        return slot

    def _drop_slot_if_idle(self, lease_id: int, name: str) -> None:
        slot = self._slots.get((lease_id, name))
        if slot is not None and slot.users == 0 and not slot.lock.locked():
            del self._slots[(lease_id, name)]

    def _free_slot(self, handle: AsyncLockHandle) -> None:
        key = (handle.lease_id, handle.name)
        slot = self._slots.get(key)
        if slot is not None and slot.holder is handle:
            slot.holder = None
            slot.lock.release()
            self._drop_slot_if_idle(*key)

    # ------------------------------------------------------------------ acquire / release

    async def acquire(self, name: str, ttl: float = 10.0, timeout: float | None = None) -> AsyncLockHandle:
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
                until granted.

        Returns:
            The handle of the grant, with its fencing token.

        Raises:
            InvalidArgument: bad name, ttl or timeout (before any RPC).
            LockTimeout: not granted within ``timeout``.
            LeaseLost: the lease was lost while waiting, twice in a row.
            ResourceExhausted: too many waiters on the coordinator.
            Unavailable: no coordinator reachable.
        """
        return await self._acquire(name, ttl, timeout, try_once=False)

    async def try_acquire(self, name: str, ttl: float = 10.0) -> AsyncLockHandle:
        """Acquire the lock ``name`` if it is free, without waiting.

        Args:
            name: The lock name.
            ttl: Lease TTL in seconds, as for :meth:`acquire`.

        Returns:
            The handle of the grant, with its fencing token.

        Raises:
            LockHeld: the lock is held (by another client, or by this one
                under the same TTL); carries the holder's lease id and token.
            InvalidArgument: bad name or ttl (before any RPC).
            Unavailable: no coordinator reachable.
        """
        return await self._acquire(name, ttl, None, try_once=True)

    @contextlib.asynccontextmanager
    async def lock(
        self, name: str, ttl: float = 10.0, timeout: float | None = None
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

        Yields:
            The handle of the grant.

        Raises:
            LeaseLost: the hold was lost before the block ended.
            (and everything :meth:`acquire` and :meth:`AsyncLockHandle.release` raise)
        """
        handle = await self.acquire(name, ttl=ttl, timeout=timeout)
        try:
            yield handle
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task in handle._cancelled_tasks and task.uncancel() == 0:
                await self._release_quietly(handle)
                raise LeaseLost(
                    "lock hold was lost", name=handle.name, lease_id=handle.lease_id, reason=handle.lost_reason
                ) from exc
            await self._release_quietly(handle)
            raise
        except BaseException:
            await self._release_quietly(handle)
            raise
        await handle.release()

    async def _release_quietly(self, handle: AsyncLockHandle) -> None:
        try:
            await handle.release()
        except FencepostError as err:
            log.debug("fencepost: release of %r on error exit failed: %r", handle.name, err)

    async def _acquire(self, name: str, ttl: float, timeout: float | None, *, try_once: bool) -> AsyncLockHandle:
        _wire.check_name(name)
        ttl_s = _wire.ttl_to_wire(ttl)
        timeout = _wire.check_timeout(timeout)
        await self._ensure_open()
        loop = asyncio.get_running_loop()
        until = None if timeout is None else loop.time() + timeout
        retries_on_lost_lease = 1
        while True:
            lease = await self._session(ttl_s, until)
            key = (lease.lease_id, name)
            slot = self._slot(*key)
            slot.users += 1
            try:
                if try_once:
                    if slot.lock.locked() or slot.users > 1:
                        holder = slot.holder
                        raise LockHeld(
                            "lock is held by this client",
                            name=name,
                            lease_id=lease.lease_id,
                            holder_lease_id=lease.lease_id,
                            holder_token=holder.token if holder is not None else 0,
                        )
                    await slot.lock.acquire()
                else:
                    await self._wait_slot(slot, until, name)
                try:
                    if lease.lost:
                        slot.lock.release()
                        continue
                    handle = await self._acquire_rpc(lease, name, until, try_once)
                except LeaseLost:
                    slot.lock.release()
                    self._lose_lease(lease, REASON_LEASE_EXPIRED)
                    if retries_on_lost_lease <= 0:
                        raise
                    retries_on_lost_lease -= 1
                    continue
                except BaseException:
                    slot.lock.release()
                    raise
                slot.holder = handle
                return handle
            finally:
                slot.users -= 1
                self._drop_slot_if_idle(*key)

    async def _wait_slot(self, slot: _Slot, until: float | None, name: str) -> None:
        if until is None:
            await slot.lock.acquire()
            return
        left = until - asyncio.get_running_loop().time()
        try:
            await asyncio.wait_for(slot.lock.acquire(), max(0.0, left))
        except TimeoutError:
            raise LockTimeout("lock is held by this client", name=name) from None

    async def _acquire_rpc(
        self, lease: _LeaseState, name: str, until: float | None, try_once: bool
    ) -> AsyncLockHandle:
        def make(left: float | None) -> tuple[Message, float | None]:
            wait_ms, forever = (0, False) if try_once else _wire.wait_to_wire(left)
            request = pb.AcquireRequest(name=name, lease_id=lease.lease_id, wait_ms=wait_ms, wait_forever=forever)
            if forever:
                return request, None
            if try_once:
                return request, self._connect_timeout
            return request, wait_ms / 1000 + _ACQUIRE_SLACK_SECONDS

        resp = await self._call("Acquire", make, until=until, idempotent=True, name=name, lease_id=lease.lease_id)
        if not resp.acquired:
            holder_lease = int(resp.holder.lease_id) if resp.HasField("holder") else 0
            holder_token = int(resp.holder.token) if resp.HasField("holder") else 0
            if not try_once:  # acquire(timeout=0): the one try failed
                raise LockTimeout(
                    f"lock is held (lease {holder_lease}, token {holder_token})", name=name, lease_id=lease.lease_id
                )
            raise LockHeld(
                "lock is held",
                name=name,
                lease_id=lease.lease_id,
                holder_lease_id=holder_lease,
                holder_token=holder_token,
            )
        handle = AsyncLockHandle(name, lease, int(resp.token), self._release)
        if lease.lost:
            # The lease was declared lost while the Acquire was in flight: the
            # grant cannot be trusted. Give it back (in the background: the
            # coordinator may be unreachable) and let _acquire retry on a new
            # lease rather than hand out a handle that is lost from the start.
            self._spawn(self._release_quietly(handle), f"fencepost-release-{name}")
            raise LeaseLost("the lease was lost while acquiring", name=name, lease_id=lease.lease_id,
                            reason=lease.lost_reason or REASON_LEASE_EXPIRED)
        lease.holds[name] = handle
        self._send(pb.KeepAliveRequest(watch=pb.WatchHold(name=name, lease_id=lease.lease_id, token=handle.token)))
        return handle

    async def _release(self, handle: AsyncLockHandle, *, until: float | None = None) -> None:
        """Release ``handle`` (see :meth:`AsyncLockHandle.release`)."""
        if handle._released:
            raise NotHolder("lock was already released", name=handle.name, lease_id=handle.lease_id,
                            reason="NOT_HOLDER")
        if self._state == "new" or self._state == "closed":
            raise FencepostError("client is closed", name=handle.name, lease_id=handle.lease_id)
        if until is None:
            until = asyncio.get_running_loop().time() + self._connect_timeout
        request = pb.ReleaseRequest(name=handle.name, lease_id=handle.lease_id, token=handle.token)

        def make(_left: float | None) -> tuple[Message, float | None]:
            return request, self._connect_timeout

        if handle.lost_reason is not None:
            reason = handle.lost_reason
            if reason == REASON_DEADLINE:
                # The server may not know yet: free the lock early, in the
                # background, so that the caller is told at once (during a
                # partition the call would wait for its whole timeout).
                self._spawn(self._release_lost(make, until, handle), f"fencepost-release-{handle.name}")
            self._finish_release(handle)
            raise LeaseLost("lock hold was lost before release", name=handle.name, lease_id=handle.lease_id,
                            reason=reason)
        handle._releasing = True
        try:
            await self._call("Release", make, until=until, idempotent=False, name=handle.name,
                             lease_id=handle.lease_id, token=handle.token)
        except (NotHolder, StaleTokenError, LeaseLost) as err:
            handle._releasing = False
            if isinstance(err, LeaseLost):
                self._lose_lease(handle._lease, REASON_LEASE_EXPIRED)
            self._lose_hold(handle, err.reason or "NOT_HOLDER")
            self._finish_release(handle)
            raise
        except BaseException:
            handle._releasing = False
            ended = handle._ended_during_release
            if ended == REASON_LEASE_EXPIRED:
                self._lose_lease(handle._lease, ended)
            elif ended is not None:
                # The server ended the hold while our Release was in flight:
                # most likely that very Release. The lock is not held either way.
                self._finish_release(handle)
            raise
        self._finish_release(handle)
        self._send(pb.KeepAliveRequest(unwatch=pb.WatchHold(name=handle.name, lease_id=handle.lease_id,
                                                            token=handle.token)))

    async def _release_lost(self, make: Any, until: float, handle: AsyncLockHandle) -> None:
        """Best-effort Release of a hold already reported lost."""
        try:
            await self._call("Release", make, until=until, idempotent=False, name=handle.name,
                             lease_id=handle.lease_id, token=handle.token)
        except FencepostError as err:
            log.debug("fencepost: release of lost hold %r: %r", handle.name, err)

    def _finish_release(self, handle: AsyncLockHandle) -> None:
        lease = handle._lease
        if lease.holds.get(handle.name) is handle:
            del lease.holds[handle.name]
        self._free_slot(handle)
        handle._mark_released()

    async def describe(self, name: str) -> LockInfo:
        """Report the holder, fencing token, waiters and TTL left of one lock.

        Args:
            name: The lock name.

        Returns:
            A snapshot taken at one etcd revision.

        Raises:
            InvalidArgument: bad name.
            Unavailable: no coordinator reachable.
        """
        _wire.check_name(name)
        await self._ensure_open()
        resp = await self._call(
            "Describe",
            lambda _left: (pb.DescribeRequest(name=name), self._connect_timeout),
            until=None,
            idempotent=True,
            name=name,
        )
        return LockInfo(
            name=name,
            held=bool(resp.held),
            holder_lease_id=int(resp.holder.lease_id) if resp.held else 0,
            holder_token=int(resp.holder.token) if resp.held else 0,
            ttl_remaining=float(resp.ttl_remaining_seconds) if resp.held and resp.ttl_remaining_seconds >= 0 else None,
            ttl=int(resp.ttl_seconds),
            waiter_count=int(resp.waiter_count),
            waiters=tuple((int(w.lease_id), int(w.token)) for w in resp.waiters),
            revision=int(resp.revision),
        )

    # ------------------------------------------------------------------ keepalive stream

    def _send(self, message: pb.KeepAliveRequest) -> None:
        """Queue a message on the current stream; dropped when there is none (resent on reconnect)."""
        if self._outbox is not None:
            self._outbox.put_nowait(message)

    def _send_keepalive(self, lease: _LeaseState) -> None:
        if self._outbox is None or lease.lost:
            return
        now = self._clock()
        for request_id, (old, sent) in list(self._pending.items()):
            if sent + old.ttl < now:  # an answer could no longer move any deadline
                del self._pending[request_id]
        request_id = next(self._request_ids)
        self._pending[request_id] = (lease, now)
        self._send(pb.KeepAliveRequest(keepalive=pb.LeaseKeepAlive(lease_id=lease.lease_id, request_id=request_id)))

    async def _keepalive_loop(self, lease: _LeaseState) -> None:
        period = lease.ttl * self._fraction
        while not lease.lost and self._state == "open":
            self._send_keepalive(lease)
            await asyncio.sleep(period)

    async def _drain(self, outbox: asyncio.Queue[pb.KeepAliveRequest | None]) -> AsyncIterator[pb.KeepAliveRequest]:
        while True:
            message = await outbox.get()
            if message is None:
                return
            yield message

    def _resend_all(self) -> None:
        for lease in list(self._leases.values()):
            self._send_keepalive(lease)
            for handle in list(lease.holds.values()):
                self._send(pb.KeepAliveRequest(watch=pb.WatchHold(name=handle.name, lease_id=lease.lease_id,
                                                                  token=handle.token)))

    async def _stream_loop(self) -> None:
        delays = _wire.backoff_delays()
        while self._state in ("open", "closing"):
            channel, stub = self._channel, self._stub
            assert channel is not None and stub is not None
            outbox: asyncio.Queue[pb.KeepAliveRequest | None] = asyncio.Queue()
            call = None
            force = False
            answered = False
            try:
                call = stub.KeepAlive(self._drain(outbox))
                self._outbox = outbox
                self._pending.clear()
                self._resend_all()
                async for response in call:
                    if not answered:
                        answered = True
                        delays = _wire.backoff_delays()
                    self._on_response(response)
                force = True  # the server ended the stream: try another one
                log.debug("fencepost: keepalive stream to %s ended", self.address)
            except grpc.aio.AioRpcError as err:
                mapped = from_rpc_error(err)
                force = mapped.reason == "SHUTTING_DOWN"
                # Log the first failure of a working stream, not every retry.
                log.log(logging.INFO if answered else logging.DEBUG,
                        "fencepost: keepalive stream to %s broke: %s", self.address, mapped)
            except grpc.aio.UsageError:
                pass  # the channel was closed by a rotation
            except asyncio.CancelledError:
                if _current_task_cancelling():
                    raise
            finally:
                if self._outbox is outbox:
                    self._outbox = None
                outbox.put_nowait(None)
                if call is not None:
                    call.cancel()
            if self._state != "open":
                return
            self._rotate(channel, force=force)
            await asyncio.sleep(next(delays))

    def _on_response(self, response: pb.KeepAliveResponse) -> None:
        kind = response.WhichOneof("response")
        if kind == "keepalive":
            ack = response.keepalive
            entry = self._pending.pop(ack.request_id, None)
            if entry is None:
                return
            lease, sent = entry
            if lease.lease_id != ack.lease_id or lease.lost:
                return
            if not lease.on_ack(sent, ack.ttl_seconds):
                self._lose_lease(lease, REASON_LEASE_EXPIRED)
        elif kind == "hold_ended":
            event = response.hold_ended
            reason = reason_name(event.reason or ErrorReason.NOT_HOLDER)
            found = self._leases.get(event.lease_id)
            if found is None:
                return
            handle = found.holds.get(event.name)
            if handle is None or handle.token != event.token:
                return
            if handle._releasing:
                handle._ended_during_release = reason
                return
            if reason == REASON_LEASE_EXPIRED:
                self._lose_lease(found, reason)
            else:
                self._lose_hold(handle, reason)

    async def _deadline_loop(self) -> None:
        """Declare leases lost when their local deadline passes (monotonic clock only)."""
        assert self._wakeup is not None
        while self._state in ("open", "closing"):
            now = self._clock()
            nearest: float | None = None
            for lease in list(self._leases.values()):
                if lease.deadline <= now:
                    self._lose_lease(lease, REASON_DEADLINE)
                elif nearest is None or lease.deadline < nearest:
                    nearest = lease.deadline
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), None if nearest is None else nearest - now)
            except TimeoutError:
                pass
