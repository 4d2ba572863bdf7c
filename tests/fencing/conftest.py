"""Fixtures for the fencing conformance suite: real servers and one driver per adapter.

Session servers (started here, stopped at the end): PostgreSQL, Redis,
dynalite, MariaDB, moto's S3; etcd is the session ``etcd`` of tests/conftest.py; SQLite is a file
per test. A :class:`Driver` gives the suite one shape over every adapter:
``await driver.writer(on_reject)`` makes a writer (own connection, own guard)
whose ``await write(key, value, token)`` goes through the guard, and
``await driver.read(key)`` returns ``(value, token)``.
"""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from fencepost.client import StaleTokenError
from fencepost.client.fencing import DynamoDBGuard, EtcdGuard, Hold, MySqlGuard, RedisGuard, S3Guard, SqlGuard

from .. import provision
from .servers import DynaliteServer, MariaDbServer, PostgresServer, RedisServer, S3Server

ADAPTERS = ["sqlite", "postgres", "redis", "etcd", "dynamodb", "mariadb", "s3"]
#: Conformance tokens run from 1 to MAX_TOKEN (the etcd driver maps each to a real revision).
MAX_TOKEN = 100

#: ``write(key, value, token)``: the token is an int, or a hold (``.token``, ``.is_valid()``) in its place.
Write = Callable[[str, str, Any], Awaitable[None]]
Hook = Callable[[StaleTokenError], None]

#: Figures of the concurrency runs, printed in the terminal summary.
FIGURES: dict[str, dict[str, float]] = {}


def _figure_lines() -> list[str]:
    if not FIGURES:
        return []
    return ["fencing conformance, concurrent writers:", *(
        f"  {name:9s} {int(fig['writes'])} writes, {int(fig['accepted'])} accepted, "
        f"{int(fig['rejected'])} rejected, final token {int(fig['final'])}, {fig['seconds']:.2f} s"
        for name, fig in FIGURES.items())]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for line in _figure_lines():
        terminalreporter.write_line(line)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """An xdist worker's terminal summary never reaches the terminal: the worker says its figures as it ends."""
    if hasattr(session.config, "workerinput"):
        for line in _figure_lines():
            provision.terminal(line)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    server = PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def dynalite() -> Iterator[DynaliteServer]:
    server = DynaliteServer()
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def mariadb() -> Iterator[MariaDbServer]:
    server = MariaDbServer()
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    server = S3Server()
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    """Threads for the blocking drivers: one per concurrent writer."""
    pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="fencing-writer")
    try:
        yield pool
    finally:
        pool.shutdown(wait=True)


class Driver:
    """One adapter behind the shape the conformance suite uses."""

    name = ""
    #: The guard of the last writer made (to read its ``rejected`` count).
    guard: Any = None

    async def writer(self, on_reject: Hook | None = None) -> Write:
        raise NotImplementedError

    async def read(self, key: str) -> tuple[str | None, int | None]:
        raise NotImplementedError

    def record(self, key: str) -> object:
        """The ``StaleTokenError.record`` expected for the suite's record ``key``."""
        return key

    def conformance_token(self, token: int | None) -> int | None:
        """The suite's token for a token found in an error (identity but for etcd)."""
        return token

    async def close(self) -> None:
        pass


class _Blocking(Driver):
    def __init__(self, executor: ThreadPoolExecutor) -> None:
        self.executor = executor
        self.cleanup: list[Callable[[], Any]] = []

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def close(self) -> None:
        for fn in reversed(self.cleanup):
            await self.run(fn)


class SqliteDriver(_Blocking):
    name = "sqlite"

    def __init__(self, executor: ThreadPoolExecutor, path: Path) -> None:
        super().__init__(executor)
        self.path = path
        conn = sqlite3.connect(path)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE records (id TEXT PRIMARY KEY, value TEXT, fencing_token BIGINT)")
        conn.commit()
        conn.close()

    def connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30, check_same_thread=False)
        self.cleanup.append(conn.close)
        return conn

    async def writer(self, on_reject: Hook | None = None) -> Write:
        guard = SqlGuard(self.connect(), "records", "id", commit=True, on_reject=on_reject)
        self.guard = guard

        async def write(key: str, value: str, token: int) -> None:
            await self.run(guard.upsert, key, token, {"value": value})
        return write

    async def read(self, key: str) -> tuple[str | None, int | None]:
        conn = sqlite3.connect(self.path)
        try:
            row = conn.execute("SELECT value, fencing_token FROM records WHERE id = ?", (key,)).fetchone()
        finally:
            conn.close()
        return (row[0], row[1]) if row else (None, None)


