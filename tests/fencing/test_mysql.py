"""MySQL/MariaDB guard specifics, on a real MariaDB: the affected-rows traps, assignment order, transactions."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pymysql.constants import CLIENT

from fencepost.client import InvalidArgument, StaleTokenError
from fencepost.client.fencing import (
    MalformedTokenError,
    MissingRecordError,
    MySqlGuard,
    SqlGuard,
    add_token_column,
    mysql_update_statement,
    mysql_upsert_statement,
)

from .servers import MariaDbServer

FLAGS = {"default": 0, "found_rows": CLIENT.FOUND_ROWS}


@pytest.fixture
def table(mariadb: MariaDbServer) -> str:
    """A fresh InnoDB table ``(id INT PRIMARY KEY, name TEXT, fencing_token BIGINT)``."""
    name = f"users_{uuid.uuid4().hex[:12]}"
    conn = mariadb.connect(autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE TABLE {name} (id INT PRIMARY KEY, name TEXT, fencing_token BIGINT) ENGINE=InnoDB")
    finally:
        conn.close()
    return name


@pytest.fixture(params=sorted(FLAGS))
def conn(request: pytest.FixtureRequest, mariadb: MariaDbServer) -> Iterator[Any]:
    """A PyMySQL connection, with the default client flags and with CLIENT.FOUND_ROWS."""
    db = mariadb.connect(client_flag=FLAGS[request.param])
    try:
        yield db
    finally:
        db.close()


def _rows(mariadb: MariaDbServer, table: str) -> list[tuple[Any, ...]]:
    """The table's committed rows, read on a connection of its own."""
    db = mariadb.connect(autocommit=True)
    try:
        with db.cursor() as cur:
            cur.execute(f"SELECT id, name, fencing_token FROM {table} ORDER BY id")
            return [tuple(r) for r in cur.fetchall()]
    finally:
        db.close()


def _rowcount(db: Any, sql: str, params: list[Any]) -> int:
    with db.cursor() as cur:
        cur.execute(sql, params)
        return int(cur.rowcount)


def test_same_token_same_values_rewrite_is_accepted(conn: Any, table: str, mariadb: MariaDbServer) -> None:
    """A rewrite of the same values with the same token is accepted (update and upsert), with either flag.

    The trap: without CLIENT.FOUND_ROWS MySQL reports 0 affected rows for a
    statement that changes nothing, which a guard reading the count alone
    would report as refused (or, for update, as a missing row).
    """
    guard = MySqlGuard(conn, table, "id", commit=True)
    guard.upsert(1, 5, {"name": "a"})
    sql = mysql_update_statement(table, "id", ["name"])
    count = _rowcount(conn, sql, ["a", 5, 1, 5])
    conn.commit()
    assert count == (1 if guard.found_rows else 0)  # the trap itself, on the raw statement
    guard.update(1, 5, {"name": "a"})
    guard.upsert(1, 5, {"name": "a"})
    guard.update(1, 5, {})
    assert guard.rejected == 0
    assert _rows(mariadb, table) == [(1, "a", 5)]


def test_upsert_refused_with_found_rows_counts_one(mariadb: MariaDbServer, table: str) -> None:
    """With CLIENT.FOUND_ROWS a refused INSERT ... ON DUPLICATE KEY UPDATE reports 1 row, yet the guard refuses it."""
    db = mariadb.connect(client_flag=CLIENT.FOUND_ROWS)
    try:
        seen: list[StaleTokenError] = []
        guard = MySqlGuard(db, table, "id", commit=True, on_reject=seen.append)
        assert guard.found_rows
        guard.upsert(1, 9, {"name": "new"})
        sql = mysql_upsert_statement(table, "id", ["name"])
        count = _rowcount(db, sql, [1, "old", 7, 7, "old", 7, 7])
        db.commit()
        assert count == 1  # the trap: refused by the condition, counted as found
        with pytest.raises(StaleTokenError) as info:
            guard.upsert(1, 7, {"name": "old"})
        assert (info.value.record, info.value.token, info.value.current_token) == (1, 7, 9)
        assert seen == [info.value]
        assert guard.rejected == 1
    finally:
        db.close()
    assert _rows(mariadb, table) == [(1, "new", 9)]


