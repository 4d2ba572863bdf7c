"""The client's transport: the unary call retry loop over the channel to one coordinator at a time.

A :class:`Transport` is a :class:`~.connection.Connection` (the channel,
rotation, waiting for a connection, TLS failures named) through which every
unary call goes: :meth:`Transport.call` waits for a connection, retries what
may be retried with the one backoff policy
(:data:`fencepost.client.v1.retry.CLIENT_BACKOFF`), and turns a failed call
into a :class:`~fencepost.client.FencepostError` with
:func:`~fencepost.client.errors.from_rpc_error`.

Retry rule: an idempotent call (Acquire, Withdraw, LeaseRevoke, Describe;
Release and AdminRevoke, made safe to repeat by their ``request_id``) that
fails with UNAVAILABLE is retried on the next address. Each attempt sends
the request that ``make`` builds; callers build it with one request id per
logical call, so every retry of a call carries the same id (see "Retries"
in proto/fencepost/v1/lock.proto). A call that is not idempotent
(LeaseGrant) is retried only while no connection could be made, so that
the request cannot have reached a server; once sent, an UNAVAILABLE answer
is raised. A call a coordinator refused at a rate limit
(RESOURCE_EXHAUSTED / LIMIT_EXCEEDED with a RetryInfo: the call did
nothing) is sent again after the delay the coordinator asked for (times 1
to 1.5, jitter), idempotent or not; the coordinator's other limits are
raised at once (:class:`~fencepost.client.errors.LimitExceeded`). A call
refused by a coordinator past its capacity (RESOURCE_EXHAUSTED /
OVERLOADED: a new lease or a wait; the call did nothing) goes at once to
the next address, each once, and once every address refused it, waits the
RetryInfo's delay (times 1 to 1.5) and goes round again; the rotation moves
the client's KeepAlive stream too, off the overloaded coordinator. A call
refused by a coordinator that drains before it stops (UNAVAILABLE /
DRAINING: a new lease or stream, an acquire; the call did nothing) is
treated the same way, idempotent or not. Either
way a call stops trying ``connect_timeout`` seconds after its first
failure, or at its own deadline.

Unknown outcomes: a call that changes state and carries a request id the
coordinator records (:data:`SETTLED_BY_REQUEST_ID`: Release,
ReleasePermit, Resign, Withdraw, AdminRevoke) gets at most a third of
``connect_timeout`` (at least :data:`MIN_ATTEMPT_SECONDS`) per attempt, so
that an attempt whose answer is lost (no answer in time, the connection
broken under it) is sent again, with the same request id, within the
caller's time: the coordinator answers the retry from its record of the
first attempt. When no attempt is answered before the call's time runs
out, the call raises :class:`~fencepost.client.errors.OutcomeUnknown`
(it may have been applied), not a timeout of something else; or, when a
coordinator answered an attempt with ETCD_UNAVAILABLE, that answer.

TLS: an address that failed its handshake is not waited for again in a
call, and once every address has, the call raises
:class:`~fencepost.client.errors.TlsError` at once (see :mod:`.connection`).

Calls on the stream: a call given the client's
:class:`~fencepost.client._leases.calls.StreamCalls` (Acquire, Release, Withdraw)
makes each attempt a message on the KeepAlive stream when the stream serves
it, else a unary call. A stream attempt fails with the ``AioRpcError`` the
unary call would have raised (a stream that ends before the answer: a lost
connection, UNAVAILABLE), so the retry rule above is the same for both.

Traces: with tracing on (see :mod:`fencepost.client.tracing`), each attempt
of a call is a CLIENT span ``fencepost.v1.LockService/<Method>``, child of
the caller's current span, whose W3C context goes to the coordinator in the
call's metadata (``traceparent``; on the stream, the message's
``traceparent`` field); without it, no span and no metadata.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from typing import Any

import grpc
import grpc.aio
from google.protobuf.message import Message
from opentelemetry.trace import SpanKind, Status, StatusCode

from .._leases.calls import StreamCalls
from .connection import FAILED, STALE, Connection, and_tls, every_handshake_failed
from .tls import PLAINTEXT, Security
from ..tracing import (
    OUTCOME,
    REQUEST_ID,
    Tracing,
    error_outcome,
    inject,
    response_facts,
    rpc_attributes,
    set_rpc_status,
)
from ..errors import LOCK_SERVICE, FencepostError, LimitExceeded, OutcomeUnknown, TlsError, Unavailable, \
    from_rpc_error
from ..v1 import details
from ..v1 import lock_pb2_grpc as pb_grpc
from ..v1.details import ErrorReason, reason_name
from ..v1.keys import LEASE_SECRET_METADATA
from ..v1.retry import CLIENT_BACKOFF

__all__ = ["MIN_ATTEMPT_SECONDS", "SETTLED_BY_REQUEST_ID", "MakeRequest", "Transport", "current_task_cancelling"]

SHUTTING_DOWN = reason_name(ErrorReason.SHUTTING_DOWN)
OVERLOADED = reason_name(ErrorReason.OVERLOADED)
DRAINING = reason_name(ErrorReason.DRAINING)
#: The refusals of a coordinator that did nothing and asks for another one: past its capacity, or draining.
GO_ELSEWHERE = frozenset({OVERLOADED, DRAINING})

#: The calls that change state whose retry with the same request id the coordinator answers from its record
#: of the first attempt (see "Retries" in proto/fencepost/v1/lock.proto): a lost answer is asked for again.
SETTLED_BY_REQUEST_ID = frozenset({"Release", "ReleasePermit", "Resign", "Withdraw", "AdminRevoke"})
#: The shortest time an attempt of such a call gets, in seconds.
MIN_ATTEMPT_SECONDS = 2.0

#: The W3C trace context header, sent in a stream call's ``traceparent`` field.
TRACEPARENT = "traceparent"

#: Builds one attempt of a call: given the seconds left before the call's
#: ``until`` (None when unbounded), returns (request, gRPC timeout in seconds or None).
MakeRequest = Callable[[float | None], tuple[Message, float | None]]


def current_task_cancelling() -> bool:
    """Whether the running task itself is being cancelled (not just a call it awaits)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class Transport(Connection):
    """The unary call loop over a :class:`~.connection.Connection`: retries, error mapping, spans.

    Args:
        addresses, connect_timeout, fail_fast, security: As for :class:`~.connection.Connection`.
        tracing: Whether (and with which tracer) each attempt is a span; by
            default the global tracer provider's, lock names included.
    """

    def __init__(self, addresses: Sequence[str], *, connect_timeout: float, fail_fast: bool = False,
                 security: Security = PLAINTEXT, tracing: Tracing | None = None) -> None:
        super().__init__(addresses, connect_timeout=connect_timeout, fail_fast=fail_fast, security=security)
        self.tracing = tracing if tracing is not None else Tracing()

    async def call(
        self,
        method: str,
        make: MakeRequest,
        *,
        until: float | None,
        idempotent: bool,
        name: str | None = None,
        lease_id: int | None = None,
        token: int | None = None,
        secret: str | None = None,
        stream: StreamCalls | None = None,
    ) -> Any:
        """Run one RPC with connection handling, retries and error mapping.

        Args:
            method: The stub method name (``"Acquire"``, ...).
            make: Called before each attempt (see :data:`MakeRequest`).
            until: Loop time after which to stop trying, or None.
            idempotent: Whether an UNAVAILABLE answer may be retried.
            name: The lock name of the call, for the error.
            lease_id: The lease id of the call, for the error.
            token: The fencing token of the call, for the error.
            secret: The secret of the lease the call names, sent as the
                ``fencepost-lease-secret`` metadata entry; None or "" for none.
            stream: The KeepAlive stream's calls: each attempt goes there when
                the stream is up and serves ``method``; None: always unary.

        Returns:
            The RPC's response message.

        Raises:
            FencepostError: the call failed (the subclass from
                :func:`~fencepost.client.errors.from_rpc_error`), no coordinator
                was reachable in time (:class:`Unavailable`), or the transport
                is closed.
            TlsError: every address failed its TLS handshake (raised at once).
        """
        loop = asyncio.get_running_loop()
        delays = CLIENT_BACKOFF.delays()
        give_up_at: float | None = None

        def budget() -> float:
            nonlocal give_up_at
            now = loop.time()
            if give_up_at is None:
                give_up_at = now + self.connect_timeout
                if until is not None:
                    give_up_at = min(give_up_at, until)
            return give_up_at - now

        settles = idempotent and method in SETTLED_BY_REQUEST_ID
        # The last attempt of such a call that was sent and got no answer (it may have been applied).
        unsettled: BaseException | None = None

        def unknown() -> OutcomeUnknown:
            request_id = getattr(request, "request_id", "") or None
            return OutcomeUnknown(f"{method} was sent but no answer said whether it was applied (retried with "
                                  f"request id {request_id} until the call's time ran out)", method=method,
                                  request_id=request_id, name=name, lease_id=lease_id)

        unreachable: set[str] = set()  # addresses that could not be connected to (fail_fast)
        overloaded = 0  # refusals of coordinators past their capacity
        tls_failed: dict[str, TlsError] = {}  # address -> its failed handshake
        # The last retried UNAVAILABLE answer (e.g. ETCD_UNAVAILABLE: a coordinator
        # answered, its etcd did not): what the call raises when a retry then runs
        # out of time, a better account than "no answer in time".
        answered: FencepostError | None = None
        while True:
            if self.closed:
                raise FencepostError("client is closed", name=name, lease_id=lease_id)
            channel, stub, address = self.channel, self.stub, self.address
            assert channel is not None and stub is not None
            if channel.get_state(try_to_connect=True) != grpc.ChannelConnectivity.READY:
                left = budget()
                if left <= 0:
                    if unsettled is not None:
                        raise unknown() from unsettled
                    raise Unavailable(and_tls(self.unreachable("no coordinator reachable"), tls_failed), name=name,
                                      lease_id=lease_id)
                try:
                    wait = left if self.fail_fast else min(left, self.per_try)
                    outcome = await self._wait_ready(channel, address, wait, once=self.fail_fast)
                except TlsError as err:
                    tls_failed.setdefault(address, err)
                    if len(tls_failed) >= len(self.addresses):
                        raise every_handshake_failed(tls_failed, name=name, lease_id=lease_id) from None
                    self.rotate(channel, force=True)
                    continue
                except TimeoutError:
                    self.rotate(channel, force=True)
                    await asyncio.sleep(min(next(delays), max(0.0, budget())))
                    continue
                except grpc.aio.UsageError as err:  # the stream's rotation closed it: use the new channel
                    if budget() <= 0:
                        raise Unavailable("channel closed", name=name, lease_id=lease_id) from err
                    await asyncio.sleep(min(next(delays), max(0.0, budget())))
                    continue
                if outcome == STALE:
                    self.rotate(channel, force=True)  # try a fresh connection
                    continue
                if outcome == FAILED:  # fail_fast: this address's connection attempt failed, not for TLS
                    # Each address counts once: after a STALE answer the rotation comes back to a failed one.
                    unreachable.add(address)
                    self.rotate(channel, force=True)
                    if len(unreachable | tls_failed.keys()) >= len(self.addresses):
                        raise Unavailable(and_tls(self.unreachable("every connection attempt failed"), tls_failed),
                                          name=name, lease_id=lease_id)
                    continue
            request, timeout = make(None if until is None else until - loop.time())
            if settles and getattr(request, "request_id", ""):
                attempt = max(MIN_ATTEMPT_SECONDS, self.connect_timeout / 3)
                timeout = attempt if timeout is None else min(timeout, attempt)
            try:
                return await self._send(stub, method, request, timeout, name, lease_id, token, secret, stream)
            except grpc.aio.AioRpcError as err:
                mapped = from_rpc_error(err, name=name, lease_id=lease_id, token=token, address=address)
                if settles and mapped.reason is None and err.code() in (grpc.StatusCode.DEADLINE_EXCEEDED,
                                                                        grpc.StatusCode.UNAVAILABLE):
                    unsettled = err  # sent, and its answer lost: ask again with the same request id
                    if budget() <= 0:
                        # A coordinator's own account (ETCD_UNAVAILABLE) of an earlier attempt says more.
                        raise (answered if answered is not None else unknown()) from err
                    if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                        self.rotate(channel)
                        await asyncio.sleep(min(next(delays), max(0.0, budget())))
                        continue
                if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED and answered is not None:
                    raise answered from err
                if mapped.reason in GO_ELSEWHERE:
                    # Past its capacity, or draining before it stops, the coordinator did nothing: the next
                    # address at once (each once a round), then wait as asked, within the call's time.
                    overloaded += 1
                    self.rotate(channel)
                    if overloaded % len(self.addresses):
                        continue
                    pause = (mapped.retry_delay or 1.0) * random.uniform(1.0, 1.5)
                    if budget() <= pause:
                        raise mapped from err
                    await asyncio.sleep(pause)
                    continue
                if isinstance(mapped, LimitExceeded) and mapped.retry_delay is not None:
                    # A rate limit: nothing was done; wait as asked (never in a tight loop), within the call's time.
                    pause = mapped.retry_delay * random.uniform(1.0, 1.5)
                    if budget() <= pause:
                        raise mapped from err
                    await asyncio.sleep(pause)
                    continue
                if (self.fail_fast and err.code() == grpc.StatusCode.UNAVAILABLE and mapped.reason is None
                        and address not in tls_failed):
                    # The connection broke under the call: a coordinator that refuses this client's
                    # certificate (or its lack of one) after a TLS 1.3 handshake can do that, once the
                    # channel was READY. Say so, as a failed connection attempt would have.
                    failure = await self.tls_failure(channel, address, max(0.0, budget()), details=err.details() or "")
                    if failure is not None:
                        tls_failed[address] = failure
                        if len(tls_failed) >= len(self.addresses) or not idempotent or budget() <= 0:
                            raise every_handshake_failed(tls_failed, name=name, lease_id=lease_id) from None
                if err.code() != grpc.StatusCode.UNAVAILABLE or not idempotent or budget() <= 0:
                    raise mapped from err
                if mapped.reason is not None:  # a coordinator's own answer, not a broken connection
                    answered = mapped
                self.rotate(channel, force=mapped.reason == SHUTTING_DOWN)
            except grpc.aio.UsageError as err:  # the channel was closed by a rotation
                if budget() <= 0:
                    if unsettled is not None:
                        raise unknown() from unsettled
                    raise Unavailable("channel closed", name=name, lease_id=lease_id) from err
            except asyncio.CancelledError:
                if current_task_cancelling():
                    raise
                # The call (not this task) was cancelled: its channel was closed.
                if settles and not self.closed:
                    unsettled = Unavailable("connection closed during the call", name=name, lease_id=lease_id)
                if not idempotent or budget() <= 0:
                    if unsettled is not None:
                        raise unknown() from unsettled
                    raise Unavailable("connection closed during the call", name=name, lease_id=lease_id) from None
            await asyncio.sleep(min(next(delays), max(0.0, budget())))

    async def _send(self, stub: pb_grpc.LockServiceStub, method: str, request: Message, timeout: float | None,
                    name: str | None, lease_id: int | None, token: int | None, secret: str | None = None,
                    stream: StreamCalls | None = None) -> Any:
        """Send one attempt of a call: in a CLIENT span carrying its context to the server, when tracing is on.

        The attempt is a message on the KeepAlive stream when ``stream`` serves ``method`` now, else a unary call.
        """
        on_stream = stream is not None and stream.serves(method)
        owned = ((LEASE_SECRET_METADATA, secret),) if secret else ()
        tracer = self.tracing.tracer()
        if tracer is None:
            if on_stream:
                assert stream is not None
                return await stream.call(method, request, timeout=timeout, secret=secret or "")
            return await getattr(stub, method)(request, timeout=timeout, metadata=owned or None)
        attributes = rpc_attributes(LOCK_SERVICE, method)
        attributes.update(self.tracing.lock_attributes(name, lease_id, token))
        request_id = getattr(request, "request_id", "")  # the same on every attempt of one call
        if request_id:
            attributes[REQUEST_ID] = request_id
        with tracer.start_as_current_span(f"{LOCK_SERVICE}/{method}", kind=SpanKind.CLIENT, attributes=attributes,
                                          record_exception=False, set_status_on_exception=False) as span:
            try:
                if on_stream:
                    assert stream is not None
                    traceparent = dict(inject()).get(TRACEPARENT, "")
                    response = await stream.call(method, request, timeout=timeout, secret=secret or "",
                                                 traceparent=traceparent)
                else:
                    response = await getattr(stub, method)(request, timeout=timeout,
                                                           metadata=tuple(inject()) + owned)
            except grpc.aio.AioRpcError as err:
                set_rpc_status(span, err.code(), server=False, message=err.details())
                span.set_attribute(OUTCOME, error_outcome(details.parse(err).reason, err.code()))
                raise
            except asyncio.CancelledError:
                set_rpc_status(span, grpc.StatusCode.CANCELLED, server=False)
                span.set_attribute(OUTCOME, grpc.StatusCode.CANCELLED.name)
                raise
            except BaseException as exc:  # the channel was closed under the call (UsageError), ...
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                raise
            set_rpc_status(span, grpc.StatusCode.OK, server=False)
            span.set_attributes(response_facts(method, response))
            return response
