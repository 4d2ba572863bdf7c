"""Stored tokens that no guard wrote, run against every adapter on its real server.

Something other than a guard (a migration, a script, another library) left a
record whose token is not a canonical non-negative integer: ``"1e3"``,
``"007"``, ``7.5``, ``"7.0"``, ``"abc"``, ``""``, a string where the store
types a number, a negative. Each adapter plants the ones its store can hold
(SQLite's INTEGER column turns ``"1e3"``, ``"007"`` and ``"7.0"`` into
integers; PostgreSQL's and MariaDB's BIGINT hold only the negative), then a
write with a token above every number in the list must be refused with
:class:`MalformedTokenError`, counted in ``rejected`` and by the hook, and
leave the record as planted.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest

from fencepost.client import StaleTokenError
from fencepost.client.fencing import MalformedTokenError

from .conftest import MAX_TOKEN, Driver, EtcdDriver, records_prefix

TEXT = ["1e3", "007", "7.5", "7.0", "abc", "", "-5", " 7", "+7"]
#: The malformed stored tokens each store can hold, as its client writes them.
MALFORMED: dict[str, list[Any]] = {
    "sqlite": [7.5, "abc", "", -5, b"7"],
    "postgres": [-5],
    "mariadb": [-5],
    "redis": TEXT,
    "s3": [t for t in TEXT if t.strip() == t],  # S3 trims the blanks around a metadata value
    "etcd": [t.encode() for t in TEXT] + [b"7", b"00000000000000000007x", b"0000000000000000007"],
    "dynamodb": [{"N": "7.5"}, {"N": "-5"}, {"S": "7"}, {"S": "abc"}, {"B": b"7"}, {"BOOL": True}],
}


def _sql(driver: Any, sql: str, params: tuple[Any, ...]) -> Any:
    if driver.name == "sqlite":
        conn = sqlite3.connect(driver.path)
        try:
            row = conn.execute(sql.replace("%s", "?"), params).fetchone()
            conn.commit()
            return row
        finally:
            conn.close()
    if driver.name == "postgres":
        import psycopg

        with psycopg.connect(driver.dsn, autocommit=True) as conn:
            cur = conn.execute(sql, params)
            return cur.fetchone() if cur.description else None
    conn = driver.server.connect(autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchone()
    finally:
        conn.close()


async def plant(driver: Driver, key: str, stored: Any) -> None:
    """Write the record ``key`` with value ``old`` and token ``stored`` past the guard."""
    d: Any = driver
    if driver.name in ("sqlite", "postgres", "mariadb"):
        table = getattr(d, "table", "records")
        await d.run(_sql, d, f"INSERT INTO {table} (id, value, fencing_token) VALUES (%s, 'old', %s)", (key, stored))
    elif driver.name == "redis":
        await d.run(lambda: d.client.hset(d.ns + key, mapping={"value": "old", "fencing_token": stored}))
    elif driver.name == "dynamodb":
        item = {"id": {"S": key}, "value": {"S": "old"}, "fencing_token": stored}
        await d.run(lambda: d.client.put_item(TableName=d.table, Item=item))
    elif driver.name == "s3":
        await d.run(lambda: d.client.put_object(Bucket=d.bucket, Key=key, Body=b"old",
                                                Metadata={"fencing-token": stored}))
    else:
        assert isinstance(driver, EtcdDriver)
        record = (records_prefix(driver.prefix) + key).encode()
        await driver.client.kv.put(record, b"old", timeout=5)
        await driver.client.kv.put(record + b"\x00fencing_token", stored, timeout=5)


async def raw(driver: Driver, key: str) -> Any:
    """The record ``key`` as the store holds it: (value, token), the token as its client returns it."""
    d: Any = driver
    if driver.name in ("sqlite", "postgres", "mariadb"):
        table = getattr(d, "table", "records")
        return tuple(await d.run(_sql, d, f"SELECT value, fencing_token FROM {table} WHERE id = %s", (key,)))
    if driver.name == "redis":
        return tuple(await d.run(d.client.hmget, d.ns + key, ["value", "fencing_token"]))
    if driver.name == "dynamodb":
        resp = await d.run(lambda: d.client.get_item(TableName=d.table, Key={"id": {"S": key}}, ConsistentRead=True))
        return resp["Item"]["value"], resp["Item"]["fencing_token"]
    if driver.name == "s3":
        resp = await d.run(lambda: d.client.get_object(Bucket=d.bucket, Key=key))
        return resp["Body"].read(), resp["Metadata"].get("fencing-token")
    assert isinstance(driver, EtcdDriver)
    record = (records_prefix(driver.prefix) + key).encode()
    resp_value = await driver.client.kv.get(record, timeout=5)
    resp_token = await driver.client.kv.get(record + b"\x00fencing_token", timeout=5)
    return ([bytes(kv.value) for kv in resp_value.kvs], [bytes(kv.value) for kv in resp_token.kvs])


async def test_malformed_stored_token_refused(driver: Driver) -> None:
    """A stored token that is not a canonical non-negative integer refuses the write, typed, counted, unchanged."""
    cases = MALFORMED[driver.name]
    seen: list[StaleTokenError] = []
    write = await driver.writer(on_reject=seen.append)
    for i, stored in enumerate(cases):
        key = f"m{i}"
        await plant(driver, key, stored)
        before = await raw(driver, key)
        with pytest.raises(MalformedTokenError) as info:
            await write(key, "new", MAX_TOKEN)
        err = info.value
        assert err.record == driver.record(key)
        assert err.reason == "MALFORMED_TOKEN" and err.current_token is None
        assert isinstance(err, StaleTokenError)
        assert await raw(driver, key) == before, stored
        assert seen[-1] is err
    assert driver.guard.rejected == len(cases) == len(seen)


async def test_canonical_token_beside_malformed_ones_still_fenced(driver: Driver) -> None:
    """After refusals over malformed tokens, a well-formed record still takes higher tokens and refuses lower ones."""
    write = await driver.writer()
    await plant(driver, "bad", MALFORMED[driver.name][0])
    with pytest.raises(MalformedTokenError):
        await write("bad", "x", 5)
    await write("good", "a", 5)
    await write("good", "b", 9)
    with pytest.raises(StaleTokenError) as info:
        await write("good", "c", 7)
    assert not isinstance(info.value, MalformedTokenError)
    assert await driver.read("good") == ("b", 9)
    assert driver.guard.rejected == 2
