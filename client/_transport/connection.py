"""The channel to one coordinator at a time: opening, rotation, waiting for a connection, and why one failed.

A :class:`Connection` holds a ``grpc.aio`` channel to one coordinator
address at a time. When that coordinator misbehaves it moves to the next
address (:meth:`~Connection.rotate`); :meth:`~Connection.wait_connected`
waits for a READY channel, going round the addresses with the one backoff
policy (:data:`fencepost.client.v1.retry.CLIENT_BACKOFF`).

TLS: the channels are opened by the client's
:class:`~fencepost.client._transport.tls.Security`. Each time a channel fails to
connect, :meth:`Connection.tls_failure` asks whether the TLS handshake is
why; an address that failed its handshake is not waited for again, and
once every address has, the wait raises
:class:`~fencepost.client.errors.TlsError` at once: a certificate that does
not verify will not verify on the next try, unless the client's TLS files
changed on disk meanwhile. Each channel is opened with the files as they
are then (:meth:`~.tls.Security.reloaded`, see :mod:`.renewal`), and a
channel that is not connected is replaced by a new one when the files
changed since it was opened, so that a renewed certificate is used at the
next handshake. When a coordinator refuses a handshake while the client's
own certificate has expired (or is not valid yet), the TlsError (and the
KeepAlive stream's one warning) names its file and its expiry.

The calls made over it are :class:`~.transport.Transport`'s.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import grpc
import grpc.aio

from . import handshake, renewal
from ..errors import TlsError, Unavailable
from ..v1 import lock_pb2_grpc as pb_grpc
from ..v1.retry import CLIENT_BACKOFF
from .tls import PLAINTEXT, Security

__all__ = ["DIAGNOSE_SECONDS", "DRAIN_SECONDS", "FAILED", "READY", "ROTATE_GRACE_SECONDS", "STALE", "Connection",
           "and_tls", "every_handshake_failed"]

log = logging.getLogger("fencepost.client")

#: Grace given to calls still running on a channel being replaced, in seconds.
ROTATE_GRACE_SECONDS = 0.5

#: Longest wait, in :meth:`Connection.close`, for gRPC to report the end of
#: the connectivity watches of the closed channels, in seconds.
DRAIN_SECONDS = 2.0

#: Longest time spent finding out why a connection failed (a call that
#: fails at once, and maybe one TLS handshake of our own), in seconds.
DIAGNOSE_SECONDS = 2.0

# What Connection._wait_ready saw.
READY, FAILED, STALE = "ready", "failed", "stale"

#: The method of the call that reads a failed channel's last error. It fails
#: without reaching a server when the channel cannot connect; if the channel
#: connects meanwhile, a coordinator answers it (grpc.health.v1), harmlessly.
_PROBE_METHOD = "/grpc.health.v1.Health/Check"


class Connection:
    """A channel to one of a list of coordinator addresses at a time.

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
    """

    def __init__(self, addresses: Sequence[str], *, connect_timeout: float, fail_fast: bool = False,
                 security: Security = PLAINTEXT) -> None:
        self.addresses: tuple[str, ...] = tuple(addresses)
        self.connect_timeout = connect_timeout
        self.fail_fast = fail_fast
        self.security = security
        self.channel: grpc.aio.Channel | None = None
        self.stub: pb_grpc.LockServiceStub | None = None
        self.closed = False
        self._index = 0
        self._closing: set[asyncio.Task[None]] = set()
        # Connectivity watches still registered with gRPC (see _watch).
        self._watches: set[asyncio.Task[None]] = set()
        # Addresses whose last connection attempt found an HTTP/1 server (gRPC's details said so).
        self.http1: set[str] = set()

    @property
    def address(self) -> str:
        """The address of the coordinator currently used."""
        return self.addresses[self._index]

    @property
    def per_try(self) -> float:
        """Seconds to wait for one address to connect before trying the next."""
        return max(1.0, self.connect_timeout / len(self.addresses))

    def open(self) -> None:
        """Open a channel to the current address (no connection is made yet), with the TLS files as they are now."""
        self.security = self.security.reloaded()
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
        if not force and len(self.addresses) == 1 and not renewal.changed(self.security):
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
                raise Unavailable(and_tls(self.unreachable(f"no coordinator reachable at {', '.join(self.addresses)}"),
                                          tls_failed))
            try:
                if await self._wait_ready(channel, address, min(left, per_try), once=False) == READY:
                    return
                self.rotate(channel, force=True)  # STALE: try a fresh connection
            except TlsError as err:
                tls_failed.setdefault(address, err)
                if len(tls_failed) >= len(self.addresses):
                    raise every_handshake_failed(tls_failed) from None
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
        a fresh channel. STALE is returned too, at once, when the channel is
        not READY and the client's TLS files changed since it was opened: a
        fresh channel reads them.

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
            if renewal.changed(self.security):
                return STALE
            if state == grpc.ChannelConnectivity.TRANSIENT_FAILURE:
                failure = await self.tls_failure(channel, address, until - loop.time())
                if failure is not None:
                    if stale or renewal.changed(self.security):
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
            (known to be) TLS: nothing listens, a reset, a timeout. A
            coordinator's refusal of the client's certificate while it has
            expired (or is not valid yet) names its file and expiry.
        """
        timeout = max(0.05, min(timeout, DIAGNOSE_SECONDS))
        if details is None:
            details = await _connect_error(channel, timeout)
            if details is None:
                return None
        if HTTP1_SERVER in details:
            self.http1.add(address)
        return await handshake.failure(self.security, details, address, timeout)

    def unreachable(self, message: str) -> str:
        """``message`` (no coordinator reachable), with a hint when an address answered as an HTTP/1 server."""
        if not self.http1:
            return message
        return (f"{message} ({', '.join(sorted(self.http1))} answered HTTP/1: is it a coordinator's HTTP port, "
                f"--http-listen? this client speaks gRPC, to --listen)")

    async def close(self) -> None:
        """Stop every call: close the channel and the ones being replaced. Idempotent.

        Returns once every channel this transport opened is closed (those
        replaced by a rotation within :data:`ROTATE_GRACE_SECONDS`) and gRPC
        has answered their connectivity watches (within :data:`DRAIN_SECONDS`):
        then gRPC has nothing left to deliver to this event loop, which may be
        closed (the sync client's shared loop is closed once its last client has closed).
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


#: What gRPC's connection error says when the address answered as an HTTP/1.x server (an HTTP port).
HTTP1_SERVER = "http1.x server"


def and_tls(message: str, failures: dict[str, TlsError]) -> str:
    """``message``, followed by the TLS failures seen on the way, if any."""
    if not failures:
        return message
    return f"{message} ({'; '.join(err.message for err in failures.values())})"


def every_handshake_failed(failures: dict[str, TlsError], *, name: str | None = None,
                            lease_id: int | None = None) -> TlsError:
    """The TlsError to raise once every address has failed its handshake."""
    first = next(iter(failures.values()))
    message = first.message
    if len(failures) > 1:
        message = "TLS handshake failed with every coordinator: " + "; ".join(
            f"{address}: {err.cause}" for address, err in failures.items())
    return TlsError(message, address=first.address, cause=first.cause, name=name, lease_id=lease_id)
