"""The keepalive stream: one bidirectional KeepAlive call for every lease and hold of a client.

:class:`KeepAliveStream` keeps one ``KeepAlive`` stream open through the
:class:`~fencepost.client._transport.transport.Transport`, reopening it (with backoff,
after a rotation) whenever it breaks. Each lease is renewed about every
``ttl * keepalive_fraction`` seconds (:mod:`.renewals`: one task for every
lease; the leases due together go in one batch when the coordinator
announces ``keepalives``, else one keepalive each); each hold is watched, so
that the coordinator reports its end (HoldEnded). Messages are queued in an
outbox; what a broken stream may have lost (a keepalive for each lease, a
watch for each hold) is sent again on the next stream, once its initial
metadata says whether it serves batches (waited for
:data:`ANNOUNCEMENT_WAIT` at most). Leases and tokens do not change across a
reconnect: both live in etcd.

Dispatch: an acknowledgement, alone or one of several in a
``LeaseKeepAliveAcks``, is matched to its keepalive by request id, and
moves that lease's deadline from the keepalive's send time; one with TTL <= 0
loses the lease. A HoldEnded is matched by (name, lease id, token): an event
for an older grant of the same name is ignored, and one that arrives while
the hold's Release is in flight is left to the release to interpret.

The local deadlines are watched by :class:`~.deadlines.DeadlineWatcher`:
a lease is lost when its deadline passes, even if no message arrives.

Calls on the stream: when the coordinator announces them (initial metadata,
see :mod:`fencepost.client._leases.calls`), Acquire, Release and Withdraw go as
messages on the stream (:attr:`KeepAliveStream.calls`; several queued
together go as one ``calls`` message when the coordinator announces it) and
their answers, alone or several in one ``answers`` message, are dispatched
here. A grant answered on the stream is watched there by the
coordinator, and a release answered there drops that watch: :meth:`watch`
and :meth:`unwatch` then send nothing for that hold (until the next stream,
on which :meth:`resend_all` watches every hold again).

A stream that cannot be opened because the TLS handshake fails is retried
like any other (the coordinator's certificate may be replaced, or the
client's files on disk may not matter: the server's may), but the cause is
logged once, at WARNING, until a stream answers again.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc
import grpc.aio

from .calls import KEEPALIVES, Answer, Outbox, StreamCalls, drain
from .lease import Lease, LeasePool
from .renewals import EARLY, Renewals
from .._metrics import NO_CLIENT_METRICS, ClientMetrics
from .._transport.transport import Transport, current_task_cancelling
from ..errors import ResourceExhausted, from_rpc_error
from ..handle import AsyncLockHandle
from ..v1 import kinds
from ..v1 import lock_pb2 as pb
from ..v1.details import ErrorReason, reason_name
from ..v1.keys import MAX_KEEPALIVES_PER_BATCH
from ..v1.retry import CLIENT_BACKOFF

__all__ = ["ANNOUNCEMENT_WAIT", "KeepAliveStream", "Spawn", "hold_end_reason"]

log = logging.getLogger("fencepost.client")

LEASE_EXPIRED = reason_name(ErrorReason.LEASE_EXPIRED)
NOT_HOLDER = reason_name(ErrorReason.NOT_HOLDER)
SHUTTING_DOWN = reason_name(ErrorReason.SHUTTING_DOWN)
DRAINING = reason_name(ErrorReason.DRAINING)

#: (lease id, lock name, fencing token) of one hold.
HoldKey = tuple[int, str, int]
#: Starts a background task: (coroutine, task name) -> the task.
Spawn = Callable[[Awaitable[Any], str], "asyncio.Task[Any]"]

#: Longest wait, in seconds, for a new stream's initial metadata before the keepalives of every lease are
#: sent again on it (a coordinator sends it as the stream opens; one older than the calls on the stream
#: sends it with its first answer only); no more than :data:`~.renewals.EARLY` of the shortest period.
ANNOUNCEMENT_WAIT = 0.25


def hold_end_reason(reason: int) -> str:
    """The reason name of a HoldEnded event (``NOT_HOLDER`` when unset or unknown to this client)."""
    try:
        return reason_name(reason or ErrorReason.NOT_HOLDER)
    except ValueError:  # a reason added after this client was built
        return NOT_HOLDER


class KeepAliveStream:
    """The client's KeepAlive stream: outbox, resend on reconnect, dispatch of what arrives.

    Args:
        transport: The channel to use (rotated when the stream breaks).
        pool: The client's leases and holds.
        fraction: Keepalive period as a fraction of each lease's granted TTL.
        spawn: Starts a background task owned by the client.
        on_open: Called on each new stream to queue what must be sent again;
            :meth:`resend_all` by default.
        on_response: Called with each message that arrives; :meth:`dispatch`
            by default.
        send_keepalives: Called to send one keepalive of each lease given;
            :meth:`send_keepalives` by default.
        metrics: Observes each keepalive's round trip (``fencepost_client_keepalive_rtt_seconds``).
        stream_calls: Send Acquire, Release and Withdraw on the stream when it
            serves them (see :attr:`calls`); False keeps them unary.

    The three callbacks let the client route the stream's events through
    methods of its own, which a subclass may observe.
    """

    def __init__(
        self,
        transport: Transport,
        pool: LeasePool,
        *,
        fraction: float,
        spawn: Spawn,
        on_open: Callable[[], None] | None = None,
        on_response: Callable[[pb.KeepAliveResponse], None] | None = None,
        send_keepalives: Callable[[list[Lease]], None] | None = None,
        metrics: ClientMetrics = NO_CLIENT_METRICS,
        stream_calls: bool = True,
    ) -> None:
        self.transport = transport
        #: The calls sent on the stream (given to Transport.call by the lock recipe).
        self.calls = StreamCalls(enabled=stream_calls)
        self.metrics = metrics
        self.pool = pool
        self.fraction = fraction
        self.outbox: Outbox | None = None
        #: request id -> (lease, clock reading when its keepalive was queued)
        self.pending: dict[int, tuple[Lease, float]] = {}
        self._spawn = spawn
        self._on_open = on_open or self.resend_all
        self._on_response = on_response or self.dispatch
        self._send_keepalives = send_keepalives or self.send_keepalives
        #: When each lease is next renewed, and the task that renews them.
        self.renewals = Renewals(pool.clock, fraction, lambda leases: self._send_keepalives(leases))
        self._renewing: asyncio.Task[Any] | None = None
        self._request_ids = itertools.count(1)
        self._closing = False
        self._tls_told: set[str] = set()  # TLS failures logged since a stream last answered
        # Holds the current stream watches without a watch message (granted on it), and holds whose
        # release on it dropped their watch: watch() and unwatch() send nothing for them.
        self._watched_by_grant: set[HoldKey] = set()
        self._unwatched_by_release: set[HoldKey] = set()
        #: The round trip of the last keepalive acknowledged on the current stream, in whole ms (0: none yet),
        #: sent with each keepalive message (``last_rtt_ms``: the coordinator's sign of its capacity).
        self.last_rtt_ms = 0

    # ------------------------------------------------------------------ sending

    def send(self, message: pb.KeepAliveRequest) -> None:
        """Queue a message on the current stream; dropped when there is none (resent on reconnect)."""
        if self.outbox is not None:
            self.outbox.put_nowait(message)

    def send_keepalives(self, leases: Sequence[Lease]) -> None:
        """Queue one keepalive of each live lease of ``leases``, remembering its send time under a new request id.

        More than one go as one batch (``keepalives``, split past
        :data:`MAX_KEEPALIVES_PER_BATCH`) when the stream announced that it
        serves batches; else each is a ``keepalive`` message of its own.
        Dropped when no stream is open (the reconnect sends them again).
        Each message carries :attr:`last_rtt_ms` and its send time (``sent_ms``, the pool's clock).
        """
        live = [lease for lease in leases if not lease.lost]
        if self.outbox is None or not live:
            return
        now = self.pool.clock()
        for request_id, (old, sent) in list(self.pending.items()):
            if sent + old.ttl < now:  # an answer could no longer move any deadline
                del self.pending[request_id]
        ids = []
        for lease in live:
            request_id = next(self._request_ids)
            self.pending[request_id] = (lease, now)
            ids.append(request_id)
        sent_ms = max(1, int(now * 1000))
        # The secret goes with every keepalive and watch: a stream (re)connected to any replica needs it
        # with the first message naming the lease, and 43 bytes each TTL/3 cost less than tracking that.
        if len(live) > 1 and self.calls.announces(KEEPALIVES):
            entries = [pb.LeaseKeepAlive(lease_id=lease.lease_id, request_id=request_id, lease_secret=lease.secret)
                       for lease, request_id in zip(live, ids)]
            for start in range(0, len(entries), MAX_KEEPALIVES_PER_BATCH):
                batch = entries[start:start + MAX_KEEPALIVES_PER_BATCH]
                self.send(pb.KeepAliveRequest(keepalives=pb.LeaseKeepAlives(keepalives=batch),
                                              last_rtt_ms=self.last_rtt_ms, sent_ms=sent_ms))
            return
        for lease, request_id in zip(live, ids):
            self.send(pb.KeepAliveRequest(keepalive=pb.LeaseKeepAlive(lease_id=lease.lease_id, request_id=request_id),
                                          lease_secret=lease.secret, last_rtt_ms=self.last_rtt_ms,
                                          sent_ms=sent_ms))

    def watch(self, handle: AsyncLockHandle) -> None:
        """Ask to be told (HoldEnded) when ``handle``'s hold ends (nothing to send when granted on this stream)."""
        key = _key(handle)
        if key in self._watched_by_grant:
            self._watched_by_grant.discard(key)
            return
        self.send(pb.KeepAliveRequest(watch=_hold(handle), lease_secret=handle.lease_secret))

    def unwatch(self, handle: AsyncLockHandle) -> None:
        """Stop hearing about ``handle``'s hold after its release (nothing to send when released on this stream)."""
        key = _key(handle)
        if key in self._unwatched_by_release:
            self._unwatched_by_release.discard(key)
            return
        self.send(pb.KeepAliveRequest(unwatch=_hold(handle)))

    def resend_all(self) -> None:
        """Queue a keepalive for every live lease (one batch when the stream serves them) and a watch for every live hold."""
        leases = self.pool.leases()
        self.renewals.renewed(leases, self.pool.clock())
        self._send_keepalives(leases)
        for lease in leases:
            for handle in list(lease.holds.values()):
                self.watch(handle)

    def start_keepalives(self, lease: Lease) -> None:
        """Renew ``lease`` about every ``ttl * fraction`` seconds, from now until it is lost (see :mod:`.renewals`)."""
        self.renewals.add(lease)
        if self._renewing is None or self._renewing.done():
            self._renewing = self._spawn(self.renewals.run(), "fencepost-keepalives")

    # ------------------------------------------------------------------ receiving

    def dispatch(self, response: pb.KeepAliveResponse) -> None:
        """Apply one message from the coordinator: an acknowledgement, a HoldEnded event, or a call's answer."""
        kind = response.WhichOneof("response")
        if kind == "keepalive":
            self._on_ack(response.keepalive)
        elif kind == "keepalives":  # several acks ready together (a stream on which batches were sent)
            for ack in response.keepalives.acks:
                self._on_ack(ack)
        elif kind == "hold_ended":
            self._on_hold_ended(response.hold_ended)
        elif kind in ("acquired", "released", "withdrawn", "failed"):
            self._on_answer(response, kind)
        elif kind == "answers":  # several answers ready together (a stream on which batches of calls were sent)
            for answer in response.answers.answers:
                self._on_answer(answer, answer.WhichOneof("response"))

    def _on_answer(self, response: Answer, kind: str | None) -> None:
        call = self.calls.answer(response)
        if call is None:
            return
        _method, request = call
        if kind == "acquired" and response.acquired.acquired:
            self._watched_by_grant.add((request.lease_id, request.name, response.acquired.token))
        elif kind == "released":
            self._unwatched_by_release.add((request.lease_id, request.name, request.token))

    def _on_ack(self, ack: pb.LeaseKeepAliveAck) -> None:
        entry = self.pending.pop(ack.request_id, None)
        if entry is None:
            return
        lease, sent = entry
        if lease.lease_id != ack.lease_id:
            return
        rtt = self.pool.clock() - sent
        self.last_rtt_ms = min(2**32 - 1, max(1, round(rtt * 1000)))
        self.metrics.keepalive_answered(rtt)
        if lease.lost:
            return
        if not lease.on_ack(sent, ack.ttl_seconds):
            self.pool.lose(lease, LEASE_EXPIRED)

    def _on_hold_ended(self, event: pb.HoldEnded) -> None:
        name = kinds.internal_name(event.kind, event.name, event.slot)
        self._watched_by_grant.discard((event.lease_id, name, event.token))  # a grant its caller never took
        handle = self.pool.find_hold(event.lease_id, name, event.token)
        if handle is None:
            return
        reason = hold_end_reason(event.reason)
        if not handle._note_hold_ended(reason):
            return  # its release is in flight: the release's outcome interprets the event
        if reason == LEASE_EXPIRED:
            self.pool.lose(handle._lease, reason)
        else:
            self.pool.lose_hold(handle, reason)

    # ------------------------------------------------------------------ the stream

    def begin_close(self) -> None:
        """Stop sending keepalives and do not reopen the stream once it breaks."""
        self._closing = True
        self.renewals.stop()

    def announcement_wait(self) -> float:
        """The longest wait, in seconds, for a new stream's initial metadata before resending on it.

        :data:`ANNOUNCEMENT_WAIT`, but no more than :data:`~.renewals.EARLY`
        of the shortest live lease's period: at most as late as a renewal
        may be early.
        """
        periods = [self.renewals.period(lease) for lease in self.pool.leases() if not lease.lost]
        return min([ANNOUNCEMENT_WAIT, *(EARLY * period for period in periods)])

    def reconnect_ceiling(self) -> float:
        """The longest wait before the next attempt to reopen the stream, in seconds.

        :data:`CLIENT_BACKOFF`'s cap (2 s), but no more than half the keepalive
        period of the shortest-lived lease (``ttl * fraction / 2``; 0.67 s for
        a 4 s TTL) and no less than its base: a coordinator back from a
        restart is reached within a fraction of a keepalive period, in time to
        renew the leases and to hear of the ones that ended meanwhile.
        """
        ttls = [lease.ttl for lease in self.pool.leases() if not lease.lost]
        if not ttls:
            return CLIENT_BACKOFF.cap
        return max(CLIENT_BACKOFF.base, min(CLIENT_BACKOFF.cap, min(ttls) * self.fraction / 2))

    async def run(self) -> None:
        """Keep a stream open until :meth:`begin_close` (then until it breaks) or cancellation.

        Between attempts it waits a delay drawn uniformly from [0, ceiling]
        (full jitter), the ceiling growing as :data:`CLIENT_BACKOFF`'s up to
        :meth:`reconnect_ceiling`; the growth starts again once a stream answers.
        When the server itself ends the stream (it is shutting down: every one
        of its clients is reconnecting at this moment) the ceiling is
        :meth:`reconnect_ceiling` from the first attempt, so that the
        reconnects reach the restarted or next coordinator spread out (field
        case F11) and still within half a keepalive period (F09).
        """
        ceilings = CLIENT_BACKOFF.ceilings()
        while True:
            channel, stub, address = self.transport.channel, self.transport.stub, self.transport.address
            assert channel is not None and stub is not None
            outbox: Outbox = asyncio.Queue()
            call = None
            listening: asyncio.Task[None] | None = None
            force = False
            answered = False
            unreachable: str | None = None  # gRPC's details when the stream found no connection
            try:
                call = stub.KeepAlive(drain(outbox))
                self.calls.opened(outbox)
                listening = self._spawn(self.calls.listen(call, outbox), "fencepost-stream-calls-metadata")
                # What it serves (calls, batches of keepalives) before the keepalives of every lease go again.
                await asyncio.wait((listening,), timeout=self.announcement_wait())
                self.outbox = outbox
                self.pending.clear()
                self.last_rtt_ms = 0  # a round trip of this stream's own
                self._watched_by_grant.clear()
                self._unwatched_by_release.clear()
                self._on_open()
                async for response in call:
                    if not answered:
                        answered = True
                        ceilings = CLIENT_BACKOFF.ceilings()
                        self._tls_told.clear()
                    self._on_response(response)
                force = True  # the server ended the stream: try another one
                log.debug("fencepost: keepalive stream to %s ended", self.transport.address)
            except grpc.aio.AioRpcError as err:
                mapped = from_rpc_error(err, address=address)
                force = mapped.reason in (SHUTTING_DOWN, DRAINING)  # stopping: the next address (draining: refused)
                if err.code() == grpc.StatusCode.UNAVAILABLE and not answered:
                    unreachable = err.details() or ""
                # Log the first failure of a working stream, not every retry; a coordinator's limit
                # (too many streams of this caller; past its capacity; draining) always: its leases get no keepalives
                # meanwhile. With several addresses, the next attempt goes to the next one.
                log.log(logging.WARNING if isinstance(mapped, ResourceExhausted) or mapped.reason == DRAINING else
                        logging.INFO if answered else logging.DEBUG,
                        "fencepost: keepalive stream to %s broke: %s", self.transport.address, mapped)
            except grpc.aio.UsageError:
                pass  # the channel was closed by a rotation
            except asyncio.CancelledError:
                if current_task_cancelling():
                    raise
            finally:
                if self.outbox is outbox:
                    self.outbox = None
                self.calls.ended(outbox)
                if listening is not None:
                    listening.cancel()
                outbox.put_nowait(None)
                if call is not None:
                    call.cancel()
            if self._closing:
                return
            if unreachable is not None:
                await self._tell_tls(channel, address, unreachable)
            if force:  # the server went away from every client at once: spread out at once
                ceilings = itertools.repeat(CLIENT_BACKOFF.cap)
            self.transport.rotate(channel, force=force)
            await asyncio.sleep(random.uniform(0.0, min(next(ceilings), self.reconnect_ceiling())))

    async def _tell_tls(self, channel: grpc.aio.Channel, address: str, details: str) -> None:
        """Log, once until a stream answers again, that TLS is why the stream cannot be opened."""
        failure = await self.transport.tls_failure(channel, address, CLIENT_BACKOFF.cap, details=details)
        if failure is not None and failure.message not in self._tls_told:
            self._tls_told.add(failure.message)
            log.warning("fencepost: keepalive stream cannot be opened: %s; retrying until it can", failure.message)


def _key(handle: AsyncLockHandle) -> HoldKey:
    return handle.lease_id, handle.hold_name, handle.token


def _hold(handle: AsyncLockHandle) -> pb.WatchHold:
    return pb.WatchHold(name=handle.name, lease_id=handle.lease_id, token=handle.token, kind=handle.kind,
                        slot=handle.slot)
