"""Fencing guards refuse a str that is not valid UTF-8 with InvalidArgument before anything is sent (issue 14, item 8).

A key with a lone surrogate (what ``sys.argv`` or ``os.fsdecode`` hold for a
byte that is not UTF-8) reached the driver, which raised a bare
UnicodeEncodeError (sqlite3, redis-py's encoder, botocore's serializer).
"""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest

from fencepost.client import InvalidArgument
from fencepost.client.fencing import DynamoDBGuard, RedisGuard, SqlGuard

BAD = "inv:\udcff"


class Recorder:
    """A stand-in for a redis-py or boto3 client that records every call (none must be made)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return lambda *a, **k: self.calls.append("script")

        return call


def test_sql_guard_when_key_or_value_is_not_utf8() -> None:
    """SqlGuard.update and upsert refuse a key or a value that is not UTF-8 (field key / values); no row changes."""
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (id TEXT PRIMARY KEY, v TEXT, fencing_token BIGINT)")
    db.execute("INSERT INTO t VALUES ('ok', 'x', 1)")
    guard = SqlGuard(db, "t", "id")
    for call in (guard.update, guard.upsert):
        with pytest.raises(InvalidArgument) as info:
            call(BAD, 5, {"v": "y"})
        assert info.value.field == "key" and "UTF-8" in info.value.message
        with pytest.raises(InvalidArgument) as info:
            call("ok", 5, {"v": "y\ud800"})
        assert info.value.field == "values"
    assert db.execute("SELECT v, fencing_token FROM t").fetchall() == [("x", 1)]


def test_redis_guard_when_key_or_value_is_not_utf8() -> None:
    """RedisGuard.put and get refuse a key or value that is not UTF-8 before any command."""
    client = Recorder()
    guard = RedisGuard(client)
    sent = list(client.calls)
    with pytest.raises(InvalidArgument) as info:
        guard.put(BAD, 5, "v")
    assert info.value.field == "key"
    with pytest.raises(InvalidArgument) as info:
        guard.put("k", 5, "v\ud800")
    assert info.value.field == "value"
    with pytest.raises(InvalidArgument) as info:
        guard.get(BAD)
    assert info.value.field == "key"
    assert client.calls == sent


def test_dynamodb_guard_when_key_or_attribute_is_not_utf8() -> None:
    """DynamoDBGuard refuses a key or attribute str that is not UTF-8, nested in the low-level form, before any call."""
    client = Recorder()
    guard = DynamoDBGuard(client, "t")
    with pytest.raises(InvalidArgument) as info:
        guard.put_item({"id": {"S": BAD}}, 5, {"v": {"S": "ok"}})
    assert info.value.field == "key"
    with pytest.raises(InvalidArgument) as info:
        guard.update_item({"id": {"S": "ok"}}, 5, {"v": {"L": [{"S": "x\ud800"}]}})
    assert info.value.field == "values"
    with pytest.raises(InvalidArgument) as info:
        guard.get_item({"id": {"S": BAD}})
    assert info.value.field == "key"
    assert client.calls == []