class PostgresDriver(_Blocking):
    name = "postgres"

    def __init__(self, executor: ThreadPoolExecutor, dsn: str) -> None:
        import psycopg

        super().__init__(executor)
        self.dsn = dsn
        self.table = f"records_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {self.table} (id TEXT PRIMARY KEY, value TEXT, fencing_token BIGINT)")

    async def writer(self, on_reject: Hook | None = None) -> Write:
        import psycopg

        conn = await self.run(psycopg.connect, self.dsn)
        self.cleanup.append(conn.close)
        guard = SqlGuard(conn, self.table, "id", commit=True, on_reject=on_reject)
        self.guard = guard

        async def write(key: str, value: str, token: int) -> None:
            await self.run(guard.upsert, key, token, {"value": value})
        return write

    async def read(self, key: str) -> tuple[str | None, int | None]:
        import psycopg

        def get() -> Any:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                return conn.execute(f"SELECT value, fencing_token FROM {self.table} WHERE id = %s",
                                    (key,)).fetchone()
        row = await self.run(get)
        return (row[0], row[1]) if row else (None, None)


class MariaDbDriver(_Blocking):
    name = "mariadb"

    def __init__(self, executor: ThreadPoolExecutor, server: MariaDbServer) -> None:
        super().__init__(executor)
        self.server = server
        self.table = f"records_{uuid.uuid4().hex[:12]}"
        conn = server.connect(autocommit=True)
        try:
            with conn.cursor() as cur:
                cur.execute(f"CREATE TABLE {self.table} (id VARCHAR(64) PRIMARY KEY, value TEXT, "
                            f"fencing_token BIGINT) ENGINE=InnoDB")
        finally:
            conn.close()

    async def writer(self, on_reject: Hook | None = None) -> Write:
        conn = await self.run(self.server.connect)
        self.cleanup.append(conn.close)
        guard = MySqlGuard(conn, self.table, "id", commit=True, on_reject=on_reject)
        self.guard = guard

        async def write(key: str, value: str, token: int) -> None:
            await self.run(guard.upsert, key, token, {"value": value})
        return write

    async def read(self, key: str) -> tuple[str | None, int | None]:
        def get() -> Any:
            conn = self.server.connect(autocommit=True)
            try:
                with conn.cursor() as cur:
                    cur.execute(f"SELECT value, fencing_token FROM {self.table} WHERE id = %s", (key,))
                    return cur.fetchone()
            finally:
                conn.close()
        row = await self.run(get)
        return (row[0], row[1]) if row else (None, None)


class RedisDriver(_Blocking):
    name = "redis"

    def __init__(self, executor: ThreadPoolExecutor, url: str) -> None:
        import redis

        super().__init__(executor)
        self.client = redis.Redis.from_url(url)
        self.cleanup.append(self.client.close)
        self.ns = f"fencing-test:{uuid.uuid4().hex}:"

    async def writer(self, on_reject: Hook | None = None) -> Write:
        guard = RedisGuard(self.client, on_reject=on_reject)
        self.guard = guard

        async def write(key: str, value: str, token: int) -> None:
            await self.run(guard.put, self.ns + key, token, value)
        return write

    def record(self, key: str) -> object:
        return self.ns + key

    async def read(self, key: str) -> tuple[str | None, int | None]:
        value, token = await self.run(RedisGuard(self.client).get, self.ns + key)
        return (None if value is None else value.decode()), token


