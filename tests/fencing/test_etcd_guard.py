"""etcd guard specifics: the write is tied to a live hold of a real lock."""

from __future__ import annotations

from typing import Any

import pytest
from etcd3aio import Etcd3Client

from fencepost.client import AsyncLockClient, StaleTokenError
from fencepost.client.fencing import EtcdGuard


async def test_put_when_lock_released(address: str, prefix: str, etcd_client: Etcd3Client) -> None:
    """A write lands while the writer holds the lock and is refused (NOT_HOLDER) once it released it."""
    seen: list[StaleTokenError] = []
    guard = EtcdGuard(etcd_client, prefix=prefix, on_reject=seen.append)
    record = prefix + "records/inv-42"
    async with AsyncLockClient(address) as client:
        handle = await client.acquire("inv:42", ttl=10.0, timeout=5.0)
        await guard.put(record, b"v1", handle)
        await guard.put(record, b"v2", handle)
        assert await guard.get(record) == (b"v2", handle.token)
        await handle.release()
        with pytest.raises(StaleTokenError) as info:
            await guard.put(record, b"late", handle)
    err = info.value
    assert err.reason == "NOT_HOLDER"
    assert (err.record, err.token, err.current_token) == (record, handle.token, handle.token)
    assert err.name == "inv:42" and err.lease_id == handle.lease_id
    assert await guard.get(record) == (b"v2", handle.token)
    assert guard.rejected == 1 and seen == [err]


async def test_put_when_next_holder_wrote(address: str, prefix: str, etcd_client: Etcd3Client) -> None:
    """After a new holder wrote with its larger token, the old holder's write is refused."""
    guard = EtcdGuard(etcd_client, prefix=prefix)
    record = prefix + "records/r"
    async with AsyncLockClient(address) as client:
        first: Any = await client.acquire("r", ttl=10.0, timeout=5.0)
        await guard.put(record, b"a", first)
        await first.release()
        second: Any = await client.acquire("r", ttl=10.0, timeout=5.0)
        assert second.token > first.token
        await guard.put(record, b"b", second)
        with pytest.raises(StaleTokenError):
            await guard.put(record, b"late", first)
        await second.release()
    assert await guard.get(record) == (b"b", second.token)
