"""The coordinator's etcd client: every call the coordinator makes to etcd goes through here.

It sends each call to the current member (:class:`~.members.Members`), with
the auth token as ``token`` metadata when the coordinator has etcd
credentials, under the per-call deadline and retry rule of its operation
(:data:`~.failures.RULES`), and turns a failure that ends the call into the
coordinator's error (:func:`~.failures.error_for`). A Txn whose outcome is
unknown is resolved by its :class:`TxnPlan`'s read-back, never re-sent
blindly. The lock Txns (:meth:`EtcdClient.lock_txn`) that arrive while one
is in flight go to etcd together as one Txn (:mod:`.batch`).

Traces: with a tracer, each unary request sent for a traced call (a
recording span is current: the coordinator's SERVER span) is a CLIENT span
``etcdserverpb.<Service>/<Method>`` (``etcdserverpb.KV/Txn``, one per
attempt; a read-back is a request of its own) with ``db.system`` ``etcd``,
``db.operation`` (``Txn``, ``Range``, ``LeaseGrant``, ...),
``fencepost.etcd.op`` (the retry rule's operation, as the metrics'
``operation`` label), ``rpc.*`` and ``rpc.grpc.status_code``, and a Txn's
``fencepost.etcd.succeeded``; the W3C context goes to etcd in the request's
metadata (``traceparent``). Requests made outside any call (the health
monitor's reads, the deletion watcher, the shared keepalive and watch
streams) are not traced.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import grpc
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Tracer

from fencepost.client.tracing import inject, rpc_attributes, set_rpc_status
from fencepost.client.errors import FencepostError, LeaseLost
from fencepost.client.v1 import etcdops
from fencepost.client.v1.etcd import rpc_pb2, rpc_pb2_grpc
from fencepost.client.v1.retry import ETCD_BACKOFF, Backoff

from ..telemetry.metrics import NO_METRICS, LockMetrics
from . import deadline
from .batch import DEFAULT_MAX_REQUESTS, DEFAULT_MAX_TXN_OPS, TxnBatcher
from .failures import RULES, UNKNOWN_OUTCOME, Failure, Op, Rule, classify, error_for, etcd_unavailable
from .keepalive import KeepAlives
from .members import EtcdAuth, EtcdTls, Members

__all__ = ["NOT_APPLIED", "EtcdClient", "HeaderWatch", "Stubs", "TxnPlan"]

_log = logging.getLogger(__name__)
T = TypeVar("T")


class _NotApplied:
    def __repr__(self) -> str:
        return "NOT_APPLIED"


#: What a :class:`TxnPlan`'s ``resolve`` returns when the read-back shows the Txn did not apply.
NOT_APPLIED: Any = _NotApplied()


@dataclass(frozen=True)
class TxnPlan(Generic[T]):
    """A Txn, how to read its response, and how to tell its outcome when the response is lost.

    Attributes:
        request: The Txn.
        decide: Reads the Txn's response into the caller's result.
        read_back: Read-only ops that show what the Txn would have written
            (e.g. our key and its create revision), read at one revision
            when the outcome is unknown.
        resolve: Reads the read-back's TxnResponse (``responses[i]`` for
            ``read_back[i]``) into the caller's result, or returns
            :data:`NOT_APPLIED` when the Txn did not apply: it is then sent
            again (its compares make a late duplicate of the first a no-op).
        name: The lock name, for errors.
        lease_id: The lease, for errors.
    """

    request: rpc_pb2.TxnRequest
    decide: Callable[[rpc_pb2.TxnResponse], T]
    read_back: Sequence[rpc_pb2.RequestOp]
    resolve: Callable[[rpc_pb2.TxnResponse], T]
    name: str | None = None
    lease_id: int | None = None


@dataclass(frozen=True)
class Stubs:
    """The etcd service stubs on one member's channel."""

    kv: Any
    lease: Any
    watch: Any
    auth: Any
    maintenance: Any = None  # Maintenance.Status only (ServerInfo); None in fakes that do not serve it

    @classmethod
    def on(cls, channel: grpc.aio.Channel) -> Stubs:
        """The generated stubs (``rpc_pb2_grpc``) on ``channel``."""
        return cls(rpc_pb2_grpc.KVStub(channel), rpc_pb2_grpc.LeaseStub(channel),
                   rpc_pb2_grpc.WatchStub(channel), rpc_pb2_grpc.AuthStub(channel),
                   rpc_pb2_grpc.MaintenanceStub(channel))


