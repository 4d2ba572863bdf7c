"""The lock recipe, client side: grant leases, acquire and release holds over the transport.

:class:`Locker` makes the calls of the lock protocol (LeaseGrant,
LeaseRevoke, Acquire, Release, Withdraw) through the
:class:`~fencepost.client._transport.transport.Transport` (Acquire, Release and
Withdraw as messages on the KeepAlive stream when it serves them, see
:mod:`~fencepost.client._leases.calls`; the same rules either way) and keeps the
:class:`~fencepost.client._leases.lease.LeasePool` in step with their answers:

- a lease is granted once per requested TTL and shared by every lock taken
  with that TTL; a second local acquire of a name held under that lease
  waits for the local holder (the pool's slot), so that the coordinator is
  never asked for a lock its caller already holds;
- a grant that arrives after its lease was declared lost is given back, and
  the acquire retries once on a new lease;
- a release keeps the hold until the server confirms, and classifies a
  refusal: NOT_HOLDER and STALE_TOKEN lose the hold, LEASE_EXPIRED loses the
  lease; a HoldEnded that arrived while the Release was in flight settles a
  release whose answer was lost.

No state outlives the call that made it unless the caller holds it:

- a LeaseGrant whose caller is cancelled goes on, and the lease it grants is
  revoked (nobody would know of it, yet its keys would live for its TTL);
- an Acquire that ends without a definite answer (cancelled, the client's
  own deadline, the transport failed) is withdrawn: a Withdraw call deletes
  the key it may have left, a queued wait or a grant that never reached the
  caller. The caller's slot stays taken until the withdrawal is done, so a
  later local acquire of the same (lease, name) cannot be the one withdrawn;
- a Release whose caller is cancelled goes on in the background: the hold
  stays valid until the coordinator answers, then it is released (never
  reported lost because its caller gave up).

With tracing on, a release is a span ``fencepost.release`` (its Release
call a child; see :mod:`~fencepost.client.tracing`); the acquire's span is
made by the client. A clean-up spawned by a call is in the call's trace.

A cancelled call waits up to :data:`CLEANUP_WAIT_SECONDS` for its clean-up
before its cancellation completes (so that, normally, nothing is left once
it has); a call that failed otherwise raises at once, keeping its deadline.
A clean-up that takes longer goes on in the background, retried while its
lease lives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from google.protobuf.message import Message

from .._transport import wire
from .._leases.lease import Lease, LeasePool, Slot
from .._leases.stream import KeepAliveStream, Spawn
from ..tracing import OUTCOME, failed
from .._transport.transport import Transport, current_task_cancelling
from ..errors import (
    REASON_DEADLINE,
    FencepostError,
    InvalidArgument,
    LeaseLost,
    LockHeld,
    LockTimeout,
    NotHolder,
    StaleTokenError,
    TlsError,
    Unavailable,
)
from ..handle import AsyncLockHandle
from ..v1 import kinds
from ..v1 import lock_pb2 as pb
from ..v1.details import ErrorReason, reason_name
from ..v1.retry import CLIENT_BACKOFF

__all__ = ["Locker"]

log = logging.getLogger("fencepost.client")

LEASE_EXPIRED = reason_name(ErrorReason.LEASE_EXPIRED)
NOT_HOLDER = reason_name(ErrorReason.NOT_HOLDER)

#: Slack added to the gRPC deadline of a bounded Acquire, in seconds, so that
#: the coordinator's own ACQUIRE_TIMEOUT answer normally arrives first.
ACQUIRE_SLACK_SECONDS = 1.0

#: Longest a cancelled call waits for its clean-up (a Withdraw, a LeaseRevoke)
#: before its cancellation completes, in seconds; the clean-up goes on after that.
CLEANUP_WAIT_SECONDS = 1.0

#: Reasons of a refused Acquire after which the coordinator has left nothing of
#: that call in etcd (bad input, its wait timed out and was withdrawn, the lease
#: is gone, the queue was full, a limit refused the call before it did anything): no withdrawal is needed.
SETTLED_REASONS = frozenset(reason_name(r) for r in (
    ErrorReason.INVALID_FIELD, ErrorReason.ACQUIRE_TIMEOUT, ErrorReason.LEASE_EXPIRED, ErrorReason.TOO_MANY_WAITERS,
    ErrorReason.LIMIT_EXCEEDED))


class Locker:
    """Leases and holds of one client, kept in step with the coordinator's answers.

    Args:
        transport: Where the calls go.
        pool: The client's leases, holds and slots.
        stream: The keepalive stream (to watch and unwatch holds).
        spawn: Starts a background task owned by the client.
        on_new_lease: Called with each newly granted lease (to start its
            keepalives and watch its deadline).
        state: The client's state: ``"new"``, ``"open"``, ``"closing"`` or
            ``"closed"`` (a lease granted once the client is no longer open is
            not kept; a release needs an open or closing client).
        on_idle: Called when a lease may have become idle (an acquire ended,
            a hold was released), so that the pool's bound applies at once.
    """

    def __init__(
        self,
        transport: Transport,
        pool: LeasePool,
        stream: KeepAliveStream,
        *,
        spawn: Spawn,
        on_new_lease: Callable[[Lease], None],
        state: Callable[[], str],
        on_idle: Callable[[], None] = lambda: None,
    ) -> None:
        self.transport = transport
        self.pool = pool
        self.stream = stream
        self._spawn = spawn
        self._on_new_lease = on_new_lease
        self._state = state
        self._on_idle = on_idle

    @property
    def _call_timeout(self) -> float:
        return self.transport.connect_timeout

    # ------------------------------------------------------------------ leases

    async def lease_for(self, ttl: int, until: float | None) -> Lease:
        """The live lease for a requested TTL of ``ttl`` whole seconds, granting one if needed.

        Args:
            ttl: Requested TTL in whole seconds.
            until: Loop time after which to stop trying, or None.

        Returns:
            A live lease (its granted TTL may exceed ``ttl``).

        Raises:
            FencepostError: the grant failed, or the client closed meanwhile.
        """
        lease = self.pool.live(ttl)
        if lease is not None:
            return lease
        async with self.pool.grant_lock(ttl):
            lease = self.pool.live(ttl)
            if lease is not None:
                return lease
            sent = self.pool.clock()
            # The call is not cancelled with its caller: a lease granted for a
            # caller that gave up must be revoked, so its id must arrive.
            grant = asyncio.ensure_future(self.transport.call(
                "LeaseGrant",
                lambda left: (pb.LeaseGrantRequest(ttl_seconds=ttl), _bounded(self._call_timeout, left)),
                until=until,
                idempotent=False,
            ))
            try:
                resp = await asyncio.shield(grant)
            except asyncio.CancelledError:
                await self._clean_up(self._revoke_granted(grant), "fencepost-revoke-cancelled-grant")
                raise
            lease = Lease(resp.lease_id, max(int(resp.ttl_seconds), ttl), sent, clock=self.pool.clock,
                          secret=resp.lease_secret)
            if self._state() != "open":
                self._spawn(self._revoke_quietly(lease.lease_id, lease.secret), "fencepost-revoke-after-close")
                raise FencepostError("client is closed", lease_id=lease.lease_id)
            self.pool.add(ttl, lease)
            self._on_new_lease(lease)
            return lease

    async def _revoke_granted(self, grant: asyncio.Future[Any]) -> None:
        """Revoke the lease of a LeaseGrant whose caller was cancelled, once its id is known."""
        try:
            resp = await grant
        except BaseException:  # noqa: BLE001 - no lease was granted to us, or we cannot know its id
            return
        await self._revoke_quietly(int(resp.lease_id), resp.lease_secret)

    async def _revoke_quietly(self, lease_id: int, secret: str) -> None:
        try:
            await self.revoke(lease_id, until=None, secret=secret)
        except FencepostError as err:
            log.debug("fencepost: revoke of unused lease %d failed (it expires by its TTL): %r", lease_id, err)

    async def _clean_up(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        """Run a clean-up in the background; a cancelled caller waits for it up to :data:`CLEANUP_WAIT_SECONDS`.

        A caller that failed otherwise (a timeout, Unavailable) does not wait:
        its deadline is kept.
        """
        task = self._spawn(coro, name)
        if not current_task_cancelling():
            return
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(asyncio.shield(task), CLEANUP_WAIT_SECONDS)

    async def revoke(self, lease_id: int, *, until: float | None, secret: str = "") -> bool:
        """Revoke a lease (idempotent).

        Args:
            lease_id: The lease.
            until: Loop time after which to stop trying, or None.
            secret: The lease's secret (:attr:`Lease.secret`).

        Returns:
            Whether the coordinator still knew the lease.
        """
        resp = await self.transport.call(
            "LeaseRevoke",
            lambda _left: (pb.LeaseRevokeRequest(lease_id=lease_id), self._call_timeout),
            until=until,
            idempotent=True,
            lease_id=lease_id,
            secret=secret,
        )
        return bool(resp.found)

    # ------------------------------------------------------------------ acquire

    async def acquire(self, name: str, ttl: int, until: float | None, *, try_once: bool,
                      lock_delay: int = 0) -> AsyncLockHandle:
        """Acquire ``name`` under the lease for ``ttl`` (see ``AsyncLockClient.acquire``).

        Args:
            name: The lock name (checked).
            ttl: Requested TTL in whole seconds (checked).
            until: Loop time after which to give up waiting, or None.
            try_once: Fail with LockHeld instead of waiting.
            lock_delay: The hold's lock-delay in whole seconds (checked), 0 for none.

        Returns:
            The handle of the grant.

        Raises:
            LockHeld, LockTimeout, LeaseLost, FencepostError: as the public methods say.
        """
        retries_on_lost_lease = 1
        while True:
            lease = await self.lease_for(ttl, until)
            self.pool.used(lease)  # not idle while this acquire runs (no await since lease_for returned)
            key = (lease.lease_id, name)
            slot = self.pool.slot(*key)
            slot.users += 1
            try:
                if try_once:
                    if slot.lock.locked() or slot.users > 1:
                        holder = slot.holder
                        raise LockHeld(
                            _held_here(name, lease.lease_id, f"lock {name!r} is held by this client (lease "
                                                             f"{lease.lease_id:#x})"),
                            name=name,
                            lease_id=lease.lease_id,
                            holder_lease_id=lease.lease_id,
                            holder_token=holder.token if holder is not None else 0,
                        )
                    await slot.lock.acquire()
                else:
                    await _wait_slot(slot, until, name, _held_here(name, lease.lease_id))
                try:
                    if lease.lost:
                        slot.lock.release()
                        continue
                    handle = await self._acquire_rpc(lease, name, until, try_once, lock_delay)
                except LeaseLost:
                    slot.lock.release()
                    self.pool.lose(lease, LEASE_EXPIRED)
                    if retries_on_lost_lease <= 0:
                        raise
                    retries_on_lost_lease -= 1
                    continue
                except BaseException as err:
                    if _settled(err) or lease.lost or self._state() != "open":
                        slot.lock.release()
                        raise
                    # The Acquire may have queued a key, or been granted, for a
                    # caller who will never know: withdraw it, keeping the slot
                    # until that is done.
                    await self._clean_up(self._withdraw(lease, name, slot), f"fencepost-withdraw-{name}")
                    raise
                slot.holder = handle
                return handle
            finally:
                slot.users -= 1
                self.pool.drop_slot_if_idle(*key)
                self.pool.unused(lease)
                self._on_idle()

    async def _withdraw(self, lease: Lease, name: str, slot: Slot) -> None:
        """Delete this lease's key in lock ``name`` (Withdraw), retried while the lease lives; then free ``slot``."""
        delays = CLIENT_BACKOFF.delays()
        request = pb.WithdrawRequest(name=name, lease_id=lease.lease_id, request_id=wire.new_request_id())
        try:
            while not lease.lost and self._state() == "open":
                try:
                    resp = await self.transport.call(
                        "Withdraw", lambda _left: (request, self._call_timeout),
                        until=None, idempotent=True, name=name, lease_id=lease.lease_id, secret=lease.secret,
                        stream=self.stream.calls)
                except LeaseLost:
                    return  # the lease is gone, and its keys with it
                except (Unavailable, TlsError) as err:
                    log.debug("fencepost: withdraw of %r failed, retrying: %r", name, err)
                    await asyncio.sleep(next(delays))
                    continue
                except FencepostError as err:
                    log.warning("fencepost: could not withdraw %r of lease %d (its key ends with the lease): %s",
                                name, lease.lease_id, err)
                    return
                if resp.found:
                    log.debug("fencepost: withdrew the %s of %r (lease %d) left by an abandoned acquire",
                              "grant" if resp.held else "wait", name, lease.lease_id)
                return
        finally:
            slot.lock.release()
            self.pool.drop_slot_if_idle(lease.lease_id, name)

    async def _acquire_rpc(self, lease: Lease, name: str, until: float | None, try_once: bool,
                           lock_delay: int = 0) -> AsyncLockHandle:
        request_id = wire.new_request_id()  # the same on every attempt (only the wait left changes)

        def make(left: float | None) -> tuple[Message, float | None]:
            wait_ms, forever = (0, False) if try_once else wire.wait_to_wire(left)
            request = pb.AcquireRequest(name=name, lease_id=lease.lease_id, wait_ms=wait_ms, wait_forever=forever,
                                        lock_delay_seconds=lock_delay, request_id=request_id)
            if forever:
                return request, None
            if try_once:
                return request, self._call_timeout
            return request, wait_ms / 1000 + ACQUIRE_SLACK_SECONDS

        resp = await self.transport.call("Acquire", make, until=until, idempotent=True, name=name,
                                         lease_id=lease.lease_id, secret=lease.secret, stream=self.stream.calls)
        if not resp.acquired:
            holder_lease = int(resp.holder.lease_id) if resp.HasField("holder") else 0
            holder_token = int(resp.holder.token) if resp.HasField("holder") else 0
            if not try_once:  # acquire(timeout=0): the one try failed
                raise LockTimeout(
                    f"lock is held (lease {holder_lease}, token {holder_token})", name=name, lease_id=lease.lease_id
                )
            message = (f"lock {name!r} is held by lease {holder_lease:#x} with token {holder_token}"
                       if resp.HasField("holder") else f"lock {name!r} is free but the lock-delay of a holder that "
                       "was lost has not passed yet")
            raise LockHeld(message, name=name, lease_id=lease.lease_id, holder_lease_id=holder_lease,
                           holder_token=holder_token)
        handle = AsyncLockHandle(name, lease, int(resp.token), self.release)
        if lease.lost:
            # The lease was declared lost while the Acquire was in flight: the
            # grant cannot be trusted. Give it back (in the background: the
            # coordinator may be unreachable) and let acquire() retry on a new
            # lease rather than hand out a handle that is lost from the start.
            self._spawn(self.release_quietly(handle), f"fencepost-release-{name}")
            raise LeaseLost("the lease was lost while acquiring", name=name, lease_id=lease.lease_id,
                            reason=lease.lost_reason or LEASE_EXPIRED)
        lease.holds[handle.hold_name] = handle
        self.stream.watch(handle)  # sends nothing when the grant came on the current stream: it is watched there
        return handle

    # ------------------------------------------------------------------ release

    async def release(self, handle: AsyncLockHandle, *, until: float | None = None) -> None:
        """Release ``handle`` (see :meth:`AsyncLockHandle.release`).

        Args:
            handle: The hold.
            until: Loop time after which to stop trying; ``connect_timeout``
                from now by default.

        Raises:
            NotHolder, StaleTokenError, LeaseLost, Unavailable, FencepostError:
                as :meth:`AsyncLockHandle.release` says.
        """
        tracing = self.transport.tracing
        tracer = tracing.tracer()
        if tracer is None:
            return await self._release(handle, until)
        with tracer.start_as_current_span(
                "fencepost.release", attributes=tracing.lock_attributes(handle.name, handle.lease_id, handle.token),
                record_exception=False, set_status_on_exception=False) as span:
            try:
                await self._release(handle, until)
            except BaseException as exc:
                failed(span, exc)
                raise
            span.set_attribute(OUTCOME, "released")

    async def _release(self, handle: AsyncLockHandle, until: float | None) -> None:
        if handle._released:
            raise NotHolder(f"{handle.what} was already released", name=handle.name, lease_id=handle.lease_id)
        if self._state() in ("new", "closed"):
            raise FencepostError("client is closed", name=handle.name, lease_id=handle.lease_id)
        if until is None:
            until = asyncio.get_running_loop().time() + self._call_timeout
        if handle.lost_reason is not None:
            reason = handle.lost_reason
            if reason == REASON_DEADLINE:
                # The server may not know yet: free the lock early, in the
                # background, so that the caller is told at once (during a
                # partition the call would wait for its whole timeout).
                self._spawn(self._release_lost(handle, until), f"fencepost-release-{handle.name}")
            self.pool.finish_release(handle)
            raise LeaseLost(f"{'lock hold' if handle.what == 'lock' else handle.what} was lost before release",
                            name=handle.name, lease_id=handle.lease_id,
                            reason=reason)
        if handle._release_task is None:
            handle._releasing = True
            # Not cancelled with its caller: a Release that reached the server
            # may have committed, and only its answer tells (see _settle_release).
            task = handle._release_task = asyncio.ensure_future(self._release_rpc(handle, until))
            task.add_done_callback(lambda done: self._settle_release(handle, done))
        await asyncio.shield(handle._release_task)

    def _settle_release(self, handle: AsyncLockHandle, done: asyncio.Future[None]) -> None:
        """Apply the outcome of a Release call to the hold (also when its caller was cancelled)."""
        handle._release_task = None
        handle._releasing = False
        if done.cancelled():
            return
        err = done.exception()
        if err is None:
            self.pool.finish_release(handle)
            self.stream.unwatch(handle)  # sends nothing when released on the current stream: that dropped the watch
            self._on_idle()
            return
        if isinstance(err, (NotHolder, StaleTokenError, LeaseLost)):
            if isinstance(err, LeaseLost):
                self.pool.lose(handle._lease, LEASE_EXPIRED)
            self.pool.lose_hold(handle, err.reason or NOT_HOLDER)
            self.pool.finish_release(handle)
            return
        ended = handle._ended_during_release
        if ended == LEASE_EXPIRED:
            self.pool.lose(handle._lease, ended)
        elif ended is not None:
            # The server ended the hold while our Release was in flight:
            # most likely that very Release. The lock is not held either way.
            self.pool.finish_release(handle)

    async def release_quietly(self, handle: AsyncLockHandle) -> None:
        """Release ``handle``, logging (not raising) a FencepostError."""
        try:
            await handle.release()
        except FencepostError as err:
            log.debug("fencepost: release of %r on error exit failed: %r", handle.name, err)

    async def _release_rpc(self, handle: AsyncLockHandle, until: float) -> None:
        # One request id per hold: every attempt of its release, and a release() called again after one
        # that failed (Unavailable), is the same call, so a retry of a Release that committed answers OK.
        # Hence retried after UNAVAILABLE like an idempotent call.
        if not handle._request_id:
            handle._request_id = wire.new_request_id()
        request = pb.ReleaseRequest(name=handle.name, lease_id=handle.lease_id, token=handle.token,
                                    request_id=handle._request_id)
        await self.transport.call("Release", lambda left: (request, _bounded(self._call_timeout, left)),
                                  until=until, idempotent=True, name=handle.name, lease_id=handle.lease_id,
                                  token=handle.token, secret=handle._lease.secret, stream=self.stream.calls)

    async def _release_lost(self, handle: AsyncLockHandle, until: float) -> None:
        """Best-effort Release of a hold already reported lost."""
        try:
            await self._release_rpc(handle, until)
        except FencepostError as err:
            log.debug("fencepost: release of lost hold %r: %r", handle.name, err)


