"""Concurrent lock Txns sent to etcd as one Txn: one gRPC call and one Raft entry for many.

Under load the coordinator makes thousands of small lock Txns a second (an
Acquire and a Release are one Txn each), and each costs a unary gRPC call
(Python CPU here) and a Raft entry in etcd. :class:`TxnBatcher` sends the
Txns that arrive while one is in flight together, as one Txn whose success
branch holds each request as a nested Txn (``RequestOp(request_txn=...)``,
etcd >= 3.3), and hands each caller its own part of the answer.

What etcd does with such a Txn (``applierV3backend.Txn`` in etcd 3.5's
``server/etcdserver/apply.go``; ``server/etcdserver/txn/txn.go`` later):

- every compare of every nested Txn is evaluated against the state BEFORE
  the batch (``compareToPath``), then the chosen branches are applied in
  order, so a read of one nested Txn sees the writes of the nested Txns
  before it;
- every write shares one main revision: the outer header's revision;
- a nested Txn's response carries an empty header (``newTxnResp``); only
  the outer one is filled in (revision, cluster and member ids, Raft term);
- ``checkIntervals`` refuses the whole Txn when two nested Txns put (or put
  and delete) one key (``duplicate key given in txn request``);
- ``--max-txn-ops`` (default 128) bounds each level: a Txn is refused when
  its compares or a branch have more ops than its budget, and a nested Txn's
  budget is what its parent leaves (``checkTxnRequest(nested, max - parent)``);
- a put on an unknown lease, a key outside the coordinator's etcd role, or a
  request over ``--max-request-bytes`` refuses the whole Txn.

The rules that make batching safe and invisible to the lock algorithm:

1. **Never two requests of one lock in a batch.** Two acquires of a free
   lock would both see it free (compares see the state before the batch) and
   both be granted at the same revision. A request is batched under its
   lock's key prefix; one whose lock is already in the batch being formed
   stays queued for the next batch, in its order (first come, first served
   per lock). Every op of a lock Txn lies inside its lock's key range (or
   its lock's own lock-delay keys, :mod:`..recipes.lock_delay`) and locks' ranges
   never overlap (:class:`~fencepost.client.v1.keys.Keys`), so
   a nested Txn reads and writes exactly what it would alone, and no two
   nested Txns write one key. One exception: a release's success branch
   may also put its request record (:mod:`..recipes.requests`), a key outside
   every lock's range and unique per call; two Txns with one request id are
   a retry of one call (one lock: never in one batch) or a reuse of the id
   by another call, which etcd refuses as a duplicate key, and the batch is
   then sent alone, Txn by Txn (rule 4). Only the Txns of :mod:`..recipes.lock` that are marked
   (:meth:`~.client.EtcdClient.lock_txn`: acquire, the waiting acquire's
   first write, release, withdraw and the waiter-key withdrawals) are
   batched; every other Txn (ownership records, the token record) goes alone.
2. **Never hold a request back to fill a batch.** With nothing in flight a
   request is sent at once, alone (:meth:`~.client.EtcdClient.txn`, exactly
   as without batching). While a Txn or a batch is in flight, requests
   queue; when it returns, everything queued (up to ``max_requests`` and the
   ``--max-txn-ops`` budget) goes as the next batch: one Txn in flight at a
   time, no timer anywhere. The next batch is formed one pass of the event
   loop after the answer (``call_soon``), so that requests whose tasks are
   already ready to run join it (measured: larger batches and less CPU per
   request at 64 clients than forming it at once).
3. **Each part of the answer looks like the answer alone.** Request i gets
   ``responses[i].response_txn`` (its own ``succeeded`` and ``responses``)
   with the batch's header copied in, so its ``decide`` is unchanged. Its
   revision is the batch's: the revision of its own writes, or (when it
   wrote nothing) a revision at which nothing in its lock's range differs
   from what it read.
4. **Unknown outcome, per request; refusals, never for the innocent.** When
   the batch's answer is lost (connection broken after sending, deadline,
   no leader), each request is resolved by its own read-back exactly as a
   lone Txn (``TxnPlan.resolve``; sent again alone when it did not apply).
   When etcd refuses the batch as a whole (too many ops, too large, a lost
   lease or a permission error of one request), each request is sent again
   alone and gets its own answer; after "too many operations" or "request is
   too large" the batch size is halved for good.
5. **Each request keeps its deadline; a cancelled caller cancels only itself.**
   A queued request whose caller's deadline (:mod:`.deadline`) passes is
   dropped with the etcd layer's timeout error (never sent); once sent, its
   caller stops waiting at its deadline while the batch goes on for the
   others. A cancelled caller is dropped from the queue, or stops waiting.
   The batch's gRPC deadline is the latest of its requests' (none if one has
   none).
6. **The token floor sees every answer**: the batch's header goes past
   :attr:`~.client.EtcdClient.headers` like any Txn's.
7. **One etcd request per batch** in the metrics (``fencepost_etcd_request_seconds``)
   and traces (one ``etcdserverpb.KV/Txn`` CLIENT span, under the first
   request's call); ``fencepost_etcd_batch_size`` counts the requests of
   each Txn sent for locks (1 for a lone one).
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from fencepost.client.errors import FencepostError
from fencepost.client.v1.etcd import rpc_pb2

from ..telemetry.metrics import NO_METRICS, LockMetrics
from . import deadline
from .failures import Failure, Op, error_for, etcd_unavailable

if TYPE_CHECKING:
    from .calls import TxnPlan

__all__ = ["DEFAULT_MAX_REQUESTS", "DEFAULT_MAX_TXN_OPS", "TxnBatcher", "ops_needed"]

_log = logging.getLogger(__name__)
T = TypeVar("T")

#: Most requests in one batch (``serve --etcd-batch-max``).
DEFAULT_MAX_REQUESTS = 64
#: etcd's ``--max-txn-ops`` default: the ops budget of a batch (see :func:`ops_needed`).
DEFAULT_MAX_TXN_OPS = 128
#: etcd's messages that refuse a Txn for its size: the batch size is halved after one.
_TOO_BIG = ("etcdserver: too many operations in txn request", "etcdserver: request is too large")


def ops_needed(request: rpc_pb2.TxnRequest) -> int:
    """The ``--max-txn-ops`` a Txn needs: its widest level (compares or a branch) plus what its nested Txns need.

    Args:
        request: A Txn.

    Returns:
        The least ``--max-txn-ops`` etcd accepts it with (``checkTxnRequest``
        gives a nested Txn the budget its parent leaves). A batch of requests
        ``r1..rn`` needs ``n + max(ops_needed(ri))``.
    """
    nested = [ops_needed(op.request_txn) for op in (*request.success, *request.failure)
              if op.WhichOneof("request") == "request_txn"]
    return max(len(request.compare), len(request.success), len(request.failure)) + max(nested, default=0)


class _Member:
    """One queued request: its plan, its lock, its caller's future, context and deadline."""

    __slots__ = ("context", "end", "future", "lock", "need", "plan", "timer")

    def __init__(self, plan: TxnPlan[Any], lock: bytes, future: asyncio.Future[Any], left: float | None) -> None:
        self.plan = plan
        self.lock = lock
        self.need = ops_needed(plan.request)
        self.future = future
        self.context = contextvars.copy_context()  # the caller's deadline and span
        self.end = None if left is None else time.monotonic() + left  # the caller's deadline
        self.timer: asyncio.TimerHandle | None = None

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        """Answer the caller, unless it is gone (cancelled, or its deadline passed)."""
        if self.timer is not None:
            self.timer.cancel()
        if self.future.done():
            return
        if error is not None:
            self.future.set_exception(error)
        else:
            self.future.set_result(result)