def test_upsert_assigns_the_token_column_last(mariadb: MariaDbServer, table: str) -> None:
    """MariaDB evaluates ON DUPLICATE KEY UPDATE assignments left to right; the guard's token comes last.

    An assignment placed after the token column sees the NEW token, so the
    value conditions must come first to read the stored one: this fails if
    the builder put the token column first.
    """
    sql = mysql_upsert_statement(table, "id", ["name"])
    assignments = re.findall(r"(`\w+`) = IF\(", sql.split("ON DUPLICATE KEY UPDATE ", 1)[1])
    assert assignments == ["`name`", "`fencing_token`"]
    db = mariadb.connect(autocommit=True)
    try:
        with db.cursor() as cur:
            cur.execute(f"INSERT INTO {table} VALUES (1, 'x', 3)")
            # The same condition, token first: `name` then sees 9, not the stored 3.
            cur.execute(f"INSERT INTO {table} (id, name, fencing_token) VALUES (1, 'y', 9) "
                        f"ON DUPLICATE KEY UPDATE fencing_token = 9, "
                        f"name = IF(fencing_token = 3, 'saw stored 3', CONCAT('saw ', fencing_token))")
    finally:
        db.close()
    assert _rows(mariadb, table) == [(1, "saw 9", 9)]


def test_update_when_stale_or_missing(conn: Any, table: str, mariadb: MariaDbServer) -> None:
    """update: a missing row raises MissingRecordError; a lower token StaleTokenError; same or higher accepted."""
    guard = MySqlGuard(conn, table, "id", commit=True)
    with pytest.raises(MissingRecordError) as missing:
        guard.update(42, 5, {"name": "a"})
    assert missing.value.record == 42
    guard.upsert(1, 5, {"name": "a"})
    guard.update(1, 8, {"name": "b"})
    with pytest.raises(StaleTokenError) as info:
        guard.update(1, 7, {"name": "c"})
    assert (info.value.record, info.value.token, info.value.current_token) == (1, 7, 8)
    assert guard.rejected == 1
    assert _rows(mariadb, table) == [(1, "b", 8)]


@pytest.mark.parametrize(
    ("call", "field"),
    [
        pytest.param(lambda g: g.upsert(1, 0, {"name": "a"}), "token", id="token-0"),
        pytest.param(lambda g: g.upsert(None, 5, {"name": "a"}), "key", id="key-None"),
        pytest.param(lambda g: g.upsert(1, 5, {"fencing_token": 1}), "values", id="values-token-column"),
        pytest.param(lambda g: g.update(1, 5, {"ID": 2}), "values", id="values-key-column"),
        pytest.param(lambda g: g.upsert(1, 5, {"name`; DROP TABLE x; --": "a"}), "values", id="values-injection"),
        pytest.param(lambda g: g.update(1, 5, None), "values", id="values-None"),
    ],
)
def test_write_when_arguments_are_bad(mariadb: MariaDbServer, table: str, call: Callable[[Any], None],
                                      field: str) -> None:
    """Bad tokens, keys and values raise InvalidArgument naming the argument before any statement is sent."""
    db = mariadb.connect()
    try:
        guard = MySqlGuard(db, table, "id", commit=True)
        with pytest.raises(InvalidArgument) as info:
            call(guard)
        assert info.value.field == field
        assert not db.get_autocommit() and not db.server_status & 1  # no statement opened a transaction
    finally:
        db.close()
    assert _rows(mariadb, table) == []


def test_guards_when_connection_is_mysql(mariadb: MariaDbServer, table: str) -> None:
    """SqlGuard refuses a MySQL connection (its statements are not MySQL's); MySqlGuard checks names."""
    db = mariadb.connect()
    try:
        with pytest.raises(InvalidArgument) as info:
            SqlGuard(db, table, "id")
        assert info.value.field == "conn"
        with pytest.raises(InvalidArgument) as info:
            MySqlGuard(db, "users; DROP TABLE x", "id")
        assert info.value.field == "table"
    finally:
        db.close()


def test_guard_in_autocommit_mode(mariadb: MariaDbServer, table: str) -> None:
    """With autocommit on, each write runs in a transaction of the guard's own and is committed on return."""
    db = mariadb.connect(autocommit=True)
    try:
        guard = MySqlGuard(db, table, "id")
        guard.upsert(1, 5, {"name": "a"})
        guard.upsert(1, 5, {"name": "a"})
        guard.update(1, 5, {"name": "a"})
        with pytest.raises(StaleTokenError):
            guard.update(1, 4, {"name": "b"})
        assert not db.server_status & 1  # no transaction left open
    finally:
        db.close()
    assert _rows(mariadb, table) == [(1, "a", 5)]