def _held_here(name: str, lease_id: int, lock: str = "lock is held by this client") -> str:
    """The message of an acquire refused because this client holds lock ``name`` under that lease already:
    ``lock`` for a lock, the election's words for an election (``name`` its internal name)."""
    public = kinds.public_hold(name)
    if public.kind == kinds.HoldKind.HOLD_KIND_ELECTION:
        return f"election {public.name!r} is led by this client (lease {lease_id:#x})"
    return lock


def _bounded(call_timeout: float, left: float | None) -> float:
    """The gRPC deadline of one attempt: ``call_timeout``, or less when the caller has less time ``left``."""
    return call_timeout if left is None else max(0.001, min(call_timeout, left))


def _settled(err: BaseException) -> bool:
    """Whether an Acquire that failed with ``err`` is known to have left nothing in etcd."""
    if not isinstance(err, FencepostError):
        return False  # cancelled: the call may have queued or been granted
    if isinstance(err, (LockHeld, InvalidArgument)):
        return True
    if err.code is None:  # made here: a one-try acquire answered "held" (settled), or no answer at all
        return isinstance(err, LockTimeout)
    return err.reason in SETTLED_REASONS


async def _wait_slot(slot: Slot, until: float | None, name: str, held: str = "lock is held by this client") -> None:
    """Wait for the local holder of ``slot`` to let go, until ``until`` (loop time) at most.

    Args:
        slot: The local exclusion (one holder per lease and lock name).
        until: Loop time to give up at; None: never.
        name: The lock's name (an election's internal one), for the LockTimeout.
        held: The LockTimeout's message (what this client holds).

    Raises:
        LockTimeout: the local holder still holds it at ``until``.
    """
    if until is None:
        await slot.lock.acquire()
        return
    left = until - asyncio.get_running_loop().time()
    try:
        await asyncio.wait_for(slot.lock.acquire(), max(0.0, left))
    except TimeoutError:
        raise LockTimeout(held, name=name) from None