class HeaderWatch(Protocol):
    """Sees the header of every linearizable KV answer (:class:`~fencepost.coordinator.recipes.tokens.TokenFloor`)."""

    def mark(self) -> int:
        """Taken before a Range or Txn is sent."""
        ...

    def seen(self, mark: int, header: Any) -> None:
        """The answer's ``ResponseHeader``, with the mark taken before its request was sent."""
        ...


#: The operations whose answers :attr:`EtcdClient.headers` sees: linearizable reads and Txns.
_KV_OPS = frozenset({Op.RANGE, Op.TXN, Op.HEALTH})


@dataclass(frozen=True)
class _ReadBack(Generic[T]):
    value: T


#: (service, method) of each unary request type the coordinator sends, for its span.
_RPC_OF: dict[type, tuple[str, str]] = {
    rpc_pb2.RangeRequest: ("etcdserverpb.KV", "Range"),
    rpc_pb2.TxnRequest: ("etcdserverpb.KV", "Txn"),
    rpc_pb2.LeaseGrantRequest: ("etcdserverpb.Lease", "LeaseGrant"),
    rpc_pb2.LeaseRevokeRequest: ("etcdserverpb.Lease", "LeaseRevoke"),
    rpc_pb2.LeaseTimeToLiveRequest: ("etcdserverpb.Lease", "LeaseTimeToLive"),
    rpc_pb2.AuthenticateRequest: ("etcdserverpb.Auth", "Authenticate"),
}


