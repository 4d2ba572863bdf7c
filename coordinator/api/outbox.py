"""A KeepAlive stream's outbox: the answers waiting to be sent, in the order they were queued.

The stream's parts queue answers (:meth:`StreamOutbox.put`, :meth:`StreamOutbox.put_ack`)
and the stream sends what :meth:`StreamOutbox.take` returns. Whatever is
ready is taken without a wait each. On a stream whose client has sent a
batch of keepalives (:attr:`StreamOutbox.batched`), acks that are next to
each other in the queue go as one ``LeaseKeepAliveAcks`` message (at most
:data:`~fencepost.client.v1.keys.MAX_KEEPALIVES_PER_BATCH`): acks ready at
the same time are sent together, and no ack is held back to wait for
another. Elsewhere each ack is its own ``LeaseKeepAliveAck`` message, as an
older client expects.

An answer that waited longer than :data:`LATE_SECONDS` to be sent is told to
``on_late`` (a backlog of answers: the coordinator is behind, see
:mod:`..admission.overload`); for acks sent together, the oldest one's wait.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from fencepost.client.v1 import lock_pb2
from fencepost.client.v1.keys import MAX_KEEPALIVES_PER_BATCH

__all__ = ["LATE_SECONDS", "StreamOutbox"]

#: A response that waited longer than this to be sent, in seconds, is told to ``on_late``.
LATE_SECONDS = 0.05

#: Queued behind the responses when the stream must end (see :meth:`StreamOutbox.end`).
_END = object()

_Ack = lock_pb2.LeaseKeepAliveAck


class StreamOutbox:
    """The answers of one KeepAlive stream waiting to be sent.

    Args:
        on_late: told the seconds a response waited to be sent, when more than :data:`LATE_SECONDS`.
    """

    def __init__(self, on_late: Callable[[float], None] | None = None) -> None:
        self._on_late = on_late
        # (time.monotonic() when queued, a KeepAliveResponse or a bare LeaseKeepAliveAck), or _END.
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._next: Any = None  # an item taken from the queue, not sent yet (it followed acks merged)
        #: Whether the client has sent a batch of keepalives: acks ready together then go as one message.
        self.batched = False

    def put(self, response: lock_pb2.KeepAliveResponse) -> None:
        """Queue ``response``."""
        self._queue.put_nowait((time.monotonic(), response))

    def put_ack(self, lease_id: int, request_id: int, ttl_seconds: int) -> None:
        """Queue the ack of one keepalive."""
        self._queue.put_nowait((time.monotonic(), _Ack(lease_id=lease_id, request_id=request_id,
                                                        ttl_seconds=ttl_seconds)))

    def end(self, _: object = None) -> None:
        """Queue the end of the stream behind what is queued (a done callback: its argument is ignored)."""
        self._queue.put_nowait(_END)

    async def take(self) -> lock_pb2.KeepAliveResponse | None:
        """The next response to send, waiting for one; None where :meth:`end` was called."""
        item = self._next
        self._next = None
        if item is None:
            item = await self._queue.get()
        if item is _END:
            return None
        queued, message = item
        if type(message) is not _Ack:
            self._told(queued)
            return message  # type: ignore[no-any-return]
        acks = None
        queue = self._queue
        while self.batched and not queue.empty() and (acks is None or len(acks) < MAX_KEEPALIVES_PER_BATCH):
            following = queue.get_nowait()
            if following is _END or type(following[1]) is not _Ack:
                self._next = following
                break
            if acks is None:
                acks = [message]
            acks.append(following[1])
        self._told(queued)
        if acks is None:
            return lock_pb2.KeepAliveResponse(keepalive=message)
        return lock_pb2.KeepAliveResponse(keepalives=lock_pb2.LeaseKeepAliveAcks(acks=acks))

    def _told(self, queued: float) -> None:
        """A response queued at ``queued`` is about to be sent: a long wait is told to ``on_late``."""
        waited = time.monotonic() - queued
        if waited > LATE_SECONDS and self._on_late is not None:
            self._on_late(waited)
