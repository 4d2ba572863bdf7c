"""A KeepAlive stream's outbox: the answers waiting to be sent, in the order they were queued.

The stream's parts queue answers (:meth:`StreamOutbox.put`, :meth:`StreamOutbox.put_ack`,
:meth:`StreamOutbox.put_answer`) and the stream sends what :meth:`StreamOutbox.take`
returns. Whatever is ready is taken without a wait each. On a stream whose
client has sent a batch of keepalives (:attr:`StreamOutbox.batched`), acks
that are next to each other in the queue go as one ``LeaseKeepAliveAcks``
message (at most :data:`~fencepost.client.v1.keys.MAX_KEEPALIVES_PER_BATCH`):
acks ready at the same time are sent together, and no ack is held back to
wait for another. Elsewhere each ack is its own ``LeaseKeepAliveAck``
message, as an older client expects. The answers of calls on the stream go
the same way: together as one ``StreamAnswers`` (at most
:data:`~fencepost.client.v1.keys.MAX_CALLS_PER_BATCH`) on a stream whose
client has sent a batch of calls (:attr:`StreamOutbox.calls_batched`), each
in a message of its own elsewhere.

An answer that waited longer than :data:`LATE_SECONDS` to be sent is told to
``on_late`` (a backlog of answers: the coordinator is behind, see
:mod:`..admission.overload`); for acks sent together, the oldest one's wait.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from fencepost.client.v1 import lock_pb2
from fencepost.client.v1.keys import MAX_CALLS_PER_BATCH, MAX_KEEPALIVES_PER_BATCH

__all__ = ["LATE_SECONDS", "StreamOutbox"]

#: A response that waited longer than this to be sent, in seconds, is told to ``on_late``.
LATE_SECONDS = 0.05

#: Queued behind the responses when the stream must end (see :meth:`StreamOutbox.end`).
_END = object()

_Ack = lock_pb2.LeaseKeepAliveAck
_Response = lock_pb2.KeepAliveResponse


class _Answer(NamedTuple):
    """The answer to one call on the stream: its request id, the answer's field (``acquired``, ...), the message."""

    request_id: int
    field: str
    message: Any


def _one_ack(ack: Any) -> _Response:
    return _Response(keepalive=ack)


def _acks(acks: list[Any]) -> _Response:
    return _Response(keepalives=lock_pb2.LeaseKeepAliveAcks(acks=acks))


def _one_answer(answer: Any) -> _Response:
    return _Response(request_id=answer.request_id, **{answer.field: answer.message})


def _answers(answers: list[Any]) -> _Response:
    response = _Response()
    add = response.answers.answers.add  # built in place: cheaper than copying StreamAnswer messages in
    for a in answers:
        add(request_id=a.request_id, **{a.field: a.message})
    return response


#: A mergeable item's type -> (its message alone, the message of several, the most in one message).
_MERGE = {_Ack: (_one_ack, _acks, MAX_KEEPALIVES_PER_BATCH), _Answer: (_one_answer, _answers, MAX_CALLS_PER_BATCH)}


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
        #: Whether the client has sent a batch of calls: answers ready together then go as one message.
        self.calls_batched = False

    def put(self, response: lock_pb2.KeepAliveResponse) -> None:
        """Queue ``response``."""
        self._queue.put_nowait((time.monotonic(), response))

    def put_ack(self, lease_id: int, request_id: int, ttl_seconds: int) -> None:
        """Queue the ack of one keepalive."""
        self._queue.put_nowait((time.monotonic(), _Ack(lease_id=lease_id, request_id=request_id,
                                                        ttl_seconds=ttl_seconds)))

    def put_answer(self, request_id: int, field: str, message: Any) -> None:
        """Queue the answer to call ``request_id``: ``field`` (``acquired``, ``released``, ``withdrawn``,
        ``failed``) set to ``message``."""
        self._queue.put_nowait((time.monotonic(), _Answer(request_id, field, message)))

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
        kind = type(message)
        if kind is _Response:
            self._told(queued)
            return message  # type: ignore[no-any-return]
        one, several, most = _MERGE[kind]
        group = None
        queue = self._queue
        while (self.batched if kind is _Ack else self.calls_batched) and not queue.empty() and (
                group is None or len(group) < most):
            following = queue.get_nowait()
            if following is _END or type(following[1]) is not kind:
                self._next = following
                break
            if group is None:
                group = [message]
            group.append(following[1])
        self._told(queued)
        return one(message) if group is None else several(group)

    def _told(self, queued: float) -> None:
        """A response queued at ``queued`` is about to be sent: a long wait is told to ``on_late``."""
        waited = time.monotonic() - queued
        if waited > LATE_SECONDS and self._on_late is not None:
            self._on_late(waited)