def test_guard_leaves_transaction_to_caller(mariadb: MariaDbServer, table: str) -> None:
    """Without commit=True (autocommit off) the write stays in the caller's transaction until it commits."""
    db = mariadb.connect()
    try:
        MySqlGuard(db, table, "id").upsert(1, 4, {"name": "x"})
        assert _rows(mariadb, table) == []
        db.commit()
    finally:
        db.close()
    assert _rows(mariadb, table) == [(1, "x", 4)]


class _AfterFirstStatement:
    """A real PyMySQL connection whose first statement is followed by ``then()`` (a seam, not a mock)."""

    def __init__(self, conn: Any, then: Callable[[], None]) -> None:
        self._conn = conn
        self._then: Callable[[], None] | None = then

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def cursor(self) -> Any:
        cur = self._conn.cursor()
        execute = cur.execute

        def execute_then(sql: str, params: Any = None) -> int:
            result = execute(sql, params)
            self._statement_done()
            return result
        cur.execute = execute_then
        return cur

    def _statement_done(self) -> None:
        """Call ``then()`` after the first statement, and never again."""
        if self._then is not None:
            then, self._then = self._then, None
            then()


def test_update_when_row_is_inserted_after_the_update(mariadb: MariaDbServer, table: str) -> None:
    """READ COMMITTED: a row inserted by another writer right after the UPDATE found none gets the write.

    The UPDATE matched nothing (count 0), the locked read then finds a row
    whose token allows the write: the guard runs the UPDATE again under that
    lock instead of reporting a write that did not happen as accepted.
    """
    def insert_elsewhere() -> None:
        other = mariadb.connect(autocommit=True)
        try:
            with other.cursor() as cur:
                cur.execute(f"INSERT INTO {table} VALUES (1, 'other', 3)")
        finally:
            other.close()

    db = mariadb.connect()
    try:
        with db.cursor() as cur:
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        guard = MySqlGuard(_AfterFirstStatement(db, insert_elsewhere), table, "id", commit=True)
        guard.update(1, 5, {"name": "mine"})
    finally:
        db.close()
    assert _rows(mariadb, table) == [(1, "mine", 5)]


def test_add_token_column_on_mariadb(mariadb: MariaDbServer) -> None:
    """add_token_column quotes with backticks on a MySQL connection; the first guarded write takes any token."""
    name = f"legacy_{uuid.uuid4().hex[:12]}"
    db = mariadb.connect()
    try:
        with db.cursor() as cur:
            cur.execute(f"CREATE TABLE {name} (id VARCHAR(16) PRIMARY KEY, status TEXT) ENGINE=InnoDB")
            cur.execute(f"INSERT INTO {name} VALUES ('inv:1', 'draft')")
        db.commit()
        add_token_column(db, name, commit=True)
        guard = MySqlGuard(db, name, "id", commit=True)
        guard.update("inv:1", 3, {"status": "paid"})
        with pytest.raises(StaleTokenError):
            guard.update("inv:1", 2, {"status": "void"})
        with db.cursor() as cur:
            cur.execute(f"SELECT status, fencing_token FROM {name}")
            assert cur.fetchone() == ("paid", 3)
    finally:
        db.close()


@pytest.mark.parametrize(("column", "stored"), [("DECIMAL(10,1)", "7.5"), ("DECIMAL(10,1)", "7.0"),
                                                 ("VARCHAR(20)", "'1e3'"), ("VARCHAR(20)", "'007'"),
                                                 ("VARCHAR(20)", "'abc'"), ("VARCHAR(20)", "''"), ("BIGINT", "-5")])
def test_write_when_token_column_holds_no_token(mariadb: MariaDbServer, conn: Any, column: str, stored: str) -> None:
    """Stored 7.5 with token 7 (was reported as written), "1e3", "abc", -5: update and upsert refuse, typed, counted."""
    table = f"t_{uuid.uuid4().hex[:12]}"
    admin = mariadb.connect(autocommit=True)
    try:
        with admin.cursor() as cur:
            cur.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, name TEXT, fencing_token {column}) ENGINE=InnoDB")
            cur.execute(f"INSERT INTO {table} VALUES (1, 'old', {stored})")
    finally:
        admin.close()
    before = _rows(mariadb, table)
    guard = MySqlGuard(conn, table, "id", commit=True)
    for token in (7, 1000):
        for write in (guard.update, guard.upsert):
            with pytest.raises(MalformedTokenError):
                write(1, token, {"name": "new"})
    assert guard.rejected == 4
    assert _rows(mariadb, table) == before
