"""One client's KeepAlive stream: forwarded keepalives and hold-ended events.

The client sends a keepalive per lease about every TTL/3 (several in one
``keepalives`` message when it batches them) and a ``watch`` for each hold
it was granted. The coordinator answers each keepalive with the TTL etcd
reset the lease to (:mod:`.renewals`; acks ready together go as one message
to a client that batches, :mod:`.outbox`), and pushes ``hold_ended`` when a
watched hold's key is deleted (release, lease expiry or revoke, or an
operator) or when a keepalive finds its lease gone. Nothing here renews a
lease on a timer. A batch of more than
:data:`~fencepost.client.v1.keys.MAX_KEEPALIVES_PER_BATCH` entries ends the
stream with INVALID_ARGUMENT (field ``keepalives``), as a message that does
not decode does.

Each hold that ends other than by a Release through this coordinator is
logged (``hold_ended``, INFO), and so is a lease a keepalive finds gone
(``lease_expired``, INFO, once per lease and stream): see :mod:`..telemetry.events`.

Ownership (:mod:`..admission.ownership`): the first keepalive or watch naming a lease
on a stream is served only once the stream's caller is found to own the
lease (its certificate identity, or the secret: ``LeaseKeepAlive.lease_secret``
of a batch's entry, else ``KeepAliveRequest.lease_secret``); the stream
remembers the leases it verified. A lease that is not the caller's
ends the stream with PERMISSION_DENIED / NOT_LEASE_OWNER, before anything is
forwarded for it.

Calls on the stream (:mod:`.stream_calls`): an ``acquire``, ``release`` or
``withdraw`` message is served as its unary call would be, by the same
servicer method, in a task of its own, and answered on the stream with its
request id (``failed`` carrying the unary call's status). A grant on the
stream is watched on it at once; a release on it that succeeds drops the
watch without a HoldEnded (a deletion seen while the release runs is told
only if the release then fails). ``cancel`` cancels a running acquire; the
end of the stream cancels every call still running. A ``calls`` message
carries several of these (``StreamCall`` entries, each with its own request
id, timeout, secret and traceparent), each served as if it had come alone;
past :data:`~fencepost.client.v1.keys.MAX_CALLS_PER_BATCH` entries the
stream ends with INVALID_ARGUMENT (field ``calls``). Once a client has sent
one, answers ready together go to it as one ``answers`` message
(:mod:`.outbox`). Each message of calls is counted (``fencepost_stream_call_batch_size``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from fencepost.client.errors import FencepostError, InvalidArgument, PermissionDenied
from fencepost.client.v1 import kinds, lock_pb2
from fencepost.client.v1.details import ErrorReason, reason_name
from fencepost.client.v1.keys import MAX_CALLS_PER_BATCH, MAX_KEEPALIVES_PER_BATCH, MAX_PERMITS, Hold
from fencepost.client.v1.retry import ETCD_BACKOFF

from ..admission.identity import Caller
from ..admission.ownership import Ownership
from ..recipes.lease import KeptLeases, Leases
from ..recipes.lock import LockManager
from ..recipes.rwlock import hold_name
from ..recipes.watch import DeleteWatcher
from ..telemetry.events import log_event
from ..telemetry.metrics import NO_METRICS, LockMetrics
from .decode import Undecodable
from .outbox import StreamOutbox
from .releases import RecentReleases
from .renewals import StreamRenewals
from .stream_calls import CALLS, CallAborted, call_context, failed, invalid

_log = logging.getLogger(__name__)

#: The answer to an acquire cancelled by its client (``cancel``).
_CANCELLED = lock_pb2.CallFailed(code=grpc.StatusCode.CANCELLED.value[0], message="cancelled by the client")


class KeepAliveStream:
    """Serves one KeepAlive stream.

    Args:
        leases: forwards keepalives to etcd.
        locks: re-reads a hold when the deletion watcher cannot tell.
        watcher: the shared deletion watcher.
        keys_for: maps (name, lease id) to the contender key.
        metrics: counts keepalives and follows the holds watched (``fencepost_watched_holds``).
        released: the holds released through this coordinator (their end is not logged again).
        kept: the leases kept alive through this coordinator's streams (``fencepost_leases``).
        on_keepalive: called with (lease id, TTL etcd answered, <= 0 when gone) for each keepalive answered.
        peer: the client's address (``context.peer()``), for the log.
        trace_id: the stream call's trace id, for the log; None for none.
        owners: checks that the caller owns each lease it names; None to check nothing.
        caller: the stream's caller (its certificate identity), for ``owners``.
        calls: serves the calls sent on the stream: method name (``Acquire``,
            ``Release``, ``Withdraw``) -> ``async (request, context) -> response``,
            the LockService servicer's methods as the interceptors wrap them
            (:func:`.stream_calls.wrapped_calls`); None to ignore them.
        context: the stream's ``grpc.aio.ServicerContext`` (its certificate), for those calls.
        on_late: told the seconds a response waited to be sent, when more than
            :data:`.outbox.LATE_SECONDS` (a backlog of answers: the coordinator is behind, see :mod:`..admission.overload`).
        on_rtt: told each round trip, in milliseconds, a keepalive message reports
            (``last_rtt_ms`` > 0; :meth:`..admission.capacity.Capacity.reported`).
        on_wait: told how long each keepalive message that carries its send
            time (``sent_ms``) waited to be read, in milliseconds: its delay
            from the sender's clock to the coordinator's, less the least such
            delay seen on the stream (the clocks' offset and the network's
            floor; after LEDBAT, RFC 6817 section 3.4.2;
            :meth:`..admission.capacity.Capacity.waited`).
    """

    def __init__(self, leases: Leases, locks: LockManager, watcher: DeleteWatcher,
                 keys_for: Callable[[str, int], bytes], *, metrics: LockMetrics = NO_METRICS,
                 released: RecentReleases | None = None, kept: KeptLeases | None = None,
                 on_keepalive: Callable[[int, int], None] | None = None,
                 peer: str | None = None, trace_id: str | None = None, owners: Ownership | None = None,
                 caller: Caller | None = None, calls: dict[str, Any] | None = None,
                 context: Any = None, on_late: Callable[[float], None] | None = None,
                 on_rtt: Callable[[int], None] = lambda _ms: None,
                 on_wait: Callable[[int], None] = lambda _ms: None) -> None:
        self._calls = calls
        self._on_rtt = on_rtt
        self._on_wait = on_wait
        self._least_delay = math.inf  # the least (coordinator's clock - sent_ms) seen on the stream, ms
        self._context = context
        self._auth: Any = None  # the stream's context.auth_context(), read at its first call
        self._peer = peer or ""
        self._running: dict[int, tuple[str, asyncio.Task[None]]] = {}  # request id -> a call on the stream
        self._releasing: dict[Hold, bool] = {}  # holds being released on the stream -> deletion seen meanwhile
        self._ending = False
        self._owners = owners
        self._who = caller if caller is not None else Caller(None, peer or "")
        self._checks: dict[int, asyncio.Task[bool]] = {}  # lease id -> its ownership check on this stream
        self._watching: set[Hold] = set()  # watches waiting for their lease's check
        self._refused: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._released = released if released is not None else RecentReleases()
        self._caller = {"peer": peer, "trace_id": trace_id}
        #: Holds watched over the stream's life.
        self.hold_count = 0
        self._metrics = metrics
        self._locks = locks
        self._watcher = watcher
        self._keys_for = keys_for
        self._out = StreamOutbox(on_late)
        self._renewals = StreamRenewals(
            leases, self._out, self._check, self._spawn, metrics=metrics,
            kept=kept if kept is not None else KeptLeases(), owners=owners, on_keepalive=on_keepalive,
            on_gone=self._lease_gone, log_fields=self._caller)
        self._holds: dict[Hold, Callable[[], None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def serve(self, requests: AsyncIterable[lock_pb2.KeepAliveRequest],
                    closing: asyncio.Event) -> AsyncIterator[lock_pb2.KeepAliveResponse]:
        """Read ``requests`` and yield the responses until either side ends.

        Args:
            requests: the client's messages.
            closing: set when the coordinator shuts down; the stream then ends.
        """
        reader = asyncio.create_task(self._read(requests))
        stop = asyncio.create_task(closing.wait())
        # The end of the reader, the coordinator's shutdown and a refusal each queue an end behind the
        # responses queued before them: the loop waits on the outbox alone (no task and no wait() per message).
        for ending in (reader, stop, self._refused):
            ending.add_done_callback(self._out.end)
        try:
            while True:
                response = await self._out.take()
                if response is not None:
                    yield response
                    continue
                if self._refused.done():
                    self._refused.result()  # a lease the caller does not own: the stream is refused
                if reader.done():
                    reader.result()  # re-raise a reader failure
                    return
                if stop.done():
                    return
        finally:
            for task in (reader, stop):
                task.cancel()
            self.close()

    @property
    def lease_count(self) -> int:
        """The different leases kept alive on this stream so far."""
        return len(self._renewals.seen)

    @property
    def watched_count(self) -> int:
        """The holds this stream watches now (until their end or an unwatch)."""
        return len(self._holds)

    def close(self) -> None:
        """Drop every hold watch and cancel pending forwards and the calls still running on the stream."""
        self._ending = True
        for _, task in self._running.values():
            task.cancel()
        self._running.clear()
        for unsubscribe in self._holds.values():
            unsubscribe()
        self._metrics.watched_holds(-len(self._holds))
        self._holds.clear()
        for task in [*self._tasks, *self._checks.values()]:
            task.cancel()
        self._watching.clear()
        if self._refused.done():
            self._refused.exception()  # retrieved (the stream may have ended first)
        self._renewals.close()

    async def _read(self, requests: AsyncIterable[lock_pb2.KeepAliveRequest]) -> None:
        async for request in requests:
            if isinstance(request, Undecodable):  # a name that is not UTF-8, or no protobuf: the stream is refused
                raise request.error()
            kind = request.WhichOneof("request")
            if kind == "keepalive":
                self._signs(request)
                self._renewals.received((request.keepalive,), request.lease_secret)
            elif kind == "keepalives":
                self._signs(request)
                entries = request.keepalives.keepalives
                if len(entries) > MAX_KEEPALIVES_PER_BATCH:  # the stream is refused, as for an undecodable message
                    raise InvalidArgument(f"keepalives holds {len(entries)} entries; at most "
                                          f"{MAX_KEEPALIVES_PER_BATCH} in one message", field="keepalives")
                self._out.batched = True
                if entries:
                    self._renewals.received(entries, request.lease_secret)
            elif kind == "watch":
                w = request.watch
                hold = Hold(_internal(w), w.lease_id, w.token)
                check = self._check(w.lease_id, request.lease_secret)
                if check is None:
                    self._watch(hold)
                else:
                    self._watching.add(hold)
                    self._spawn(self._watch_when_owned(hold, check))
            elif kind in CALLS or kind == "cancel":
                self._metrics.stream_calls(1)
                self._call(kind, request)
            elif kind == "calls":
                entries = request.calls.calls
                if len(entries) > MAX_CALLS_PER_BATCH:  # the stream is refused, as for too many keepalives
                    raise InvalidArgument(f"calls holds {len(entries)} entries; at most {MAX_CALLS_PER_BATCH} "
                                          "in one message", field="calls")
                self._out.calls_batched = True
                if entries:
                    self._metrics.stream_calls(len(entries))
                for entry in entries:
                    self._call(entry.WhichOneof("call"), entry)
            elif kind == "unwatch":
                w = request.unwatch
                hold = Hold(_internal(w), w.lease_id, w.token)
                self._watching.discard(hold)
                self._released.discard(hold)
                unsubscribe = self._holds.pop(hold, None)
                if unsubscribe is not None:
                    self._metrics.watched_holds(-1)
                    unsubscribe()

    def _signs(self, request: lock_pb2.KeepAliveRequest) -> None:
        """Pass on a keepalive message's signs of capacity: its reported round trip, how long it waited."""
        if request.last_rtt_ms:
            self._on_rtt(request.last_rtt_ms)
        if request.sent_ms:
            delay = int(time.monotonic() * 1000) - request.sent_ms
            if delay < self._least_delay:
                self._least_delay = delay
            self._on_wait(int(delay - self._least_delay))

    def _call(self, kind: str | None, request: lock_pb2.KeepAliveRequest | lock_pb2.StreamCall) -> None:
        """Serve one call: a single call message, or an entry of a ``calls`` batch (same fields)."""
        if kind == "cancel":
            running = self._running.get(request.cancel.request_id)
            if running is not None and running[0] == "acquire":
                running[1].cancel()
        elif kind is not None:
            self._start_call(kind, request)
        elif self._calls is not None:  # an entry of a batch that carries no call
            self._out.put_answer(request.request_id, "failed", invalid(InvalidArgument(
                "a calls entry carries no acquire, release, withdraw or cancel", field="call")))

    def _start_call(self, kind: str, request: lock_pb2.KeepAliveRequest | lock_pb2.StreamCall) -> None:
        """Serve the call ``request`` carries in a task of its own (its answer goes on the stream)."""
        request_id = request.request_id
        if self._calls is None:
            return
        if request_id in self._running:
            self._out.put_answer(request_id, "failed", invalid(InvalidArgument(
                f"request_id {request_id} is in use by a call still running on this stream", field="request_id")))
            return
        if self._auth is None:
            self._auth = self._context.auth_context() if self._context is not None else {}
        try:
            context = call_context(self._auth, self._peer, request)
        except InvalidArgument as exc:
            self._out.put_answer(request_id, "failed", invalid(exc))
            return
        task = asyncio.ensure_future(self._serve_call(kind, request_id, getattr(request, kind), context))
        self._running[request_id] = (kind, task)

        def done(finished: asyncio.Task[None]) -> None:
            running = self._running.get(request_id)
            if running is not None and running[1] is finished:
                del self._running[request_id]
            if finished.cancelled() and not self._ending:  # cancelled before it started (in the same batch)
                self._out.put_answer(request_id, "failed", _CANCELLED)

        task.add_done_callback(done)

    async def _serve_call(self, kind: str, request_id: int, message: Any, context: Any) -> None:
        method, answer = CALLS[kind]
        hold = Hold(hold_name(message.name, message.mode), message.lease_id, message.token) if kind == "release" \
            else None
        if hold is not None:
            self._releasing[hold] = False
        try:
            response = await self._calls[method](message, context)
        except CallAborted as exc:
            self._release_failed(hold)
            self._out.put_answer(request_id, "failed", failed(exc.status))
            return
        except asyncio.CancelledError:
            self._release_failed(hold)
            if self._ending:
                raise  # the stream ended: nobody to answer
            self._out.put_answer(request_id, "failed", _CANCELLED)
            return
        except BaseException:
            self._release_failed(hold)
            raise
        if kind == "acquire" and response.acquired:
            self._owned_here(message.lease_id)
            self._watch(Hold(hold_name(message.name, message.mode), message.lease_id, response.token))
        elif hold is not None:
            del self._releasing[hold]
            unsubscribe = self._holds.pop(hold, None)  # released: its end needs no HoldEnded
            if unsubscribe is not None:
                self._metrics.watched_holds(-1)
                unsubscribe()
                self._released.discard(hold)
        self._out.put_answer(request_id, answer, response)

    def _release_failed(self, hold: Hold | None) -> None:
        """A release on the stream failed: a deletion of its hold seen meanwhile is told now."""
        if hold is not None and self._releasing.pop(hold, False):
            self._ended(hold, ErrorReason.NOT_HOLDER)

    def _owned_here(self, lease_id: int) -> None:
        """``lease_id`` passed a call's ownership check: keepalives and watches of it on this stream are served."""
        if self._owners is not None and lease_id not in self._checks:
            passed: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            passed.set_result(True)
            self._checks[lease_id] = passed  # type: ignore[assignment]

    def _spawn(self, step: Awaitable[None]) -> None:
        task = asyncio.ensure_future(step)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _check(self, lease_id: int, secret: str) -> asyncio.Task[bool] | None:
        """The ownership check of ``lease_id`` on this stream to wait for; None once it passed (or unchecked).

        The first message naming a lease starts its check with the secret it
        carries; later ones wait for that check.
        """
        if self._owners is None:
            return None
        check = self._checks.get(lease_id)
        if check is None:
            check = self._checks[lease_id] = asyncio.ensure_future(self._verify(lease_id, secret or None))
        elif check.done() and not check.cancelled() and check.result():
            return None
        return check

    async def _verify(self, lease_id: int, secret: str | None) -> bool:
        """Whether the caller owns ``lease_id``; on a refusal, the stream ends with it.

        While etcd does not answer, the check is tried again (the client's
        deadline protects it meanwhile), until it passes or is refused.
        """
        assert self._owners is not None
        delays = ETCD_BACKOFF.delays()
        while True:
            try:
                await self._owners.check(lease_id, self._who, secret, "KeepAlive")
                return True
            except PermissionDenied as exc:
                if not self._refused.done():
                    self._refused.set_exception(exc)
                return False
            except FencepostError as exc:
                _log.info("could not check the owner of lease %#x: %s", lease_id, exc)
                await asyncio.sleep(next(delays))

    @staticmethod
    async def _owned(check: asyncio.Task[bool] | None) -> bool:
        """Wait for ``check``; whether the message waiting for it may be served."""
        return True if check is None else await asyncio.shield(check)

    async def _watch_when_owned(self, hold: Hold, check: asyncio.Task[bool]) -> None:
        if await self._owned(check) and hold in self._watching:
            self._watching.discard(hold)
            self._watch(hold)

    def _lease_gone(self, lease_id: int) -> None:
        """A keepalive found ``lease_id`` gone: every hold of it watched here ends (LEASE_EXPIRED)."""
        for hold in [h for h in self._holds if h.lease_id == lease_id]:
            self._ended(hold, ErrorReason.LEASE_EXPIRED)

    def _watch(self, hold: Hold) -> None:
        name, lease_id, token = hold
        if hold in self._holds:
            return
        key = self._keys_for(name, lease_id)
        created = self._locks.tokens.revision(token)  # the create revision of the hold's key

        def on_delete(revision: int | None) -> None:
            if revision is None:
                self._spawn(self._recheck(hold))
            elif revision > created:
                if hold in self._releasing:
                    self._releasing[hold] = True  # its release on this stream tells how it ended
                else:
                    self._ended(hold, ErrorReason.NOT_HOLDER)

        self._holds[hold] = self._watcher.subscribe(key, on_delete)
        self.hold_count += 1
        self._metrics.watched_holds(+1)
        known = self._watcher.deleted_after(key, created)
        if known:
            self._ended(hold, ErrorReason.NOT_HOLDER)
        elif known is None:
            self._spawn(self._recheck(hold))

    async def _recheck(self, hold: Hold) -> None:
        """Re-read a hold from etcd when the watcher cannot tell whether it ended."""
        delays = ETCD_BACKOFF.delays()
        while hold in self._holds:
            try:
                if not await self._locks.hold_exists(hold):
                    self._ended(hold, ErrorReason.NOT_HOLDER)
                return
            except FencepostError:
                await asyncio.sleep(next(delays))  # etcd down: the client's deadline protects it meanwhile

    def _ended(self, hold: Hold, reason: int) -> None:
        unsubscribe = self._holds.pop(hold, None)
        if unsubscribe is None:
            return  # already reported once
        self._metrics.watched_holds(-1)
        unsubscribe()
        public = kinds.public_hold(hold.name)
        if not (reason == ErrorReason.NOT_HOLDER and self._released.take(hold)):
            log_event(_log, logging.INFO, "hold_ended", f"hold of {kinds.describe(hold.name)} by lease "
                      f"{hold.lease_id:#x} ended: {reason_name(reason)}", name=public.name, lease_id=hold.lease_id,
                      token=hold.token, reason=reason_name(reason), **_kind_fields(public), **self._caller)
        self._out.put(lock_pb2.KeepAliveResponse(hold_ended=lock_pb2.HoldEnded(
            name=public.name, lease_id=hold.lease_id, token=hold.token, reason=reason, kind=public.kind,
            slot=max(public.slot, 0))))


def _internal(watch: lock_pb2.WatchHold) -> str:
    """The internal lock name of a watched hold (:mod:`fencepost.client.v1.kinds`).

    Raises:
        InvalidArgument: field ``kind`` (unknown) or ``slot`` (out of range); the stream ends.
    """
    if watch.kind == lock_pb2.HOLD_KIND_SEMAPHORE and not 0 <= watch.slot < MAX_PERMITS:
        raise InvalidArgument(f"slot must be 0 to {MAX_PERMITS - 1}", field="slot")
    try:
        return kinds.internal_name(watch.kind, watch.name, watch.slot)
    except ValueError as exc:
        raise InvalidArgument(f"kind {watch.kind} is not a HoldKind", field="kind") from exc


def _kind_fields(public: kinds.PublicHold) -> dict[str, object]:
    """The log fields that tell an election's or a semaphore permit's hold from a lock's: none for a lock."""
    if public.kind == lock_pb2.HOLD_KIND_ELECTION:
        return {"kind": "election"}
    if public.kind == lock_pb2.HOLD_KIND_SEMAPHORE:
        return {"kind": "semaphore", "slot": public.slot}
    return {}
