"""One etcd call, sent the way every call the coordinator makes to etcd is sent.

:class:`EtcdCalls` sends each call to the current member
(:class:`~.members.Members`), with the auth token as ``token`` metadata when
the coordinator has etcd credentials, under the per-call deadline and retry
rule of its operation (:data:`~.failures.RULES`), and turns a failure that
ends the call into the coordinator's error (:func:`~.failures.error_for`). A
Txn whose outcome is unknown is resolved by its :class:`TxnPlan`'s
read-back, never re-sent blindly. Which calls there are is
:class:`~.client.EtcdClient`'s.

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
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import grpc
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Tracer

from fencepost.client.errors import FencepostError
from fencepost.client.tracing import inject, rpc_attributes, set_rpc_status
from fencepost.client.v1.etcd import rpc_pb2, rpc_pb2_grpc
from fencepost.client.v1.retry import ETCD_BACKOFF, Backoff

from ..telemetry.metrics import NO_METRICS, LockMetrics
from . import deadline
from .failures import RULES, UNKNOWN_OUTCOME, Failure, Op, Rule, classify, error_for
from .members import EtcdAuth, EtcdTls, Members

__all__ = ["NOT_APPLIED", "EtcdCalls", "HeaderWatch", "ReadBack", "Stubs", "TxnPlan"]

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
class ReadBack(Generic[T]):
    """The outcome of a call whose answer was lost, told by its read-back."""

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



class EtcdCalls:
    """Sends one etcd call under its operation's rule (the base of :class:`~.client.EtcdClient`).

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

    Raises:
        ValueError: bad endpoints or TLS settings.
    """

    def __init__(self, endpoints: Sequence[str], *, tls: EtcdTls | None = None, auth: EtcdAuth | None = None,
                 stubs: Callable[[grpc.aio.Channel], Stubs] = Stubs.on, rules: dict[Op, Rule] | None = None,
                 backoff: Backoff = ETCD_BACKOFF, metrics: LockMetrics = NO_METRICS,
                 tracer: Tracer | None = None) -> None:
        self.members = Members(endpoints, tls=tls)
        self._make_stubs = stubs
        self._stubs = [stubs(self.members.channel(i)) for i in range(len(self.members))]
        self._stubs_of = [self.members.channel(i) for i in range(len(self.members))]  # the channel of each
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
        #: Sees the header of every Range and Txn answer (the token floor's watch for etcd going back).
        self.headers: HeaderWatch | None = None

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


    def _current(self) -> tuple[int, Stubs]:
        index, channel = self.members.current()
        if self._stubs_of[index] is not channel:  # reopened with renewed TLS files
            self._stubs[index], self._stubs_of[index] = self._make_stubs(channel), channel
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
                    return ReadBack(outcome)
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