class EtcdClient:
    """The coordinator's one way to etcd.

    Args:
        endpoints: etcd endpoints, host names or addresses (``etcd1:2379``,
            ``https://10.0.0.5:2379``); see :func:`~.members.parse_endpoint`.
        tls: TLS (and mTLS) settings; None for plaintext.
        auth: etcd user and password; None when etcd auth is off.
        stubs: Makes the stubs of one channel (fakes in unit tests).
        rules: The retry rule of each operation.
        backoff: The delays between attempts.
        metrics: Records each request's time and failures
            (``fencepost_etcd_request_seconds``, ``fencepost_etcd_errors_total``).
        tracer: Makes a span of each request sent for a traced call; None
            traces nothing.
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
        self.members = Members(endpoints, tls=tls)
        self._stubs = [stubs(self.members.channel(i)) for i in range(len(self.members))]
        self._auth = auth
        self._rules = {**RULES, **(rules or {})}
        self._backoff = backoff
        self._token: str | None = None
        self._stale: str | None = None  # a token etcd rejected
        #: Why etcd last refused the coordinator (credentials, permissions), None once it accepts them.
        self.refusal: str | None = None
        self._auth_lock = asyncio.Lock()
        self._metrics = metrics
        self._tracer = tracer
        self._keepalives = KeepAlives(self._open_keepalive, self._stream_broken, metrics)
        #: Sees the header of every Range and Txn answer (the token floor's watch for etcd going back).
        self.headers: HeaderWatch | None = None
        self._batcher = TxnBatcher(self.txn, self._batch_txn, self._settle, max_requests=batch_max,
                                   max_txn_ops=max_txn_ops, metrics=metrics)

    @property
    def user(self) -> str | None:
        """The etcd user the coordinator authenticates as, None without auth."""
        return self._auth.user if self._auth else None

    async def connect(self) -> None:
        """Authenticate now when credentials are set (otherwise nothing to do).

        An unreachable etcd is not an error here: calls authenticate once it answers.

        Raises:
            Unavailable: etcd refused the credentials (wrong user or password,
                auth not enabled).
        """
        if self._auth is None:
            return
        try:
            await self._ensure_token()
        except FencepostError as exc:
            if self.refusal is not None:
                raise
            _log.warning("etcd: cannot authenticate yet (%s); will retry on the first call", exc.message)

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
        return result.value if isinstance(result, _ReadBack) else plan.decide(result)

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
            return None  # not NOT_APPLIED: _unary returns _ReadBack(None) instead of sending it again

        result = await self._unary(Op.TXN, lambda s: s.kv.Txn, request, read_back=unknown)
        return None if isinstance(result, _ReadBack) else result

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

    async def keepalive(self, lease_id: int) -> int:
        """Forward one keepalive on the shared LeaseKeepAlive stream (see :mod:`.keepalive`).

        Returns:
            The TTL etcd reset the lease to, in seconds; <= 0 when the lease is gone.

        Raises:
            Unavailable: no answer on any of the KEEPALIVE rule's attempts.
        """
        return await self._keepalives.keepalive(lease_id)

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
        await self._ensure_token()
        index, stubs = self._current()
        stop = asyncio.Event()

        async def requests() -> AsyncIterator[rpc_pb2.WatchRequest]:
            yield rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(
                key=key, range_end=range_end, start_revision=start_revision,
                filters=[rpc_pb2.WatchCreateRequest.NOPUT]))
            await stop.wait()  # keep our side open while the watch runs

        call = stubs.watch.Watch(requests(), metadata=self._metadata(self._token))
        try:
            async for resp in call:
                if resp.compact_revision:
                    _log.warning("lock watch cancelled (compacted at %d); re-reading", resp.compact_revision)
                    return
                if resp.canceled:
                    failure = Failure.PERMISSION_DENIED if "permission denied" in resp.cancel_reason \
                        else Failure.REJECTED
                    raise error_for(failure, RuntimeError(resp.cancel_reason), Op.WATCH, user=self.user)
                deletes = [(bytes(e.kv.key), int(e.kv.mod_revision)) for e in resp.events if e.type == e.DELETE]
                if deletes or resp.created:
                    yield deletes
        except grpc.aio.AioRpcError as exc:
            self._metrics.etcd_failed("watch", exc.code())
            failure = classify(exc)
            self._failed(index, failure, self._token)
            raise error_for(failure, exc, Op.WATCH, user=self.user) from exc
        finally:
            stop.set()
            call.cancel()

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
        await self._ensure_token()
        index, stubs = self._current()
        stop = asyncio.Event()

        async def requests() -> AsyncIterator[rpc_pb2.WatchRequest]:
            yield rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(
                key=key, range_end=range_end, start_revision=start_revision))
            await stop.wait()  # keep our side open while the watch runs

        call = stubs.watch.Watch(requests(), metadata=self._metadata(self._token))
        try:
            async for resp in call:
                if resp.compact_revision:
                    return
                if resp.canceled:
                    failure = Failure.PERMISSION_DENIED if "permission denied" in resp.cancel_reason \
                        else Failure.REJECTED
                    raise error_for(failure, RuntimeError(resp.cancel_reason), Op.WATCH, user=self.user)
                if resp.events or resp.created:
                    yield list(resp.events)
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

    def _current(self) -> tuple[int, Stubs]:
        index, _ = self.members.current()
        return index, self._stubs[index]

    def _metadata(self, token: str | None) -> tuple[tuple[str, str], ...] | None:
        return (("token", token),) if token else None

    def _failed(self, index: int, failure: Failure, token: str | None) -> None:
        """Note a failed call: move on from a member out of reach, forget a rejected token."""
        if failure in UNKNOWN_OUTCOME:
            self.members.failed(index)
        elif failure is Failure.AUTH_EXPIRED and token is not None:
            self._stale = token
        elif failure in (Failure.AUTH_FAILED, Failure.PERMISSION_DENIED):
            self.refusal = failure.value

    async def _ensure_token(self) -> None:
        """Authenticate if credentials are set and there is no token, or etcd rejected it."""
        if self._auth is None or (self._token is not None and self._token != self._stale):
            return
        async with self._auth_lock:
            if self._token is not None and self._token != self._stale:
                return  # another call authenticated meanwhile
            request = rpc_pb2.AuthenticateRequest(name=self._auth.user, password=self._auth.password)
            resp = await self._unary(Op.AUTHENTICATE, lambda s: s.auth.Authenticate, request, anonymous=True)
            self._token = str(resp.token)
            if self.refusal == Failure.AUTH_FAILED.value:
                self.refusal = None

    async def _unary(self, op: Op, method: Callable[[Stubs], Any], request: Any, *, name: str | None = None,
                     lease_id: int | None = None, read_back: Callable[[], Awaitable[Any]] | None = None,
                     anonymous: bool = False) -> Any:
        """Send one unary call under ``op``'s rule (see :mod:`.failures`)."""
        rule = self._rules[op]
        delays = self._backoff.delays()
        failure, last = Failure.TIMEOUT, None
        for attempt in range(rule.attempts):
            limit = deadline.left()  # the caller's deadline (see .deadline)
            if attempt:
                pause = next(delays)
                if limit is not None and limit <= pause:
                    break
                await asyncio.sleep(pause)
                limit = deadline.left()
            if limit is not None and limit <= 0:
                break
            if not anonymous:
                await self._ensure_token()
            token = None if anonymous else self._token
            index, stubs = self._current()
            headers = self.headers if op in _KV_OPS else None
            mark = headers.mark() if headers is not None else 0
            sent = time.perf_counter()
            try:
                timeout = rule.timeout if limit is None else min(rule.timeout, limit)
                resp = await self._send(method(stubs), request, op, timeout, token)
                if headers is not None:
                    headers.seen(mark, resp.header)
                self._metrics.etcd_request(op.name.lower(), time.perf_counter() - sent)
                if self.refusal is not None and not anonymous:
                    self.refusal = None  # etcd accepts the coordinator again
                return resp
            except grpc.aio.AioRpcError as exc:
                self._metrics.etcd_request(op.name.lower(), time.perf_counter() - sent, exc.code())
                failure, last = classify(exc), exc
                self._failed(index, failure, token)
            if failure in rule.read_back and read_back is not None:
                outcome = await read_back()
                if outcome is not NOT_APPLIED:
                    return _ReadBack(outcome)
                _log.info("etcd %s did not apply (%s); sending it again", op.value, failure.value)
            elif failure not in rule.resend:
                break
        raise error_for(failure, last, op, name=name, lease_id=lease_id, user=self.user) from last

    async def _send(self, call: Any, request: Any, op: Op, timeout: float, token: str | None) -> Any:
        """One unary request: in a CLIENT span, its context in the metadata, when a traced call made it."""
        if self._tracer is None or not trace.get_current_span().is_recording():
            return await call(request, timeout=timeout, metadata=self._metadata(token))
        service, method = _RPC_OF.get(type(request), ("etcdserverpb", type(request).__name__))
        attributes = rpc_attributes(service, method)
        attributes.update({"db.system": "etcd", "db.operation": method, "fencepost.etcd.op": op.name.lower()})
        with self._tracer.start_as_current_span(f"{service}/{method}", kind=SpanKind.CLIENT, attributes=attributes,
                                                record_exception=False, set_status_on_exception=False) as span:
            try:
                resp = await call(request, timeout=timeout, metadata=inject(self._metadata(token)))
            except grpc.aio.AioRpcError as exc:
                set_rpc_status(span, exc.code(), server=False, message=exc.details())
                raise
            except asyncio.CancelledError:
                set_rpc_status(span, grpc.StatusCode.CANCELLED, server=False)
                raise
            set_rpc_status(span, grpc.StatusCode.OK, server=False)
            if isinstance(resp, rpc_pb2.TxnResponse):
                span.set_attribute("fencepost.etcd.succeeded", bool(resp.succeeded))
            return resp

    async def _open_keepalive(self, requests: AsyncIterator[rpc_pb2.LeaseKeepAliveRequest]
                              ) -> tuple[int, grpc.aio.StreamStreamCall]:
        with contextlib.suppress(FencepostError):  # the stream then fails UNAUTHENTICATED, and says so
            await self._ensure_token()
        index, stubs = self._current()
        return index, stubs.lease.LeaseKeepAlive(requests, metadata=self._metadata(self._token))

    def _stream_broken(self, index: int, failure: Failure) -> None:
        self._failed(index, failure, self._token)
