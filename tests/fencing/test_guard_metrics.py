"""Guard metrics: a guard given a prometheus_client registry counts accepted and stale writes by storage.

Real servers (PostgreSQL, Redis; SQLite as a file); each stale write is counted exactly once, and two
guards given the same registry share the counters.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter

from fencepost.client import InvalidArgument, StaleTokenError
from fencepost.client.fencing import RedisGuard, SqlGuard

from .servers import PostgresServer, RedisServer


def _count(registry: CollectorRegistry, name: str, storage: str) -> float | None:
    return registry.get_sample_value(name, {"storage": storage})


def _check(registry: CollectorRegistry, storage: str, first: Callable[[int], Any], second: Callable[[int], Any]
           ) -> None:
    """Two guards on one record: writes with tokens 5 and 7 (by the first), then 6 (the second: stale)."""
    first(5)
    first(7)
    with pytest.raises(StaleTokenError) as stale:
        second(6)
    assert stale.value.current_token == 7
    second(7)  # the same token again: accepted
    assert _count(registry, "fencepost_guard_writes_total", storage) == 3
    assert _count(registry, "fencepost_guard_stale_rejections_total", storage) == 1


def test_sqlite_guard_counts_writes_and_stale_rejections(tmp_path: Path) -> None:
    """SQLite: storage="sqlite"."""
    registry = CollectorRegistry()
    path = tmp_path / "db.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE t (id TEXT PRIMARY KEY, v TEXT, fencing_token BIGINT)")
    a, b = sqlite3.connect(path), sqlite3.connect(path)
    try:
        ga = SqlGuard(a, "t", "id", commit=True, metrics=registry)
        gb = SqlGuard(b, "t", "id", commit=True, metrics=registry)
        _check(registry, "sqlite", lambda t: ga.upsert("k", t, {"v": str(t)}), lambda t: gb.upsert("k", t, {"v": "x"}))
    finally:
        a.close()
        b.close()


def test_postgres_guard_counts_writes_and_stale_rejections(postgres: PostgresServer) -> None:
    """PostgreSQL (psycopg): storage="postgresql"; UPDATE and upsert both counted."""
    import psycopg

    registry = CollectorRegistry()
    table = f"metrics_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id TEXT PRIMARY KEY, v TEXT, fencing_token BIGINT)")
    with psycopg.connect(postgres.dsn) as a, psycopg.connect(postgres.dsn) as b:
        ga = SqlGuard(a, table, "id", commit=True, metrics=registry)
        gb = SqlGuard(b, table, "id", commit=True, metrics=registry)
        assert ga.storage == "postgresql"
        _check(registry, "postgresql", lambda t: ga.upsert("k", t, {"v": str(t)}),
               lambda t: gb.update("k", t, {"v": "x"}))
        assert _count(registry, "fencepost_guard_writes_total", "sqlite") is None  # no other storage label


def test_redis_guard_counts_writes_and_stale_rejections(redis_server: RedisServer) -> None:
    """Redis: storage="redis"."""
    import redis

    registry = CollectorRegistry()
    client = redis.Redis.from_url(redis_server.url)
    key = f"metrics-test:{uuid.uuid4().hex}"
    try:
        ga, gb = RedisGuard(client, metrics=registry), RedisGuard(client, metrics=registry)
        _check(registry, "redis", lambda t: ga.put(key, t, str(t)), lambda t: gb.put(key, t, "x"))
        client.delete(key)
    finally:
        client.close()


def test_guard_metrics_when_registry_is_not_one(tmp_path: Path) -> None:
    """``metrics`` must be a CollectorRegistry; a registry holding another metric of the same name is refused."""
    conn = sqlite3.connect(tmp_path / "db.sqlite3")
    try:
        with pytest.raises(InvalidArgument) as info:
            SqlGuard(conn, "t", "id", metrics=object())
        assert info.value.field == "metrics"
        taken = CollectorRegistry()
        Counter("fencepost_guard_writes", "something else", registry=taken)
        with pytest.raises(InvalidArgument, match="metrics"):
            SqlGuard(conn, "t", "id", metrics=taken)
    finally:
        conn.close()


def test_guard_without_registry_does_not_import_prometheus_client() -> None:
    """prometheus_client is not a dependency of the guards: without ``metrics`` it is never imported."""
    code = ("import sqlite3, sys\n"
            "from fencepost.client.fencing import SqlGuard\n"
            "guard = SqlGuard(sqlite3.connect(':memory:'), 't', 'id')\n"
            "sys.exit(1 if 'prometheus_client' in sys.modules else 0)\n")
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
