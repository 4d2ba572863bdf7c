"""The client's transport: coordinator addresses, the channel, and the unary call retry loop.

One :class:`Transport` holds a ``grpc.aio`` channel to one coordinator
address at a time. When that coordinator misbehaves it moves to the next
address (rotation), and every unary call goes through :meth:`Transport.call`,
which waits for a connection, retries what may be retried with the one
backoff policy (:data:`fencepost.client.v1.retry.CLIENT_BACKOFF`), and turns
a failed call into a :class:`~fencepost.client.FencepostError` with
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
raised at once (:class:`~fencepost.client.errors.LimitExceeded`). Either
way a call stops trying ``connect_timeout`` seconds after its first
failure, or at its own deadline.

TLS: the channels are opened by the client's
:class:`~fencepost.client._transport.tls.Security`. Each time a channel fails to
connect, :meth:`Transport.tls_failure` asks whether the TLS handshake is
why; an address that failed its handshake is not waited for again in that
call, and once every address has, the call raises
:class:`~fencepost.client.errors.TlsError` at once: a certificate that does
not verify will not verify on the next try.

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
import logging
import random
from collections.abc import Callable, Sequence
from typing import Any

import grpc
import grpc.aio
from google.protobuf.message import Message
from opentelemetry.trace import SpanKind, Status, StatusCode

from . import handshake
from .._leases.calls import StreamCalls
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
from ..errors import LOCK_SERVICE, FencepostError, LimitExceeded, TlsError, Unavailable, from_rpc_error
from ..v1 import details
from ..v1 import lock_pb2_grpc as pb_grpc
from ..v1.details import ErrorReason, reason_name
from ..v1.keys import LEASE_SECRET_METADATA
from ..v1.retry import CLIENT_BACKOFF

__all__ = ["MakeRequest", "Transport", "current_task_cancelling"]

log = logging.getLogger("fencepost.client")

#: Grace given to calls still running on a channel being replaced, in seconds.
ROTATE_GRACE_SECONDS = 0.5

#: Longest wait, in :meth:`Transport.close`, for gRPC to report the end of
#: the connectivity watches of the closed channels, in seconds.
DRAIN_SECONDS = 2.0

#: Longest time spent finding out why a connection failed (a call that
#: fails at once, and maybe one TLS handshake of our own), in seconds.
DIAGNOSE_SECONDS = 2.0

# What Transport._wait_ready saw.
READY, FAILED, STALE = "ready", "failed", "stale"

#: The method of the call that reads a failed channel's last error. It fails
#: without reaching a server when the channel cannot connect; if the channel
#: connects meanwhile, a coordinator answers it (grpc.health.v1), harmlessly.
_PROBE_METHOD = "/grpc.health.v1.Health/Check"

SHUTTING_DOWN = reason_name(ErrorReason.SHUTTING_DOWN)

#: The W3C trace context header, sent in a stream call's ``traceparent`` field.
TRACEPARENT = "traceparent"

#: Builds one attempt of a call: given the seconds left before the call's
#: ``until`` (None when unbounded), returns (request, gRPC timeout in seconds or None).
MakeRequest = Callable[[float | None], tuple[Message, float | None]]


def current_task_cancelling() -> bool:
    """Whether the running task itself is being cancelled (not just a call it awaits)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class Transport:
    """Channels to a list of coordinator addresses, one at a time, and the unary call loop.

    Args:
        addresses: The address of each coordinator, in the order they are
            tried, as :func:`fencepost.client._transport.wire.check_addresses` returns them.
        connect_timeout: Seconds each call (and :meth:`wait_connected`) keeps
            trying to reach a coordinator; finite, > 0.
        fail_fast: Give up on an address as soon as a connection attempt to
            it fails, and make each call try every address once only (a
            command line tool's policy). By default (a long-lived client) a
            call waits up to ``per_try`` seconds for each address to come up,
            and goes round the addresses with backoff until ``connect_timeout``.
        security: How channels are opened: plaintext (the default) or TLS.
        tracing: Whether (and with which tracer) each attempt is a span; by
            default the global tracer provider's, lock names included.
    """

    def __init__(self, addresses: Sequence[str], *, connect_timeout: float, fail_fast: bool = False,
                 security: Security = PLAINTEXT, tracing: Tracing | None = None) -> None:
        self.addresses: tuple[str, ...] = tuple(addresses)
        self.connect_timeout = connect_timeout
        self.fail_fast = fail_fast
        self.security = security
        self.tracing = tracing if tracing is not None else Tracing()
        self.channel: grpc.aio.Channel | None = None
        self.stub: pb_grpc.LockServiceStub | None = None
        self.closed = False
        self._index = 0
        self._closing: set[asyncio.Task[None]] = set()
        # Connectivity watches still registered with gRPC (see _watch).
        self._watches: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> str:
        """The address of the coordinator currently used."""
        return self.addresses[self._index]

    @property
    def per_try(self) -> float:
        """Seconds to wait for one address to connect before trying the next."""
        return max(1.0, self.connect_timeout / len(self.addresses))

    def open(self) -> None:
        """Open a channel to the current address (no connection is made yet)."""
        self.channel = self.security.channel(self.address)
        self.stub = pb_grpc.LockServiceStub(self.channel)

    def rotate(self, failed: grpc.aio.Channel | None, *, force: bool = False) -> None:
        """Move to the next address after the channel ``failed`` misbehaved (once per channel).

        Args:
            failed: The channel that failed; nothing happens unless it is the
                current one (another caller rotated already).
            force: Replace the channel even when it is the only address and
                its connection is READY (the server ended a stream, or is
                shutting down).
        """
        current = self.channel
        if failed is None or current is None or failed is not current or self.closed:
            return
        if not force and len(self.addresses) == 1:
            if failed.get_state(try_to_connect=False) == grpc.ChannelConnectivity.READY:
                return
        self._index = (self._index + 1) % len(self.addresses)
        self.open()
        task = asyncio.ensure_future(failed.close(grace=ROTATE_GRACE_SECONDS))
        task.set_name("fencepost-close-channel")
        self._closing.add(task)
        task.add_done_callback(self._closed_one)

    def _closed_one(self, task: asyncio.Task[None]) -> None:
        self._closing.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("fencepost: closing a replaced channel failed: %r", task.exception())

    async def wait_connected(self, until: float) -> None:
        """Wait until the current channel is READY, rotating addresses with backoff.

        Args:
            until: Loop time (``loop.time()``) after which to give up.

        Raises:
            TlsError: every address failed its TLS handshake (at once, not at ``until``).
            Unavailable: no coordinator connected before ``until``.
        """
        loop = asyncio.get_running_loop()
        delays = CLIENT_BACKOFF.delays()
        tls_failed: dict[str, TlsError] = {}
        # Each address gets its share of a wait shorter than connect_timeout (connect(timeout=)), so that
        # one address that does not answer cannot take all of it.
        per_try = min(self.per_try, max(0.1, (until - loop.time()) / len(self.addresses)))
        while True:
            channel, address = self.channel, self.address
            assert channel is not None
            if channel.get_state(try_to_connect=True) == grpc.ChannelConnectivity.READY:
                return
            left = until - loop.time()
            if left <= 0:
                raise Unavailable(_and_tls(f"no coordinator reachable at {', '.join(self.addresses)}", tls_failed))
            try:
                if await self._wait_ready(channel, address, min(left, per_try), once=False) == READY:
                    return
                self.rotate(channel, force=True)  # STALE: try a fresh connection
            except TlsError as err:
                tls_failed.setdefault(address, err)
                if len(tls_failed) >= len(self.addresses):
                    raise _every_handshake_failed(tls_failed) from None
                self.rotate(channel, force=True)
            except TimeoutError:
                self.rotate(channel, force=True)
                await asyncio.sleep(min(next(delays), max(0.0, until - loop.time())))

    async def _wait_ready(self, channel: grpc.aio.Channel, address: str, timeout: float, *, once: bool) -> str:
        """Wait until ``channel`` (to ``address``) is READY, asking at each failed connection whether TLS is why.

        A TLS failure seen on a channel that had already failed before this
        wait began may be stale (gRPC reports the last attempt until its
        reconnect backoff ends, and the certificates may have been fixed
        since): it is not raised, STALE is returned so that the caller tries
        a fresh channel.

        Args:
            channel: The channel to wait for.
            address: Its address.
            timeout: Seconds to wait.
            once: Return FAILED at the first failed connection (that is not a TLS failure).

        Returns:
            READY; FAILED after a failed connection when ``once``; STALE.

        Raises:
            TlsError: a connection attempt made during this wait failed its TLS handshake.
            TimeoutError: not READY within ``timeout`` seconds.
            grpc.aio.UsageError: the channel was closed (replaced by a rotation).
        """
        loop = asyncio.get_running_loop()
        until = loop.time() + timeout
        state = channel.get_state(try_to_connect=True)
        stale = state == grpc.ChannelConnectivity.TRANSIENT_FAILURE
        while state != grpc.ChannelConnectivity.READY:
            if state == grpc.ChannelConnectivity.TRANSIENT_FAILURE:
                failure = await self.tls_failure(channel, address, until - loop.time())
                if failure is not None:
                    if stale:
                        return STALE
                    raise failure
                if once:
                    return FAILED
            left = until - loop.time()
            if left <= 0:
                raise TimeoutError
            await self._watch(channel, state, left)
            state = channel.get_state(try_to_connect=True)
            stale = False
        return READY

    async def _watch(self, channel: grpc.aio.Channel, state: grpc.ChannelConnectivity, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for ``channel`` to leave ``state``.

        The watch is a task of its own, kept until gRPC answers it, and never
        cancelled: cancelling the wait does not withdraw a watch from gRPC,
        which answers it on this loop at the channel's next change of state
        (at the latest when it is closed). :meth:`close` waits for the
        answers, so that none reaches this loop after it is closed (grpc.aio
        would then print "RuntimeError: Event loop is closed" from another loop).

        Raises:
            TimeoutError: the state did not change within ``timeout``.
            grpc.aio.UsageError: the channel was closed (replaced by a rotation).
        """
        watch = asyncio.ensure_future(channel.wait_for_state_change(state))
        watch.set_name("fencepost-watch-channel")
        self._watches.add(watch)
        watch.add_done_callback(self._watched)
        await asyncio.wait((watch,), timeout=timeout)
        if not watch.done():
            raise TimeoutError
        watch.result()

    def _watched(self, task: asyncio.Task[None]) -> None:
        self._watches.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a watch outliving its wait may end with the channel's close

    async def tls_failure(self, channel: grpc.aio.Channel, address: str, timeout: float,
                          details: str | None = None) -> TlsError | None:
        """Whether the TLS handshake is why ``channel`` cannot connect to ``address``.

        Args:
            channel: A channel that failed to connect (TRANSIENT_FAILURE).
            address: Its address.
            timeout: Seconds this may take (at most :data:`DIAGNOSE_SECONDS`).
            details: gRPC's details of a call that failed for want of a
                connection, when the caller has them; else a call that fails
                at once reads them.

        Returns:
            The TlsError naming the cause, or None when the failure is not
            (known to be) TLS: nothing listens, a reset, a timeout.
        """
        timeout = max(0.05, min(timeout, DIAGNOSE_SECONDS))
        if details is None:
            details = await _connect_error(channel, timeout)
            if details is None:
                return None
        return await handshake.failure(self.security, details, address, timeout)

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

        unreachable = 0  # addresses that could not be connected to (fail_fast)
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
                    raise Unavailable(_and_tls("no coordinator reachable", tls_failed), name=name, lease_id=lease_id)
                try:
                    wait = left if self.fail_fast else min(left, self.per_try)
                    outcome = await self._wait_ready(channel, address, wait, once=self.fail_fast)
                except TlsError as err:
                    tls_failed.setdefault(address, err)
                    if len(tls_failed) >= len(self.addresses):
                        raise _every_handshake_failed(tls_failed, name=name, lease_id=lease_id) from None
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
                    unreachable += 1
                    self.rotate(channel, force=True)
                    if unreachable + len(tls_failed) >= len(self.addresses):
                        raise Unavailable(_and_tls("every connection attempt failed", tls_failed),
                                          name=name, lease_id=lease_id)
                    continue
            request, timeout = make(None if until is None else until - loop.time())
            try:
                return await self._send(stub, method, request, timeout, name, lease_id, token, secret, stream)
            except grpc.aio.AioRpcError as err:
                mapped = from_rpc_error(err, name=name, lease_id=lease_id, token=token, address=address)
                if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED and answered is not None:
                    raise answered from err
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
                            raise _every_handshake_failed(tls_failed, name=name, lease_id=lease_id) from None
                if err.code() != grpc.StatusCode.UNAVAILABLE or not idempotent or budget() <= 0:
                    raise mapped from err
                if mapped.reason is not None:  # a coordinator's own answer, not a broken connection
                    answered = mapped
                self.rotate(channel, force=mapped.reason == SHUTTING_DOWN)
            except grpc.aio.UsageError as err:  # the channel was closed by a rotation
                if budget() <= 0:
                    raise Unavailable("channel closed", name=name, lease_id=lease_id) from err
            except asyncio.CancelledError:
                if current_task_cancelling():
                    raise
                # The call (not this task) was cancelled: its channel was closed.
                if not idempotent or budget() <= 0:
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

    async def close(self) -> None:
        """Stop every call: close the channel and the ones being replaced. Idempotent.

        Returns once every channel this transport opened is closed (those
        replaced by a rotation within :data:`ROTATE_GRACE_SECONDS`) and gRPC
        has answered their connectivity watches (within :data:`DRAIN_SECONDS`):
        then gRPC has nothing left to deliver to this event loop, which may be
        closed (the sync client closes its private loop next).
        """
        self.closed = True
        if self.channel is not None:
            await self.channel.close()
        # Not cancelled: a close task cancelled before it has run, or during
        # its grace, would leave its channel open, connecting and watched.
        closing = list(self._closing)
        if closing:
            await asyncio.gather(*closing, return_exceptions=True)
        watches = list(self._watches)
        if watches:
            _done, left = await asyncio.wait(watches, timeout=DRAIN_SECONDS)
            if left:
                log.debug("fencepost: %d channel watches still unanswered after close", len(left))


async def _connect_error(channel: grpc.aio.Channel, timeout: float) -> str | None:
    """gRPC's details of why ``channel`` cannot connect: those of a call that fails without reaching a server.

    Returns:
        The details of the call's UNAVAILABLE status (``"failed to connect to
        all addresses; last error: ..."``), or None when it ended otherwise
        (the channel connected meanwhile).
    """
    try:
        await channel.unary_unary(_PROBE_METHOD)(b"", timeout=timeout)
    except grpc.aio.AioRpcError as err:
        return (err.details() or "") if err.code() == grpc.StatusCode.UNAVAILABLE else None
    return None


def _and_tls(message: str, failures: dict[str, TlsError]) -> str:
    """``message``, followed by the TLS failures seen on the way, if any."""
    if not failures:
        return message
    return f"{message} ({'; '.join(err.message for err in failures.values())})"


def _every_handshake_failed(failures: dict[str, TlsError], *, name: str | None = None,
                            lease_id: int | None = None) -> TlsError:
    """The TlsError to raise once every address has failed its handshake."""
    first = next(iter(failures.values()))
    message = first.message
    if len(failures) > 1:
        message = "TLS handshake failed with every coordinator: " + "; ".join(
            f"{address}: {err.cause}" for address, err in failures.items())
    return TlsError(message, address=first.address, cause=first.cause, name=name, lease_id=lease_id)
