"""Leases: grant, revoke, and keepalives forwarded to etcd.

A lease is an etcd lease with its TTL. Every keepalive a client sends is
forwarded on one of the etcd layer's shared ``LeaseKeepAlive`` streams and
answered with the TTL etcd reset the lease to. The coordinator never renews
a lease on its own timer: a frozen or dead client loses its lease one TTL
after its last keepalive (after etcd's ``concurrency.Session``, whose
keepalive loop is the client's here, not the coordinator's).

:class:`KeptLeases` counts the leases kept alive through this coordinator's
KeepAlive streams (``fencepost_leases``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from fencepost.client.errors import FencepostError

from ..etcd import EtcdClient, unbounded
from ..telemetry.metrics import NO_METRICS, LockMetrics
from .validate import validate_lease_id, validate_ttl

_log = logging.getLogger(__name__)


class Leases:
    """Lease grant, revoke and keepalive on etcd.

    Args:
        etcd: the coordinator's etcd layer.
    """

    def __init__(self, etcd: EtcdClient) -> None:
        self._etcd = etcd
        self._orphans: set[asyncio.Task[None]] = set()

    async def grant(self, ttl_seconds: int) -> tuple[int, int]:
        """Grant a lease.

        Args:
            ttl_seconds: requested TTL, 1 to 86400 seconds.

        Returns:
            (lease id, granted TTL in seconds); etcd may raise the TTL to its minimum.

        Raises:
            InvalidArgument: ttl_seconds out of range.
            Unavailable: etcd unreachable.
        """
        validate_ttl(ttl_seconds)
        return await self._etcd.lease_grant(ttl_seconds)

    async def grant_or_revoke(self, ttl_seconds: int,
                              then: Callable[[int], Awaitable[None]] | None = None) -> tuple[int, int]:
        """Grant a lease for a call that may be cancelled: a lease granted after the cancellation is revoked.

        The etcd LeaseGrant goes on when the caller is cancelled (its
        connection closed, its deadline passed); the lease it creates, which
        nobody would keep alive or know of, is revoked at once.

        Args:
            ttl_seconds: requested TTL, 1 to 86400 seconds.
            then: called with the new lease id before the grant counts as made
                (the ownership record is written so); when it fails, the lease
                is revoked and its error raised.

        Returns:
            (lease id, granted TTL in seconds).

        Raises:
            InvalidArgument: ttl_seconds out of range.
            Unavailable: etcd unreachable.
        """
        step = asyncio.ensure_future(self._grant_then(ttl_seconds, then))
        try:
            return await asyncio.shield(step)
        except asyncio.CancelledError:
            step.add_done_callback(self._revoke_orphan)
            raise

    async def _grant_then(self, ttl_seconds: int, then: Callable[[int], Awaitable[None]] | None) -> tuple[int, int]:
        lease_id, ttl = await self.grant(ttl_seconds)
        if then is not None:
            try:
                await then(lease_id)
            except BaseException:
                self._revoke_later(lease_id, "its ownership record could not be written")
                raise
        return lease_id, ttl

    def _revoke_orphan(self, step: asyncio.Future[tuple[int, int]]) -> None:
        if step.cancelled() or step.exception() is not None:
            return
        lease_id, _ = step.result()
        self._revoke_later(lease_id, "granted after its LeaseGrant call was cancelled")

    def _revoke_later(self, lease_id: int, why: str) -> None:
        """Revoke ``lease_id`` in the background (a lease nobody will use: ``why``)."""
        async def revoke() -> None:
            try:
                await self.revoke(lease_id)
                _log.info("revoked lease %#x: %s", lease_id, why)
            except FencepostError as exc:
                _log.warning("could not revoke lease %#x (%s); it expires by its TTL: %s", lease_id, why, exc)

        with unbounded():
            task = asyncio.ensure_future(revoke())
        self._orphans.add(task)
        task.add_done_callback(self._orphans.discard)

    async def revoke(self, lease_id: int) -> bool:
        """Revoke a lease and so delete every key attached to it.

        Returns:
            False when the lease was already gone.

        Raises:
            InvalidArgument: lease_id not > 0.
            Unavailable: etcd unreachable.
        """
        validate_lease_id(lease_id)
        return await self._etcd.lease_revoke(lease_id)

    async def keepalives(self, lease_ids: Sequence[int], answered: Callable[[int, int], None]
                         ) -> tuple[list[int], FencepostError | None]:
        """Forward one keepalive per entry of ``lease_ids`` on the shared stream, all at once.

        Args:
            lease_ids: the leases to renew.
            answered: called with (index in ``lease_ids``, TTL etcd reset the
                lease to, <= 0 when gone) as each answer arrives; never after
                this call was cancelled.

        Returns:
            The indexes of the entries etcd did not answer, and the error
            (Unavailable) that :meth:`keepalive` would have raised for them.
        """
        return await self._etcd.keepalives(lease_ids, answered)


class KeptLeases:
    """The leases kept alive through this coordinator's KeepAlive streams (``fencepost_leases``).

    A lease counts from the first keepalive a stream here forwards for it
    that etcd answers alive, until a keepalive on that stream finds it gone,
    the stream ends, or a LeaseRevoke of it is served here; once however many
    streams keep it.

    Args:
        metrics: where the count is set.
    """

    def __init__(self, metrics: LockMetrics = NO_METRICS) -> None:
        self._metrics = metrics
        self._streams: dict[int, int] = {}  # lease id -> streams keeping it

    @property
    def count(self) -> int:
        """The leases kept now."""
        return len(self._streams)

    def add(self, lease_id: int) -> None:
        """One more stream keeps ``lease_id``."""
        self._streams[lease_id] = self._streams.get(lease_id, 0) + 1
        self._metrics.leases(len(self._streams))

    def remove(self, lease_id: int) -> None:
        """A stream no longer keeps ``lease_id`` (it found it gone, or it ended)."""
        left = self._streams.get(lease_id)
        if left is None:
            return  # revoked meanwhile
        if left <= 1:
            del self._streams[lease_id]
        else:
            self._streams[lease_id] = left - 1
        self._metrics.leases(len(self._streams))

    def revoked(self, lease_id: int) -> None:
        """``lease_id`` was revoked here: no stream keeps it any more."""
        if self._streams.pop(lease_id, None) is not None:
            self._metrics.leases(len(self._streams))
