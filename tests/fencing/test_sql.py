"""SQL guard specifics: identifier validation, UPDATE on a missing row, the token column helper."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fencepost.client import StaleTokenError
from fencepost.client import FencepostError, InvalidArgument
from fencepost.client.fencing import (
    MalformedTokenError,
    MissingRecordError,
    SqlGuard,
    add_token_column,
    update_statement,
    upsert_statement,
)

from .servers import PostgresServer


@pytest.fixture
def conn(tmp_path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(tmp_path / "db.sqlite3")
    db.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT, fencing_token BIGINT)")
    db.execute("CREATE TABLE x (id INTEGER)")
    db.commit()
    yield db
    db.close()


@pytest.mark.parametrize("argument", ["table", "key_column", "token_column"])
def test_guard_when_identifier_is_injection(conn: sqlite3.Connection, argument: str) -> None:
    """A table or column name that is not an identifier is refused with InvalidArgument naming the argument."""
    kwargs = {"table": "users", "key_column": "id", "token_column": "fencing_token"}
    kwargs[argument] = "users; DROP TABLE x"
    with pytest.raises(InvalidArgument, match=argument) as info:
        SqlGuard(conn, kwargs["table"], kwargs["key_column"], token_column=kwargs["token_column"])
    assert info.value.field == argument
    assert conn.execute("SELECT count(*) FROM x").fetchone() == (0,)


def test_write_when_value_column_is_injection(conn: sqlite3.Connection) -> None:
    """A column name in the written values is validated too; values themselves are bound."""
    guard = SqlGuard(conn, "users", "id", commit=True)
    with pytest.raises(InvalidArgument, match="values"):
        guard.upsert(1, 5, {"name = 'x'; DROP TABLE x; --": "v"})
    guard.upsert(1, 5, {"name": "Robert'); DROP TABLE x; --"})
    assert conn.execute("SELECT name FROM users WHERE id = 1").fetchone() == ("Robert'); DROP TABLE x; --",)
    assert conn.execute("SELECT count(*) FROM x").fetchone() == (0,)


def test_statement_binds_parameters() -> None:
    """The UPDATE is the documented single conditional statement with placeholders only."""
    assert update_statement("users", "id", ["name"]) == (
        'UPDATE "users" SET "name" = ?, "fencing_token" = ? '
        'WHERE "id" = ? AND ("fencing_token" IS NULL OR '
        '''(typeof("fencing_token") = 'integer' AND "fencing_token" >= 0 AND "fencing_token" <= ?))''')


def test_update_when_stored_token_is_a_fraction(conn: sqlite3.Connection) -> None:
    """SQLite: an UPDATE over a REAL 7.5 in the token column is MalformedTokenError (not MissingRecordError)."""
    conn.execute("CREATE TABLE t (id TEXT PRIMARY KEY, v TEXT, fencing_token BIGINT)")
    conn.execute("INSERT INTO t VALUES ('k', 'old', 7.5)")
    guard = SqlGuard(conn, "t", "id")
    for write in (guard.update, guard.upsert):
        with pytest.raises(MalformedTokenError) as info:
            write("k", 8, {"v": "new"})
        assert (info.value.record, info.value.token, info.value.stored) == ("k", 8, 7.5)
    assert guard.rejected == 2
    assert conn.execute("SELECT v, fencing_token FROM t").fetchone() == ("old", 7.5)


@pytest.mark.parametrize(("column", "stored"), [("NUMERIC", "7.5"), ("NUMERIC", "7.0"), ("DOUBLE PRECISION", "7"),
                                                 ("BIGINT", "-5")])
def test_postgres_when_token_column_holds_no_token(postgres: PostgresServer, column: str, stored: str) -> None:
    """PostgreSQL: a token column that is not an integer type, or a negative token, refuses update and upsert."""
    import psycopg

    table = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres.dsn, autocommit=True) as db:
        db.execute(f"CREATE TABLE {table} (id TEXT PRIMARY KEY, v TEXT, fencing_token {column})")
        db.execute(f"INSERT INTO {table} VALUES ('k', 'old', {stored})")
        guard = SqlGuard(db, table, "id")
        for write in (guard.update, guard.upsert):
            with pytest.raises(MalformedTokenError):
                write("k", 8, {"v": "new"})
        assert guard.rejected == 2
        row = db.execute(f"SELECT v, fencing_token::text FROM {table}").fetchone()
        assert row == ("old", str(db.execute(f"SELECT ({stored})::{column}::text").fetchone()[0]))


def test_update_when_row_missing(conn: sqlite3.Connection) -> None:
    """UPDATE of a key with no row raises MissingRecordError (a FencepostError), not StaleTokenError."""
    guard = SqlGuard(conn, "users", "id", commit=True)
    with pytest.raises(MissingRecordError) as info:
        guard.update(42, 5, {"name": "a"})
    assert isinstance(info.value, FencepostError)
    assert info.value.record == 42
    assert guard.rejected == 0


def test_update_when_stale(conn: sqlite3.Connection) -> None:
    """UPDATE of an existing row: same or higher token accepted, lower refused with the stored token."""
    conn.execute("INSERT INTO users (id, name) VALUES (1, 'old')")
    conn.commit()
    guard = SqlGuard(conn, "users", "id", commit=True)
    guard.update(1, 8, {"name": "a"})
    guard.update(1, 8, {"name": "b"})
    with pytest.raises(StaleTokenError) as info:
        guard.update(1, 7, {"name": "c"})
    assert (info.value.record, info.value.token, info.value.current_token) == (1, 7, 8)
    assert conn.execute("SELECT name, fencing_token FROM users WHERE id = 1").fetchone() == ("b", 8)
    assert guard.rejected == 1


def test_add_token_column_sqlite(tmp_path: Path) -> None:
    """add_token_column adds a NULL BIGINT column; the first guarded write then takes any token."""
    db = sqlite3.connect(tmp_path / "legacy.sqlite3")
    db.execute("CREATE TABLE invoices (id TEXT PRIMARY KEY, status TEXT)")
    db.execute("INSERT INTO invoices VALUES ('inv:1', 'draft')")
    add_token_column(db, "invoices", commit=True)
    assert db.execute("SELECT fencing_token FROM invoices").fetchone() == (None,)
    guard = SqlGuard(db, "invoices", "id", commit=True)
    guard.update("inv:1", 3, {"status": "paid"})
    assert db.execute("SELECT status, fencing_token FROM invoices").fetchone() == ("paid", 3)
    db.close()


def test_guard_leaves_transaction_to_caller(tmp_path: Path) -> None:
    """Without commit=True the write stays in the caller's transaction until the caller commits."""
    path = tmp_path / "tx.sqlite3"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT, fencing_token BIGINT)")
    db.commit()
    SqlGuard(db, "t", "id").upsert(1, 4, {"v": "x"})
    other = sqlite3.connect(path)
    assert other.execute("SELECT count(*) FROM t").fetchone() == (0,)
    db.commit()
    assert other.execute("SELECT v, fencing_token FROM t").fetchone() == ("x", 4)
    other.close()
    db.close()


