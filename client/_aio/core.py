"""The parts of an asyncio client and its lifecycle: what every call of :class:`~fencepost.client.AsyncLockClient` runs on.

:class:`ClientCore` wires the parts together and owns the client's state
(new -> open -> closing -> closed):

- :mod:`~fencepost.client._transport.transport`: addresses, the channel, the unary call
  retry loop;
- :mod:`~fencepost.client._leases.lease`: leases and their deadline rules, the pool
  of leases by TTL, holds and the local exclusion of one (lease, name);
- :mod:`~fencepost.client._leases.stream`: the KeepAlive stream, and
  :mod:`~fencepost.client._leases.deadlines` the deadline watcher;
- :mod:`~fencepost.client._recipes.holds`: the acquire loop and the release of
  every recipe, and the lease calls (grant, revoke);
- :mod:`~fencepost.client.tracing`: OpenTelemetry spans, when the
  application has set up an SDK.

The API is built on it in layers: :class:`~.queries.QueryCalls` (the calls
that make no hold), then :class:`~fencepost.client.AsyncLockClient` (locks,
semaphores, elections).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from types import TracebackType
from typing import Any, Self

import grpc
import grpc.aio
from opentelemetry import context as otel_context
from opentelemetry.trace import TracerProvider

from .. import _fork
from .._leases.calls import Outbox
from .._leases.deadlines import DeadlineWatcher
from .._leases.lease import IDLE_LEASE_TIMEOUT, MAX_IDLE_LEASES, Lease, LeasePool
from .._leases.stream import KeepAliveStream
from .._metrics import client_metrics
from .._recipes.holds import Holds
from .._transport import wire
from .._transport.tls import TlsConfig
from .._transport.tls import security as tls_security
from .._transport.transport import Transport
from .._transport.wire import DEFAULT_ADDRESS
from ..errors import FencepostError
from ..tracing import Tracing
from ..v1 import lock_pb2 as pb

__all__ = ["ClientCore"]

log = logging.getLogger("fencepost.client")

# Upper bound on the time close() spends releasing locks and revoking leases.
_CLOSE_BUDGET_SECONDS = 5.0


class ClientCore:
    """The parts of one asyncio client and its lifecycle (the arguments are :class:`AsyncLockClient`'s)."""

    def __init__(
        self,
        address: str | Sequence[str] = DEFAULT_ADDRESS,
        *,
        tls: TlsConfig | grpc.ChannelCredentials | None = None,
        keepalive_fraction: float = 1 / 3,
        connect_timeout: float = 10.0,
        idle_lease_timeout: float = IDLE_LEASE_TIMEOUT,
        max_idle_leases: int = MAX_IDLE_LEASES,
        metrics: Any = None,
        tracer_provider: TracerProvider | None = None,
        trace_lock_names: bool = True,
        stream_calls: bool = True,
    ) -> None:
        _fork.check_new_client()
        self._generation = _fork.generation()
        addresses = wire.check_addresses(address)
        fraction = wire.check_fraction(keepalive_fraction)
        self._connect_timeout = wire.check_connect_timeout(connect_timeout)
        idle_timeout, max_idle = wire.check_idle_leases(idle_lease_timeout, max_idle_leases)
        security = tls_security(tls)
        self._metrics = client_metrics(metrics)
        self._state = "new"  # new -> open -> closing -> closed
        self._closed_event: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._transport = Transport(addresses, connect_timeout=self._connect_timeout, security=security,
                                    tracing=Tracing(tracer_provider, lock_names=bool(trace_lock_names)))
        self._leases = LeasePool(idle_timeout=idle_timeout, max_idle=max_idle, metrics=self._metrics)
        self._stream = KeepAliveStream(
            self._transport, self._leases, fraction=fraction, spawn=self._spawn, metrics=self._metrics,
            on_open=self._resend_all, on_response=self._on_response, send_keepalives=self._send_keepalives,
            stream_calls=bool(stream_calls),
        )
        self._deadlines = DeadlineWatcher(self._leases, on_retired=self._revoke_retired)
        self._holds = Holds(self._transport, self._leases, self._stream, spawn=self._spawn,
                            on_new_lease=self._on_new_lease, state=lambda: self._state, on_idle=self._deadlines.wake)

    # ------------------------------------------------------------------ lifecycle

    @property
    def addresses(self) -> tuple[str, ...]:
        """The coordinator addresses, in the order they are tried."""
        return self._transport.addresses

    @property
    def address(self) -> str:
        """The address of the coordinator currently used."""
        return self._transport.address

    async def connect(self, timeout: float | None = None) -> None:
        """Connect to a coordinator and start the keepalive stream.

        Tries the addresses in turn, with backoff, for up to ``timeout``
        seconds. Called by ``async with``; calling it again is a no-op.

        Args:
            timeout: Seconds to try for; None: ``connect_timeout``. Later
                calls' retries still use ``connect_timeout``.

        Raises:
            TlsError: every address failed its TLS handshake (raised at once).
            Unavailable: no coordinator answered within ``timeout``.
            FencepostError: the client is closed, or was inherited through
                fork (reason "FORKED").
        """
        self._check_fork()
        if self._state == "open":
            return
        if self._state != "new":
            raise FencepostError("client is closed")
        self._state = "open"
        _fork.opened_channel()
        self._transport.open()
        try:
            wait = self._connect_timeout if timeout is None else max(0.0, timeout)
            await self._transport.wait_connected(asyncio.get_running_loop().time() + wait)
        except BaseException:
            await self.close()
            raise
        # The client's own tasks belong to no caller's trace (a connect made by an acquire would
        # otherwise make the idle-lease revocations of the next hours children of that acquire).
        detached = otel_context.attach(otel_context.Context())
        try:
            self._spawn(self._stream.run(), "fencepost-keepalive-stream")
            self._spawn(self._deadlines.run(), "fencepost-deadline-watcher")
        finally:
            otel_context.detach(detached)

    async def close(self) -> None:
        """Release every held lock, revoke the leases, stop the stream, close the channel.

        Spends at most about 5 seconds on the server (errors are ignored:
        leases that could not be revoked expire by their TTL), revoking also
        a lease granted while it closes (to an acquire that was blocked). Handles still
        held become released (``on_lost`` callbacks are not called).
        Idempotent.

        Raises:
            FencepostError: the client was inherited through fork (reason
                "FORKED"): the parent's channel, leases and holds are left
                alone.
        """
        self._check_fork()
        if self._state == "closed":
            return
        if self._state == "closing":
            assert self._closed_event is not None
            await self._closed_event.wait()
            return
        self._closed_event = asyncio.Event()
        was_open = self._state == "open"
        self._state = "closing"
        self._stream.begin_close()
        try:
            if was_open:
                until = asyncio.get_running_loop().time() + min(self._connect_timeout, _CLOSE_BUDGET_SECONDS)
                await self._release_and_revoke_all(until)
                # Leases granted meanwhile (an acquire that was blocked), and their revocations: before the
                # tasks are cancelled, so that no lease outlives the client.
                await self._holds.finish(until)
        finally:
            self._leases.close()
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            await self._transport.close()
            self._state = "closed"
            self._closed_event.set()

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def _check_fork(self) -> None:
        """Raise at once in a forked child: nothing of the parent's client may be touched there."""
        if self._generation != _fork.generation():
            raise _fork.inherited_error("AsyncLockClient")

    async def _ensure_open(self, name: str | None = None) -> None:
        if self._state == "new":
            await self.connect()
        elif self._state != "open":
            raise FencepostError("client is closed", name=name)

    async def _usable(self, name: str | None = None) -> None:
        """Raise unless a call may be made now: not in a forked child, not closed (a new client is opened)."""
        self._check_fork()
        await self._ensure_open(name)

    def _closed_error(self, name: str | None) -> FencepostError | None:
        """The error of a call that close() ended (its channel closed under it), None while open."""
        return FencepostError("client is closed", name=name) if self._state != "open" else None

    async def _release_and_revoke_all(self, until: float) -> None:
        loop = asyncio.get_running_loop()

        async def quietly(aw: Awaitable[Any]) -> None:
            try:
                await asyncio.wait_for(aw, max(0.0, until - loop.time()))
            except (FencepostError, TimeoutError, grpc.aio.AioRpcError) as err:
                log.debug("fencepost: ignored during close: %r", err)

        # Each hold through its own handle: a lock's Release, an election's Resign, ...
        await asyncio.gather(*(quietly(h.release()) for h in self._leases.holds()))
        leases = self._leases.leases()
        await asyncio.gather(*(quietly(self._holds.revoke(lease.lease_id, until=until, secret=lease.secret))
                               for lease in leases))

    def _spawn(self, coro: Awaitable[Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("fencepost: background task %s failed", task.get_name(), exc_info=task.exception())

    def _revoke_retired(self, lease: Lease) -> None:
        if self._state == "open":
            self._holds.revoke_in_background(lease.lease_id, lease.secret, "fencepost-revoke-idle-lease")

    @property
    def lease_count(self) -> int:
        """How many leases the client keeps alive now (at most one per TTL in use, plus the idle ones)."""
        return len(self._leases.leases())

    @property
    def lease_ids(self) -> tuple[int, ...]:
        """The ids of the leases the client keeps alive now (:attr:`lease_count` of them), in no set order.

        An acquire that waits is queued under one of them: ``describe(name).waiters`` then shows its place
        (``fencepost acquire`` prints it while it waits).
        """
        return tuple(lease.lease_id for lease in self._leases.leases())

    def _on_new_lease(self, lease: Lease) -> None:
        self._stream.start_keepalives(lease)
        self._deadlines.wake()

    # ------------------------------------------------------------------ the stream's hooks
    #
    # The stream calls these methods of the client (not its own), so that a
    # subclass can observe it: the fault suite's probe (tests/faults/
    # test_restart_load.py) counts reconnects, acknowledgements and keepalives
    # by overriding them, and test_holders.py feeds _on_response directly.

    def _resend_all(self) -> None:
        """A new stream is open: queue a keepalive per lease and a watch per hold."""
        self._stream.resend_all()

    def _on_response(self, response: pb.KeepAliveResponse) -> None:
        """A message arrived on the stream."""
        self._stream.dispatch(response)

    def _send_keepalives(self, leases: list[Lease]) -> None:
        """Queue one keepalive of each of ``leases`` (one batch when the coordinator serves them)."""
        self._stream.send_keepalives(leases)

    @property
    def _outbox(self) -> Outbox | None:
        return self._stream.outbox

    @property
    def _pending(self) -> dict[int, tuple[Lease, float]]:
        return self._stream.pending

    @property
    def _channel(self) -> grpc.aio.Channel | None:
        return self._transport.channel

    def _rotate(self, failed: grpc.aio.Channel | None, *, force: bool = False) -> None:
        self._transport.rotate(failed, force=force)
