"""Elections in tests: what etcd and the coordinator say about one election (its candidates, its leader)."""

from __future__ import annotations

from typing import Any

from etcd3aio import Etcd3Client, prefix_range_end

from fencepost.client.v1 import kinds, lock_pb2
from fencepost.client.v1.keys import Keys


async def leader_of(stub: Any, election: str) -> lock_pb2.LeaderResponse:
    """The coordinator's Leader answer for ``election``, through the raw stub."""
    return await stub.Leader(lock_pb2.LeaderRequest(election=election), timeout=5)


async def candidates(etcd_client: Etcd3Client, prefix: str, election: str) -> int:
    """How many candidates (leader included) election ``election`` has in etcd."""
    assert etcd_client.kv is not None
    lock = Keys(prefix).lock_prefix(kinds.election_lock(election))
    resp = await etcd_client.kv.get(lock, prefix_range_end(lock), count_only=True, timeout=5)
    return int(resp.count)


async def has_candidates(etcd_client: Etcd3Client, prefix: str, election: str, n: int) -> bool:
    """Whether election ``election`` has exactly ``n`` candidates (leader included) in etcd."""
    return await candidates(etcd_client, prefix, election) == n
