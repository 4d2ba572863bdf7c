"""Leases (sessions): grant, revoke, and keepalives forwarded to etcd.

Every keepalive a client sends is forwarded on one shared etcd
``LeaseKeepAlive`` stream per coordinator and answered with the TTL etcd
reset the lease to. The coordinator never renews a lease on its own timer: a
frozen or dead client loses its lease one TTL after its last keepalive.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence

import grpc
from etcd3aio import Etcd3Client, EtcdError
from etcd3aio._protobuf import LeaseKeepAliveRequest, LeaseStub
from etcd3aio.connections import ConnectionManager

from fencepost.client.errors import Unavailable

from .errors import etcd_unavailable
from .validate import validate_lease_id, validate_ttl

_log = logging.getLogger(__name__)

_Pending = dict[int, collections.deque[asyncio.Future[int]]]

#: How long a forwarded keepalive waits for etcd's answer on one stream, in
#: seconds (a healthy etcd answers in milliseconds). Past it the stream is
#: presumed stuck on a frozen or cut-off member (a SIGSTOPped etcd keeps its
#: TCP connection open, so gRPC only notices at its ping timeout, 15 s) and
#: is replaced; all attempts together must stay under K = TTL/3 so that the
#: keepalive is still acknowledged before the client's deadline.
KEEPALIVE_ANSWER_TIMEOUT = 0.5
#: Streams a forwarded keepalive is tried on (the round-robin channel puts a
#: new stream on another member; 3 covers a 3-member cluster).
KEEPALIVE_ATTEMPTS = 3
#: Per-call deadline of unary etcd calls made by the coordinator, in seconds.
ETCD_CALL_TIMEOUT = 5.0


class Sessions:
    """Lease grant and revoke on etcd, and the shared keepalive stream.

    Args:
        etcd: a connected etcd3aio client (grant, revoke).
        endpoints: the etcd endpoints, for the keepalive stream's own channel.
    """

    def __init__(self, etcd: Etcd3Client, endpoints: Sequence[str]) -> None:
        self._etcd = etcd
        self._channel = ConnectionManager(list(endpoints)).get_channel()
        self._stub = LeaseStub(self._channel)
        self._outbox: asyncio.Queue[LeaseKeepAliveRequest] | None = None
        # Answers awaited on the current stream, by lease id, oldest first.
        self._pending: _Pending = collections.defaultdict(collections.deque)
        self._task: asyncio.Task[None] | None = None

    async def grant(self, ttl_seconds: int) -> tuple[int, int]:
        """Grant a lease.

        Args:
            ttl_seconds: requested TTL, 1 to 86400 seconds.

        Returns:
            (lease id, granted TTL in seconds); etcd may raise the TTL to its minimum.

        Raises:
            InvalidField: ttl_seconds out of range.
            EtcdUnavailable: etcd unreachable.
        """
        validate_ttl(ttl_seconds)
        try:
            resp = await self._etcd.lease.grant(ttl_seconds, timeout=ETCD_CALL_TIMEOUT, max_attempts=1)
        except (EtcdError, grpc.aio.AioRpcError, TimeoutError) as exc:
            raise etcd_unavailable(f"etcd: lease grant failed: {exc}") from exc
        return int(resp.ID), int(resp.TTL)

    async def revoke(self, lease_id: int) -> bool:
        """Revoke a lease and so delete every key attached to it.

        Returns:
            False when the lease was already gone.

        Raises:
            InvalidField: lease_id not > 0.
            EtcdUnavailable: etcd unreachable.
        """
        validate_lease_id(lease_id)
        try:
            await self._etcd.lease.revoke(lease_id, timeout=ETCD_CALL_TIMEOUT)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return False
            raise etcd_unavailable(f"etcd: lease revoke failed: {exc.details()}", lease_id=lease_id) from exc
        except (EtcdError, TimeoutError) as exc:
            raise etcd_unavailable(f"etcd: lease revoke failed: {exc}", lease_id=lease_id) from exc
        return True

    async def keepalive(self, lease_id: int) -> int:
        """Forward one keepalive to etcd on the shared stream.

        Args:
            lease_id: the lease to renew.

        Returns:
            The TTL etcd reset the lease to, in seconds; <= 0 if the lease is gone.

        Raises:
            EtcdUnavailable: no answer from etcd on KEEPALIVE_ATTEMPTS streams,
                each given KEEPALIVE_ANSWER_TIMEOUT.
        """
        last: BaseException | None = None
        for _ in range(KEEPALIVE_ATTEMPTS):
            task, outbox, pending = self._ensure_stream()
            answer: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            answer.add_done_callback(_retrieve)
            pending[lease_id].append(answer)
            outbox.put_nowait(LeaseKeepAliveRequest(ID=lease_id))
            try:
                return await asyncio.wait_for(asyncio.shield(answer), KEEPALIVE_ANSWER_TIMEOUT)
            except TimeoutError as exc:
                # The stream's member is stuck: replace the stream, retry on the next member.
                last = exc
                self._restart_stream(task)
            except Unavailable as exc:  # the stream broke under the answer: retry on a new one
                last = exc
        raise etcd_unavailable("etcd: no keepalive answer", lease_id=lease_id) from last

    async def close(self) -> None:
        """Stop the keepalive stream and close its channel (leases are left alone)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._channel.close()

    def _ensure_stream(self) -> tuple[asyncio.Task[None], asyncio.Queue[LeaseKeepAliveRequest], _Pending]:
        """The current stream (task, outbox, awaited answers), opened if there is none."""
        if self._task is None or self._task.done() or self._outbox is None:
            self._outbox = asyncio.Queue()
            self._pending = collections.defaultdict(collections.deque)
            self._task = asyncio.create_task(self._run(self._outbox, self._pending),
                                             name="fencepost-lease-keepalive")
        return self._task, self._outbox, self._pending

    def _restart_stream(self, task: asyncio.Task[None]) -> None:
        """End ``task``'s stream (its awaited answers fail) so the next keepalive opens a new one."""
        if self._task is task:
            _log.warning("etcd keepalive stream unanswered for %.1f s; opening a new one", KEEPALIVE_ANSWER_TIMEOUT)
            self._task = None
            task.cancel()

    async def _run(self, outbox: asyncio.Queue[LeaseKeepAliveRequest], pending: _Pending) -> None:
        async def requests() -> AsyncIterator[LeaseKeepAliveRequest]:
            while True:
                yield await outbox.get()

        call = self._stub.LeaseKeepAlive(requests())
        try:
            async for resp in call:
                waiting = pending.get(int(resp.ID))
                if waiting:
                    answer = waiting.popleft()
                    if not waiting:
                        del pending[int(resp.ID)]
                    if not answer.done():
                        answer.set_result(int(resp.TTL))
        except grpc.aio.AioRpcError as exc:
            _log.warning("etcd keepalive stream broke: %s", exc.code().name)
        finally:
            call.cancel()
            # Answers that will never come: those keepalives count as not
            # acknowledged; the client's deadline covers them.
            for waiting in pending.values():
                for answer in waiting:
                    if not answer.done():
                        answer.set_exception(etcd_unavailable("etcd keepalive stream broke"))
            pending.clear()


def _retrieve(answer: asyncio.Future[int]) -> None:
    """Mark an answer's exception as seen (its caller may have timed out)."""
    if not answer.cancelled():
        answer.exception()
