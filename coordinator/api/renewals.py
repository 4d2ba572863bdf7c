"""The keepalives of one KeepAlive stream, single or batched: forwarded to etcd, answered, and what the answers say.

A ``keepalive`` message renews one lease; a ``keepalives`` message
(``LeaseKeepAlives``) renews several, and each of its entries is served
exactly as a ``keepalive`` of its own: one code path serves both, a single
keepalive being a batch of one. Per entry: the ownership check of its lease
on this stream (the entry's secret, else the message's, else the caller's
certificate identity: :meth:`.stream.KeepAliveStream` checks), one keepalive
forwarded to etcd, one ack with the entry's request id (queued as soon as
etcd answers that entry: :mod:`.outbox` sends acks ready together as one
message), the limits hook (``on_keepalive``), the leases kept here
(``fencepost_leases``) and, when etcd says the lease is gone, its end told
once (``lease_expired``, INFO) and its watched holds ended. Per message: one
task, the keepalive counters (``fencepost_keepalives_total`` per lease,
``fencepost_keepalive_batch_size`` per message), and at most one log line
when etcd does not answer.

:func:`renew_once` serves the unary LeaseKeepAlive call the same way, for
one lease without a stream: forwarded, counted, the limits hook told, and a
lease that is gone refused as LEASE_EXPIRED.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from fencepost.client.errors import LeaseLost, Unavailable
from fencepost.client.v1 import lock_pb2

from ..admission.ownership import Ownership
from ..recipes.lease import KeptLeases, Leases
from ..telemetry.events import log_event
from ..telemetry.metrics import LockMetrics
from .outbox import StreamOutbox

__all__ = ["StreamRenewals", "renew_once"]

_log = logging.getLogger(__name__)

#: The stream's ownership check of a lease: (lease id, secret) -> the check to wait for (its result: owned),
#: None once it passed or when nothing is checked.
Check = Callable[[int, str], "asyncio.Future[bool] | None"]


def _ended(*_args: object) -> None:
    """The callbacks of a stream that ended: nothing is checked, forwarded or ended any more."""
    return None


class StreamRenewals:
    """Serves the keepalives of one stream.

    Args:
        leases: forwards keepalives to etcd.
        outbox: the stream's answers.
        check: the stream's ownership check (see :data:`Check`).
        spawn: runs a coroutine in a task of the stream (cancelled when the stream ends).
        metrics: counts keepalives.
        kept: the leases kept alive through this coordinator's streams (``fencepost_leases``).
        owners: told of each lease a keepalive finds gone; None for none.
        on_keepalive: called with (lease id, TTL etcd answered, <= 0 when gone) for each keepalive answered.
        on_gone: called with each lease a keepalive finds gone (the stream ends its watched holds).
        log_fields: the stream's log fields (``peer``, ``trace_id``).
    """

    def __init__(self, leases: Leases, outbox: StreamOutbox, check: Check, spawn: Callable[[Awaitable[None]], None],
                 *, metrics: LockMetrics, kept: KeptLeases, owners: Ownership | None,
                 on_keepalive: Callable[[int, int], None] | None, on_gone: Callable[[int], None],
                 log_fields: dict[str, str | None]) -> None:
        self._leases = leases
        self._outbox = outbox
        self._check = check
        self._spawn = spawn
        self._metrics = metrics
        self._kept = kept
        self._owners = owners
        self._on_keepalive = on_keepalive
        self._on_gone = on_gone
        self._log_fields = log_fields
        self._kept_here: set[int] = set()  # leases this stream counts in ``kept``
        self._expired: set[int] = set()
        #: The different leases renewed on this stream so far.
        self.seen: set[int] = set()

    def received(self, entries: Sequence[lock_pb2.LeaseKeepAlive], secret: str) -> None:
        """Serve one keepalive message: ``entries`` (one for a single keepalive), ``secret`` the message's.

        Each entry's lease is checked (its own secret, else ``secret``) and
        forwarded; an entry whose lease the caller does not own is not, and
        the stream ends with the refusal.
        """
        self._metrics.keepalives(len(entries))
        waits: dict[int, asyncio.Future[bool]] | None = None
        for entry in entries:
            lease_id = entry.lease_id
            check = self._check(lease_id, entry.lease_secret or secret)
            if check is not None:
                if waits is None:
                    waits = {}
                waits[lease_id] = check
            self.seen.add(lease_id)
        self._spawn(self._forward([(entry.lease_id, entry.request_id) for entry in entries], waits))

    async def _forward(self, entries: list[tuple[int, int]], waits: dict[int, asyncio.Future[bool]] | None) -> None:
        """Forward ``entries`` (lease id, request id) to etcd once their leases' checks passed; ack each."""
        if waits:
            refused = {lease_id for lease_id, check in waits.items() if not await asyncio.shield(check)}
            if refused:
                entries = [entry for entry in entries if entry[0] not in refused]
                if not entries:
                    return

        def answered(index: int, ttl: int) -> None:
            self._answered(*entries[index], ttl)

        unanswered, error = await self._leases.keepalives([lease_id for lease_id, _ in entries], answered)
        if unanswered:  # no answer: the client's deadline counts them as not acknowledged
            leases = ", ".join(f"{entries[i][0]:#x}" for i in unanswered[:5]) + (", ..." if len(unanswered) > 5 else "")
            _log.info("keepalive for lease %s not answered: %s", leases, error)

    def _answered(self, lease_id: int, request_id: int, ttl: int) -> None:
        """etcd answered the keepalive ``request_id`` of ``lease_id`` with ``ttl`` (<= 0: the lease is gone)."""
        self._outbox.put_ack(lease_id, request_id, ttl)
        if self._on_keepalive is not None:
            self._on_keepalive(lease_id, ttl)
        if ttl > 0:
            if lease_id not in self._kept_here and lease_id not in self._expired:
                self._kept_here.add(lease_id)
                self._kept.add(lease_id)
            return
        if lease_id in self._kept_here:
            self._kept_here.discard(lease_id)
            self._kept.remove(lease_id)
        if self._owners is not None:
            self._owners.ended(lease_id)
        if lease_id not in self._expired:
            self._expired.add(lease_id)
            log_event(_log, logging.INFO, "lease_expired", f"lease {lease_id:#x} expired or was revoked "
                      f"(a keepalive found it gone)", lease_id=lease_id, **self._log_fields)
        self._on_gone(lease_id)

    def close(self) -> None:
        """The stream ended: the leases it kept no longer count as kept here; the stream's callbacks are dropped.

        They are bound methods of the stream, which holds this object: without this the pair (with the
        stream's gRPC context and call state) would wait for the cycle collector's oldest generation.
        """
        for lease_id in self._kept_here:
            self._kept.remove(lease_id)
        self._kept_here.clear()
        self._check = self._spawn = self._on_gone = _ended  # type: ignore[assignment]


