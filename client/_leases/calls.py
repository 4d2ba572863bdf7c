"""Acquire, Release and Withdraw sent as messages on the client's KeepAlive stream.

A coordinator that serves these calls on the stream says so in the stream's
initial metadata (:data:`CALLS_METADATA`); see the ``KeepAlive`` comment in
``proto/fencepost/v1/lock.proto``. Each call is then one message each way
instead of a unary gRPC call: the fast path under load (grpc.aio: about
4,900 unary calls/s against 17,900 stream messages/s on 2 cores).

:class:`StreamCalls` is told of each stream by the
:class:`~fencepost.client._leases.stream.KeepAliveStream` (:meth:`~StreamCalls.opened`,
:meth:`~StreamCalls.listen`, :meth:`~StreamCalls.ended`) and of each answer
(:meth:`~StreamCalls.answer`). :meth:`~StreamCalls.call` is one attempt of
a call, made by :meth:`fencepost.client._transport.transport.Transport.call` instead
of the unary call when :meth:`~StreamCalls.serves` says the current stream
serves it. An attempt that fails raises the ``grpc.aio.AioRpcError`` the
unary call would have raised, so that the transport's one retry rule and
:func:`~fencepost.client.errors.from_rpc_error` apply unchanged:

- ``failed``: the answer's code, message and ``google.rpc.Status`` details
  (as the unary call's ``grpc-status-details-bin`` trailer);
- the stream ended before the answer (the coordinator cancels every call
  running on a stream that ends): UNAVAILABLE without details, as a
  connection lost during a unary call: the outcome is unknown;
- no answer within the call's timeout: DEADLINE_EXCEEDED, as a unary call's
  deadline.

An acquire whose caller is cancelled or whose timeout passes is abandoned
with a ``cancel`` message, as cancelling the unary call would (the client
then withdraws it, see :mod:`fencepost.client._recipes.lock`).

Batches: when the stream also announces :data:`CALL_BATCHES`, each call (and
each ``cancel``) is queued as a :class:`CallEntry`, and :func:`drain`, which
feeds the stream, sends the entries that are next to each other in the
outbox as one ``calls`` message (at most
:data:`~fencepost.client.v1.keys.MAX_CALLS_PER_BATCH` entries and
:data:`~fencepost.client.v1.keys.MAX_CALLS_BATCH_BYTES`): the calls queued
in the same event-loop turn, and those queued while gRPC was writing the
previous message. Nothing waits for a timer; one call alone is a batch of
one (measured: no dearer than a single call message, about 1 us either way
of the ~200 us a gRPC message costs). The coordinator then sends answers ready together as one ``answers``
message, each entry delivered by :meth:`StreamCalls.answer` as a single
answer is.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import AsyncIterator
from typing import Any, NamedTuple

import grpc
import grpc.aio
from google.protobuf.message import Message

from ..v1 import lock_pb2 as pb
from ..v1.details import STATUS_DETAILS_KEY
from ..v1.keys import MAX_CALLS_BATCH_BYTES, MAX_CALLS_PER_BATCH

__all__ = ["CALLS_METADATA", "CALL_BATCHES", "KEEPALIVES", "CallEntry", "Outbox", "StreamCalls", "drain"]

#: The initial metadata key by which a coordinator announces the calls it serves on the stream, and
#: the calls this client sends there when announced (its value lists them, comma-separated), and
#: :data:`KEEPALIVES` when it serves batches of keepalives.
CALLS_METADATA = "fencepost-stream-calls"
#: The word of :data:`CALLS_METADATA` by which a coordinator says it serves batches of keepalives.
KEEPALIVES = "keepalives"
#: The word of :data:`CALLS_METADATA` by which a coordinator says it serves batches of calls (``calls``).
CALL_BATCHES = "calls"

#: LockService method -> (KeepAliveRequest field of the call, KeepAliveResponse field of its answer).
_FIELDS: dict[str, tuple[str, str]] = {
    "Acquire": ("acquire", "acquired"),
    "Release": ("release", "released"),
    "Withdraw": ("withdraw", "withdrawn"),
}

_CODES: dict[int, grpc.StatusCode] = {code.value[0]: code for code in grpc.StatusCode}



class CallEntry(NamedTuple):
    """A call queued to go as an entry of a ``calls`` message (:func:`drain` sends it).

    Attributes:
        fields: the ``StreamCall`` fields (``request_id``, ``timeout_ms``,
            ``lease_secret``, ``traceparent``, and the call: ``acquire``, ...).
    """

    fields: dict[str, Any]

    def size(self) -> int:
        """About how many bytes the entry takes in a message (its call, secret and traceparent, and 16 for the rest)."""
        f = self.fields
        call = f.get("acquire") or f.get("release") or f.get("withdraw") or f.get("cancel")
        return (call.ByteSize() if call is not None else 0) + len(f.get("lease_secret", "")) + \
            len(f.get("traceparent", "")) + 16


#: The messages a stream sends, in order: messages, call entries (sent together by :func:`drain`), None to end.
Outbox = asyncio.Queue[pb.KeepAliveRequest | CallEntry | None]
#: An answer to a call: alone (a KeepAliveResponse) or an entry of a batch of answers (its fields have the same names).
Answer = pb.KeepAliveResponse | pb.StreamAnswer


class _Pending(NamedTuple):
    method: str
    request: Message
    outbox: Outbox
    answer: asyncio.Future[Answer | None]  # None: the stream ended first


class StreamCalls:
    """The calls running on the current KeepAlive stream, and whether that stream serves them.

    Args:
        enabled: Send calls on the stream when it serves them; False keeps
            every call unary (``AsyncLockClient(stream_calls=False)``).
    """

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self._outbox: Outbox | None = None
        self._served: frozenset[str] = frozenset()  # the methods the current stream announced
        self._announced: frozenset[str] = frozenset()  # every word the current stream announced
        self._batches = False  # the current stream serves batches of calls: calls are queued as entries
        self._pending: dict[int, _Pending] = {}
        self._request_ids = itertools.count(1)

    # ------------------------------------------------------------------ the stream's life

    def opened(self, outbox: Outbox) -> None:
        """A new stream sends from ``outbox``; it serves no call until its initial metadata says so."""
        self._outbox = outbox
        self._served = self._announced = frozenset()
        self._batches = False

    async def listen(self, call: grpc.aio.StreamStreamCall, outbox: Outbox) -> None:
        """Read the initial metadata of the stream ``call`` (sending from ``outbox``): which calls it serves.

        Returns when the metadata arrives (a coordinator that serves calls
        sends it as the stream opens; an older one with its first answer) or
        the stream ends. Never raises but for cancellation.
        """
        try:
            metadata = await call.initial_metadata()
        except (grpc.RpcError, grpc.aio.UsageError):
            return
        self.announced(outbox, metadata or ())

    def announced(self, outbox: Outbox, metadata: Any) -> None:
        """Record the calls the stream sending from ``outbox`` announced in its initial metadata ((key, value) pairs)."""
        if outbox is not self._outbox:
            return  # a stream that has ended since
        served: set[str] = set()
        for key, value in metadata:
            if key == CALLS_METADATA and isinstance(value, str):
                served.update(word.strip() for word in value.split(","))
        self._announced = frozenset(served)
        self._served = frozenset(method for method, (field, _) in _FIELDS.items() if field in served)
        self._batches = CALL_BATCHES in served

    def ended(self, outbox: Outbox) -> None:
        """The stream sending from ``outbox`` ended: every call still waiting on it has an unknown outcome."""
        if outbox is self._outbox:
            self._outbox = None
            self._served = self._announced = frozenset()
            self._batches = False
        for request_id, pending in list(self._pending.items()):
            if pending.outbox is outbox:
                del self._pending[request_id]
                if not pending.answer.done():
                    pending.answer.set_result(None)

    # ------------------------------------------------------------------ calls

    def announces(self, word: str) -> bool:
        """Whether the current stream announced ``word`` (:data:`KEEPALIVES`, ...), calls enabled or not."""
        return word in self._announced

    def serves(self, method: str) -> bool:
        """Whether an attempt of LockService ``method`` goes on the stream now (it is up and serves it)."""
        return self.enabled and self._outbox is not None and method in self._served

    @property
    def running(self) -> int:
        """How many calls are waiting for their answer."""
        return len(self._pending)

    async def call(self, method: str, request: Message, *, timeout: float | None, secret: str = "",
                   traceparent: str = "") -> Any:
        """Send one attempt of ``method`` on the current stream and wait for its answer.

        Args:
            method: ``"Acquire"``, ``"Release"`` or ``"Withdraw"`` (one :meth:`serves` said yes to).
            request: Its request message (``AcquireRequest``, ...).
            timeout: Seconds to wait for the answer, as a unary call's
                deadline (sent as ``timeout_ms``); None for no bound.
            secret: The secret of the lease the call names; "" for none.
            traceparent: The caller's W3C trace context; "" for none.

        Returns:
            The answer (``AcquireResponse``, ``ReleaseResponse`` or ``WithdrawResponse``).

        Raises:
            grpc.aio.AioRpcError: the status the unary call would have ended
                with: the coordinator's (``failed``), UNAVAILABLE when the
                stream ended first or was down, DEADLINE_EXCEEDED after ``timeout``.
            asyncio.CancelledError: the caller was cancelled (an acquire is
                abandoned with a ``cancel`` message).
        """
        outbox = self._outbox
        if outbox is None or not self.serves(method):
            raise _error(grpc.StatusCode.UNAVAILABLE, "keepalive stream is down")
        field, answer_field = _FIELDS[method]
        request_id = next(self._request_ids)
        answer: asyncio.Future[Answer | None] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = _Pending(method, request, outbox, answer)
        timeout_ms = 0 if timeout is None else max(1, math.ceil(timeout * 1000))
        fields = {"request_id": request_id, "timeout_ms": timeout_ms, "lease_secret": secret,
                  "traceparent": traceparent, field: request}
        outbox.put_nowait(CallEntry(fields) if self._batches else pb.KeepAliveRequest(**fields))
        try:
            if timeout is None:
                response = await answer
            else:
                async with asyncio.timeout(timeout):
                    response = await answer
        except TimeoutError:
            self._abandon(request_id)
            raise _error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
        except asyncio.CancelledError:
            self._abandon(request_id)
            raise
        if response is None:
            raise _error(grpc.StatusCode.UNAVAILABLE, "keepalive stream ended before the answer")
        kind = response.WhichOneof("response")
        if kind == answer_field:
            return getattr(response, kind)
        if kind == "failed":
            raise _failed(response.failed)
        raise _error(grpc.StatusCode.INTERNAL, f"unexpected answer {kind!r} to a stream {field}")

    def answer(self, response: Answer) -> tuple[str, Message] | None:
        """Deliver an answer (``acquired``, ``released``, ``withdrawn`` or ``failed``) to its call.

        Args:
            response: a KeepAliveResponse, or one entry of its ``answers``.

        Returns:
            (method, request) of the call it answers; None when no call waits
            for it (abandoned, or an unknown request id).
        """
        pending = self._pending.pop(response.request_id, None)
        if pending is None:
            return None
        if not pending.answer.done():
            pending.answer.set_result(response)
        return pending.method, pending.request

    def _abandon(self, request_id: int) -> None:
        """Forget a call whose caller stopped waiting; an acquire still running is cancelled on its stream."""
        pending = self._pending.pop(request_id, None)
        if pending is None or pending.method != "Acquire" or pending.outbox is not self._outbox:
            return  # answered already, or its stream ended (which cancelled it)
        fields = {"cancel": pb.CancelCall(request_id=request_id)}
        pending.outbox.put_nowait(CallEntry(fields) if self._batches else pb.KeepAliveRequest(**fields))


_NOTHING = object()


async def drain(outbox: Outbox) -> AsyncIterator[pb.KeepAliveRequest]:
    """The messages of a stream's ``outbox``, in order, until None: what the stream sends.

    :class:`CallEntry` items next to each other in the outbox go as one
    ``calls`` message, of at most :data:`~fencepost.client.v1.keys.MAX_CALLS_PER_BATCH`
    entries and about :data:`~fencepost.client.v1.keys.MAX_CALLS_BATCH_BYTES`:
    what is queued when gRPC asks for the next message goes at once, and
    nothing is held back to wait for more.
    """
    held: Any = _NOTHING  # an item taken from the outbox behind a batch, not sent yet
    while True:
        message = await outbox.get() if held is _NOTHING else held
        held = _NOTHING
        if message is None:
            return
        if type(message) is CallEntry:
            batch = pb.KeepAliveRequest()
            add = batch.calls.calls.add  # built in place: cheaper than copying StreamCall messages in
            add(**message.fields)
            count, size = 1, message.size()
            while not outbox.empty() and count < MAX_CALLS_PER_BATCH:
                following = outbox.get_nowait()
                if type(following) is not CallEntry or (size := size + following.size()) > MAX_CALLS_BATCH_BYTES:
                    held = following
                    break
                add(**following.fields)
                count += 1
            message = batch
        yield message


def _error(code: grpc.StatusCode, details: str, trailing: grpc.aio.Metadata | None = None) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailing or grpc.aio.Metadata(), details=details)


def _failed(failed: pb.CallFailed) -> grpc.aio.AioRpcError:
    """The error a unary call would have raised with the status of ``failed``."""
    code = _CODES.get(failed.code, grpc.StatusCode.UNKNOWN)
    trailing = grpc.aio.Metadata((STATUS_DETAILS_KEY, failed.status)) if failed.status else None
    return _error(code, failed.message, trailing)
