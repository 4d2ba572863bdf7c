"""The coordinator's LeaseKeepAlive streams, :data:`STREAMS` of them, shared by every lease.

Each keepalive a client sends is forwarded as one ``LeaseKeepAliveRequest``
on the stream of its lease (``lease_id % STREAMS``: one lease always on the
same stream); etcd answers each with the TTL it reset the lease to (0 or
less when the lease is gone), in order per lease. More than one stream
because a grpc.aio stream sends one message at a time, each write awaited
until gRPC took it: one stream was found to carry about 1,500 to 2,000
keepalives a second on 2 busy cores while its event loop was mostly idle,
and past that they queued here (``waiting_seconds``). Nothing here renews a lease
on a timer. A client's batch of keepalives (:meth:`KeepAlives.keepalives`) is
forwarded the same way, one request per lease, without a task per lease:
each answer is handed over as it arrives.

A member that stops answering (SIGSTOPped, cut off without FIN or RST) keeps
its TCP connection open, so gRPC would only notice at its ping timeout
(15 s); so a stream on which a keepalive waits while nothing at all was
answered for ``RULES[Op.KEEPALIVE].timeout`` (0.5 s) is ended, and its
keepalives are sent again on a new stream on the next member,
``RULES[Op.KEEPALIVE].attempts`` (3) times at most: all attempts together
stay under K = TTL/3 for the shortest TTLs clients use, so the keepalive is
still acknowledged before the client's deadline.

One watchdog per stream checks this every quarter of the timeout, instead
of a timer per keepalive (thousands a second with many leases). It judges
only while this process keeps up: when its own check ran late by more than
its interval (the event loop is overloaded, so answers that did arrive may
not have been read yet), it does not blame etcd, unless the silence has
lasted :data:`SILENCE_CAP` timeouts. Ending a working stream under load
would throw away every answer in flight on it and make the overload worse:
live leases must not die because the coordinator is busy.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import grpc

from fencepost.client.errors import FencepostError
from fencepost.client.v1.etcd import rpc_pb2

from ..telemetry.metrics import NO_METRICS, LockMetrics
from .failures import RULES, Failure, Op, classify, error_for

__all__ = ["STREAMS", "BrokenHandler", "KeepAlives", "StreamOpener"]

_log = logging.getLogger(__name__)

_Pending = dict[int, collections.deque[asyncio.Future[int]]]
#: Keepalives sent on one stream, oldest first: (time.monotonic() when sent, its answer).
_Sent = collections.deque[tuple[float, asyncio.Future[int]]]

#: A stream silent this many timeouts is ended even while this process runs late.
SILENCE_CAP = 4
#: LeaseKeepAlive streams per coordinator.
STREAMS = 4

#: Opens a LeaseKeepAlive stream on the current member: (member index, the call).
StreamOpener = Callable[[AsyncIterator[rpc_pb2.LeaseKeepAliveRequest]],
                        Awaitable[tuple[int, grpc.aio.StreamStreamCall]]]
#: Told which member's stream ended, and how (the etcd layer moves on to the
#: next member, or authenticates again).
BrokenHandler = Callable[[int, Failure], None]


class _StreamBroke(Exception):
    """The stream ended under an awaited answer (the answer will never come)."""

    def __init__(self, failure: Failure, exc: BaseException | None) -> None:
        super().__init__(failure.value)
        self.failure = failure
        self.exc = exc


class KeepAlives:
    """Forwards keepalives on :data:`STREAMS` shared LeaseKeepAlive streams, each replaced when it goes silent.

    Args:
        open_stream: Opens a stream on the current member (the etcd layer's).
        on_broken: Called with a member's index and the failure when a
            stream went silent or broke, so that the next stream goes to
            another member (or carries a new auth token).
        metrics: Records each keepalive's time to its answer, and those
            unanswered (operation ``keepalive``).
        streams: how many streams the leases are spread over.
    """

    def __init__(self, open_stream: StreamOpener, on_broken: BrokenHandler,
                 metrics: LockMetrics = NO_METRICS, streams: int = STREAMS) -> None:
        self._metrics = metrics
        self._rule = RULES[Op.KEEPALIVE]
        self._streams = [_Stream(open_stream, on_broken) for _ in range(streams)]

    async def keepalive(self, lease_id: int) -> int:
        """Forward one keepalive for ``lease_id`` and return etcd's answer (:meth:`keepalives` of one).

        Returns:
            The TTL etcd reset the lease to, in seconds; <= 0 when the lease is gone.

        Raises:
            Unavailable: no answer within the rule's timeout on each of its attempts.
        """
        answers: list[int] = []
        _, error = await self.keepalives((lease_id,), lambda _, ttl: answers.append(ttl))
        if error is not None:
            raise error
        return answers[0]

    async def keepalives(self, lease_ids: Sequence[int], answered: Callable[[int, int], None]
                         ) -> tuple[list[int], FencepostError | None]:
        """Forward one keepalive per entry of ``lease_ids`` at once, each under the KEEPALIVE rule.

        Each entry follows the rule on its own (sent again on a new stream
        when the one it was sent on broke or went silent under it, at most
        the rule's attempts in all). No task per entry: each answer is
        handed to ``answered`` as soon as it arrives, so that no entry waits
        for another. Once this call is cancelled, ``answered`` is not called
        again.

        Args:
            lease_ids: the leases to renew (one may appear more than once: each entry is forwarded).
            answered: called with (index in ``lease_ids``, the TTL etcd reset the lease to; <= 0 when it is gone).

        Returns:
            The indexes of the entries left unanswered (none when all were),
            and the error :meth:`keepalive` would have raised for them.
        """
        loop = asyncio.get_running_loop()
        todo, failed = list(range(len(lease_ids))), []
        last: list[_StreamBroke] = []  # the last failure seen, if any
        if not todo:
            return [], None

        def done(finished: asyncio.Future[None], resend: list[int], left: list[int], index: int, sent: float,
                 answer: asyncio.Future[int]) -> None:
            """The answer of entry ``index`` of this round (``finished`` once ``left`` is 0) arrived or failed."""
            if finished.done():
                return  # the caller was cancelled
            try:
                ttl = answer.result()
            except _StreamBroke as exc:
                self._metrics.etcd_request("keepalive", time.perf_counter() - sent, _code(exc))
                last[:] = [exc]
                (resend if exc.failure in self._rule.resend else failed).append(index)
            else:
                self._metrics.etcd_request("keepalive", time.perf_counter() - sent)
                answered(index, ttl)
            left[0] -= 1
            if not left[0]:
                finished.set_result(None)

        for _ in range(self._rule.attempts):
            finished: asyncio.Future[None] = loop.create_future()
            resend: list[int] = []
            left = [len(todo)]
            for index in todo:
                self._send(lease_ids[index]).add_done_callback(
                    functools.partial(done, finished, resend, left, index, time.perf_counter()))
            try:
                await finished
            finally:
                finished.cancel()  # no-op once done; else (cancelled) no later answer is handed over
            todo = resend
            if not todo:
                break
        unanswered = sorted(failed + todo)
        if not unanswered:
            return [], None
        broke = last[-1]
        return unanswered, error_for(broke.failure, broke.exc, Op.KEEPALIVE, lease_id=lease_ids[unanswered[0]])

    def _send(self, lease_id: int) -> asyncio.Future[int]:
        """Send one keepalive of ``lease_id`` on its stream: its answer."""
        streams = self._streams
        return streams[lease_id % len(streams)].send(lease_id)

    @property
    def waiting_seconds(self) -> float:
        """How long the oldest keepalive still waiting for etcd's answer has waited, in seconds (0.0: none waits).

        Counted from when it was queued: a backlog in this process counts, as
        well as a slow etcd.
        """
        return max(stream.waiting_seconds for stream in self._streams)

    async def close(self) -> None:
        """Stop the streams (leases are left alone)."""
        for stream in self._streams:
            await stream.close()


class _Stream:
    """One LeaseKeepAlive stream: opened on first use, replaced when it goes silent or breaks."""

    def __init__(self, open_stream: StreamOpener, on_broken: BrokenHandler) -> None:
        self._open = open_stream
        self._on_broken = on_broken
        self._rule = RULES[Op.KEEPALIVE]
        self._outbox: asyncio.Queue[rpc_pb2.LeaseKeepAliveRequest] | None = None
        # Answers awaited on the current stream, by lease id, oldest first.
        self._pending: _Pending = collections.defaultdict(collections.deque)
        self._sent: _Sent = collections.deque()
        self._heard = 0.0  # time.monotonic() of the current stream's last answer (or its start)
        self._task: asyncio.Task[None] | None = None

    def send(self, lease_id: int) -> asyncio.Future[int]:
        """Send one keepalive of ``lease_id`` on the current stream (opened if there is none): its answer."""
        outbox, pending, sent_here = self._ensure_stream()
        answer: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        answer.add_done_callback(_retrieve)
        pending[lease_id].append(answer)
        sent_here.append((time.monotonic(), answer))
        outbox.put_nowait(rpc_pb2.LeaseKeepAliveRequest(ID=lease_id))
        return answer

    @property
    def waiting_seconds(self) -> float:
        """How long the oldest keepalive still waiting for etcd's answer has waited, in seconds (0.0: none waits).

        Counted from when it was queued: a backlog in this process counts, as
        well as a slow etcd.
        """
        sent = self._sent
        while sent and sent[0][1].done():
            sent.popleft()
        return time.monotonic() - sent[0][0] if sent else 0.0

    async def close(self) -> None:
        """Stop the stream (leases are left alone)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _ensure_stream(self) -> tuple[asyncio.Queue[rpc_pb2.LeaseKeepAliveRequest], _Pending, _Sent]:
        """The current stream (outbox, awaited answers by lease, keepalives in send order), opened if there is none."""
        if self._task is None or self._task.done() or self._outbox is None:
            self._outbox = asyncio.Queue()
            self._pending = collections.defaultdict(collections.deque)
            self._sent = collections.deque()
            self._heard = time.monotonic()
            self._task = asyncio.create_task(self._run(self._outbox, self._pending, self._sent),
                                             name="fencepost-lease-keepalive")
        return self._outbox, self._pending, self._sent

    def _restart(self, task: asyncio.Task[None], silent: float) -> None:
        """End ``task``'s stream (its awaited answers fail) so the next keepalive opens a new one."""
        if self._task is task:
            _log.warning("etcd keepalive stream unanswered for %.1f s; opening a new one", silent)
            self._task = None
            task.cancel()

    async def _watchdog(self, task: asyncio.Task[None], sent: _Sent) -> None:
        """End ``task``'s stream once a keepalive waits on it and nothing was answered for the timeout."""
        loop = asyncio.get_running_loop()
        timeout = self._rule.timeout
        interval = timeout / 4
        while True:
            before = loop.time()
            await asyncio.sleep(interval)
            late = loop.time() - before - interval > interval  # this process is behind: answers may be unread
            while sent and sent[0][1].done():
                sent.popleft()
            if not sent:
                continue
            now = time.monotonic()
            silent = now - max(self._heard, sent[0][0])  # since the last answer, or since the oldest waiting was sent
            if silent > timeout * (SILENCE_CAP if late else 1):
                self._restart(task, silent)
                return

    async def _run(self, outbox: asyncio.Queue[rpc_pb2.LeaseKeepAliveRequest], pending: _Pending,
                   sent: _Sent) -> None:
        async def requests() -> AsyncIterator[rpc_pb2.LeaseKeepAliveRequest]:
            while True:
                yield await outbox.get()

        broke = _StreamBroke(Failure.TIMEOUT, None)  # unless it breaks otherwise: cancelled when silent
        index, call = -1, None
        task = asyncio.current_task()
        assert task is not None
        watchdog = asyncio.ensure_future(self._watchdog(task, sent))
        try:
            index, call = await self._open(requests())
            async for resp in call:
                if self._task is task:
                    self._heard = time.monotonic()
                waiting = pending.get(int(resp.ID))
                if waiting:
                    answer = waiting.popleft()
                    if not waiting:
                        del pending[int(resp.ID)]
                    if not answer.done():
                        answer.set_result(int(resp.TTL))
        except grpc.aio.AioRpcError as exc:
            broke = _StreamBroke(classify(exc), exc)
            _log.warning("etcd keepalive stream broke: %s %s", exc.code().name, exc.details())
        except FencepostError as exc:  # could not open a stream (authentication failed)
            broke = _StreamBroke(Failure.AUTH_FAILED, exc)
        finally:
            watchdog.cancel()
            if call is not None:
                call.cancel()
                self._on_broken(index, broke.failure)
            # Answers that will never come: those keepalives count as not
            # acknowledged; the client's deadline covers them.
            for waiting in pending.values():
                for answer in waiting:
                    if not answer.done():
                        answer.set_exception(broke)
            pending.clear()


def _code(broke: _StreamBroke) -> grpc.StatusCode:
    """The gRPC code a broken stream ended with; DEADLINE_EXCEEDED when it was replaced for going silent."""
    if isinstance(broke.exc, grpc.aio.AioRpcError):
        return broke.exc.code()
    if broke.failure is Failure.AUTH_FAILED:
        return grpc.StatusCode.UNAUTHENTICATED
    return grpc.StatusCode.DEADLINE_EXCEEDED


def _retrieve(answer: asyncio.Future[int]) -> None:
    """Mark an answer's exception as seen (its caller may have timed out)."""
    if not answer.cancelled():
        answer.exception()
