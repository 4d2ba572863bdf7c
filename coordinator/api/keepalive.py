"""The KeepAlive RPC: admits each stream, serves it (:mod:`.stream`) and logs its life.

A stream is admitted as its row of :data:`.rpcs.RPCS` says (the ``acquire``
action, no lock name) and counts as a stream (:mod:`.slots`); it is then
served by one :class:`~.stream.KeepAliveStream`, announces the calls and
the batches of keepalives it serves (initial metadata,
:data:`~.stream_calls.CALLS_METADATA`), and logs
one ``stream_open`` and one ``stream_close`` event (how it ended:
``half_closed``, ``cancelled``, ``refused``, ``shutdown``, ``error``). At
shutdown it ends with UNAVAILABLE / SHUTTING_DOWN, unlogged as a refusal.

Memory: a stream's objects are freed by their reference counts when it
ends (its renewals drop the stream's bound methods at close, which made a
cycle holding the stream, its gRPC context and call state: about 39 objects
per stream that waited for the cycle collector's oldest generation, 15 MiB
of heap 20 s after a flood of 2,000 streams). gRPC's own method lookup
leaves a small cycle per call (5 objects, no call state), and glibc keeps
the pages freed, so once at least :data:`COLLECT_AFTER` streams have ended
since the last time and they are four times the streams still open (a
flood ended), :func:`.memory.release_memory` collects and trims
:data:`RELEASE_DELAY` later (tens of milliseconds, once per flood).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable

import grpc

from fencepost.client.errors import FencepostError
from fencepost.client.v1 import lock_pb2

from ..admission.identity import caller_of
from ..telemetry.events import caller, log_event
from .memory import release_memory
from .rpcs import Admission
from .slots import StreamSlots
from .status import Refusals, shutting_down
from .stream import KeepAliveStream
from .stream_calls import CALLS_METADATA

__all__ = ["KeepAlives"]

_log = logging.getLogger(__name__)

#: Fewest streams ended since the last release of memory for the next one (see the module docstring).
COLLECT_AFTER = 1000
#: Seconds from a flood's end to the release of memory (a later end within them puts it off again): the
#: clients close their connections after their streams, and gRPC frees each connection's buffers then.
RELEASE_DELAY = 10.0


class KeepAlives:
    """Serves KeepAlive streams, and knows the ones open (ServerInfo's counts).

    Args:
        admission: applies KeepAlive's row of the RPC table.
        refusals: ends a refused stream with its status.
        slots: the streams served at once.
        closing: set when the coordinator shuts down.
        stream: makes the :class:`~.stream.KeepAliveStream` of one call, given its context and its log
            fields (``peer``, ``trace_id``).
    """

    def __init__(self, admission: Admission, refusals: Refusals, slots: StreamSlots, closing: asyncio.Event,
                 stream: Callable[..., KeepAliveStream]) -> None:
        self._admission = admission
        self._refusals = refusals
        self._slots = slots
        self._closing = closing
        self._stream = stream
        #: The streams being served.
        self.open: set[KeepAliveStream] = set()
        self._ended = 0  # streams ended since the last cycle collection
        self._release: asyncio.TimerHandle | None = None  # the release_memory() to come
        self._released: asyncio.Future[None] | None = None  # the last release_memory() (a reference: not lost)

    async def serve(self, requests: AsyncIterable[lock_pb2.KeepAliveRequest], context: grpc.aio.ServicerContext
                    ) -> AsyncIterator[lock_pb2.KeepAliveResponse]:
        """The responses of one KeepAlive call (the servicer's KeepAlive yields them).

        Raises:
            grpc.aio.AbortError: the stream is refused, or ends at shutdown (see :meth:`.status.Refusals.refuse`).
        """
        key = caller_of(context).key
        try:
            await self._admission.admit("KeepAlive", None, context)
            self._slots.open(key)
        except FencepostError as exc:
            await self._refusals.refuse(context, exc, "KeepAlive")
        who = caller(context)
        stream = self._stream(context, **who)
        self.open.add(stream)
        log_event(_log, logging.INFO, "stream_open", f"KeepAlive stream opened by {who['peer']}", **who)
        started, ended = time.monotonic(), "error"  # "error": a failure of the stream
        refused: FencepostError | None = None
        try:
            await context.send_initial_metadata((CALLS_METADATA,))  # the calls and keepalive batches served
            async for response in stream.serve(requests, self._closing):
                yield response
            ended = "shutdown" if self._closing.is_set() else "half_closed"
        except FencepostError as exc:  # a message the stream refuses (a name that is not UTF-8, no protobuf)
            ended, refused = "refused", exc
        except (asyncio.CancelledError, GeneratorExit):
            ended = "cancelled"
            raise
        finally:
            self._slots.close(key)
            self.open.discard(stream)
            self._ended += 1
            if self._ended >= max(COLLECT_AFTER, 4 * len(self.open)):  # a flood ended
                self._ended = 0
                if self._release is not None:
                    self._release.cancel()
                self._release = asyncio.get_running_loop().call_later(RELEASE_DELAY, self._release_memory)
            log_event(_log, logging.INFO, "stream_close", f"KeepAlive stream of {who['peer']} ended: {ended}",
                      ended=ended, leases=stream.lease_count, holds=stream.hold_count,
                      duration_s=round(time.monotonic() - started, 3), **who)
        if refused is not None:
            await self._refusals.refuse(context, refused, "KeepAlive")
        if self._closing.is_set():
            await self._refusals.refuse(context, shutting_down(), "KeepAlive", log=False)

    def _release_memory(self) -> None:
        self._release = None
        self._released = asyncio.ensure_future(release_memory())

    def counts(self) -> dict[str, int]:
        """ServerInfo's counts of the streams open: ``keepalive_streams``, ``keepalive_leases``, ``watched_holds``."""
        return {"keepalive_streams": len(self.open), "keepalive_leases": sum(s.lease_count for s in self.open),
                "watched_holds": sum(s.watched_count for s in self.open)}
