"""etcd guard specifics: the write is tied to a live hold of a real lock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from fencepost.client import AsyncLockClient, StaleTokenError, Unavailable
from fencepost.client import InvalidArgument
from fencepost.client.fencing import EtcdGuard, Hold
from fencepost.coordinator.embedded import EmbeddedEtcd


@pytest.fixture
async def etcd_channel(etcd: EmbeddedEtcd) -> AsyncIterator[grpc.aio.Channel]:
    """A plain grpc.aio channel to the session etcd, as a guard's user makes it."""
    channel = grpc.aio.insecure_channel(f"dns:///{etcd.endpoint}")
    try:
        yield channel
    finally:
        await channel.close()


async def test_put_when_lock_released(address: str, prefix: str, etcd_channel: grpc.aio.Channel) -> None:
    """A write lands while the writer holds the lock and is refused (NOT_HOLDER) once it released it."""
    seen: list[StaleTokenError] = []
    guard = EtcdGuard(etcd_channel, prefix=prefix, on_reject=seen.append)
    record = prefix + "records/inv-42"
    async with AsyncLockClient(address) as client:
        handle = await client.acquire("inv:42", ttl=10.0, timeout=5.0)
        await guard.put(record, handle, b"v1")
        await guard.put(record, handle, b"v2")
        assert await guard.get(record) == (b"v2", handle.token)
        await handle.release()
        with pytest.raises(StaleTokenError) as info:
            await guard.put(record, handle, b"late")
    err = info.value
    assert err.reason == "NOT_HOLDER"
    assert (err.record, err.token, err.current_token) == (record, handle.token, handle.token)
    assert err.name == "inv:42" and err.lease_id == handle.lease_id
    assert await guard.get(record) == (b"v2", handle.token)
    assert guard.rejected == 1 and seen == [err]


async def test_put_when_next_holder_wrote(address: str, prefix: str, etcd_channel: grpc.aio.Channel) -> None:
    """After a new holder wrote with its larger token, the old holder's write is refused."""
    guard = EtcdGuard(etcd_channel, prefix=prefix)
    record = prefix + "records/r"
    async with AsyncLockClient(address) as client:
        first: Any = await client.acquire("r", ttl=10.0, timeout=5.0)
        await guard.put(record, first, b"a")
        await first.release()
        second: Any = await client.acquire("r", ttl=10.0, timeout=5.0)
        assert second.token > first.token
        await guard.put(record, second, b"b")
        with pytest.raises(StaleTokenError):
            await guard.put(record, first, b"late")
        await second.release()
    assert await guard.get(record) == (b"b", second.token)


async def test_put_when_token_is_not_a_token(etcd_channel: grpc.aio.Channel, prefix: str) -> None:
    """A bad token is refused with InvalidArgument (field "token") before anything is sent to etcd."""
    guard = EtcdGuard(etcd_channel, prefix=prefix)
    for bad in (0, -1, True):
        with pytest.raises(InvalidArgument) as info:
            await guard.put(prefix + "records/r", Hold("r", 1, bad), b"x")  # type: ignore[arg-type]
        assert info.value.field == "token"
    assert await guard.get(prefix + "records/r") == (None, None)


async def test_put_when_etcd_unreachable_raises_unavailable(prefix: str) -> None:
    """An etcd failure is Unavailable (a FencepostError), with the gRPC error chained."""
    async with grpc.aio.insecure_channel("dns:///127.0.0.1:1") as channel:
        guard = EtcdGuard(channel, prefix=prefix, timeout=2.0)
        with pytest.raises(Unavailable) as info:
            await guard.put(prefix + "records/r", Hold("r", 1, 5), b"x")
    assert isinstance(info.value.__cause__, grpc.aio.AioRpcError)
