"""The coordinator's etcd client: every call the coordinator makes to etcd goes through here.

:class:`EtcdClient` is the calls themselves (KV: Range, multi-key reads,
Txn with read-back resolution, lock Txns; leases; the deletion and range
watches), each sent as :class:`~.calls.EtcdCalls` sends every call (member,
auth token, retry rule, spans). The lock Txns (:meth:`EtcdClient.lock_txn`)
that arrive while one is in flight go to etcd together as one Txn
(:mod:`.batch`); the keepalives of every lease share one stream
(:mod:`.keepalive`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

import grpc
from opentelemetry.trace import Tracer

from fencepost.client.errors import FencepostError, LeaseLost
from fencepost.client.v1 import etcdops
from fencepost.client.v1.etcd import rpc_pb2
from fencepost.client.v1.retry import ETCD_BACKOFF, Backoff

from ..telemetry.metrics import NO_METRICS, LockMetrics
from . import deadline
from .batch import DEFAULT_MAX_REQUESTS, DEFAULT_MAX_TXN_OPS, TxnBatcher
from .calls import NOT_APPLIED, EtcdCalls, ReadBack, Stubs, TxnPlan
from .failures import Failure, Op, Rule, classify, error_for, etcd_unavailable
from .keepalive import KeepAlives
from .members import EtcdAuth, EtcdTls

__all__ = ["EtcdClient"]

_log = logging.getLogger(__name__)
T = TypeVar("T")


class EtcdClient(EtcdCalls):
    """The coordinator's one way to etcd.

    Args:
        endpoints, tls, auth, stubs, rules, backoff, metrics, tracer: see :class:`~.calls.EtcdCalls`.
        batch_max: Most lock Txns sent as one etcd Txn (:mod:`.batch`); 0 sends each alone.
        max_txn_ops: etcd's ``--max-txn-ops``, which bounds a batch.

    Raises:
        ValueError: bad endpoints or TLS settings; a negative ``batch_max``.
    """

    def __init__(self, endpoints: Sequence[str], *, tls: EtcdTls | None = None, auth: EtcdAuth | None = None,
                 stubs: Callable[[grpc.aio.Channel], Stubs] = Stubs.on, rules: dict[Op, Rule] | None = None,
                 backoff: Backoff = ETCD_BACKOFF, metrics: LockMetrics = NO_METRICS,
                 tracer: Tracer | None = None, batch_max: int = DEFAULT_MAX_REQUESTS,
                 max_txn_ops: int = DEFAULT_MAX_TXN_OPS) -> None:
        super().__init__(endpoints, tls=tls, auth=auth, stubs=stubs, rules=rules, backoff=backoff, metrics=metrics,
                         tracer=tracer)
        self._keepalives = KeepAlives(self._open_keepalive, self._stream_broken, metrics)
        self._batcher = TxnBatcher(self.txn, self._batch_txn, self._settle, max_requests=batch_max,
                                   max_txn_ops=max_txn_ops, metrics=metrics)

    async def close(self) -> None:
        """Stop the keepalive stream and close every channel (leases are left alone)."""
        await self._batcher.close()
        await self._keepalives.close()
        await self.members.close()

    # ------------------------------------------------------------ KV

    async def range(self, request: rpc_pb2.RangeRequest, *, op: Op = Op.RANGE, name: str | None = None,
                    lease_id: int | None = None) -> rpc_pb2.RangeResponse:
        """A Range (linearizable), retried per ``op``'s rule.

        Raises:
            Unavailable: etcd unreachable, or refused the coordinator.
        """
        return await self._unary(op, lambda s: s.kv.Range, request, name=name, lease_id=lease_id)

    async def read(self, ops: Sequence[rpc_pb2.RequestOp], *, compare: Sequence[rpc_pb2.Compare] = (),
                   name: str | None = None, lease_id: int | None = None) -> rpc_pb2.TxnResponse:
        """Several reads at one revision (a Txn that writes nothing), retried like a Range.

        Args:
            ops: Range ops only (the Txn's success branch).
            compare: Compares that must hold for ``ops`` to be read;
                ``succeeded`` in the response tells whether they did.

        Raises:
            Unavailable: etcd unreachable, or refused the coordinator.
        """
        if any(op.WhichOneof("request") != "request_range" for op in ops):
            raise ValueError("read() takes range ops only")
        # A read-only Txn is never cancelled on the wire, nor cut short by the caller's
        # deadline: etcd before 3.5.5 panics (the whole member exits) when the context of a
        # read-only Txn ends while it is applied (etcd-io/etcd#14110, fixed by #14178), and
        # the embedded etcd is 3.5.1. The call goes on in the background under the RANGE
        # rule's own deadline; the caller stops waiting at its own.
        with deadline.unbounded():
            task = asyncio.ensure_future(self._unary(Op.RANGE, lambda s: s.kv.Txn, etcdops.txn(compare, ops),
                                                     name=name, lease_id=lease_id))
        task.add_done_callback(lambda done: done.cancelled() or done.exception())
        left = deadline.left()
        try:
            return await asyncio.wait_for(asyncio.shield(task), None if left is None else max(0.0, left))
        except TimeoutError:
            raise error_for(Failure.TIMEOUT, None, Op.RANGE, name=name, lease_id=lease_id, user=self.user) from None

    async def txn(self, plan: TxnPlan[T]) -> T:
        """Send a Txn once; when its outcome is unknown, read back and send again only if it did not apply.

        Returns:
            ``plan.decide`` of the Txn's response, or ``plan.resolve`` of the read-back.

        Raises:
            LeaseLost: the Txn puts a key on a lease that etcd does not know.
            Unavailable: etcd unreachable, or refused the coordinator; also
                when the outcome is still unknown after the rule's attempts.
        """
        async def read_back() -> Any:
            return plan.resolve(await self.read(plan.read_back, name=plan.name, lease_id=plan.lease_id))

        result = await self._unary(Op.TXN, lambda s: s.kv.Txn, plan.request, name=plan.name,
                                   lease_id=plan.lease_id, read_back=read_back)
        return result.value if isinstance(result, ReadBack) else plan.decide(result)

    async def lock_txn(self, plan: TxnPlan[T], lock: bytes) -> T:
        """A lock's Txn, sent with the other lock Txns that wait for the one in flight (:mod:`.batch`).

        Like :meth:`txn` (alone at once when nothing is in flight), for a Txn
        whose compares and ops all lie in one lock's key range (but for the
        put of a request record, see :mod:`.batch`).

        Args:
            plan: The Txn and how to read its answer.
            lock: The lock's key prefix (``Keys.lock_prefix``): never two Txns of one lock in a batch.

        Returns:
            ``plan.decide`` of its answer, or ``plan.resolve`` of its read-back.

        Raises:
            LeaseLost: the Txn puts a key on a lease that etcd does not know.
            Unavailable: etcd unreachable, or refused the coordinator; or the
                caller's deadline passed first.
        """
        return await self._batcher.txn(plan, lock)

    async def _batch_txn(self, request: rpc_pb2.TxnRequest) -> rpc_pb2.TxnResponse | None:
        """Send a batch of lock Txns (the TXN rule: re-sent only after a refusal before applying).

        Returns:
            Its response; None when its outcome is unknown (each request is then read back).

        Raises:
            LeaseLost, Unavailable: etcd refused it (or the deadline passed before it was sent).
        """
        async def unknown() -> Any:
            return None  # not NOT_APPLIED: _unary returns ReadBack(None) instead of sending it again

        result = await self._unary(Op.TXN, lambda s: s.kv.Txn, request, read_back=unknown)
        return None if isinstance(result, ReadBack) else result

    async def _settle(self, plan: TxnPlan[T]) -> T:
        """The answer of ``plan``'s Txn after its outcome was lost: its read-back, or (not applied) sent alone."""
        outcome = plan.resolve(await self.read(plan.read_back, name=plan.name, lease_id=plan.lease_id))
        return await self.txn(plan) if outcome is NOT_APPLIED else outcome

    async def healthy(self, key: bytes) -> bool:
        """Whether etcd answers a linearizable count of ``key``'s range (the HEALTH rule: 2 tries of 1 s)."""
        try:
            await self.range(etcdops.count(key), op=Op.HEALTH)
        except FencepostError as exc:
            _log.debug("etcd health read failed: %s", exc)
            return False
        return True

    async def status(self) -> rpc_pb2.StatusResponse:
        """The current member's Maintenance.Status (the STATUS rule: 2 tries of 2 s, under the caller's deadline).

        Returns:
            etcd's StatusResponse: server ``version``, ``dbSize``, ``leader``,
            ``raftIndex``, ``raftTerm``, and a header with the cluster and member ids.

        Raises:
            Unavailable: etcd unreachable, or refused the coordinator.
        """
        return await self._unary(Op.STATUS, lambda s: s.maintenance.Status, rpc_pb2.StatusRequest())

    # ------------------------------------------------------------ leases

    async def lease_grant(self, ttl_seconds: int) -> tuple[int, int]:
        """Grant a lease (never re-sent after it may have reached etcd).

        Returns:
            (lease id, granted TTL in seconds).

        Raises:
            Unavailable: etcd unreachable or refused.
        """
        resp = await self._unary(Op.LEASE_GRANT, lambda s: s.lease.LeaseGrant,
                                 rpc_pb2.LeaseGrantRequest(TTL=ttl_seconds))
        if resp.error:
            raise etcd_unavailable(f"etcd: LeaseGrant refused: {resp.error}")
        return int(resp.ID), int(resp.TTL)

    async def lease_revoke(self, lease_id: int) -> bool:
        """Revoke a lease (deleting its keys); an unknown outcome is resolved by a TTL lookup.

        Returns:
            False when etcd did not know the lease.

        Raises:
            Unavailable: etcd unreachable or refused.
        """
        async def read_back() -> Any:
            ttl, _ = await self.lease_ttl(lease_id)
            return True if ttl <= 0 else NOT_APPLIED

        try:
            await self._unary(Op.LEASE_REVOKE, lambda s: s.lease.LeaseRevoke,
                              rpc_pb2.LeaseRevokeRequest(ID=lease_id), lease_id=lease_id, read_back=read_back)
        except LeaseLost:
            return False
        return True

    async def lease_ttl(self, lease_id: int) -> tuple[int, int]:
        """Look up a lease's TTL.

        Returns:
            (seconds left, granted TTL in seconds); (-1, 0) when the lease is gone.

        Raises:
            Unavailable: etcd unreachable or refused.
        """
        try:
            resp = await self._unary(Op.LEASE_TTL, lambda s: s.lease.LeaseTimeToLive,
                                     rpc_pb2.LeaseTimeToLiveRequest(ID=lease_id), lease_id=lease_id)
        except LeaseLost:
            return -1, 0
        return int(resp.TTL), int(resp.grantedTTL)

    async def lease_keys(self, lease_id: int) -> tuple[int, int, list[bytes]]:
        """Look up a lease's TTL and the keys attached to it (LeaseTimeToLive with keys = true).

        Returns:
            (seconds left, granted TTL in seconds, attached keys); (-1, 0, []) when the lease is gone.

        Raises:
            Unavailable: etcd unreachable or refused.
        """
        try:
            resp = await self._unary(Op.LEASE_TTL, lambda s: s.lease.LeaseTimeToLive,
                                     rpc_pb2.LeaseTimeToLiveRequest(ID=lease_id, keys=True), lease_id=lease_id)
        except LeaseLost:
            return -1, 0, []
        if resp.TTL < 0:
            return -1, 0, []
        return int(resp.TTL), int(resp.grantedTTL), list(resp.keys)

    @property
    def keepalive_waiting_seconds(self) -> float:
        """How long the oldest keepalive forwarded to etcd and not yet answered has waited, in seconds (0.0: none)."""
        return self._keepalives.waiting_seconds

    async def keepalives(self, lease_ids: Sequence[int], answered: Callable[[int, int], None]
                         ) -> tuple[list[int], FencepostError | None]:
        """Forward one keepalive per entry of ``lease_ids`` at once, each handed to ``answered`` as it is answered.

        See :meth:`.keepalive.KeepAlives.keepalives`: ``answered`` gets (index,
        TTL); returns the indexes left unanswered and the error for them.
        """
        return await self._keepalives.keepalives(lease_ids, answered)

    # ------------------------------------------------------------ watch

    async def watch_deletes(self, key: bytes, range_end: bytes, start_revision: int
                            ) -> AsyncIterator[list[tuple[bytes, int]]]:
        """Watch a key range for deletions from ``start_revision`` on, on the current member.

        Yields:
            An empty batch once etcd has created the watch, then each watch
            response's deletions, as (key, deletion revision) pairs.

        Returns when etcd cancels the watch because ``start_revision`` was
        compacted (the caller re-reads and watches again from a newer revision).

        Raises:
            Unavailable: the stream broke, or etcd refused the watch.
        """
        create = rpc_pb2.WatchCreateRequest(key=key, range_end=range_end, start_revision=start_revision,
                                            filters=[rpc_pb2.WatchCreateRequest.NOPUT])
        async with contextlib.aclosing(self._watch(create)) as responses:
            async for resp in responses:
                if resp.compact_revision:
                    _log.warning("lock watch cancelled (compacted at %d); re-reading", resp.compact_revision)
                    return
                deletes = [(bytes(e.kv.key), int(e.kv.mod_revision)) for e in resp.events if e.type == e.DELETE]
                if deletes or resp.created:
                    yield deletes

    async def watch_range(self, key: bytes, range_end: bytes, start_revision: int) -> AsyncIterator[list[Any]]:
        """Watch a key range for puts and deletions from ``start_revision`` on, on the current member.

        For a reader that follows a small range itself (an election's
        Observe); the locks' deletions go through :meth:`watch_deletes`.

        Yields:
            An empty batch once etcd has created the watch, then each watch
            response's events (``mvccpb.Event``: ``type`` PUT or DELETE,
            ``kv`` with key, create and mod revision, lease and value), in
            revision order.

        Returns when etcd cancels the watch because ``start_revision`` was
        compacted (the caller re-reads and watches again from a newer revision).

        Raises:
            Unavailable: the stream broke, or etcd refused the watch.
        """
        create = rpc_pb2.WatchCreateRequest(key=key, range_end=range_end, start_revision=start_revision)
        async with contextlib.aclosing(self._watch(create)) as responses:
            async for resp in responses:
                if resp.compact_revision:
                    return
                if resp.events or resp.created:
                    yield list(resp.events)

    async def _watch(self, create: rpc_pb2.WatchCreateRequest) -> AsyncIterator[Any]:
        """One etcd watch on the current member: its responses, until it is closed or fails.

        Raises:
            Unavailable: the stream broke, or etcd cancelled the watch for another reason than a compaction.
        """
        await self._ensure_token()
        index, stubs = self._current()
        stop = asyncio.Event()

        async def requests() -> AsyncIterator[rpc_pb2.WatchRequest]:
            yield rpc_pb2.WatchRequest(create_request=create)
            await stop.wait()  # keep our side open while the watch runs

        call = stubs.watch.Watch(requests(), metadata=self._metadata(self._token))
        try:
            async for resp in call:
                if resp.canceled and not resp.compact_revision:
                    failure = Failure.PERMISSION_DENIED if "permission denied" in resp.cancel_reason \
                        else Failure.REJECTED
                    raise error_for(failure, RuntimeError(resp.cancel_reason), Op.WATCH, user=self.user)
                yield resp
        except grpc.aio.AioRpcError as exc:
            self._metrics.etcd_failed("watch", exc.code())
            failure = classify(exc)
            self._failed(index, failure, self._token)
            raise error_for(failure, exc, Op.WATCH, user=self.user) from exc
        finally:
            stop.set()
            call.cancel()

    async def range_at(self, request: rpc_pb2.RangeRequest, *, name: str | None = None
                       ) -> rpc_pb2.RangeResponse | None:
        """A Range at the revision ``request.revision`` asks for (> 0), retried like :meth:`range`.

        Returns:
            The response; None when etcd no longer has that revision
            (compacted) or has not reached it yet.

        Raises:
            Unavailable: etcd unreachable, or refused the coordinator.
        """
        try:
            return await self.range(request, name=name)
        except FencepostError as exc:
            cause = exc.__cause__
            if isinstance(cause, grpc.aio.AioRpcError) and cause.code() == grpc.StatusCode.OUT_OF_RANGE:
                return None  # "required revision has been compacted" / "is a future revision"
            raise

    # ------------------------------------------------------------ internals

    async def _open_keepalive(self, requests: AsyncIterator[rpc_pb2.LeaseKeepAliveRequest]
                              ) -> tuple[int, grpc.aio.StreamStreamCall]:
        with contextlib.suppress(FencepostError):  # the stream then fails UNAUTHENTICATED, and says so
            await self._ensure_token()
        index, stubs = self._current()
        return index, stubs.lease.LeaseKeepAlive(requests, metadata=self._metadata(self._token))

    def _stream_broken(self, index: int, failure: Failure) -> None:
        self._failed(index, failure, self._token)

