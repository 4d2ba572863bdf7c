"""The holds of one client: leases granted and revoked, the one acquire loop, the one release.

:class:`Holds` makes the calls every recipe shares (LeaseGrant,
LeaseRevoke) and runs each acquire and release of a lock, a semaphore
permit or an election's leadership through its
:class:`~.recipe.Recipe` (the calls that differ), keeping the
:class:`~fencepost.client._leases.lease.LeasePool` in step with the answers:

- a lease is granted once per requested TTL and shared by every hold taken
  with that TTL; a second local acquire of a name held under that lease
  waits for the local holder (the pool's slot), so that the coordinator is
  never asked for a hold its caller already has;
- a grant that arrives after its lease was declared lost is given back, and
  the acquire retries once on a new lease;
- a release keeps the hold until the server confirms, and classifies a
  refusal: NOT_HOLDER and STALE_TOKEN lose the hold, LEASE_EXPIRED loses the
  lease; a HoldEnded that arrived while the release was in flight settles a
  release whose answer was lost.

No state outlives the call that made it unless the caller holds it:

- a LeaseGrant whose caller is cancelled goes on, and the lease it grants is
  revoked (nobody would know of it, yet its keys would live for its TTL);
  so is a lease granted once the client began to close, and no LeaseGrant
  is sent then: ``close()`` waits (:meth:`Holds.finish`) for the grants in
  flight and these revocations, so that no lease outlives the client;
- an acquire call that ends without a definite answer (cancelled, the client's
  own deadline, the transport failed) is withdrawn (the recipe's
  withdrawal deletes the key it may have left, a queued wait or a grant
  that never reached the caller). The caller's slot stays taken until the
  withdrawal is done, so a later local acquire of the same (lease, name)
  cannot be the one withdrawn;
- a release whose caller is cancelled goes on in the background: the hold
  stays valid until the coordinator answers, then it is released (never
  reported lost because its caller gave up).

With tracing on, a release is a span ``fencepost.release`` (its call a
child; see :mod:`~fencepost.client.tracing`); the acquire's span is made by
the client. A clean-up spawned by a call is in the call's trace.

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
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from .._leases.lease import Lease, LeasePool, Slot
from .._leases.stream import KeepAliveStream, Spawn
from .._transport.transport import Transport, current_task_cancelling
from ..errors import REASON_DEADLINE, FencepostError, LeaseLost, LockHeld, LockTimeout, NotHolder, \
    StaleTokenError, Unavailable
from ..handle import AsyncLockHandle
from ..tracing import OUTCOME, failed
from ..v1 import lock_pb2 as pb
from ..v1.retry import CLIENT_BACKOFF
from .recipe import LEASE_EXPIRED, NOT_HOLDER, Recipe, bounded

__all__ = ["CLEANUP_WAIT_SECONDS", "Holds", "ReleaseCall"]

log = logging.getLogger("fencepost.client")

#: Longest a cancelled call waits for its clean-up (a withdrawal, a LeaseRevoke)
#: before its cancellation completes, in seconds; the clean-up goes on after that.
CLEANUP_WAIT_SECONDS = 1.0

# An acquire with less than this left to wait makes one try (the wire's wait_ms counts in ms).
_ONE_MS = 0.001

#: A recipe's release call: (handle, loop time to stop trying at) -> None (see Recipe.release_call).
ReleaseCall = Callable[[AsyncLockHandle, float], Awaitable[None]]


class Holds:
    """Leases and holds of one client, kept in step with the coordinator's answers.

    Args:
        transport: Where the calls go.
        pool: The client's leases, holds and slots.
        stream: The keepalive stream (to watch and unwatch holds; its calls).
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
        self.spawn = spawn
        self._on_new_lease = on_new_lease
        self._state = state
        self._on_idle = on_idle
        # LeaseGrants in flight and revocations of leases nobody keeps: close() lets them finish.
        self._finishing: set[asyncio.Future[Any]] = set()

    @property
    def call_timeout(self) -> float:
        """The gRPC deadline of a call that does not wait, in seconds (the client's ``connect_timeout``)."""
        return self.transport.connect_timeout

    @property
    def is_open(self) -> bool:
        """Whether the client is open (a withdrawal or a lease is only worth it then)."""
        return self._state() == "open"

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
            if not self.is_open:  # closing: a new lease would only have to be revoked
                raise FencepostError("client is closed")
            sent = self.pool.clock()
            # The call is not cancelled with its caller: a lease granted for a
            # caller that gave up must be revoked, so its id must arrive.
            grant = self._finishes(asyncio.ensure_future(self._grant(ttl, until)))
            try:
                resp = await asyncio.shield(grant)
            except asyncio.CancelledError:
                await self.clean_up(self._revoke_granted(grant), "fencepost-revoke-cancelled-grant", finishes=True)
                raise
            lease = Lease(resp.lease_id, max(int(resp.ttl_seconds), ttl), sent, clock=self.pool.clock,
                          secret=resp.lease_secret)
            if not self.is_open:
                self.revoke_in_background(lease.lease_id, lease.secret, "fencepost-revoke-after-close")
                raise FencepostError("client is closed", lease_id=lease.lease_id)
            self.pool.add(ttl, lease)
            self._on_new_lease(lease)
            return lease

    async def _grant(self, ttl: int, until: float | None) -> Any:
        """LeaseGrant; a lease granted once the client began to close is revoked here, before this returns.

        Raises:
            FencepostError: the call failed, or the client closed meanwhile (the lease is revoked).
        """
        resp = await self.transport.call(
            "LeaseGrant", lambda left: (pb.LeaseGrantRequest(ttl_seconds=ttl), bounded(self.call_timeout, left)),
            until=until, idempotent=False)
        if not self.is_open:
            await self.revoke_quietly(int(resp.lease_id), resp.lease_secret)
            raise FencepostError("client is closed", lease_id=int(resp.lease_id))
        return resp

    def _finishes(self, future: asyncio.Future[Any]) -> asyncio.Future[Any]:
        """Make :meth:`finish` wait for ``future``."""
        self._finishing.add(future)
        future.add_done_callback(self._finishing.discard)
        return future

    def revoke_in_background(self, lease_id: int, secret: str, name: str) -> None:
        """Revoke a lease nobody keeps in a task of the client's that :meth:`finish` waits for."""
        self._finishes(self.spawn(self.revoke_quietly(lease_id, secret), name))

    async def finish(self, until: float) -> None:
        """Wait (up to loop time ``until``) for the LeaseGrants in flight and the revocations of leases nobody
        keeps: ``close()`` calls it before it cancels the client's tasks, so that no lease outlives the client."""
        loop = asyncio.get_running_loop()
        while self._finishing and (left := until - loop.time()) > 0:
            await asyncio.wait(set(self._finishing), timeout=left)

    async def _revoke_granted(self, grant: asyncio.Future[Any]) -> None:
        """Revoke the lease of a LeaseGrant whose caller was cancelled, once its id is known."""
        try:
            resp = await grant
        except BaseException:  # noqa: BLE001 - no lease was granted to us, or we cannot know its id
            return
        await self.revoke_quietly(int(resp.lease_id), resp.lease_secret)

    async def revoke_quietly(self, lease_id: int, secret: str) -> None:
        """Revoke a lease this client no longer uses, logging (not raising) a failure: it expires by its TTL."""
        try:
            await self.revoke(lease_id, until=None, secret=secret)
        except FencepostError as err:
            log.debug("fencepost: revoke of unused lease %d failed (it expires by its TTL): %r", lease_id, err)

    async def clean_up(self, coro: Coroutine[Any, Any, None], name: str, *, finishes: bool = False) -> None:
        """Run a clean-up in the background; a cancelled caller waits for it up to :data:`CLEANUP_WAIT_SECONDS`.

        A caller that failed otherwise (a timeout, Unavailable) does not wait:
        its deadline is kept. ``finishes``: ``close()`` waits for it too (:meth:`finish`).
        """
        task = self.spawn(coro, name)
        if finishes:
            self._finishes(task)
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
            lambda _left: (pb.LeaseRevokeRequest(lease_id=lease_id), self.call_timeout),
            until=until,
            idempotent=True,
            lease_id=lease_id,
            secret=secret,
        )
        return bool(resp.found)

    # ------------------------------------------------------------------ acquire

    async def acquire(self, recipe: Recipe, ttl: int, until: float | None, *, try_once: bool) -> AsyncLockHandle:
        """Acquire what ``recipe`` names under the lease for ``ttl`` (see ``AsyncLockClient.acquire``).

        An acquire with less than a millisecond left to wait (``timeout`` 0)
        makes one try (with the usual time for its calls to reach a coordinator
        and be answered): LockTimeout when it is held.

        Args:
            recipe: The calls, names and words of this acquire.
            ttl: Requested TTL in whole seconds (checked).
            until: Loop time after which to give up waiting, or None.
            try_once: Fail with LockHeld instead of waiting.

        Returns:
            The handle of the grant.

        Raises:
            LockHeld, LockTimeout, LeaseLost, FencepostError: as the public methods say.
        """
        if until is not None and not try_once and until - asyncio.get_running_loop().time() < _ONE_MS:
            try:
                return await self._acquire(recipe, ttl, None, try_once=True)
            except LockHeld as held:
                raise LockTimeout(recipe.not_granted_now(held), name=recipe.name, lease_id=held.lease_id) from None
        return await self._acquire(recipe, ttl, until, try_once=try_once)

    async def _acquire(self, recipe: Recipe, ttl: int, until: float | None, *, try_once: bool) -> AsyncLockHandle:
        retries_on_lost_lease = 1
        while True:
            lease = await self.lease_for(ttl, until)
            self.pool.used(lease)  # not idle while this acquire runs (no await since lease_for returned)
            key = (lease.lease_id, recipe.local_name)
            slot = self.pool.slot(*key)
            slot.users += 1
            try:
                if try_once:
                    if slot.lock.locked() or slot.users > 1:
                        holder = slot.holder
                        raise LockHeld(recipe.held_here(lease.lease_id, waiting=False), name=recipe.name,
                                       lease_id=lease.lease_id, holder_lease_id=lease.lease_id,
                                       holder_token=holder.token if holder is not None else 0)
                    await slot.lock.acquire()
                else:
                    await _wait_slot(slot, until, recipe.name, recipe.held_here(lease.lease_id, waiting=True))
                try:
                    if lease.lost:
                        slot.lock.release()
                        continue
                    handle = self.keep(recipe.acting, await recipe.acquire_call(lease, until, try_once))
                except LeaseLost:
                    slot.lock.release()
                    self.pool.lose(lease, LEASE_EXPIRED)
                    if retries_on_lost_lease <= 0:
                        raise
                    retries_on_lost_lease -= 1
                    continue
                except BaseException as err:
                    if recipe.settled(err) or lease.lost or not self.is_open:
                        slot.lock.release()
                        raise
                    # The call may have queued a key, or been granted, for a
                    # caller who will never know: withdraw it, keeping the slot
                    # until that is done.
                    await self.clean_up(self._withdraw(recipe, lease, slot), f"fencepost-withdraw-{recipe.name}")
                    raise
                slot.holder = handle
                return handle
            finally:
                slot.users -= 1
                self.pool.drop_slot_if_idle(*key)
                self.pool.unused(lease)
                self._on_idle()

    def keep(self, acting: str, handle: AsyncLockHandle) -> AsyncLockHandle:
        """Keep a grant: registered under its lease and watched; given back if the lease was lost meanwhile.

        Raises:
            LeaseLost: the lease was declared lost while the call was in flight:
                the grant cannot be trusted. It is given back (in the background:
                the coordinator may be unreachable) and the loop retries on a
                new lease rather than hand out a handle that is lost from the start.
        """
        lease = handle._lease
        if lease.lost:
            self.spawn(self.release_quietly(handle), f"fencepost-release-{handle.name}")
            raise LeaseLost(f"the lease was lost while {acting}", name=handle.name, lease_id=lease.lease_id,
                            reason=lease.lost_reason or LEASE_EXPIRED)
        self.pool.add_hold(handle)
        self.stream.watch(handle)  # sends nothing when the grant came on the current stream: it is watched there
        return handle

    async def _withdraw(self, recipe: Recipe, lease: Lease, slot: Slot) -> None:
        """Withdraw what an abandoned acquire call may have left, retried while the lease lives; then free ``slot``."""
        delays = CLIENT_BACKOFF.delays()
        try:
            while not lease.lost and self.is_open:
                try:
                    withdrawn = await recipe.withdraw_call(lease)
                except LeaseLost:
                    return  # the lease is gone, and its keys with it
                except Unavailable as err:
                    log.debug("fencepost: withdrawal from %s failed, retrying: %r", recipe.local_name, err)
                    await asyncio.sleep(next(delays))
                    continue
                except FencepostError as err:
                    log.log(recipe.withdraw_failure_level, "fencepost: could not withdraw from %r (lease %d; what "
                            "the acquire left ends with the lease): %s", recipe.name, lease.lease_id, err)
                    return
                if withdrawn is not None:
                    log.debug("fencepost: withdrew %s of %r (lease %d) left by an abandoned acquire",
                              withdrawn, recipe.name, lease.lease_id)
                return
        finally:
            slot.lock.release()
            self.pool.drop_slot_if_idle(lease.lease_id, recipe.local_name)

    # ------------------------------------------------------------------ release

    async def release(self, handle: AsyncLockHandle, call: ReleaseCall, *, until: float | None = None) -> None:
        """Release ``handle`` with its recipe's release ``call`` (see :meth:`AsyncLockHandle.release`).

        Args:
            handle: The hold.
            call: Its recipe's release call (:meth:`Recipe.release_call`).
            until: Loop time after which to stop trying; ``connect_timeout``
                from now by default.

        Raises:
            NotHolder, StaleTokenError, LeaseLost, Unavailable, FencepostError:
                as :meth:`AsyncLockHandle.release` says.
        """
        tracing = self.transport.tracing
        tracer = tracing.tracer()
        if tracer is None:
            return await self._release(handle, call, until)
        with tracer.start_as_current_span(
                "fencepost.release", attributes=tracing.lock_attributes(handle.name, handle.lease_id, handle.token),
                record_exception=False, set_status_on_exception=False) as span:
            try:
                await self._release(handle, call, until)
            except BaseException as exc:
                failed(span, exc)
                raise
            span.set_attribute(OUTCOME, "released")

    async def _release(self, handle: AsyncLockHandle, call: ReleaseCall, until: float | None) -> None:
        if handle.released:
            raise NotHolder(f"{handle.what} was already released", name=handle.name, lease_id=handle.lease_id)
        if self._state() in ("new", "closed"):
            raise FencepostError("client is closed", name=handle.name, lease_id=handle.lease_id)
        deadline = asyncio.get_running_loop().time() + self.call_timeout if until is None else until
        if handle.lost_reason is not None:
            reason = handle.lost_reason
            if reason == REASON_DEADLINE:
                # The server may not know yet: free the lock early, in the
                # background, so that the caller is told at once (during a
                # partition the call would wait for its whole timeout).
                self.spawn(self._release_lost(handle, call, deadline), f"fencepost-release-{handle.name}")
            self.pool.finish_release(handle)
            raise LeaseLost(f"{'lock hold' if handle.what == 'lock' else handle.what} was lost before release",
                            name=handle.name, lease_id=handle.lease_id, reason=reason)
        await asyncio.shield(handle._start_release(lambda: call(handle, deadline),
                                                  lambda done: self.settle_release(handle, done)))

    def settle_release(self, handle: AsyncLockHandle, done: asyncio.Future[None]) -> None:
        """Apply the outcome of a release call to the hold (also when its caller was cancelled)."""
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
            # The server ended the hold while our release was in flight:
            # most likely that very release. The lock is not held either way.
            self.pool.finish_release(handle)

    async def release_quietly(self, handle: AsyncLockHandle) -> None:
        """Release ``handle``, logging (not raising) a FencepostError."""
        try:
            await handle.release()
        except FencepostError as err:
            log.debug("fencepost: release of %r on error exit failed: %r", handle.name, err)

    async def _release_lost(self, handle: AsyncLockHandle, call: ReleaseCall, until: float) -> None:
        """Best-effort release of a hold already reported lost."""
        try:
            await call(handle, until)
        except FencepostError as err:
            log.debug("fencepost: release of lost hold %r: %r", handle.name, err)


async def _wait_slot(slot: Slot, until: float | None, name: str, held: str) -> None:
    """Wait for the local holder of ``slot`` to let go, until ``until`` (loop time) at most.

    Args:
        slot: The local exclusion (one holder per lease and name).
        until: Loop time to give up at; None: never.
        name: The hold's name, for the LockTimeout.
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
