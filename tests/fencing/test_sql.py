"""SQL guard specifics: identifier validation, UPDATE on a missing row, the token column helper."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from fencepost.client import StaleTokenError
from fencepost.client import FencepostError, InvalidArgument
from fencepost.client.fencing import MissingRecordError, SqlGuard, add_token_column, update_statement

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
        'WHERE "id" = ? AND ("fencing_token" IS NULL OR "fencing_token" <= ?)')


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
