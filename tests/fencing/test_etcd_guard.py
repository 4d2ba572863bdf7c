"""etcd guard specifics: the write is tied to a live hold of a real lock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from etcd3aio import Etcd3Client

from fencepost.client import AsyncLockClient, StaleTokenError, Unavailable
from fencepost.client import InvalidArgument
from fencepost.client.fencing import EtcdGuard, Hold
from fencepost.client.v1.keys import Keys
from fencepost.coordinator.process.embedded import EmbeddedEtcd

from ..conftest import count_keys
from .conftest import records_prefix


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
    record = records_prefix(prefix) + "inv-42"
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
    record = records_prefix(prefix) + "r"
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
            await guard.put(records_prefix(prefix) + "r", Hold("r", 1, bad), b"x")  # type: ignore[arg-type]
        assert info.value.field == "token"
    assert await guard.get(records_prefix(prefix) + "r") == (None, None)


async def test_put_when_etcd_unreachable_raises_unavailable(prefix: str) -> None:
    """An etcd failure is Unavailable (a FencepostError), with the gRPC error chained."""
    async with grpc.aio.insecure_channel("dns:///127.0.0.1:1") as channel:
        guard = EtcdGuard(channel, prefix=prefix, timeout=2.0)
        with pytest.raises(Unavailable) as info:
            await guard.put(records_prefix(prefix) + "r", Hold("r", 1, 5), b"x")
    assert isinstance(info.value.__cause__, grpc.aio.AioRpcError)


async def test_put_when_key_is_empty_or_inside_the_lock_prefix(
    address: str, prefix: str, etcd_channel: grpc.aio.Channel, etcd_client: Etcd3Client
) -> None:
    """An empty key, or one inside the lock prefix, is InvalidArgument (field "key") before any call.

    The empty key was an Unavailable from etcd ("key is not provided"); a
    key inside the prefix let a guarded write overwrite a lock key (and drop
    its lease): here the holder's own contender key.
    """
    guard = EtcdGuard(etcd_channel, prefix=prefix)
    async with AsyncLockClient(address) as client:
        handle = await client.acquire("inv:7", ttl=10.0, timeout=5.0)
        lock_key = Keys(prefix).contender(handle.name, handle.lease_id)
        before = (await etcd_client.kv.get(lock_key, timeout=5)).kvs[0]
        for key in ("", b"", lock_key, lock_key.decode(), prefix + "records/r", prefix.encode()):
            with pytest.raises(InvalidArgument) as info:
                await guard.put(key, handle, b"clobber")
            assert info.value.field == "key", key
        with pytest.raises(InvalidArgument) as info:
            await guard.get("")
        assert info.value.field == "key"
        after = (await etcd_client.kv.get(lock_key, timeout=5)).kvs[0]
        assert (after.value, after.lease, after.mod_revision) == (before.value, before.lease, before.mod_revision)
        assert (await client.describe("inv:7")).holder_token == handle.token
        await guard.put(records_prefix(prefix) + "inv-7", handle, b"ok")
        await handle.release()
    assert await count_keys(etcd_client, prefix) == 0


BAD_HOLDS = {
    "None": None,
    "not-a-hold": object(),
    "empty-name": Hold("", 1, 5),
    "name-not-utf8": Hold("\ud800", 1, 5),
    "name-not-str": Hold(b"r", 1, 5),
    "lease-id-0": Hold("r", 0, 5),
    "lease-id-negative": Hold("r", -1, 5),
    "lease-id-bool": Hold("r", True, 5),
    "lease-id-str": Hold("r", "1", 5),
}


@pytest.mark.parametrize("hold", list(BAD_HOLDS.values()), ids=list(BAD_HOLDS))
async def test_put_when_hold_is_not_a_grant(prefix: str, hold: Any) -> None:
    """A hold that is not a valid grant is InvalidArgument (field "hold") before any call (etcd is unreachable)."""
    async with grpc.aio.insecure_channel("dns:///127.0.0.1:1") as channel:
        guard = EtcdGuard(channel, prefix=prefix, timeout=2.0)
        with pytest.raises(InvalidArgument) as info:
            await guard.put(records_prefix(prefix) + "r", hold, b"x")
    assert info.value.field == "hold"


@pytest.mark.parametrize(("key", "value", "field"), [
    ("r", None, "value"), ("r", 5, "value"), ("r", "\udcff", "value"),
    (None, b"x", "key"), (5, b"x", "key"), ("\udcff", b"x", "key"),
], ids=["value-None", "value-int", "value-not-utf8", "key-None", "key-int", "key-not-utf8"])
async def test_put_when_key_or_value_is_bad(prefix: str, key: Any, value: Any, field: str) -> None:
    """A value or key that is not str/bytes (or not UTF-8) is InvalidArgument naming it, before any call."""
    async with grpc.aio.insecure_channel("dns:///127.0.0.1:1") as channel:
        guard = EtcdGuard(channel, prefix=prefix, timeout=2.0)
        full = records_prefix(prefix) + key if isinstance(key, str) else key
        with pytest.raises(InvalidArgument) as info:
            await guard.put(full, Hold("r", 1, 5), value)
    assert info.value.field == field


async def test_guard_when_channel_or_options_are_bad(etcd: EmbeddedEtcd) -> None:
    """EtcdGuard(None), a sync channel, an empty prefix or a bad timeout: InvalidArgument naming the argument."""
    with pytest.raises(InvalidArgument) as info:
        EtcdGuard(None)  # type: ignore[arg-type]
    assert info.value.field == "channel"
    with grpc.insecure_channel(etcd.endpoint) as sync_channel:
        with pytest.raises(InvalidArgument) as info:
            EtcdGuard(sync_channel)  # type: ignore[arg-type]
        assert info.value.field == "channel"
    async with grpc.aio.insecure_channel(f"dns:///{etcd.endpoint}") as channel:
        for kwargs, field in (({"prefix": ""}, "prefix"), ({"prefix": None}, "prefix"),
                              ({"timeout": 0}, "timeout"), ({"timeout": float("nan")}, "timeout")):
            with pytest.raises(InvalidArgument) as info:
                EtcdGuard(channel, **kwargs)
            assert info.value.field == field
