"""Redis guard specifics, on a real redis-server: argument checks before any command."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from fencepost.client import InvalidArgument
from fencepost.client.fencing import MalformedTokenError, RedisGuard

from .servers import RedisServer


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[Any]:
    import redis

    client = redis.Redis.from_url(redis_server.url)
    try:
        yield client
    finally:
        client.close()


def test_guard_when_client_is_none() -> None:
    """RedisGuard(None) is InvalidArgument (field "client"), not an AttributeError."""
    with pytest.raises(InvalidArgument) as info:
        RedisGuard(None)
    assert info.value.field == "client"


@pytest.mark.parametrize(("key", "value", "field"), [
    ("k", None, "value"), ("k", True, "value"), ("k", [1], "value"), (None, "v", "key"), ([1], "v", "key"),
], ids=["value-None", "value-bool", "value-list", "key-None", "key-list"])
def test_put_when_key_or_value_is_bad(redis_client: Any, key: Any, value: Any, field: str) -> None:
    """A key or value redis-py would refuse (or mangle) is InvalidArgument naming it; nothing is written."""
    guard = RedisGuard(redis_client)
    ns = f"fencing-test:{uuid.uuid4().hex}:"
    full = ns + key if isinstance(key, str) else key
    with pytest.raises(InvalidArgument) as info:
        guard.put(full, 5, value)
    assert info.value.field == field
    assert redis_client.keys(ns + "*") == []
    guard.put(ns + "k", 5, 7)
    assert guard.get(ns + "k") == (b"7", 5)


@pytest.mark.parametrize("stored", ["1e3", "7.0", "abc", "007", ""])
def test_put_when_stored_token_is_not_canonical(redis_client: Any, stored: str) -> None:
    """Token 999 over a stored "1e3" (same length, sorts higher) and the rest: MalformedTokenError, hash unchanged."""
    key = f"fencing-test:{uuid.uuid4().hex}"
    redis_client.hset(key, mapping={"value": "old", "fencing_token": stored})
    guard = RedisGuard(redis_client)
    with pytest.raises(MalformedTokenError) as info:
        guard.put(key, 999, "new")
    assert info.value.stored == stored.encode() and info.value.current_token is None
    assert guard.rejected == 1
    assert redis_client.hgetall(key) == {b"value": b"old", b"fencing_token": stored.encode()}
    with pytest.raises(MalformedTokenError):
        guard.get(key)