class DynamoDriver(_Blocking):
    name = "dynamodb"

    def __init__(self, executor: ThreadPoolExecutor, server: DynaliteServer) -> None:
        super().__init__(executor)
        self.client = server.client()
        self.table = f"records-{uuid.uuid4().hex[:12]}"
        self.client.create_table(
            TableName=self.table, KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST")
        waiter = self.client.get_waiter("table_exists")
        waiter.wait(TableName=self.table, WaiterConfig={"Delay": 0.05, "MaxAttempts": 200})
        self.cleanup.append(self.client.close)

    async def writer(self, on_reject: Hook | None = None) -> Write:
        guard = DynamoDBGuard(self.client, self.table, on_reject=on_reject)
        self.guard = guard

        async def write(key: str, value: str, token: int) -> None:
            await self.run(guard.put_item, {"id": {"S": key}}, token, {"value": {"S": value}})
        return write

    def record(self, key: str) -> object:
        return {"id": {"S": key}}

    async def read(self, key: str) -> tuple[str | None, int | None]:
        item = await self.run(DynamoDBGuard(self.client, self.table).get_item, {"id": {"S": key}})
        if item is None:
            return None, None
        return item["value"]["S"], int(item["fencing_token"]["N"])


class S3Driver(_Blocking):
    name = "s3"

    def __init__(self, executor: ThreadPoolExecutor, server: S3Server) -> None:
        super().__init__(executor)
        self.client = server.client()
        self.cleanup.append(self.client.close)
        self.bucket = f"records-{uuid.uuid4().hex[:12]}"
        self.client.create_bucket(Bucket=self.bucket)

    async def writer(self, on_reject: Hook | None = None) -> Write:
        guard = S3Guard(self.client, self.bucket, on_reject=on_reject)
        self.guard = guard

        async def write(key: str, value: str, token: int) -> None:
            await self.run(guard.put, key, token, value)
        return write

    async def read(self, key: str) -> tuple[str | None, int | None]:
        body, token = await self.run(S3Guard(self.client, self.bucket).get, key)
        return (None if body is None else body.decode()), token


def records_prefix(prefix: str) -> str:
    """Where a test keeps its etcd guard records: beside the lock prefix, never inside it."""
    return prefix.rstrip("/") + ".records/"


class EtcdDriver(Driver):
    """etcd: conformance token t is a real grant: the contender key of lease id t.

    The driver puts one contender key per conformance token under a test lock
    name, in token order, so key t's create revision (the real fencing token
    the guard checks) grows with t. Every key exists at once, so every token
    "holds" for the guard's holder check; the stored-token check is what the
    suite exercises. The record keys live beside the test's lock prefix
    (:func:`records_prefix`: the guard refuses keys inside it).
    """

    name = "etcd"

    def __init__(self, client: Any, channel: Any, prefix: str) -> None:
        self.client = client  # an etcd3aio client, to put the contender keys
        self.channel = channel  # the guard's grpc.aio channel to etcd
        self.prefix = prefix
        self.lock = "conformance"
        self.revisions: dict[int, int] = {}
        self.tokens: dict[int, int] = {}

    async def setup(self) -> None:
        from fencepost.client.v1.keys import Keys

        keys = Keys(self.prefix)
        for t in range(1, MAX_TOKEN + 1):
            resp = await self.client.kv.put(keys.contender(self.lock, t), b"", timeout=5)
            self.revisions[t] = int(resp.header.revision)
            self.tokens[int(resp.header.revision)] = t

    def conformance_token(self, token: int | None) -> int | None:
        return None if token is None else self.tokens[token]

    def record(self, key: str) -> object:
        return records_prefix(self.prefix) + key

    async def close(self) -> None:
        # The fake contender keys hang on no lease: delete them, and the records, so that the
        # suite's end-of-run check (tests/conftest.py::_orphans) sees only what clients left.
        from etcd3aio import prefix_range_end

        for start in (self.prefix.encode(), records_prefix(self.prefix).encode()):
            await self.client.kv.delete(start, prefix_range_end(start), timeout=5)
        await self.client.close()
        await self.channel.close()

    async def writer(self, on_reject: Hook | None = None) -> Write:
        guard = EtcdGuard(self.channel, prefix=self.prefix, on_reject=on_reject)
        self.guard = guard

        async def write(key: str, value: str, token: Any) -> None:
            # A token that is not a conformance token (the bad-token test) goes to the guard as it is;
            # a hold (the token-ahead test) gives its token (the etcd guard checks the lock key itself).
            token = getattr(token, "token", token)
            ok = isinstance(token, int) and not isinstance(token, bool)
            revision = self.revisions.get(token, token) if ok else token
            await guard.put(records_prefix(self.prefix) + key, Hold(self.lock, token, revision), value)
        return write

    async def read(self, key: str) -> tuple[str | None, int | None]:
        value, token = await EtcdGuard(self.channel, prefix=self.prefix).get(records_prefix(self.prefix) + key)
        return (None if value is None else value.decode()), self.conformance_token(token)


@pytest.fixture(params=ADAPTERS)
async def driver(request: pytest.FixtureRequest, executor: ThreadPoolExecutor, tmp_path: Path) -> AsyncIterator[Driver]:
    """Each adapter in turn, on its real server."""
    name = request.param
    drv: Driver
    if name == "sqlite":
        drv = SqliteDriver(executor, tmp_path / "records.sqlite3")
    elif name == "postgres":
        drv = PostgresDriver(executor, request.getfixturevalue("postgres").dsn)
    elif name == "redis":
        drv = RedisDriver(executor, request.getfixturevalue("redis_server").url)
    elif name == "dynamodb":
        drv = DynamoDriver(executor, request.getfixturevalue("dynalite"))
    elif name == "mariadb":
        drv = MariaDbDriver(executor, request.getfixturevalue("mariadb"))
    elif name == "s3":
        drv = S3Driver(executor, request.getfixturevalue("s3_server"))
    else:
        import grpc
        from etcd3aio import Etcd3Client

        endpoint = request.getfixturevalue("etcd").endpoint
        client = Etcd3Client([endpoint])
        await client.connect()
        drv = EtcdDriver(client, grpc.aio.insecure_channel(f"dns:///{endpoint}"), request.getfixturevalue("prefix"))
        await drv.setup()
    try:
        yield drv
    finally:
        await drv.close()