class TxnBatcher:
    """Sends concurrent lock Txns as one etcd Txn (see the module's docstring for the rules).

    Args:
        alone: Sends one Txn as without batching, resolving an unknown
            outcome by its read-back (:meth:`~.client.EtcdClient.txn`).
        batch: Sends a batch Txn once (re-sent only after a failure that
            means etcd refused it before applying); returns its response, or
            None when its outcome is unknown; raises the etcd layer's error
            when etcd refused it.
        settle: The answer of a Txn whose outcome is unknown: its read-back's
            ``resolve``, or the Txn sent again alone when it did not apply.
        max_requests: Most requests per batch; 0 or 1 sends every Txn alone.
        max_txn_ops: The etcd cluster's ``--max-txn-ops``.
        metrics: Records each lock Txn's size (``fencepost_etcd_batch_size``).

    Raises:
        ValueError: a negative ``max_requests``, or ``max_txn_ops`` below 2.
    """

    def __init__(self, alone: Callable[[TxnPlan[Any]], Awaitable[Any]],
                 batch: Callable[[rpc_pb2.TxnRequest], Awaitable[rpc_pb2.TxnResponse | None]],
                 settle: Callable[[TxnPlan[Any]], Awaitable[Any]], *, max_requests: int = DEFAULT_MAX_REQUESTS,
                 max_txn_ops: int = DEFAULT_MAX_TXN_OPS, metrics: LockMetrics = NO_METRICS) -> None:
        if max_requests < 0:
            raise ValueError(f"max_requests is {max_requests}; must be >= 0 (0: no batching)")
        if max_txn_ops < 2:
            raise ValueError(f"max_txn_ops is {max_txn_ops}; must be >= 2")
        self._alone = alone
        self._batch = batch
        self._settle = settle
        #: Most requests per batch now (halved when etcd refuses a batch for its size).
        self.max_requests = max_requests
        self._max_ops = max_txn_ops
        self._metrics = metrics
        self._queue: collections.deque[_Member] = collections.deque()
        self._busy = False  # a lone Txn or a batch is in flight
        self._closed = False
        self._tasks: set[asyncio.Task[None]] = set()

    async def txn(self, plan: TxnPlan[T], lock: bytes) -> T:
        """Send a lock Txn, alone at once when nothing is in flight, else in the next batch.

        Args:
            plan: The Txn and how to read its answer; every op must lie in ``lock``'s key range.
            lock: The lock's key prefix (:meth:`~fencepost.client.v1.keys.Keys.lock_prefix`).

        Returns:
            ``plan.decide`` of its part of the answer, or ``plan.resolve`` of its read-back.

        Raises:
            LeaseLost: the Txn puts a key on a lease that etcd does not know.
            Unavailable: etcd unreachable, or refused the coordinator; the
                caller's deadline passed before the answer (ETCD_UNAVAILABLE).
        """
        if self.max_requests <= 1 or self._closed:
            self._metrics.etcd_batch(1)
            return await self._alone(plan)  # type: ignore[no-any-return]
        if not self._busy and not self._queue:
            self._busy = True
            self._metrics.etcd_batch(1)
            try:
                return await self._alone(plan)  # type: ignore[no-any-return]
            finally:
                self._after()
        loop = asyncio.get_running_loop()
        left = deadline.left()
        member = _Member(plan, lock, loop.create_future(), left)
        if left is not None:
            member.timer = loop.call_later(max(0.0, left), self._expire, member)
        self._queue.append(member)
        try:
            return await member.future  # type: ignore[no-any-return]
        except asyncio.CancelledError:
            if member.timer is not None:
                member.timer.cancel()
            self._unqueue(member)  # sent already: the batch goes on for the others
            raise

    async def close(self) -> None:
        """Stop: fail the queued requests, cancel the batches in flight (their callers get Unavailable)."""
        self._closed = True
        closing = etcd_unavailable("etcd: the coordinator's etcd client closed")
        while self._queue:
            self._queue.popleft().finish(error=closing)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------ internals

    def _expire(self, member: _Member) -> None:
        """The caller's deadline passed: it stops waiting (if queued, the request is never sent)."""
        member.timer = None
        self._unqueue(member)
        plan = member.plan
        member.finish(error=error_for(Failure.TIMEOUT, None, Op.TXN, name=plan.name, lease_id=plan.lease_id))

    def _unqueue(self, member: _Member) -> None:
        try:
            self._queue.remove(member)
        except ValueError:
            pass  # sent (or expired) already

    def _take(self) -> list[_Member]:
        """The next batch: the queued requests in order, one per lock, within the size and ops budgets."""
        batch: list[_Member] = []
        locks: set[bytes] = set()
        need = 0
        kept: collections.deque[_Member] = collections.deque()
        for member in self._queue:
            if member.future.done():
                continue  # gone meanwhile
            if (len(batch) < self.max_requests and member.lock not in locks
                    and len(batch) + 1 + max(need, member.need) <= self._max_ops):
                batch.append(member)
                locks.add(member.lock)
                need = max(need, member.need)
            else:
                kept.append(member)  # its lock is in this batch already, or the batch is full: next batch
        self._queue = kept
        return batch

    def _after(self) -> None:
        """The lone Txn or the batch in flight returned: send what is queued, one loop pass later."""
        self._busy = False
        if self._queue and not self._closed:
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        """With nothing in flight, send what is queued: alone if one request, else as one batch."""
        if self._busy or not self._queue or self._closed:
            return
        batch = self._take()
        if not batch:
            return
        self._busy = True
        self._metrics.etcd_batch(len(batch))
        first = batch[0]
        # Sent in a copy of the first request's context: its deadline when alone, its span as the parent.
        self._spawn(self._send_one(first) if len(batch) == 1 else self._send_batch(batch), first.context)

    def _spawn(self, step: Coroutine[Any, Any, None], context: contextvars.Context) -> None:
        task = asyncio.get_running_loop().create_task(step, context=context.copy())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send_one(self, member: _Member) -> None:
        try:
            await self._answer(member, self._alone(member.plan))
        finally:
            self._after()

    async def _send_batch(self, batch: list[_Member]) -> None:
        resp: rpc_pb2.TxnResponse | None = None
        refusal: FencepostError | None = None
        try:
            ends = [member.end for member in batch if member.end is not None]
            limit = max(ends) - time.monotonic() if len(ends) == len(batch) else None  # the latest deadline
            request = rpc_pb2.TxnRequest(success=[rpc_pb2.RequestOp(request_txn=m.plan.request) for m in batch])
            with deadline.unbounded(), deadline.bounded(limit):
                resp = await self._batch(request)
        except FencepostError as exc:
            refusal = exc
        except BaseException as exc:  # cancelled (close()), or a bug: nobody may wait forever
            for member in batch:
                member.finish(error=etcd_unavailable(f"etcd: the batch of lock Txns failed: {exc!r}"))
            raise
        finally:
            self._after()
        if refusal is not None:
            self._refused(batch, refusal)
        elif resp is None or len(resp.responses) != len(batch):
            for member in batch:  # outcome unknown: each request by its own read-back
                if not member.future.done():
                    self._spawn(self._answer(member, self._settle(member.plan)), member.context)
        else:
            for member, op in zip(batch, resp.responses):
                if member.future.done():
                    continue
                part = op.response_txn
                part.header.CopyFrom(resp.header)  # a nested Txn's header is empty
                try:
                    member.finish(member.plan.decide(part))
                except Exception as exc:
                    member.finish(error=exc)

    def _refused(self, batch: list[_Member], refusal: FencepostError) -> None:
        """etcd refused the batch as a whole: send each request alone; after a size refusal, halve the size."""
        cause = refusal.__cause__
        said = (cause.details() or "") if isinstance(cause, grpc.RpcError) else ""  # type: ignore[attr-defined]
        if said.startswith(_TOO_BIG) and self.max_requests > 1:
            self.max_requests = max(1, len(batch) // 2)
            _log.warning("etcd refused a batch of %d lock Txns (%s); batches of at most %d from now on",
                         len(batch), said, self.max_requests)
        else:
            _log.info("etcd refused a batch of %d lock Txns (%s); sending each alone", len(batch), refusal.message)
        for member in batch:
            if not member.future.done():
                self._spawn(self._answer(member, self._alone(member.plan)), member.context)

    @staticmethod
    async def _answer(member: _Member, step: Awaitable[Any]) -> None:
        try:
            result = await step
        except asyncio.CancelledError:  # close()
            member.finish(error=etcd_unavailable("etcd: the coordinator's etcd client closed"))
            raise
        except Exception as exc:
            member.finish(error=exc)
        else:
            member.finish(result)
