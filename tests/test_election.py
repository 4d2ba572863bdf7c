"""Leader election against a real etcd and in-process coordinators: campaign, proclaim, resign, leader, observe."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from etcd3aio import Etcd3Client, prefix_range_end

from fencepost.client import (
    AsyncLockClient,
    LeaderInfo,
    LeaseLost,
    LockClient,
    LockTimeout,
    NotHolder,
)
from fencepost.client.v1 import kinds, lock_pb2, lock_pb2_grpc
from fencepost.client.v1.keys import MAX_VALUE_BYTES, Keys

from .conftest import error_info, wait_for
from .owned_stub import secret_metadata


async def _leader(stub: Any, election: str) -> lock_pb2.LeaderResponse:
    return await stub.Leader(lock_pb2.LeaderRequest(election=election), timeout=5)


async def test_campaign_leader_proclaim_resign(address: str) -> None:
    """The first candidate leads with its value; proclaim changes the value, not the token; resign frees it."""
    async with AsyncLockClient(address) as client, AsyncLockClient(address) as other:
        assert await client.leader("sched") is None
        lead = await client.campaign("sched", "10.0.0.1:80", ttl=10, timeout=5)
        assert lead.token > 0 and lead.value == b"10.0.0.1:80" and lead.name == "sched"
        assert lead.kind == kinds.HoldKind.HOLD_KIND_ELECTION
        seen = await other.leader("sched")
        assert seen is not None
        assert (seen.value, seen.lease_id, seen.token) == (b"10.0.0.1:80", lead.lease_id, lead.token)
        await lead.proclaim(b"10.0.0.2:80")
        seen = await other.leader("sched")
        assert seen is not None and (seen.value, seen.token) == (b"10.0.0.2:80", lead.token)
        assert lead.value == b"10.0.0.2:80"
        # An election and a lock of the same name are independent.
        lock = await other.acquire("sched", ttl=10, timeout=5)
        await lock.release()
        await lead.resign()
        assert lead.released and not lead.lost.is_set()
        assert await other.leader("sched") is None


async def candidates(etcd_client: Etcd3Client, prefix: str, election: str) -> int:
    """How many candidates (leader included) election ``election`` has in etcd."""
    assert etcd_client.kv is not None
    lock = Keys(prefix).lock_prefix(kinds.election_lock(election))
    resp = await etcd_client.kv.get(lock, prefix_range_end(lock), count_only=True, timeout=5)
    return int(resp.count)


async def test_fifo_handoff_with_larger_token(address: str, etcd_client: Etcd3Client, prefix: str) -> None:
    """Queued candidates lead in arrival order, each with a larger token, when the leader resigns."""
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(AsyncLockClient(address)) for _ in range(3)]
        first = await clients[0].campaign("fifo", "a", timeout=5)
        tasks = []
        for i in (1, 2):
            tasks.append(asyncio.create_task(clients[i].campaign("fifo", "bc"[i - 1], timeout=20)))
            await wait_for(lambda n=i: _has(etcd_client, prefix, "fifo", n + 1), 10, what=f"candidate {i} queued")
        await first.resign()
        second = await asyncio.wait_for(tasks[0], 10)
        assert second.token > first.token and second.value == b"b"
        assert not tasks[1].done()
        info = await clients[0].leader("fifo")
        assert info is not None and info.token == second.token and info.value == b"b"
        await second.resign()
        third = await asyncio.wait_for(tasks[1], 10)
        assert third.token > second.token and third.value == b"c"
        await third.resign()


async def _has(etcd_client: Etcd3Client, prefix: str, election: str, n: int) -> bool:
    return await candidates(etcd_client, prefix, election) == n