async def renew_once(leases: Leases, lease_id: int, *, metrics: LockMetrics, on_keepalive: Callable[[int, int], None],
                     owners: Ownership, log_fields: dict[str, str | None]) -> int:
    """One keepalive of ``lease_id`` outside a stream (LeaseKeepAlive): forwarded to etcd, counted, answered.

    Args:
        leases: forwards the keepalive to etcd.
        lease_id: the lease (its owner was checked).
        metrics: counts the keepalive (a message of one lease).
        on_keepalive: told (lease id, TTL etcd answered, <= 0 when gone).
        owners: told of a lease found gone.
        log_fields: the call's log fields (``peer``, ``trace_id``).

    Returns:
        The TTL etcd reset the lease to, in seconds (> 0).

    Raises:
        LeaseLost: LEASE_EXPIRED: etcd says the lease is gone (logged ``lease_expired``).
        Unavailable: etcd did not answer.
    """
    metrics.keepalives(1)
    ttls: list[int] = []
    _, error = await leases.keepalives((lease_id,), lambda _, ttl: ttls.append(ttl))
    if not ttls:
        raise error if error is not None else Unavailable(f"etcd did not answer the keepalive of lease {lease_id:#x}",
                                                          lease_id=lease_id)
    on_keepalive(lease_id, ttls[0])
    if ttls[0] > 0:
        return ttls[0]
    owners.ended(lease_id)
    log_event(_log, logging.INFO, "lease_expired", f"lease {lease_id:#x} expired or was revoked (a keepalive found "
              f"it gone)", lease_id=lease_id, **log_fields)
    raise LeaseLost(f"lease {lease_id:#x} has expired or was revoked", lease_id=lease_id)
