"""The one LeaseKeepAlive stream per coordinator, shared by every lease.

Each keepalive a client sends is forwarded as one ``LeaseKeepAliveRequest``
on this stream; etcd answers each with the TTL it reset the lease to (0 or
less when the lease is gone), in order per lease. Nothing here renews a lease
on a timer.

A member that stops answering (SIGSTOPped, cut off without FIN or RST) keeps
its TCP connection open, so gRPC would only notice at its ping timeout
(15 s); so a keepalive unanswered for ``RULES[Op.KEEPALIVE].timeout``
(0.5 s) ends the stream, and the keepalive is sent again on a new stream on
the next member, ``RULES[Op.KEEPALIVE].attempts`` (3) times at most: all
attempts together stay under K = TTL/3 for the shortest TTLs clients use,
so the keepalive is still acknowledged before the client's deadline.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from fencepost.client.errors import FencepostError
from fencepost.client.v1.etcd import rpc_pb2

from ..lock_metrics import NO_METRICS, LockMetrics
from .policy import RULES, Failure, Op, classify, error_for

__all__ = ["BrokenHandler", "KeepAlives", "StreamOpener"]

_log = logging.getLogger(__name__)

_Pending = dict[int, collections.deque[asyncio.Future[int]]]

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
    """Forwards keepalives on one shared LeaseKeepAlive stream, replaced when it goes silent.

    Args:
        open_stream: Opens a stream on the current member (the etcd layer's).
        on_broken: Called with a member's index and the failure when its
            stream went silent or broke, so that the next stream goes to
            another member (or carries a new auth token).
        metrics: Records each keepalive's time to its answer, and those
            unanswered (operation ``keepalive``).
    """

    def __init__(self, open_stream: StreamOpener, on_broken: BrokenHandler,
                 metrics: LockMetrics = NO_METRICS) -> None:
        self._open = open_stream
        self._on_broken = on_broken
        self._metrics = metrics
        self._rule = RULES[Op.KEEPALIVE]
        self._outbox: asyncio.Queue[rpc_pb2.LeaseKeepAliveRequest] | None = None
        # Answers awaited on the current stream, by lease id, oldest first.
        self._pending: _Pending = collections.defaultdict(collections.deque)
        self._task: asyncio.Task[None] | None = None

    async def keepalive(self, lease_id: int) -> int:
        """Forward one keepalive for ``lease_id`` and return etcd's answer.

        Returns:
            The TTL etcd reset the lease to, in seconds; <= 0 when the lease is gone.

        Raises:
            Unavailable: no answer within the rule's timeout on each of its attempts.
        """
        last: _StreamBroke | None = None
        for _ in range(self._rule.attempts):
            task, outbox, pending = self._ensure_stream()
            answer: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            answer.add_done_callback(_retrieve)
            pending[lease_id].append(answer)
            outbox.put_nowait(rpc_pb2.LeaseKeepAliveRequest(ID=lease_id))
            sent = time.perf_counter()
            try:
                ttl = await asyncio.wait_for(asyncio.shield(answer), self._rule.timeout)
                self._metrics.etcd_request("keepalive", time.perf_counter() - sent)
                return ttl
            except TimeoutError:
                # The stream's member is stuck: replace the stream, retry on the next member.
                self._metrics.etcd_request("keepalive", time.perf_counter() - sent, grpc.StatusCode.DEADLINE_EXCEEDED)
                last = _StreamBroke(Failure.TIMEOUT, None)
                self._restart(task)
            except _StreamBroke as exc:  # the stream broke under the answer: retry on a new one
                self._metrics.etcd_request("keepalive", time.perf_counter() - sent, _code(exc))
                last = exc
                if exc.failure not in self._rule.resend:
                    break
        failure = last.failure if last is not None else Failure.TIMEOUT
        raise error_for(failure, last.exc if last else None, Op.KEEPALIVE, lease_id=lease_id)

    async def close(self) -> None:
        """Stop the stream (leases are left alone)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _ensure_stream(self) -> tuple[asyncio.Task[None], asyncio.Queue[rpc_pb2.LeaseKeepAliveRequest], _Pending]:
        """The current stream (task, outbox, awaited answers), opened if there is none."""
        if self._task is None or self._task.done() or self._outbox is None:
            self._outbox = asyncio.Queue()
            self._pending = collections.defaultdict(collections.deque)
            self._task = asyncio.create_task(self._run(self._outbox, self._pending),
                                             name="fencepost-lease-keepalive")
        return self._task, self._outbox, self._pending

    def _restart(self, task: asyncio.Task[None]) -> None:
        """End ``task``'s stream (its awaited answers fail) so the next keepalive opens a new one."""
        if self._task is task:
            _log.warning("etcd keepalive stream unanswered for %.1f s; opening a new one", self._rule.timeout)
            self._task = None
            task.cancel()

    async def _run(self, outbox: asyncio.Queue[rpc_pb2.LeaseKeepAliveRequest], pending: _Pending) -> None:
        async def requests() -> AsyncIterator[rpc_pb2.LeaseKeepAliveRequest]:
            while True:
                yield await outbox.get()

        broke = _StreamBroke(Failure.TIMEOUT, None)  # unless it breaks otherwise: cancelled when silent
        index, call = -1, None
        try:
            index, call = await self._open(requests())
            async for resp in call:
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
