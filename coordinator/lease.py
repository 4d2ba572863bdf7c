"""Leases: grant, revoke, and keepalives forwarded to etcd.

A lease is an etcd lease with its TTL. Every keepalive a client sends is
forwarded on the etcd layer's one shared ``LeaseKeepAlive`` stream and
answered with the TTL etcd reset the lease to. The coordinator never renews
a lease on its own timer: a frozen or dead client loses its lease one TTL
after its last keepalive (after etcd's ``concurrency.Session``, whose
keepalive loop is the client's here, not the coordinator's).
"""

from __future__ import annotations

from .etcd import EtcdClient
from .validate import validate_lease_id, validate_ttl


class Leases:
    """Lease grant, revoke and keepalive on etcd.

    Args:
        etcd: the coordinator's etcd layer.
    """

    def __init__(self, etcd: EtcdClient) -> None:
        self._etcd = etcd

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

    async def keepalive(self, lease_id: int) -> int:
        """Forward one keepalive to etcd on the shared stream.

        Returns:
            The TTL etcd reset the lease to, in seconds; <= 0 if the lease is gone.

        Raises:
            Unavailable: no answer from etcd (see :mod:`.etcd.keepalive`).
        """
        return await self._etcd.keepalive(lease_id)