def test_postgres_update_missing_and_add_column(postgres: PostgresServer) -> None:
    """PostgreSQL: add_token_column, UPDATE on a missing row, a stale UPDATE, with %s parameters."""
    import psycopg

    with psycopg.connect(postgres.dsn) as db:
        db.execute("CREATE TABLE legacy_invoices (id TEXT PRIMARY KEY, status TEXT)")
        db.execute("INSERT INTO legacy_invoices VALUES ('inv:1', 'draft')")
        add_token_column(db, "legacy_invoices", commit=True)
        guard = SqlGuard(db, "legacy_invoices", "id", commit=True)
        with pytest.raises(MissingRecordError):
            guard.update("inv:404", 5, {"status": "paid"})
        guard.update("inv:1", 5, {"status": "paid"})
        with pytest.raises(StaleTokenError) as info:
            guard.update("inv:1", 4, {"status": "void"})
        assert (info.value.token, info.value.current_token) == (4, 5)
        row = db.execute("SELECT status, fencing_token FROM legacy_invoices").fetchone()
        assert row == ("paid", 5)


# ---------------------------------------------------------------- the guard owns the key and token columns


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A connection to a real database with ``users (id INTEGER PRIMARY KEY, name TEXT, fencing_token BIGINT)``."""
    if request.param == "sqlite":
        conn: Any = sqlite3.connect(tmp_path / "owned.sqlite3")
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT, fencing_token BIGINT)")
        conn.commit()
        yield conn
        conn.close()
        return
    import psycopg

    dsn = request.getfixturevalue("postgres").dsn
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("DROP TABLE IF EXISTS users")
        admin.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT, fencing_token BIGINT)")
    conn = psycopg.connect(dsn)
    yield conn
    conn.close()


def _rows(conn: Any) -> list[tuple[Any, ...]]:
    cur = conn.cursor()
    cur.execute("SELECT id, name, fencing_token FROM users ORDER BY id")
    rows = [tuple(r) for r in cur.fetchall()]
    cur.close()
    return rows


@pytest.mark.parametrize("column", ["fencing_token", "FENCING_TOKEN"])
def test_upsert_when_values_set_the_token_column(db: Any, column: str) -> None:
    """values naming the token column is refused before any statement: the stored token stays the writer's.

    Before the fix the INSERT listed the token column twice and stored the
    caller's 1 instead of the token 5, so a stale writer with token 2 was
    then accepted after token 5 had written.
    """
    guard = SqlGuard(db, "users", "id", commit=True)
    with pytest.raises(InvalidArgument) as info:
        guard.upsert(9, 5, {"name": "a", column: 1})
    assert info.value.field == "values"
    assert _rows(db) == []
    guard.upsert(9, 5, {"name": "a"})
    with pytest.raises(StaleTokenError):
        guard.upsert(9, 2, {"name": "stale"})
    with pytest.raises(InvalidArgument):
        guard.update(9, 5, {column: 1})
    assert _rows(db) == [(9, "a", 5)]


@pytest.mark.parametrize("column", ["id", "ID"])
def test_update_when_values_set_the_key_column(db: Any, column: str) -> None:
    """values naming the key column is refused (update and upsert): the record does not move to another key."""
    guard = SqlGuard(db, "users", "id", commit=True)
    guard.upsert(2, 5, {"name": "a"})
    for write in (guard.update, guard.upsert):
        with pytest.raises(InvalidArgument) as info:
            write(2, 5, {column: 77})
        assert info.value.field == "values"
    assert _rows(db) == [(2, "a", 5)]


@pytest.mark.parametrize("values", [None, "name", [("name", "a")], 5])
def test_write_when_values_is_not_a_mapping(db: Any, values: object) -> None:
    """values that is not a mapping raises InvalidArgument (field "values"), not a TypeError."""
    guard = SqlGuard(db, "users", "id", commit=True)
    for write in (guard.update, guard.upsert):
        with pytest.raises(InvalidArgument) as info:
            write(1, 5, values)  # type: ignore[arg-type]
        assert info.value.field == "values"
    assert _rows(db) == []


def test_upsert_when_key_is_none(db: Any) -> None:
    """A None key is refused (in SQLite it would insert a row under a fresh rowid)."""
    guard = SqlGuard(db, "users", "id", commit=True)
    with pytest.raises(InvalidArgument) as info:
        guard.upsert(None, 5, {"name": "a"})
    assert info.value.field == "key"
    assert _rows(db) == []


def test_statements_when_columns_name_the_key_or_token_column() -> None:
    """The statement builders refuse the guard's own columns too, and a token column that is the key column."""
    for build in (update_statement, upsert_statement):
        for column in ("fencing_token", "id"):
            with pytest.raises(InvalidArgument) as info:
                build("users", "id", ["name", column])
            assert info.value.field == "values"
        with pytest.raises(InvalidArgument) as info:
            build("users", "id", ["name"], token_column="Id")
        assert info.value.field == "token_column"


def test_guard_when_conn_is_not_a_connection() -> None:
    """SqlGuard(None, ...) names the connection, not the paramstyle."""
    with pytest.raises(InvalidArgument) as info:
        SqlGuard(None, "users", "id")
    assert info.value.field == "conn"
