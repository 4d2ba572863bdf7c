"""After an unattended etcd restore, guards say the stored token is ahead of the lock service (issue 25, item 7).

The input: etcd restored from a snapshot (same cluster token) while the
coordinator was stopped, and no ``recover-tokens``: the next holder of a lock
gets a token below the one its record holds. Its guarded writes are still
refused (nothing is corrupted), but now as :class:`StoredTokenAheadError`,
counted in ``guard.ahead`` and ``fencepost_guard_token_ahead_total{storage}``
(the alert ``FencepostStoredTokenAhead``), while a holder that lost its lock
still gets the plain ``StaleTokenError``. Real etcd (the test's own,
restored with ``etcdutl``), a real coordinator and client, real PostgreSQL
(SqlGuard) and Redis (RedisGuard).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

import fencepost.client as fc
from fencepost.client.fencing import RedisGuard, SqlGuard, StoredTokenAheadError
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.process.embedded import EmbeddedEtcd

from ..conftest import wait_for
from ..etcd_restore import cycles, own_etcd, recover_cli, restore, snapshot_save
from .servers import PostgresServer, RedisServer

__all__ = ["own_etcd"]  # the fixture, from tests/etcd_restore.py

NAME = "inv:42"


def ahead_count(registry: CollectorRegistry, storage: str) -> float:
    return registry.get_sample_value("fencepost_guard_token_ahead_total", {"storage": storage}) or 0.0


def stale_count(registry: CollectorRegistry, storage: str) -> float:
    return registry.get_sample_value("fencepost_guard_stale_rejections_total", {"storage": storage}) or 0.0


class Records:
    """One record in PostgreSQL (SqlGuard) and one in Redis (RedisGuard), written with a lock handle."""

    def __init__(self, postgres: PostgresServer, redis_server: RedisServer, registry: CollectorRegistry) -> None:
        import psycopg
        import redis

        self.table = f"ahead_{uuid.uuid4().hex[:12]}"
        self.conn = psycopg.connect(postgres.dsn, autocommit=True)
        self.conn.execute(f"CREATE TABLE {self.table} (id TEXT PRIMARY KEY, v TEXT, fencing_token BIGINT)")
        self.sql = SqlGuard(self.conn, self.table, "id", metrics=registry)
        self.redis = redis.Redis.from_url(redis_server.url)
        self.key = f"ahead:{uuid.uuid4().hex}"
        self.kv = RedisGuard(self.redis, metrics=registry)

    def write(self, hold: Any, value: str) -> None:
        self.sql.upsert("inv:42", hold, {"v": value})
        self.kv.put(self.key, hold, value)

    def tokens(self) -> tuple[int, int | None]:
        row = self.conn.execute(f"SELECT fencing_token FROM {self.table} WHERE id = 'inv:42'").fetchone()
        return row[0], self.kv.get(self.key)[1]

    def close(self) -> None:
        self.redis.delete(self.key)
        self.redis.close()
        self.conn.execute(f"DROP TABLE {self.table}")
        self.conn.close()


@pytest.fixture
def records(postgres: PostgresServer, redis_server: RedisServer) -> Any:
    registry = CollectorRegistry()
    made = Records(postgres, redis_server, registry)
    try:
        yield made, registry
    finally:
        made.close()


@pytest.fixture
async def coordinator_of(own_etcd: EmbeddedEtcd, prefix: str) -> AsyncIterator[Any]:
    """Start coordinators on the test's etcd (no data directory: the unattended case); all stopped at the end."""
    made: list[Coordinator] = []

    async def start() -> Coordinator:
        coordinator = Coordinator([own_etcd.endpoint], listen="127.0.0.1:0", prefix=prefix)
        made.append(coordinator)
        await asyncio.wait_for(coordinator.start(), 20)
        return coordinator
    yield start
    for coordinator in made:
        await asyncio.wait_for(coordinator.stop(0), 20)


async def test_unattended_restore_when_the_new_holder_writes_then_its_guards_say_the_token_is_ahead(
        own_etcd: EmbeddedEtcd, prefix: str, tmp_path: Path, records: Any, coordinator_of: Any) -> None:
    """The rewound holder's writes are refused as StoredTokenAheadError (metric +1 per guard); after its hold
    ends, the same write is a plain StaleTokenError; after recover-tokens the next holder writes again."""
    rec, registry = records
    first = await coordinator_of()
    await cycles(first.address, NAME, 2)
    snapshot_save(own_etcd, tmp_path / "snap.db")
    await cycles(first.address, NAME, 50)
    async with fc.AsyncLockClient(first.address) as client:
        before = await client.acquire(NAME, ttl=10.0, timeout=5.0)
        await asyncio.to_thread(rec.write, before, "before the restore")
        await before.release()
    top = before.token
    assert await asyncio.to_thread(rec.tokens) == (top, top)
    await first.stop(0)

    await asyncio.to_thread(restore, own_etcd, tmp_path / "snap.db")  # same cluster token, nobody watching
    second = await coordinator_of()
    async with fc.AsyncLockClient(second.address) as client:
        rewound = await client.acquire(NAME, ttl=10.0, timeout=5.0)
        assert rewound.token < top, (rewound.token, top)  # the issue: tokens went back
        print(f"rewound holder: token {rewound.token}, records at {top}")
        with pytest.raises(StoredTokenAheadError) as sql:
            await asyncio.to_thread(rec.sql.upsert, "inv:42", rewound, {"v": "after"})
        with pytest.raises(StoredTokenAheadError) as kv:
            await asyncio.to_thread(rec.kv.put, rec.key, rewound, "after")
        for err in (sql.value, kv.value):
            assert isinstance(err, fc.StaleTokenError) and err.reason == "TOKEN_AHEAD"
            assert (err.token, err.current_token) == (rewound.token, top)
            assert "ahead of the lock service" in str(err)
            assert f"recover-tokens --above T' (T at least {top}" in str(err)
        assert (ahead_count(registry, "postgresql"), ahead_count(registry, "redis")) == (1, 1)
        assert (rec.sql.ahead, rec.kv.ahead, rec.sql.rejected, rec.kv.rejected) == (1, 1, 1, 1)

        await rewound.release()  # no longer live: the same refusal is the ordinary stale one
        for write in (lambda: rec.sql.upsert("inv:42", rewound, {"v": "late"}),
                      lambda: rec.kv.put(rec.key, rewound, "late")):
            with pytest.raises(fc.StaleTokenError) as late:
                await asyncio.to_thread(write)
            assert not isinstance(late.value, StoredTokenAheadError) and late.value.reason == "STALE_TOKEN"
        assert (ahead_count(registry, "postgresql"), ahead_count(registry, "redis")) == (1, 1)
        assert (stale_count(registry, "postgresql"), stale_count(registry, "redis")) == (2, 2)
        assert await asyncio.to_thread(rec.tokens) == (top, top)

    recover_cli(own_etcd, prefix, top)  # the fix the error names
    # This coordinator never refused (it could not tell): it takes up the new floor at its next record check.
    await wait_for(lambda: second.tokens is not None and second.tokens.floor > 0, 10, 0.05, "the recovered floor")
    async with fc.AsyncLockClient(second.address) as client:
        recovered = await client.acquire(NAME, ttl=10.0, timeout=5.0)
        assert recovered.token > top
        await asyncio.to_thread(rec.write, recovered, "after the recovery")
        assert await asyncio.to_thread(rec.tokens) == (recovered.token, recovered.token)
        await recovered.release()
